"""The folder put first on `PYTHONPATH` so that every interpreter of a patched run runs
rlcollect's startup hook (`sitecustomize.py`); nothing here is imported by rlcollect."""
