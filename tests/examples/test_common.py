"""The helpers shared by the example scripts: metrics, recorder, checkpoints, models, Catch."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type

from rlcollect.envs import GymEnv, SerialEnv
from rlcollect.testing import CountingEnv


@pytest.fixture
def common(scripts: dict[str, ModuleType]) -> ModuleType:
    import common.checkpoint
    import common.env_info
    import common.evaluation
    import common.metrics
    import common.models
    import common.recorder

    return common


def cartpole_info(common: ModuleType) -> object:
    return common.env_info.EnvInfo.from_env(GymEnv("CartPole-v1", categorical_action_encoding=True))


def test_metrics_log_appends_to_a_resumed_file_with_its_own_header(
    common: ModuleType, tmp_path: Path
) -> None:
    metrics = common.metrics
    path = tmp_path / "metrics.csv"
    log = metrics.MetricsLog(path, extra_columns=["loss"])
    log.write({"frames": 10, "mean_episode_return": math.nan, "loss": 0.5, "ignored": 1})
    log.close()
    log = metrics.MetricsLog(path, extra_columns=["other"], append=True)
    assert log.columns[-1] == "loss", "the existing header is kept"
    log.write({"frames": 20, "mean_episode_return": 3.0, "loss": 0.25})
    log.close()
    rows = metrics.read_metrics(path)
    assert [row["frames"] for row in rows] == [10.0, 20.0]
    assert math.isnan(rows[0]["mean_episode_return"])
    assert rows[1]["loss"] == 0.25


def test_recorder_checkpoints_on_schedule_and_carries_elapsed_time(
    common: ModuleType, tmp_path: Path
) -> None:
    recorder = common.recorder.RunRecorder(
        tmp_path, 1000, 250, checkpoint_every=300, elapsed=5.0, progress=False
    )
    assert not recorder.checkpoint_due(299)
    assert recorder.checkpoint_due(300)
    recorder.log({"frames": 400, "mean_episode_return": 1.0})
    recorder.save(400, lambda: {"frames": 400, "collector": {"frames": 400}})
    assert not recorder.checkpoint_due(599)
    assert recorder.checkpoint_due(600)
    recorder.close()
    state = common.checkpoint.load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["frames"] == 400
    assert state["elapsed"] >= 5.0
    assert (tmp_path / "return.png").read_bytes()[:4] == b"\x89PNG"


def test_load_checkpoint_rejects_other_files(common: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=r"^resume='.*weights.pt' is not an example checkpoint"):
        common.checkpoint.load_checkpoint(path)
    path.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"is not a readable checkpoint"):
        common.checkpoint.load_checkpoint(path)


def test_discrete_actor_samples_and_scores_like_a_categorical(common: ModuleType) -> None:
    torch.manual_seed(0)
    actor = common.models.Actor(cartpole_info(common))
    torch.nn.init.normal_(actor.head.weight)
    observation = torch.randn(4000, 4)
    action, log_prob = actor(observation)
    logits = actor.head(actor.encoder(observation))
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(log_prob, reference.log_prob(action))
    frequency = action.float().mean()
    assert abs(frequency - reference.probs[:, 1].mean()) < 0.03, "samples follow the probs"
    score, entropy = actor.evaluate(observation, action)
    torch.testing.assert_close(score, log_prob)
    torch.testing.assert_close(entropy, reference.entropy())
    with set_interaction_type(InteractionType.DETERMINISTIC):
        greedy, _ = actor(observation)
    assert torch.equal(greedy, logits.argmax(-1))


def test_continuous_actor_scores_like_a_normal(common: ModuleType) -> None:
    info = common.env_info.EnvInfo.from_env(GymEnv("Pendulum-v1"))
    actor = common.models.Actor(info, init_log_std=-0.5)
    observation = torch.randn(64, 3)
    action, log_prob = actor(observation)
    mean = actor.head(actor.encoder(observation))
    reference = torch.distributions.Normal(mean, actor.log_std.exp())
    assert action.shape == (64, 1)
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1))
    _, entropy = actor.evaluate(observation, action)
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))


def test_pixel_encoder_reads_uint8_images_with_any_leading_dims(common: ModuleType) -> None:
    info = common.env_info.EnvInfo.from_env(
        GymEnv("common.catch:Catch-v0", categorical_action_encoding=True)
    )
    assert info.observation_shape == (10, 5, 1)
    assert info.observation_dtype == torch.uint8
    actor = common.models.Actor(info)
    single, _ = actor(torch.zeros(10, 5, 1, dtype=torch.uint8))
    batched, _ = actor(torch.zeros(2, 3, 10, 5, 1, dtype=torch.uint8))
    assert single.shape == ()
    assert batched.shape == (2, 3)


def test_epsilon_greedy_follows_epsilon(common: ModuleType) -> None:
    torch.manual_seed(0)
    q_network = common.models.QNetwork(cartpole_info(common))
    observation = torch.randn(2000, 4)
    greedy = q_network(observation).argmax(-1)
    policy = common.models.EpsilonGreedy(q_network, epsilon=0.0)
    assert torch.equal(policy(observation), greedy)
    policy.epsilon.fill_(1.0)
    disagree = (policy(observation) != greedy).float().mean()
    assert 0.4 < disagree < 0.6, "uniform random actions disagree with greedy ones half the time"
    with set_interaction_type(InteractionType.DETERMINISTIC):
        assert torch.equal(policy(observation), greedy)
    assert "epsilon" in policy.state_dict(), "epsilon travels with the weights"


def test_catch_passes_the_env_contract_and_rewards_a_catch(scripts: dict) -> None:
    from common.catch import Catch

    from rlcollect.testing import check_env

    check_env(GymEnv(Catch(), categorical_action_encoding=True))
    env = Catch(rows=4, columns=3)
    observation, _ = env.reset(seed=1)
    ball = int(observation[0].argmax())
    paddle = env.columns // 2
    rewards = []
    for _ in range(3):
        move = (ball > paddle) - (ball < paddle)
        paddle = min(max(paddle + move, 0), 2)
        _, reward, terminated, truncated, _ = env.step(move + 1)
        rewards.append(reward)
    assert rewards == [0.0, 0.0, 1.0]
    assert terminated
    assert not truncated


def test_evaluate_runs_whole_greedy_episodes_on_a_batched_env(common: ModuleType) -> None:
    def make_env() -> SerialEnv:
        return SerialEnv(
            2, lambda: GymEnv("common.catch:Catch-v0", categorical_action_encoding=True)
        )

    info = common.env_info.EnvInfo.from_env(make_env())
    policy = TensorDictModule(
        common.models.Actor(info), in_keys=["observation"], out_keys=["action", "log_prob"]
    )
    mean = common.evaluation.evaluate(make_env, policy, episodes=6)
    assert -1.0 <= mean <= 1.0


def test_update_pacer_keeps_the_ratio_from_when_learning_starts(scripts: dict) -> None:
    pacer = scripts["dqn"].UpdatePacer(updates_per_frame=1 / 4, learning_starts=100)
    assert pacer.lag(frames=64, updates=0, buffer_size=64) == 0
    # first seen at 128 frames, but the buffer crossed 100 items at frame 100: anchored there
    assert pacer.lag(frames=128, updates=0, buffer_size=128) == 7
    assert pacer.lag(frames=192, updates=7, buffer_size=192) == 16
    assert pacer.lag(frames=192, updates=23, buffer_size=192) == 0
    resumed = scripts["dqn"].UpdatePacer(updates_per_frame=1 / 4, learning_starts=100)
    assert resumed.lag(frames=10_000, updates=500, buffer_size=100) == 0
    assert resumed.lag(frames=10_040, updates=500, buffer_size=140) == 10


def test_learning_rate_anneals_linearly_to_its_end_factor(scripts: dict) -> None:
    from omegaconf import OmegaConf

    network = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
    cfg = OmegaConf.create({"dqn": {"lr_end_factor": 0.1}})
    learner = scripts["dqn"].Learner(cfg, network, optimizer, key="observation")
    assert learner.anneal_learning_rate(0, 1000) == pytest.approx(1e-3)
    assert learner.anneal_learning_rate(500, 1000) == pytest.approx(0.55e-3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.55e-3)
    assert learner.anneal_learning_rate(2000, 1000) == pytest.approx(1e-4), "stops at the end"


def test_linear_learning_rate_follows_progress_and_stops_at_its_end(scripts: dict) -> None:
    from common.schedules import LinearLearningRate

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=2.0)
    schedule = LinearLearningRate(optimizer, end_factor=0.0)
    assert schedule.set(0.25) == pytest.approx(1.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1.5)
    assert schedule.set(3.0) == 0.0, "progress beyond 1 keeps the end value"


def test_evaluate_takes_each_sub_envs_share_of_the_episodes(common: ModuleType) -> None:
    """Sub-env 0's episodes last 2 steps, sub-env 1's 6: counting the first 4 to finish would
    take three short ones; each sub-env's share gives the true mean (2 + 2 + 6 + 6) / 4."""

    def make_env() -> CountingEnv:
        return CountingEnv(episode_length=[2, 6], batch_size=(2,))

    def still(td: TensorDictBase) -> TensorDictBase:
        return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))

    assert common.evaluation.evaluate(make_env, still, episodes=4) == 4.0
    # shares of 3 over 2 sub-envs: 1 and 2 episodes
    assert common.evaluation.evaluate(make_env, still, episodes=3) == (2 + 6 + 6) / 3


def test_seeded_evaluation_is_reproducible(common: ModuleType) -> None:
    def make_env() -> GymEnv:
        return GymEnv("CartPole-v1", categorical_action_encoding=True)

    info = common.env_info.EnvInfo.from_env(make_env())
    torch.manual_seed(0)
    policy = TensorDictModule(
        common.models.Actor(info), in_keys=["observation"], out_keys=["action", "log_prob"]
    )
    scores = {common.evaluation.evaluate(make_env, policy, episodes=3, seed=5) for _ in range(3)}
    assert len(scores) == 1


def test_resumed_metrics_drop_the_rows_logged_after_the_checkpoint(
    common: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "metrics.csv"
    log = common.metrics.MetricsLog(path)
    for frames in (100, 200, 300, 400):  # interrupted at 400; its checkpoint was at 200
        log.write({"frames": frames, "mean_episode_return": float(frames)})
    log.close()
    resumed = common.metrics.MetricsLog(path, append=True, keep_through_frames=200)
    resumed.write({"frames": 300, "mean_episode_return": 3.0})
    resumed.close()
    rows = common.metrics.read_metrics(path)
    assert [row["frames"] for row in rows] == [100, 200, 300]
    assert rows[-1]["mean_episode_return"] == 3.0


def test_report_of_a_run_that_logged_nothing_names_its_frames(
    common: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Resuming a finished run logs no row: the report still gives the run's frames."""
    recorder = common.recorder.RunRecorder(tmp_path, 1000, 1000, progress=False)
    recorder.close()
    with caplog.at_level("INFO"):
        common.evaluation.report_run(recorder, None, None, episodes=0)
    assert "frames=1000 " in caplog.text
