"""The loop in this process: `Collector` (arguments -> parts, delivery, `collect` into a rollout,
background collection), its controls (`control.py`), its set-up (`setup.py`), devices,
background thread and profiler."""
