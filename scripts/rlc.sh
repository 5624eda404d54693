#!/usr/bin/env bash
# Set up a virtual environment from nothing and run one of the project's jobs.
#   bash scripts/rlc.sh train [hydra overrides]  -> examples/ppo.py (the default experiment)
#   bash scripts/rlc.sh test  [pytest args]      -> the test suite
#   bash scripts/rlc.sh bench                    -> benchmarks/*.py
#   bash scripts/rlc.sh lint                     -> ruff
#   bash scripts/rlc.sh docs  [mkdocs args]      -> the documentation site, built into site/
# torch==2.13.0 is installed first, on its own: a CPU build is what a fresh machine gets, and
# letting pip resolve torch through other packages would pull a newer CUDA build (gigabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

setup() {
  local extras=$1
  if [ ! -x "$VENV/bin/python" ]; then
    echo "rlc.sh: creating the virtual environment $VENV" >&2
    "$PYTHON_BIN" -m venv "$VENV"
  fi
  echo "rlc.sh: installing $TORCH_SPEC (CPU build) into $VENV (minutes on a cold cache)" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
  echo "rlc.sh: installing rlcollect with the extras [$extras]" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
  if [[ ",$extras," == *,rllib,* ]]; then
    # ray[rllib] 2.60 pins gymnasium 1.2.2; RLlib runs on the release the rest of the project
    # uses (its examples and our RLlib tests pass on it), so that one goes back in.
    # pip says so (ray's pin is not met), and installs it.
    gymnasium=$(grep -o '"gymnasium[^"]*"' pyproject.toml | head -1 | tr -d '"')
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$gymnasium"
  fi
  # An editable install leaves our modules uncompiled; where PYTHONDONTWRITEBYTECODE is set (as
  # on this project's machines), every new interpreter (a worker, a Ray actor, a script run)
  # would compile them again: about 0.4 s of CPU each.
  "$VENV/bin/python" -m compileall -q rlcollect examples
  echo "rlc.sh: ready; 'source $VENV/bin/activate' to use it yourself" >&2
}

# BenchMARL 1.5.2 (the newest) pins torchrl<0.12 and imports a name TorchRL 0.14.1 removed: it runs
# beside TorchRL 0.14.1 under `python -m rlcollect.patch` (docs/guide/benchmarl.md). --no-deps
# keeps its pin from pulling an older TorchRL (and torch); gym and gym-notices are what VMAS
# imports; its renderer's pyglet and six, and BenchMARL's video logging's av and torchvision, are
# left out (runs with experiment.render=false need none of them). All but gym-notices are source
# releases: built with the environment's setuptools (torch's dependency) rather than one fetched
# per package, 15 s instead of 55 s on a cold cache.
install_benchmarl() {
  echo "rlc.sh: installing BenchMARL 1.5.2 and VMAS 1.5.2 beside TorchRL (no dependencies)" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation benchmarl==1.5.2 vmas==1.5.2 gym==0.26.2 gym-notices==0.0.8
}

job=${1:-}
[ $# -gt 0 ] && shift
case "$job" in
  train) setup examples; exec "$VENV/bin/python" examples/ppo.py "$@" ;;
  # BenchMARL is installed too: its tests (tests/torchrl_frontends/test_benchmarl.py) fail, not
  # skip, where it is missing.
  test) setup test,examples,pettingzoo,ray,rllib,envpool,mujoco,logging,video,sweep; install_benchmarl
    RLCOLLECT_FULL_TEST_INSTALL=1 exec "$VENV/bin/python" -m pytest "$@" ;;
  bench)
    setup bench,examples,ray
    for script in benchmarks/envs.py benchmarks/collectors.py benchmarks/multi_collectors.py \
        benchmarks/replay.py benchmarks/ray_collectors.py benchmarks/ppo_vs_sb3.py; do
      "$VENV/bin/python" "$script" "$@"
    done ;;
  lint) setup dev; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . ;;
  docs) setup docs; exec "$VENV/bin/mkdocs" build --strict "$@" ;;
  *) echo "usage: bash scripts/rlc.sh {train|test|bench|lint|docs} [args...]" >&2; exit 2 ;;
esac
