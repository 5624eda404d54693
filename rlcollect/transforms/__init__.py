"""Env transforms, batch post-processors and trajectory views."""

from rlcollect.transforms.base import Compose, Transform
from rlcollect.transforms.cat_frames import CatFrames
from rlcollect.transforms.dtype import DoubleToFloat
from rlcollect.transforms.gae import GAE
from rlcollect.transforms.init_tracker import InitTracker
from rlcollect.transforms.multistep import MultiStep
from rlcollect.transforms.observation_norm import ObservationNorm
from rlcollect.transforms.reward_sum import RewardSum
from rlcollect.transforms.rollout_gae import RolloutGAE
from rlcollect.transforms.running_stats import RunningMeanStd
from rlcollect.transforms.shift import ShiftedView
from rlcollect.transforms.split import SplitTrajectories, split_trajectories
from rlcollect.transforms.step_counter import StepCounter
from rlcollect.transforms.transformed_env import TransformedEnv

__all__ = [
    "GAE",
    "CatFrames",
    "Compose",
    "DoubleToFloat",
    "InitTracker",
    "MultiStep",
    "ObservationNorm",
    "RewardSum",
    "RolloutGAE",
    "RunningMeanStd",
    "ShiftedView",
    "SplitTrajectories",
    "StepCounter",
    "Transform",
    "TransformedEnv",
    "split_trajectories",
]
