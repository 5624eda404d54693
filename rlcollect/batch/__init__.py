"""The batch contract's other shapes: compact <-> transitions, whole episodes, end-of-trajectory
flags. Below the envs and the collectors; imports only `rlcollect.keys`."""
