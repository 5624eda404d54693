"""Collectors: step envs with a policy and hand batches to training."""

from rlcollect.collectors.collector import Collector

__all__ = ["Collector"]
