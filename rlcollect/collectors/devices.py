"""The collector's device split (env, policy and storing devices), and the wait for copies
between processes that share CUDA memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDictBase, is_non_tensor, is_tensor_collection

DeviceLike = torch.device | str | int | None


def canonical_device(device: torch.device) -> torch.device:
    """`device` with its index filled in: "cuda" is the current CUDA device, e.g. "cuda:0".

    Parameters and tensors always report an index, so comparing devices without it would see
    "cuda" and "cuda:0" as different and copy data (or the policy) for nothing.
    """
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def parse_device(value: DeviceLike, argument: str) -> torch.device | None:
    """`torch.device(value)`, with an error naming `argument` when the string is not a device."""
    if value is None:
        return None
    if isinstance(value, torch.device):
        device = value
    else:
        try:
            device = torch.device(value)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"{argument}={value!r} is not a device; use e.g. 'cpu', 'cuda', 'cuda:0' or a "
                "torch.device."
            ) from err
    _check_available(device, argument, value)
    return canonical_device(device)


def _check_available(device: torch.device, argument: str, value: DeviceLike) -> None:
    """A ValueError naming `argument` when `device` is a CUDA device this machine lacks."""
    if device.type != "cuda":
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(
            f"{argument}={value!r} is a CUDA device, but CUDA is not available here; "
            "use 'cpu' (or leave it unset)."
        )
    if device.index is not None and device.index >= count:
        raise ValueError(
            f"{argument}={value!r} names CUDA device {device.index}, but this machine has "
            f"{count}; use an index below {count}."
        )


@dataclass(frozen=True)
class DeviceSplit:
    """Where the env runs, where the policy runs and where batches are stored.

    `device` fills whichever of the three is unset; the env device then defaults to the env's
    own device, the policy device to the env device, and the storing device to the env device.
    """

    env: torch.device
    policy: torch.device
    storing: torch.device
    # Whether `storing_device` or `device` was given (or `env_device` and `policy_device`, the
    # same one): batches then carry that device, and otherwise none, as in TorchRL.
    storing_is_explicit: bool = field(default=False, compare=False)
    # Whether `policy_device` or `device` was given: the policy then reads TensorDicts on
    # that device even when the env keeps none, as in TorchRL.
    policy_is_explicit: bool = field(default=False, compare=False)

    @classmethod
    def resolve(
        cls,
        *,
        env_own_device: torch.device,
        device: DeviceLike = None,
        env_device: DeviceLike = None,
        policy_device: DeviceLike = None,
        storing_device: DeviceLike = None,
    ) -> DeviceSplit:
        common = parse_device(device, "device")
        own = canonical_device(torch.device(env_own_device))
        given_env = parse_device(env_device, "env_device")
        env = given_env or common or own
        explicit_policy = parse_device(policy_device, "policy_device") or common
        explicit_storing = parse_device(storing_device, "storing_device") or common
        if explicit_storing is None and given_env is not None and given_env == explicit_policy:
            explicit_storing = given_env  # TorchRL's rule: the env and policy's shared device
        return cls(
            env=env,
            policy=explicit_policy or env,
            storing=explicit_storing or env,
            storing_is_explicit=explicit_storing is not None,
            policy_is_explicit=explicit_policy is not None,
        )

    @property
    def policy_crosses(self) -> bool:
        """Whether observations must move to another device before the policy sees them."""
        return self.policy != self.env

    @property
    def storing_crosses(self) -> bool:
        """Whether each batch must be copied to another device to be stored."""
        return self.storing != self.env


def cuda_devices_of(tensordict: TensorDictBase) -> set[torch.device]:
    """The CUDA devices `tensordict`'s tensors live on (none for a tensordict on the CPU).

    Lazy stacks are read part by part: their leaves may differ in shape (heterogeneous or
    dynamic specs) and cannot be stacked to be read.
    """
    if tensordict.device is not None:
        return {tensordict.device} if tensordict.device.type == "cuda" else set()
    parts = getattr(tensordict, "tensordicts", None)  # a LazyStackedTensorDict's
    if parts is not None:
        return set().union(*(cuda_devices_of(part) for part in parts))
    devices: set[torch.device] = set()
    for value in tensordict.values():
        if isinstance(value, torch.Tensor):
            devices |= {value.device} if value.is_cuda else set()
        elif is_tensor_collection(value) and not is_non_tensor(value):
            devices |= cuda_devices_of(value)
    return devices


def finish_cuda_copies(tensordict: TensorDictBase) -> None:
    """Wait until the work queued on the current stream of each CUDA device of `tensordict`
    is done; nothing for a tensordict on the CPU (no CUDA call is made).

    A batch shared with another process through CUDA IPC has no stream order across the two
    processes: the writer must finish its copies into it before saying the batch is ready,
    and the reader must finish copying it out before the writer may overwrite it.
    """
    for device in cuda_devices_of(tensordict):
        torch.cuda.current_stream(device).synchronize()
