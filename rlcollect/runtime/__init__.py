"""Processes and Ray: the worker-process mechanism shared by `ParallelEnv` and the collectors'
workers, and the Ray lease. Knows no RL; imports only `rlcollect.errors`."""
