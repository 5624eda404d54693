#!/usr/bin/env bash
# Fill a folder (default .whl/, ignored by git) with exactly the wheels the GPU machine lacks, for
# scripts/gpu_check.sh to install there with no network: scripts/gpu/carried.txt (one pinned
# version each) and rlcollect itself, for one python version (default 3.12, the GPU machine's),
# x86-64 manylinux; never torch or anything scripts/gpu/provided.txt says the machine has.
# Then it proves the set complete offline: pip's resolver, given only that folder and stand-ins
# for the machine's own packages (provided.txt), must resolve rlcollect, torchrl and hydra-core
# for that python, and need every wheel in the folder. It fails otherwise, or over 64 MiB.
#   bash scripts/gpu_wheels.sh [DIR]
#   GPU_PYTHON_VERSION=3.11 GPU_PROVIDED=FILE bash scripts/gpu_wheels.sh DIR   (the dry run's:
#   this machine's python, and FILE listing what its venv stands in for the GPU machine with)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYTHON_BIN=${PYTHON:-python3}
PY_VERSION=${GPU_PYTHON_VERSION:-3.12}
PROVIDED=${GPU_PROVIDED:-scripts/gpu/provided.txt}
ABI=cp${PY_VERSION/./}
LIMIT_MIB=64
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
TARGET=(--python-version "$PY_VERSION" --implementation cp --abi "$ABI" "${PLATFORMS[@]}")
pip_() { "$PYTHON_BIN" -m pip --disable-pip-version-check "$@"; }
requirements() { grep -v -e '^#' -e '^$' "$1"; }

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
echo "gpu_wheels: downloading $(requirements scripts/gpu/carried.txt | wc -l) wheels for python $PY_VERSION into $DEST" >&2
for requirement in $(requirements scripts/gpu/carried.txt); do
  if ! pip_ download --quiet --no-deps --only-binary=:all: "${TARGET[@]}" -d "$DEST" "$requirement"; then
    # A few pure-Python packages publish only a source archive (antlr4-python3-runtime 4.9.3):
    # built here, it must come out as a py3-none-any wheel, which any python 3 can install.
    echo "gpu_wheels: no wheel for $requirement on the index; building a pure-Python one" >&2
    pip_ wheel --quiet --no-deps -w "$DEST" "$requirement"
  fi
done
pip_ wheel --quiet --no-deps -w "$DEST" .
for wheel in "$DEST"/*.whl; do
  case "$(basename "$wheel")" in
    *-none-any.whl | *-"$ABI"-*.whl | *-abi3-*.whl) ;;
    *) echo "gpu_wheels: $wheel is built for another python than $PY_VERSION" >&2; exit 1 ;;
  esac
done
duplicates=$(ls "$DEST" | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$duplicates" ]; then
  echo "gpu_wheels: more than one version of: $duplicates (the install there takes one each)" >&2
  exit 1
fi

# --- the resolver check, offline: the folder alone plus stand-ins for the machine's packages ---
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
requirements "$PROVIDED" > "$work/provided.txt"
"$PYTHON_BIN" scripts/gpu/stand_in_wheels.py "$work/provided.txt" "$work/stand-ins"
PIP_CONFIG_FILE=/dev/null pip_ install --quiet --dry-run --ignore-installed --no-index \
  --find-links "$DEST" --find-links "$work/stand-ins" --only-binary=:all: "${TARGET[@]}" \
  --target "$work/target" --report "$work/report.json" rlcollect torchrl hydra-core
"$PYTHON_BIN" scripts/gpu/check_resolution.py "$work/report.json" "$DEST" "$work/provided.txt"

mib() { awk '{ total += $1 } END { printf "%d", (total + 1048575) / 1048576 }'; }
wheels_mib=$(stat -c %s "$DEST"/*.whl | mib)
tree_mib=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | mib)
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, ${wheels_mib} MiB; with the working tree (${tree_mib} MiB) $((wheels_mib + tree_mib)) MiB of ${LIMIT_MIB}" >&2
if [ $((wheels_mib + tree_mib)) -ge $LIMIT_MIB ]; then
  echo "gpu_wheels: over the ${LIMIT_MIB} MiB a call to the GPU machine carries" >&2
  exit 1
fi
