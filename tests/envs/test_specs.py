"""Tests for the spec classes: shapes, dtypes, domains, batching and Composite's key handling."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlcollect.envs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    OneHot,
    TensorSpec,
    Unbounded,
)

LEAF_SPECS = {
    "unbounded": Unbounded(shape=(3,)),
    "unbounded_int": Unbounded(shape=(2,), dtype=torch.int32),
    "unbounded_bool": Unbounded(shape=(2,), dtype=torch.bool),
    "bounded": Bounded(-1.0, 2.0, shape=(2, 2)),
    "bounded_int": Bounded(0, 255, shape=(4,), dtype=torch.uint8),
    "bounded_infinite": Bounded(-float("inf"), float("inf"), shape=(2,)),
    "bounded_per_element": Bounded(torch.tensor([0.0, -5.0]), torch.tensor([1.0, 5.0]), shape=(2,)),
    "categorical": Categorical(4),
    "categorical_multi": Categorical([2, 3, 4]),
    "categorical_flag": Categorical(2, shape=(1,), dtype=torch.bool),
    "one_hot": OneHot(3),
    "binary": Binary(5),
    "binary_bool": Binary(shape=(2, 2), dtype=torch.bool),
}


@pytest.mark.parametrize("name", list(LEAF_SPECS))
def test_rand_is_in_and_has_shape_and_dtype(name: str) -> None:
    spec = LEAF_SPECS[name]
    for _ in range(10):
        value = spec.rand()
        assert value.shape == spec.shape
        assert value.dtype == spec.dtype
        assert spec.is_in(value)
    batched = spec.rand((4, 2))
    assert batched.shape == torch.Size([4, 2, *spec.shape])
    assert spec.is_in(batched)


@pytest.mark.parametrize("name", list(LEAF_SPECS))
def test_zero_has_shape_and_dtype(name: str) -> None:
    spec = LEAF_SPECS[name]
    zero = spec.zero((3,))
    assert zero.shape == torch.Size([3, *spec.shape])
    assert zero.dtype == spec.dtype
    assert spec.is_in(zero) == (not isinstance(spec, OneHot))


@pytest.mark.parametrize("name", list(LEAF_SPECS))
def test_is_in_rejects_wrong_dtype_and_shape(name: str) -> None:
    spec = LEAF_SPECS[name]
    value = spec.rand()
    other_dtype = torch.float16 if spec.dtype != torch.float16 else torch.float32
    assert not spec.is_in(value.to(other_dtype))
    if spec.shape:
        wrong_shape = (*spec.shape[:-1], spec.shape[-1] + 1)
        assert not spec.is_in(torch.zeros(wrong_shape, dtype=spec.dtype))
    assert not spec.is_in(value.tolist())  # type: ignore[arg-type]


def test_bounded_domain_and_zero_clamping() -> None:
    spec = Bounded(1.0, 2.0, shape=(2,))
    assert spec.zero().tolist() == [1.0, 1.0]
    assert spec.is_in(torch.tensor([1.0, 2.0]))
    assert not spec.is_in(torch.tensor([1.0, 2.01]))
    assert not spec.is_in(torch.tensor([0.99, 2.0]))
    half_line = Bounded(-float("inf"), 0.0, shape=(100,))
    assert half_line.is_in(half_line.rand())
    integer = Bounded(-3, 3, shape=(1000,), dtype=torch.int64)
    assert set(integer.rand().tolist()) <= set(range(-3, 4))


def test_bounded_refuses_low_above_high() -> None:
    with pytest.raises(
        ValueError, match=r"Bounded spec needs low <= high; got low=2\.0 and high=1\.0"
    ):
        Bounded(2.0, 1.0)


@settings(max_examples=50, deadline=None)
@given(
    low=st.floats(-1e6, 1e6, allow_nan=False),
    width=st.floats(0.0, 1e6, allow_nan=False),
    size=st.integers(1, 5),
)
def test_bounded_rand_stays_within_any_finite_bounds(low: float, width: float, size: int) -> None:
    spec = Bounded(low, low + width, shape=(size,), dtype=torch.float64)
    value = spec.rand((8,))
    assert spec.is_in(value)
    assert bool((value >= low).all())
    assert bool((value <= low + width).all())


def test_categorical_domain_per_element() -> None:
    spec = Categorical([2, 3])
    assert spec.shape == torch.Size([2])
    assert spec.is_in(torch.tensor([1, 2]))
    assert not spec.is_in(torch.tensor([2, 2]))
    assert not spec.is_in(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"Categorical spec needs n >= 1; got n=\[2, 0\]"):
        Categorical([2, 0])


def test_one_hot_domain_and_index() -> None:
    spec = OneHot(4)
    assert spec.is_in(torch.tensor([0, 0, 1, 0]))
    assert not spec.is_in(torch.tensor([0, 1, 1, 0]))
    assert not spec.is_in(torch.tensor([0, 0, 2, 0]))
    assert not spec.is_in(torch.zeros(4, dtype=torch.int64))
    assert spec.to_categorical(torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0]])).tolist() == [2, 0]
    assert OneHot(4, shape=(3, 4)).rand().sum(-1).tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match=r"OneHot spec shape \(3,\) must end with n=4"):
        OneHot(4, shape=(3,))


def test_binary_domain_and_arguments() -> None:
    spec = Binary(3)
    assert spec.dtype == torch.int8
    assert spec.is_in(torch.tensor([0, 1, 1], dtype=torch.int8))
    assert not spec.is_in(torch.tensor([0, 2, 1], dtype=torch.int8))
    assert Binary(shape=(2, 5)).n == 5
    with pytest.raises(ValueError, match="Binary spec needs n or shape; got neither"):
        Binary()


def test_unbounded_accepts_any_value_of_its_shape() -> None:
    spec = Unbounded(shape=(2,))
    assert spec.is_in(torch.tensor([1e30, -1e30]))
    assert spec.is_in(torch.tensor([float("inf"), float("nan")]))


# --- batching, copying, equality -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(LEAF_SPECS))
def test_expand_prepends_batch_dims_and_keeps_the_domain(name: str) -> None:
    spec = LEAF_SPECS[name]
    batched = spec.expand(4, 2)
    assert batched.shape == torch.Size([4, 2, *spec.shape])
    assert type(batched) is type(spec)
    assert batched.dtype == spec.dtype
    value = batched.rand()
    assert value.shape == batched.shape
    assert batched.is_in(value)
    assert spec.shape != batched.shape
    assert spec.rand().shape == spec.shape


def test_expanded_bounds_are_checked_per_element() -> None:
    spec = Bounded(torch.tensor([0.0, 10.0]), torch.tensor([1.0, 11.0]), shape=(2,)).expand(3)
    value = torch.tensor([[0.5, 10.5]] * 3)
    assert spec.is_in(value)
    value[2, 0] = 10.5
    assert not spec.is_in(value)


def test_clone_and_to_are_independent_copies() -> None:
    spec = Bounded(0.0, 1.0, shape=(2,))
    clone = spec.clone()
    clone.shape = torch.Size([5])
    assert spec.shape == torch.Size([2])
    moved = spec.to("meta")
    assert moved.device == torch.device("meta")
    assert moved.low.device == torch.device("meta")
    assert spec.device == torch.device("cpu")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (Bounded(0.0, 1.0, shape=(2,)), Bounded(0.0, 2.0, shape=(2,))),
        (Categorical(3), Categorical(4)),
        (OneHot(3), OneHot(4)),
        (Unbounded(shape=(2,)), Unbounded(shape=(3,))),
        (Unbounded(shape=(2,)), Unbounded(shape=(2,), dtype=torch.float64)),
        (Unbounded(shape=(2,)), Bounded(-1.0, 1.0, shape=(2,))),
        (Composite(a=Categorical(3)), Composite(a=Categorical(5))),
    ],
)
def test_specs_with_different_domains_are_not_equal(first: TensorSpec, second: TensorSpec) -> None:
    assert first == first.clone()
    assert first != second


# --- Composite -----------------------------------------------------------------------------------


def make_composite() -> Composite:
    spec = Composite(shape=(2,))
    spec["observation"] = Unbounded(shape=(2, 3))
    spec["agent", "position"] = Bounded(-1.0, 1.0, shape=(2, 2))
    spec["agent", "sensors", "contact"] = Binary(shape=(2, 4))
    return spec


def test_composite_nested_keys_match_tensordict_keys() -> None:
    spec = make_composite()
    value = spec.zero()
    assert isinstance(value, TensorDict)
    assert value.batch_size == torch.Size([2])
    for include_nested in (False, True):
        for leaves_only in (False, True):
            assert set(spec.keys(include_nested, leaves_only)) == set(
                value.keys(include_nested=include_nested, leaves_only=leaves_only)
            )
    assert [key for key, _ in spec.leaves()] == [
        ("observation",),
        ("agent", "position"),
        ("agent", "sensors", "contact"),
    ]


def test_composite_get_set_contains_delete() -> None:
    spec = make_composite()
    assert isinstance(spec["agent"], Composite)
    assert spec["agent"].shape == torch.Size([2])
    assert spec["agent", "sensors", "contact"].shape == torch.Size([2, 4])
    assert ("agent", "position") in spec
    assert ("agent", "missing") not in spec
    assert "agent" in spec
    assert len(spec) == 2
    assert list(spec) == ["observation", "agent"]
    del spec["observation"]
    assert "observation" not in spec


def test_composite_rand_zero_is_in() -> None:
    spec = make_composite()
    value = spec.rand()
    assert spec.is_in(value)
    assert spec.rand((5,)).batch_size == torch.Size([5, 2])
    value["agent", "position"] = torch.full((2, 2), 3.0)
    assert not spec.is_in(value)
    assert not spec.is_in(spec.rand().exclude("observation"))


def test_composite_expand_clone_to() -> None:
    spec = make_composite().expand(3)
    assert spec.shape == torch.Size([3, 2])
    assert spec["agent", "sensors", "contact"].shape == torch.Size([3, 2, 4])
    assert spec.is_in(spec.rand())
    clone = spec.clone()
    clone["extra"] = Unbounded(shape=(3, 2))
    assert "extra" not in spec
    assert spec.to("meta")["agent", "position"].device == torch.device("meta")
    assert spec == spec.clone()


@pytest.mark.parametrize(
    ("low", "high", "expected_mean", "in_half"),
    [
        (-math.inf, math.inf, 0.0, None),  # N(0, 1)
        (0.0, math.inf, 1.0, "above"),  # low + Exp(1)
        (-math.inf, 0.0, -1.0, "below"),  # high - Exp(1)
    ],
)
def test_rand_of_unbounded_boxes_samples_as_gymnasium(
    low: float, high: float, expected_mean: float, in_half: str | None
) -> None:
    torch.manual_seed(0)
    values = Bounded(low, high, shape=(20_000,)).rand()
    assert torch.isfinite(values).all()
    assert abs(values.mean().item() - expected_mean) < 0.05
    assert abs(values.std().item() - 1.0) < 0.05
    if in_half == "above":
        assert (values >= 0).all()
    elif in_half == "below":
        assert (values <= 0).all()


def test_rand_of_integer_bounds_draws_every_value_alike() -> None:
    torch.manual_seed(0)
    counts = torch.bincount(Bounded(0, 4, shape=(50_000,), dtype=torch.int64).rand())
    assert counts.numel() == 5
    assert (counts - 10_000).abs().max() < 500
