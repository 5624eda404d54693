"""The documentation site's python examples run as written, and its pages keep the facts that
the tests pin.

Every ```python block of `docs/**/*.md` runs, in a fresh namespace whose `__name__` is
`"__main__"` (as a script run by `python`), under a timeout and the leak checks of
`tests/conftest.py`. Two HTML comments, on the line right before a block, change that:

- `<!-- test-setup -->`: the block defines names that the examples after it on the same page use
  (a policy, an env maker); it runs before each of them.
- `<!-- skip-test: <why> -->`: the block does not run (e.g. it joins a multi-node cluster); the
  reason is required, and `SKIPPED` lists every such block, so that a new one is a decision.

A block that imports an optional extra that is not installed (`mpe2`, `ray`) is skipped.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(
    r"^(?:<!-- (?P<marker>test-setup|skip-test)(?::(?P<reason>[^>]*))? -->\n)?"
    r"(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```",
    re.MULTILINE | re.DOTALL,
)
FENCE = re.compile(r"^[ ]*```.*?^[ ]*```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
OPTIONAL_EXTRAS = {"mpe2", "pettingzoo", "ray"}
# The blocks that do not run, by page and heading (each says why, in its skip-test comment).
SKIPPED = {
    ("guide/ray.md", "Scaling out with Ray"),
    ("guide/rllib.md", "RLlib's door: EnvRunners for RLlib's Algorithms"),
    ("guide/rllib.md", "Picking the env backend in one line"),
}


@dataclass
class Block:
    """One ```python block of a docs page, with the setup blocks above it on its page."""

    page: str
    heading: str
    line: int
    code: str
    marker: str | None = None
    reason: str = ""
    setups: list[Block] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.heading})"

    def run(self, **names: Any) -> dict[str, Any]:
        """Run the setup blocks, then this one, in one fresh namespace, and return it; `names`
        replace what the setup blocks define (e.g. `action_dim=2`) before this block runs."""
        namespace: dict[str, Any] = {"__name__": "__main__"}
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # e.g. an action that misfits the spec
            for block in [*self.setups, self]:
                if block is self:
                    namespace.update(names)
                try:
                    exec(compile(block.code, str(block), "exec"), namespace)
                except ModuleNotFoundError as err:
                    if err.name not in OPTIONAL_EXTRAS:
                        raise
                    pytest.skip(f"{self} needs the optional {err.name!r}, not installed")
        return namespace


def page_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    page = path.relative_to(DOCS).as_posix()
    blocks: list[Block] = []
    for match in BLOCK.finditer(text):
        headings = HEADING.findall(FENCE.sub("", text[: match.start()]))
        block = Block(
            page=page,
            heading=headings[-1] if headings else "",
            line=text.count("\n", 0, match.start("indent")) + 1,
            code=textwrap.dedent(match["code"]),
            marker=match["marker"],
            reason=(match["reason"] or "").strip(),
            setups=[block for block in blocks if block.marker == "test-setup"],
        )
        blocks.append(block)
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in sorted(DOCS.rglob("*.md")) for block in page_blocks(path)]


def block_under(page: str, heading: str) -> Block:
    """The one example block (not a setup) of `page` under `heading`."""
    found = [
        block
        for block in page_blocks(DOCS / page)
        if block.heading == heading and block.marker != "test-setup"
    ]
    assert len(found) == 1, f"{page} has {len(found)} example blocks under {heading!r}"
    return found[0]


def section(page: str, heading: str) -> str:
    """The text of `page` under the heading line `heading`, up to the next heading as high."""
    text = (DOCS / page).read_text()
    level = heading.split(" ", 1)[0]
    assert f"\n{heading}\n" in f"\n{text}", f"{page} has no heading {heading!r}"
    after = f"\n{text}".split(f"\n{heading}\n", 1)[1]
    return re.split(rf"^#{{1,{len(level)}}} ", after, maxsplit=1, flags=re.MULTILINE)[0]


# --- the examples run ---

# Blocks with a test of their own (below), which checks what they produce.
CHECKED = {
    ("index.md", "Quickstart"),
    ("guide/multiprocess.md", "Multi-process collection"),
    ("guide/rllib-sampling.md", "Trajectory views"),
    ("guide/multi-agent.md", "One policy per team"),
    ("guide/rollout-buffer.md", "Usage"),
    ("guide/rollout-buffer.md", "GAE and a PPO iteration"),
}


def unchecked_examples() -> list[Block]:
    return [
        block
        for block in all_blocks()
        if block.marker is None and (block.page, block.heading) not in CHECKED
    ]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("block", unchecked_examples(), ids=str)
def test_example_runs(block: Block) -> None:
    block.run()


def test_every_block_runs_or_says_why_not() -> None:
    blocks = all_blocks()
    assert blocks, f"no python blocks found under {DOCS}"
    skipped = {(block.page, block.heading) for block in blocks if block.marker == "skip-test"}
    assert skipped == SKIPPED, "a skipped block is a decision: list it in SKIPPED"
    for block in blocks:
        if block.marker == "skip-test":
            assert block.reason, f"{block}: say why it is skipped (<!-- skip-test: why -->)"
    examples = {(block.page, block.heading) for block in blocks if block.marker is None}
    assert examples >= CHECKED, f"checked blocks not found: {CHECKED - examples}"


@pytest.mark.timeout(120)  # one process: SerialEnv steps its envs here, as in test_readme.py
def test_front_page_quickstart_runs_and_is_the_readme_s() -> None:
    block = block_under("index.md", "Quickstart")
    readme = (ROOT / "README.md").read_text()
    assert f"```python\n{block.code}```" in readme.split("## Quickstart", 1)[1]
    namespace = block.run()
    assert namespace["data"].batch_size == (4, 250)
    assert namespace["data"].names == [None, "time"]
    assert len(namespace["buffer"]) == 5000
    assert namespace["sample"].batch_size == (256,)


def test_front_page_has_the_readme_s_two_commands() -> None:
    commands = re.compile(r"```bash\nbash scripts/rlc.sh train .*?```", re.DOTALL)
    readme = commands.search((ROOT / "README.md").read_text())
    index = commands.search((DOCS / "index.md").read_text())
    assert readme, "README.md lost its two commands"
    assert index, "docs/index.md lost the two commands"
    assert readme.group(0) == index.group(0)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_multi_process_example_runs() -> None:
    namespace = block_under("guide/multiprocess.md", "Multi-process collection").run()
    assert namespace["data"].batch_size == (2, 500)
    assert namespace["collector"].policy_version == 4


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_views_example_stores_the_views_in_the_batch() -> None:
    collector = block_under("guide/rllib-sampling.md", "Trajectory views").run()["collector"]
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    assert batch["prev_actions"].shape == batch["action"].shape  # [T, *feature]
    assert batch["prev_rewards"].shape == batch["next", "reward"].shape
    assert batch["last_observations"].shape == (1000, 4, 4)  # [T, K, *feature], K = 4 offsets


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
def test_multi_agent_example_gives_one_sub_batch_per_team() -> None:
    namespace = block_under("guide/multi-agent.md", "One policy per team").run()
    assert namespace["predator_batch"].batch_size == (1000, 3)
    assert namespace["prey_rewards"].shape == (1000, 1, 1)


def cartpole_actions(rollout: Any) -> Any:
    """`[N, T]`: the action index CartPole took at each step of a buffer-layout `rollout`,
    found by replaying its dynamics from `obs[t]` with either action to `obs[t + 1]`; -1 at
    the steps that ended an episode (the env was reset into `obs[t + 1]`)."""
    import gymnasium as gym
    import numpy as np
    import torch

    cartpole = gym.make("CartPole-v1").unwrapped
    cartpole.reset(seed=0)
    obs, done = rollout["obs"].double().numpy(), rollout["done"]
    steps = rollout.batch_size[-1] - 1
    taken = torch.full((rollout.batch_size[0], steps), -1)
    for env_index, step in zip(*torch.nonzero(~done[:, :steps], as_tuple=True), strict=True):
        matches = []
        for action in (0, 1):
            cartpole.state = obs[env_index, step].copy()
            after = cartpole.step(action)[0]
            matches.append(np.allclose(after, obs[env_index, step + 1], atol=1e-4))
        assert sum(matches) == 1, f"step {int(step)} of env {int(env_index)}: {matches}"
        taken[env_index, step] = matches.index(True)
    return taken


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_children", "nothing_left_at_os_level")
@pytest.mark.parametrize("action_dim", [1, 2])
@pytest.mark.parametrize("heading", ["Usage", "GAE and a PPO iteration"])
def test_rollout_buffer_examples_store_the_index_or_the_one_hot_cartpole_took(
    heading: str, action_dim: int
) -> None:
    import torch

    namespace = block_under("guide/rollout-buffer.md", heading).run(action_dim=action_dim)
    namespace["collector"].shutdown()
    rollout = namespace["rollout"]
    assert rollout["action"].shape == (4, 17, action_dim)
    assert rollout["action"].dtype == torch.float32
    taken = cartpole_actions(rollout)
    stepped = taken >= 0
    # every step but the episode ends: an episode lasts 8 steps at least, so 2 per env at most
    assert stepped.sum() >= 16 * 4 - 2 * 4
    stored = rollout["action"][:, :16][stepped]
    if action_dim == 1:
        assert torch.equal(stored[:, 0], taken[stepped].float()), "each action's index"
    else:
        expected = torch.nn.functional.one_hot(taken[stepped], 2).float()
        assert torch.equal(stored, expected), "each action's one-hot"


# --- the pages keep their facts ---


def test_running_experiments_lists_every_config_and_how_to_activate() -> None:
    page = (DOCS / "guide" / "experiments.md").read_text()
    assert "source .venv/bin/activate" in page
    conf = ROOT / "examples" / "conf"
    for group in ("env", "collector", "logger"):
        for config in sorted((conf / group).glob("*.yaml")):
            assert f"`{config.stem}`" in page, f"{group}={config.stem} is not listed"
    assert "resume=" in page


def test_results_put_the_default_ppo_run_next_to_sb3() -> None:
    from omegaconf import OmegaConf

    text = section("results.md", "## PPO on CartPole-v1 against Stable-Baselines3")
    assert "python benchmarks/ppo_vs_sb3.py" in text
    assert "2026-11-25" in text
    assert "| seeds 0-4 | frames to solve | seconds to solve | final greedy eval" in text
    assert "| rlcollect, `examples/ppo.py` |" in text
    assert "| SB3 PPO, RL Zoo hyperparameters |" in text
    # the defaults the section names are those of the config
    cfg = OmegaConf.load(ROOT / "examples" / "conf" / "ppo.yaml")
    text = " ".join(text.split())  # across line breaks
    assert f"{cfg.collector.total_frames:,} frames" in text
    assert f"{cfg.ppo.epochs} full-batch epochs" in text
    assert cfg.ppo.num_minibatches == 1
    assert f"gamma {cfg.gae.gamma} and lambda {cfg.gae.lmbda}" in text
    lr = f"{cfg.optim.lr:.0e}".replace("e-0", "e-")  # 3e-3
    assert f"learning rate {lr} and clip range {cfg.ppo.clip_epsilon}" in text


def test_readme_headline_result_is_the_results_page_s() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split("## Headline result", 1)[1].split())
    results = " ".join(
        section("results.md", "## PPO on CartPole-v1 against Stable-Baselines3").split()
    )
    for fact in ("5.4-7.5", "13.5-17.7", "0.39 and 0.43", "500 in every"):
        assert fact in readme, f"the README's headline no longer says {fact!r}"
        assert fact in results, f"the results page no longer says {fact!r}"


def test_links_into_the_docs_reach_a_page() -> None:
    for path, base in ((ROOT / "README.md", ROOT), (DOCS / "index.md", DOCS)):
        links = re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", path.read_text())
        assert links, f"{path.name} links to no docs page"
        for link in links:
            assert (base / link).is_file(), f"{path.name} links to {link}, which does not exist"


# --- the API reference names only public paths ---

PUBLIC_PACKAGES = (
    "rlcollect",
    "rlcollect.collectors",
    "rlcollect.envs",
    "rlcollect.replay",
    "rlcollect.transforms",
    "rlcollect.testing",
)


def test_reference_names_only_public_paths() -> None:
    """`::: path` names a public package or a name in its `__all__`: the reference survives
    modules moving inside the packages."""
    import importlib

    public = set(PUBLIC_PACKAGES)
    for package in PUBLIC_PACKAGES:
        public |= {f"{package}.{name}" for name in importlib.import_module(package).__all__}
    for path in sorted((DOCS / "reference").glob("*.md")):
        identifiers = re.findall(r"^::: (\S+)", path.read_text(), re.MULTILINE)
        for identifier in identifiers:
            assert identifier in public, f"{path.name} names {identifier}, not a public path"
