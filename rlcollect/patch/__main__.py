"""`python -m rlcollect.patch script.py args...` / `python -m rlcollect.patch -m module args...`:
run a TorchRL program as `__main__` with its collectors, and its children's, on rlcollect.

`python -m rlcollect.patch --install-hook` (`--uninstall-hook`) writes (removes) the `.pth`
line with which `RLCOLLECT_PATCH_TORCHRL=1` alone patches any Python of this environment.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from rlcollect.patch import child_environment, startup_hook

USAGE = (
    "usage: python -m rlcollect.patch script.py [args...]\n"
    "       python -m rlcollect.patch -m module [args...]\n"
    "       python -m rlcollect.patch --install-hook | --uninstall-hook\n"
)


def run_script(path: str, args: Sequence[str]) -> None:
    """Run the file at `path` as `__main__`, as `python path args...` would."""
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    runpy.run_path(path, run_name="__main__")


def run_module(name: str, args: Sequence[str]) -> None:
    """Run module `name` as `__main__`, as `python -m name args...` would."""
    sys.argv = [name, *args]
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def patch_this_run() -> None:
    """Patch this process when TorchRL's collectors are imported, and every process it starts."""
    os.environ.update(child_environment.child_variables())
    startup_hook.install()


def main(argv: Sequence[str]) -> int:
    """The launcher's command line; the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] == "--install-hook":
        sys.stdout.write(f"wrote {child_environment.install_hook()}\n")
        return 0
    if argv[0] == "--uninstall-hook":
        removed = child_environment.uninstall_hook()
        sys.stdout.write(f"removed {removed}\n" if removed else "no hook installed here\n")
        return 0
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.stderr.write("-m needs a module name\n" + USAGE)
            return 2
        patch_this_run()
        run_module(argv[1], argv[2:])
        return 0
    if argv[0].startswith("-"):
        sys.stderr.write(f"unknown option {argv[0]!r}\n" + USAGE)
        return 2
    patch_this_run()
    run_script(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
