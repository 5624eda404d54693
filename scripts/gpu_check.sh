#!/usr/bin/env bash
# The GPU check: the one command to run on the GPU machine (python 3.12 with torch and CUDA, no
# network, the wheels of scripts/gpu_wheels.sh carried in .whl/). It installs the wheels offline,
# records the versions and CUDA facts, runs every CUDA test of ours (pytest -m gpu), then the GPU
# benchmark, and writes a report: OUT/gpu_report.md (facts, each test's outcome, the benchmark
# table, each phase's time), with facts.json, gpu_tests.xml/.log and the benchmark's files.
# Every phase is bounded: the whole check ends within 10 minutes (one call's limit there) at
# worst, and in about 5 when all goes well, so a rerun fits the 15 minutes of GPU time.
#   bash scripts/gpu_check.sh [OUT]          (OUT defaults to $OUT, then gpu-check-out)
# Environment: PYTHON (python3), GPU_WHEELS (.whl), GPU_SITE (where the wheels go),
#   GPU_CHECK_QUICK=1 (the benchmark's quick mode: the dry run on CPU),
#   GPU_CHECK_SKIP_INSTALL=1 (use what the interpreter already imports: our suite's smoke run).
set -uo pipefail  # not -e: each phase runs and is reported, whatever the one before did
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu-check-out}}
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # used from scripts/gpu too
WHEELS=${GPU_WHEELS:-.whl}
SITE=${GPU_SITE:-/tmp/rlcollect-gpu-site}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: > "$OUT/phases.tsv"

phase() {  # phase NAME SECONDS COMMAND...: run, bounded, and record its exit code and time
  local name=$1 limit=$2 started=$SECONDS code
  shift 2
  echo "gpu_check: $name (at most ${limit}s)" >&2
  timeout --kill-after=15 "$limit" "$@"
  code=$?
  printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - started))" >> "$OUT/phases.tsv"
  return $code
}

# --- install the carried wheels, offline ---
if [ "${GPU_CHECK_SKIP_INSTALL:-0}" != 1 ]; then
  ls "$WHEELS"/*.whl > /dev/null || { echo "gpu_check: no wheels in $WHEELS" >&2; exit 1; }
  rm -rf "$SITE" && mkdir -p "$SITE" && SITE=$(cd "$SITE" && pwd)
  PIP_CONFIG_FILE=/dev/null phase install 60 "$PY" -m pip install --quiet --no-index --no-deps \
    --no-compile --no-cache-dir --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl \
    || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

# --- versions and CUDA facts (from scripts/gpu/, so rlcollect is the installed one) ---
(cd scripts/gpu && phase facts 60 "$PY" facts.py) > "$OUT/facts.json" || exit 1
cat "$OUT/facts.json" >&2

# --- every CUDA test of ours: tests/gpu/ and the other files that mark one; the marked tests ---
mapfile -t files < <({ ls tests/gpu/test_*.py; grep -rl --include='test_*.py' 'mark.gpu' tests; } | sort -u)
phase tests 270 "$PY" -m pytest -p no:cacheprovider -o addopts="" --import-mode=importlib -ra \
  --strict-markers -m gpu --timeout 240 --continue-on-collection-errors \
  --junitxml "$OUT/gpu_tests.xml" "${files[@]}" > "$OUT/gpu_tests.log" 2>&1
tail -n 25 "$OUT/gpu_tests.log" >&2

# --- the GPU benchmark (CPU mode without CUDA) ---
mode=(--rounds 2)  # two interleaved rounds: about 150 s there
[ "${GPU_CHECK_QUICK:-0}" = 1 ] && mode=(--quick)
phase benchmark 200 "$PY" benchmarks/gpu.py "${mode[@]}" --out "$OUT" \
  > "$OUT/gpu_benchmark.log" 2>&1
tail -n 5 "$OUT/gpu_benchmark.log" >&2

# --- the report ---
"$PY" scripts/gpu/report.py "$OUT"
