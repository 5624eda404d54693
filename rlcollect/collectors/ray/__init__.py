"""The loop in Ray actors: `RayCollector` over one collector per actor (`actor.py`), the fleet
of actors and their faults (`fleet.py`), their controls, options, background writing and weight
staleness. Never imports the multi-process room: what both share is `collectors/children.py`
and `collectors/weights/`. (`import ray` inside this package still names the top-level Ray:
the project uses absolute imports only.)"""
