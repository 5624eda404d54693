"""RayCollector(..., store_obs_once=True): the gathered batch is compacted here, losslessly."""

from __future__ import annotations

import pytest
import torch

from rlcollect import transition_view
from rlcollect.batch.compact import is_compact
from rlcollect.collectors.ray.collector import RayCollector
from tests.collectors.ray.helpers import RAY_TEST_TIMEOUT, counting_env

pytest.importorskip("ray")

pytestmark = [pytest.mark.timeout(RAY_TEST_TIMEOUT)]


def test_compact_batches_give_the_standard_ones_back() -> None:
    def run(store_obs_once: bool) -> list:
        with RayCollector(
            counting_env(3),
            num_collectors=2,
            frames_per_batch=14,
            total_frames=56,
            store_obs_once=store_obs_once,
        ) as collector:
            return list(collector)

    standard, compact = run(False), run(True)
    for compact_batch, standard_batch in zip(compact, standard, strict=True):
        assert is_compact(compact_batch)
        view = transition_view(compact_batch)
        assert view.batch_size == standard_batch.batch_size
        assert set(view.keys(True, True)) == set(standard_batch.keys(True, True))
        for key in standard_batch.keys(True, True):
            if key != "action":  # random actions, drawn afresh by every run's actors
                assert torch.equal(view[key], standard_batch[key]), key
