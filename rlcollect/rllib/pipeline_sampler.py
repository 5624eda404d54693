"""The general path on the engine: RLlib's connector pipelines, module and episode callbacks run
on live episodes as the policy step of the engine's `RolloutLoop`, for configs the batched step
does not cover (a user's connectors, recurrent modules, episode callbacks, structured
observations). The loop steps the env; this module only keeps RLlib's episodes beside it.
`PipelineSampler` serves single-agent episodes; `MultiAgentSampler` (`multi_agent_sampler.py`)
is the same sampler with multi-agent episodes and the env's agent dicts."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import ENV_TO_MODULE_CONNECTOR, MODULE_TO_ENV_CONNECTOR, WEIGHTS_SEQ_NO
from ray.rllib.utils.spaces.space_utils import unbatch
from tensordict.nn import TensorDictModule
from torch import nn

from rlcollect import keys
from rlcollect.collectors.rollout import BatchAbandonedError
from rlcollect.rllib.engine_loops import EPISODE_BATCH_STEPS, EngineLoops


class PipelineStep(nn.Module):
    """The engine's policy step for the general path: each call is the sampler's next step
    (`PipelineSampler.act`), its env actions returned as one tensor. Outside a batch (the
    engine's probe of the policy's outputs) it returns zeros and touches no episode."""

    def __init__(self, sampler: PipelineSampler, zero_action: torch.Tensor) -> None:
        super().__init__()
        self.__dict__["_sampler"] = sampler  # not a submodule
        self._zero = zero_action

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if not self._sampler.collecting:
            return self._zero
        return self._sampler.act()


class PipelineSampler(EngineLoops):
    """RLlib's sampling semantics on live episodes, stepped by the engine's loop.

    At each step the previous step's results (read from the carrier and the env's step
    record) go into the episodes, the episode callbacks run where RLlib's runner makes them
    (`on_episode_created`, `_start`, `_step`, `_end`), the env-to-module pipeline runs on the
    episodes, then the module's forward and the module-to-env pipeline give the actions the
    loop hands the env. A sub-env that ended is reset by the engine at once, so its next
    episode starts on the next step (RLlib's runner spends an autoreset step on it instead).

    Args:
        runner: the EnvRunner (its env, module, pipelines, metrics and callbacks).
    """

    inference_mode = False  # connectors may keep what they build past the step

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        super().__init__(runner)

    def _make_policy(self) -> TensorDictModule:
        zero = self.env.action_spec.zero()
        return TensorDictModule(
            PipelineStep(self, zero), in_keys=[keys.OBSERVATION], out_keys=[keys.ACTION]
        )

    def _bind_env(self) -> None:
        super()._bind_env()
        if self.record is None:
            raise ValueError(
                f"RLlib's pipelines read the env's own observations and infos; the "
                f"{type(self.env).__name__} engine env keeps none (use GymVectorBackend())."
            )
        self.record.keep_observations = True
        self.episodes: list[SingleAgentEpisode] = []
        self._shared_data: dict = {}
        self._to_module: Any = None

    def reset(self, seed: int | None, explore: bool) -> None:
        """Every sub-env starts a fresh episode at the next batch (seeded when `seed` is given)."""
        self.request_reset(seed)
        self.episodes = []

    # --- sampling ------------------------------------------------------------------------------

    def sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        *,
        explore: bool,
        random_actions: bool,
        t: Any,
        weights_seq_no: int,
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], int]:
        """`(finished episodes, ongoing chunks, env steps)`: `ceil(num_timesteps / num_envs)`
        steps of every sub-env, or the first `num_episodes` episodes to finish (then no
        ongoing chunk)."""
        self._explore, self._random, self._timestep = explore, random_actions, t
        self._seq_no, self._limit = weights_seq_no, num_episodes
        self.finished: list[Any] = []
        self._restart_count()
        if num_timesteps is not None:
            while (steps := self._steps_to_go(num_timesteps)) > 0:
                if not self._batch(steps):  # the env failed and was rebuilt
                    self._restart_count()
            return self.finished, self._cut_ongoing(), self.steps
        while len(self.finished) < num_episodes:
            if not self._batch(EPISODE_BATCH_STEPS):
                self._restart_count()
        return self.finished, [], self.steps

    def _restart_count(self) -> None:
        """Count from zero (a sample's start, or after the env was rebuilt)."""
        self.steps = 0

    def _steps_to_go(self, num_timesteps: int) -> int:
        """Steps per sub-env of the next batch (0: the sample is complete). Each step of the
        loop is one env step of every sub-env (the engine resets ended ones at once)."""
        return max(0, -(-(num_timesteps - self.steps) // self._runner.num_envs))

    def _batch(self, steps: int) -> bool:
        """One batch through the engine's loop; False when the env failed and was rebuilt
        (the episodes finished before the failure kept, the ongoing ones dropped)."""
        self._t = 0
        try:
            # Random actions too are drawn by `act` (RLlib's: the vector env's action space),
            # which keeps the episodes; the loop's own random step would not.
            loop, err = self._run(steps, random_actions=False)
        except BatchAbandonedError:  # enough whole episodes: the rest of the batch is not run
            return True
        if err is not None:
            # A step that completed before the failure (the env failed resetting the sub-envs
            # it ended) still finishes its episodes; the ongoing ones are dropped.
            if loop is not None and self.episodes and self.completed_steps() == self._t:
                self._absorb(loop.layout.carrier, self._t - 1, restart=False)
            self.episodes = []
            self.recover(err)
            return False
        self._absorb(loop.layout.carrier, steps - 1)
        return True

    def _enough(self) -> bool:
        return self._limit is not None and len(self.finished) >= self._limit

    def act(self) -> torch.Tensor:
        """The step at `self._t`: the last step into the episodes (or fresh episodes from a
        reset), then the actions for this one."""
        carrier = self._current.layout.carrier
        t, self._t = self._t, self._t + 1
        if t > 0:
            self._absorb(carrier, t - 1)
            if self._enough():  # no step past the episode that made enough (as RLlib's runner)
                raise BatchAbandonedError
        elif not self.episodes:
            self._start_all(carrier)
        if self._random:
            to_env = self._random_to_env()
        else:
            to_env = self._forward_to_env(self._timestep(self.steps))
        return self._hand_to_env(to_env)

    def _random_to_env(self) -> dict[str, Any]:
        """Random actions (from the vector env's action space, as RLlib's runner draws them)."""
        return {Columns.ACTIONS: self._runner.env.action_space.sample()}

    def _hand_to_env(self, to_env: dict[str, Any]) -> torch.Tensor:
        """Keep the module's actions and outputs for the episodes; the env's actions as the
        carrier's action tensor."""
        actions = to_env.pop(Columns.ACTIONS)
        self._actions = unbatch(actions)
        env_actions = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
        self._to_env = to_env
        return torch.as_tensor(np.stack([np.asarray(action) for action in unbatch(env_actions)]))

    # --- the episodes beside the carrier -------------------------------------------------------

    def _start_all(self, carrier: Any) -> None:
        """Fresh episodes from the reset at slot 0."""
        runner = self._runner
        self._shared_data = {}
        self.episodes = [self._new_episode(index) for index in range(runner.num_envs)]
        observations = list(self.record.root_observations_at(0))
        infos = list(self.record.root_infos_at(0))
        for episode, observation, info in zip(self.episodes, observations, infos, strict=True):
            episode.add_env_reset(observation=observation, infos=info)
        self._env_to_module(self.episodes, {Columns.OBS: observations, Columns.INFOS: infos})
        for index in range(runner.num_envs):
            runner.episode_callback("on_episode_start", index, self.episodes)

    def _absorb(self, carrier: Any, t: int, restart: bool = True) -> None:
        """The step at slot `t` into the episodes; episodes that ended there end (their sub-env
        was reset into slot `t + 1`, where the next episode starts, unless `restart` is False:
        the env failed in that reset)."""
        runner = self._runner
        next_td = carrier.get(keys.NEXT)
        observations = self.record.next_observations[t]
        rewards = next_td.get(keys.REWARD)[:, t, 0].numpy().astype(np.float64)
        terminateds = next_td.get(keys.TERMINATED)[:, t, 0].numpy()
        truncateds = next_td.get(keys.TRUNCATED)[:, t, 0].numpy()
        infos = self.record.next_infos[t]
        for index, episode in enumerate(self.episodes):
            extras = {key: value[index] for key, value in self._to_env.items()}
            extras[WEIGHTS_SEQ_NO] = self._seq_no
            episode.add_env_step(
                observation=observations[index],
                action=self._actions[index],
                reward=rewards[index],
                infos=infos[index],
                terminated=bool(terminateds[index]),
                truncated=bool(truncateds[index]),
                extra_model_outputs=extras,
            )
        self.steps += runner.num_envs
        step_data = {
            Columns.OBS: observations,
            Columns.ACTIONS: self._actions,
            Columns.REWARDS: rewards,
            Columns.INFOS: infos,
            Columns.TERMINATEDS: terminateds,
            Columns.TRUNCATEDS: truncateds,
        }
        ended = [index for index, episode in enumerate(self.episodes) if episode.is_done]
        if ended:
            # The env-to-module pipeline sees an episode's last step before the episode ends
            # (a connector may rewrite it in place, e.g. flatten or extend the observation),
            # as in RLlib's runner; its batch is not used: those sub-envs start anew.
            self._env_to_module(
                [self.episodes[index] for index in ended],
                {key: [value[index] for index in ended] for key, value in step_data.items()},
            )
        restarted = self._end_episodes(ended, t + 1 if restart else None)
        if not restart:
            return
        self._env_to_module(self.episodes, step_data)
        for index in range(runner.num_envs):
            if index not in ended:
                runner.episode_callback("on_episode_step", index, self.episodes)
        for index in restarted:
            runner.episode_callback("on_episode_start", index, self.episodes)

    def _end_episodes(self, ended: list[int], reset_slot: int | None) -> list[int]:
        """The `ended` episodes end (step and end callbacks; finished while more are wanted);
        a new one starts in each sub-env from its reset at `reset_slot`. Returns the restarted
        sub-envs."""
        runner, restarted = self._runner, []
        for index in ended:
            episode = self.episodes[index]
            runner.episode_callback("on_episode_step", index, self.episodes)
            runner.episode_callback("on_episode_end", index, self.episodes)
            if not self._enough():
                self.finished.append(episode.to_numpy() if runner.episodes_to_numpy else episode)
            if reset_slot is None:
                continue
            self._new_episode(index)
            self.episodes[index].add_env_reset(
                observation=self.record.root_observations[reset_slot][index],
                infos=self.record.root_infos[reset_slot][index],
            )
            restarted.append(index)
        return restarted

    def _new_episode(self, index: int) -> SingleAgentEpisode:
        runner = self._runner
        episode = SingleAgentEpisode(
            observation_space=runner.env.single_observation_space,
            action_space=runner.env.single_action_space,
        )
        if len(self.episodes) > index:
            self.episodes[index] = episode
        else:
            self.episodes.append(episode)
        runner.episode_callback("on_episode_created", index, self.episodes)
        return episode

    def _env_to_module(self, episodes: list[Any], data: dict[str, Any], timed: bool = True) -> None:
        """Run the env-to-module pipeline on `episodes` (its batch feeds the next forward); not
        `timed`: without the runner's metrics (a pass over the episodes just finished)."""
        runner = self._runner
        if runner.module is None:
            return
        self._to_module = runner._env_to_module(
            rl_module=runner.module,
            episodes=episodes,
            batch={},
            explore=self._explore,
            shared_data=self._shared_data,
            metrics=runner.metrics if timed else None,
            metrics_prefix_key=(ENV_TO_MODULE_CONNECTOR,),
            **data,
        )

    def _forward_to_env(self, t: int) -> dict[str, Any]:
        to_module, self._to_module = self._to_module, None
        return forward_to_env(
            self._runner, to_module, self.episodes, self._shared_data, self._explore, t
        )

    def _cut_ongoing(self) -> list[SingleAgentEpisode]:
        runner = self._runner
        continuations = [
            episode.cut(len_lookback_buffer=runner.lookback) for episode in self.episodes
        ]
        ongoing = []
        for episode in self.episodes:
            if episode.t == 0:
                continue
            episode.validate()
            ongoing.append(episode.to_numpy() if runner.episodes_to_numpy else episode)
        self.episodes = continuations
        return ongoing


def forward_to_env(
    runner: Any, to_module: Any, episodes: list[Any], shared_data: dict, explore: bool, t: int
) -> dict[str, Any]:
    """The module's forward (exploration or inference) on `to_module`, then the runner's
    module-to-env pipeline: what goes to the env, for single- and multi-agent pipelines."""
    if explore:
        output = runner.module.forward_exploration(to_module, t=t)
    else:
        output = runner.module.forward_inference(to_module)
    return runner._module_to_env(
        rl_module=runner.module,
        batch=output,
        episodes=episodes,
        explore=explore,
        shared_data=shared_data,
        metrics=runner.metrics,
        metrics_prefix_key=(MODULE_TO_ENV_CONNECTOR,),
    )
