"""Helpers shared by the example scripts: config checks, models, metrics, checkpoints."""
