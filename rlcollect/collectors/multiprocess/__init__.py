"""The loop in worker processes: `MultiSyncCollector` and `MultiAsyncCollector` over one
`Collector` per worker. The parent side is `base.py`, `control.py` and `pool.py`; the child side
is `worker.py`; the processes, pipes and message format are `rlcollect.runtime.processes`'s,
shared with `ParallelEnv`."""
