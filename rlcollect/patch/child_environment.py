"""How the patch reaches every interpreter of a run: environment variables that child processes
inherit (spawn and forkserver workers, subprocesses, the Ray workers of a cluster started after
the patch), read at their start by `sitecustomize` or by an installed `.pth` line."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import MutableMapping
from pathlib import Path

from rlcollect.patch.startup_hook import ENABLE_VARIABLE

PYTHONPATH_FOLDER = Path(__file__).parent / "pythonpath"  # holds our `sitecustomize.py`
STARTUP_HOOK = Path(__file__).parent / "startup_hook.py"
# Set by the process that printed what it patched: its children print nothing.
ANNOUNCED_VARIABLE = "RLCOLLECT_PATCH_ANNOUNCED"
PTH_NAME = "rlcollect-patch.pth"


def child_variables(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The variables an interpreter needs to patch itself at start: the switch, and our
    `sitecustomize` folder first on `PYTHONPATH` (the rest of `environ`'s kept). For the
    workers of a Ray cluster already running: `ray.init(runtime_env={"env_vars": ...})`.

    Examples:
        >>> from rlcollect.patch import environment_variables
        >>> sorted(environment_variables({"PYTHONPATH": "/mine"}))
        ['PYTHONPATH', 'RLCOLLECT_PATCH_TORCHRL']
        >>> environment_variables({"PYTHONPATH": "/mine"})["PYTHONPATH"].endswith(":/mine")
        True
    """
    entries = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    folder = str(PYTHONPATH_FOLDER)
    return {
        ENABLE_VARIABLE: "1",
        "PYTHONPATH": os.pathsep.join([folder, *(e for e in entries if e != folder)]),
    }


def set_variables(
    variables: dict[str, str], environ: MutableMapping[str, str] = os.environ
) -> dict[str, str | None]:
    """Set `variables` in `environ`; returns what they were (None: unset), for `restore`."""
    before = {name: environ.get(name) for name in variables}
    environ.update(variables)
    return before


def restore_variables(
    before: dict[str, str | None], environ: MutableMapping[str, str] = os.environ
) -> None:
    """Put back the variables `set_variables` changed."""
    for name, value in before.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def pth_line() -> str:
    """The one `.pth` line that runs the startup hook when `RLCOLLECT_PATCH_TORCHRL` is set."""
    hook = str(STARTUP_HOOK)
    return (
        f"import os; os.environ.get({ENABLE_VARIABLE!r}, '').strip().lower() in "
        "('1', 'true', 'yes', 'on') and exec(compile(open("
        f"{hook!r}, encoding='utf-8').read(), {hook!r}, 'exec'), "
        "{'__name__': '_rlcollect_patch_startup', '__file__': " + repr(hook) + "})\n"
    )


def install_hook(site_packages: Path | None = None) -> Path:
    """Write the `.pth` line into `site_packages` (this interpreter's, by default), so that
    `RLCOLLECT_PATCH_TORCHRL=1` alone patches any Python started from this environment."""
    folder = site_packages or Path(sysconfig.get_paths()["purelib"])
    path = folder / PTH_NAME
    path.write_text(pth_line(), encoding="utf-8")
    return path


def uninstall_hook(site_packages: Path | None = None) -> Path | None:
    """Remove the `.pth` line `install_hook` wrote; the path removed, or None."""
    path = (site_packages or Path(sysconfig.get_paths()["purelib"])) / PTH_NAME
    if not path.exists():
        return None
    path.unlink()
    return path
