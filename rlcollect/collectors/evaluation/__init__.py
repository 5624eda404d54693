"""Evaluation: `Evaluator` plays whole episodes with a policy's current weights, blocking or in
the background, in this process (`local.py`), a worker process (`process.py`, `worker.py`) or a
Ray actor (`ray_actor.py`), as `backends.py` chooses; each runs one `EpisodeRunner`
(`runner.py`) over our `Collector`. Ray is imported only when the "ray" backend creates its
actor."""

from rlcollect.collectors.evaluation.evaluator import Evaluator

__all__ = ["Evaluator"]
