"""Batched inference: env workers that only step envs, one inference server for the policy."""

from rlcollect.collectors.batched.client import InferenceServerError
from rlcollect.collectors.batched.collector import AsyncBatchedCollector

__all__ = ["AsyncBatchedCollector", "InferenceServerError"]
