"""The key names of the batch contract (DESIGN.md), in one place."""

from __future__ import annotations

OBSERVATION = "observation"
ACTION = "action"
REWARD = "reward"
DONE = "done"
TERMINATED = "terminated"
TRUNCATED = "truncated"
NEXT = "next"
RESET = "_reset"

COLLECTOR = "collector"
TRAJ_IDS = (COLLECTOR, "traj_ids")
MASK = (COLLECTOR, "mask")
WORKER_ID = (COLLECTOR, "worker_id")

STEP_COUNT = "step_count"
EPISODE_REWARD = "episode_reward"
IS_INIT = "is_init"
POLICY_VERSION = "policy_version"

SAMPLE_LOG_PROB = "sample_log_prob"
STATE_VALUE = "state_value"
ADVANTAGE = "advantage"
VALUE_TARGET = "value_target"
PRIORITY_WEIGHT = "priority_weight"
INDEX = "index"

DONE_KEYS = (DONE, TERMINATED, TRUNCATED)
TIME_DIM_NAME = "time"

# The compact layout (rlcollect/compact.py): next observations stored apart, and their steps.
FINAL = "final"
FINAL_STEP = (FINAL, "step")
