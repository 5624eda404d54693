"""RLlib-style sampling: batches of whole episodes (`whole_episodes.py`), horizons
(`horizon.py`), and trajectory views written at inference (`view_requirements.py`,
`trajectory_views.py`, `view_writer.py`)."""
