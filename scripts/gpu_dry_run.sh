#!/usr/bin/env bash
# The GPU check rehearsed here, on CPU, end to end: a fresh venv holding only what the GPU
# machine has (torch, the CPU build on this machine's disk, and the rest of
# scripts/gpu/provided.txt), the carried wheels built for this machine's python by
# scripts/gpu_wheels.sh (its offline resolver check included), then scripts/gpu_check.sh run in
# that venv with no network at all (a network namespace of its own, where `unshare` allows one):
# the wheels installed offline, the CUDA tests collected and skipped, the benchmark in its quick
# CPU mode, the report written to DIR/out/gpu_report.md; then the CUDA tests' CPU twins, run on
# that install (DIR/out/cpu_twins.log).
#   bash scripts/gpu_dry_run.sh [DIR]        (DIR defaults to .gpu-dry, ignored by git)
# TORCH_SPEC=torch==2.11.0 rehearses with the GPU machine's torch (its CUDA 13 build, which runs
# without a GPU; about 3 GB to download, so not the default).
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=${1:-.gpu-dry}
PYTHON_BIN=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
rm -rf "$DRY"
mkdir -p "$DRY"

# --- a venv with only the GPU machine's own packages: torch, numpy, pytest, ... ---
"$PYTHON_BIN" -m venv "$DRY/venv"
pip_() { "$DRY/venv/bin/python" -m pip --disable-pip-version-check --quiet "$@"; }
pip_ install "$TORCH_SPEC"
# Torch and numpy at this python's releases (the machine's numpy is not built for every python);
# the other pins as the machine has them.
grep -v -e '^#' -e '^$' -e '^torch==' -e '^numpy==' scripts/gpu/provided.txt > "$DRY/others.txt"
pip_ install numpy -r "$DRY/others.txt"
"$DRY/venv/bin/python" -m pip list --format=freeze --disable-pip-version-check \
  | grep -i -E '^(torch|numpy)==' | sed 's/+.*//' | cat - "$DRY/others.txt" > "$DRY/provided.txt"

# --- the wheels, built for this python, and the resolver check against that venv's set ---
version=$("$DRY/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
GPU_PYTHON_VERSION=$version GPU_PROVIDED="$DRY/provided.txt" bash scripts/gpu_wheels.sh "$DRY/whl"

# --- the check itself, as the GPU machine runs it: no network ---
isolate=()
if unshare -n true 2> /dev/null; then
  isolate=(unshare -n)
  echo "gpu_dry_run: running the check in a network namespace of its own (no network)" >&2
fi
"${isolate[@]}" env PYTHON="$DRY/venv/bin/python" GPU_WHEELS="$DRY/whl" GPU_SITE="$DRY/site" \
  GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh "$DRY/out"

# --- the CPU twins of the CUDA tests, on what the check installed: the tests' own code runs ---
"${isolate[@]}" env PYTHONPATH="$DRY/site" "$DRY/venv/bin/python" -m pytest -p no:cacheprovider \
  -o addopts="" --import-mode=importlib -q --timeout 240 -m "not gpu" tests/gpu \
  | tee "$DRY/out/cpu_twins.log" | tail -n 3
