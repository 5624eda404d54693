"""The GPU check's facts: python, torch and CUDA, the GPU, the packages the check runs on, and
whether every installed package's requirements are met there (`python facts.py > facts.json`).

Run from scripts/gpu/, so `rlcollect` is the installed wheel, not the working tree.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import warnings
from typing import Any

PACKAGES = ("rlcollect", "tensordict", "torchrl", "gymnasium", "hydra-core", "omegaconf", "numpy")
# torchrl._torchrl: TorchRL's compiled part (the sum trees of its prioritized replay), built
# against one torch; on another it does not load (0.14.1's loads neither on 2.11 nor on 2.13).
# Nothing the check runs needs it: reported, so a TorchRL row's trouble is told from ours.
IMPORTS = (
    "rlcollect",
    "tensordict",
    "gymnasium",
    "torchrl",
    "torchrl._torchrl",
    "hydra",
    "omegaconf",
)


def cuda_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if facts["cuda_available"]:
        properties = torch.cuda.get_device_properties(0)
        facts |= {
            "device_name": properties.name,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "memory_gib": round(properties.total_memory / 2**30, 1),
            "multiprocessors": properties.multi_processor_count,
            "cudnn": torch.backends.cudnn.version(),
        }
    return facts


def nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    query = "--query-gpu=name,driver_version,memory.total"
    done = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() or done.stderr.strip()


def imports() -> dict[str, str]:
    """Each package imported: "ok", or the error; with the warnings it raised on import."""
    results = {}
    for name in IMPORTS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                module = importlib.import_module(name)
            except Exception as err:  # any failure to import is a fact to report
                results[name] = f"failed: {type(err).__name__}: {str(err)[:200]}"
                continue
        notes = sorted({str(w.message).splitlines()[0][:160] for w in caught})
        where = getattr(module, "__file__", "?")
        results[name] = "ok" + (f" ({where})" if name == "rlcollect" else "")
        results[name] += "".join(f"; warning: {note}" for note in notes)
    return results


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def unmet_requirements() -> list[str]:
    """Every requirement, followed from the packages the check runs on down to the last one,
    that the installed versions do not meet (extras skipped): the offline install took no
    dependency, so this is its proof on the machine itself."""
    from packaging.requirements import Requirement

    installed = {canonical(dist.metadata["Name"]): dist for dist in metadata.distributions()}
    problems, seen, pending = [], set(), list(PACKAGES)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        dist = installed.get(name)
        if dist is None:
            problems.append(f"{name} is not installed")
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            needed = canonical(requirement.name)
            have = installed.get(needed)
            if have is None or not requirement.specifier.contains(have.version, prereleases=True):
                found = have.version if have else "nothing"
                problems.append(f"{name} needs {requirement}, found {found}")
            else:
                pending.append(needed)
    return problems


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    facts = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **cuda_facts(),
        "nvidia_smi": nvidia_smi(),
        "versions": versions(),
        "imports": imports(),
        "unmet_requirements": unmet_requirements(),
    }
    json.dump(facts, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
