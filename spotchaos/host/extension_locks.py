"""Build locks torch's C++ extensions leave behind: why a job that builds one may never start.

``torch.utils.cpp_extension.load`` builds an extension on the first start of each environment and
holds a ``lock`` file in its build folder while it does (torch's ``FileBaton``); a build killed
midway (a start timeout on a loaded machine, a fault, a Ctrl-C) leaves it, and every later start
waits on it forever, before its first event. DeepSpeed's CPU accelerator builds one in
``deepspeed.initialize`` (docs/distributed.md). The harness cannot tell a stale lock from a build
that runs, so it names what it finds when a job never started, and touches nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

SHOWN = 3


def build_locks(env: Mapping[str, str]) -> list[str]:
    """The ``lock`` files in torch's extension folders (``TORCH_EXTENSIONS_DIR``, else
    ``~/.cache/torch_extensions``: ``<flavour>/<extension>/lock``), oldest first; no link followed."""
    root = env.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    found: list[tuple[float, str]] = []
    try:
        flavours = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        for flavour in flavours:
            for extension in os.scandir(flavour.path):
                if not extension.is_dir(follow_symlinks=False):
                    continue
                lock = os.path.join(extension.path, "lock")
                try:
                    found.append((os.lstat(lock).st_mtime, lock))
                except OSError:
                    continue
    except OSError:
        return []
    return [path for _, path in sorted(found)]


def build_lock_note(env: Mapping[str, str]) -> str:
    """One sentence naming the build locks there are, for a job that never started; "" for none."""
    locks = build_locks(env)
    if not locks:
        return ""
    ages = []
    for path in locks[:SHOWN]:
        try:
            minutes = (time.time() - os.lstat(path).st_mtime) / 60
        except OSError:
            continue
        ages.append(f"{path} ({minutes:.0f} min old)")
    more = f" and {len(locks) - SHOWN} more" if len(locks) > SHOWN else ""
    return (
        f" A torch extension build lock is there: {', '.join(ages)}{more}. A build killed midway leaves it, "
        "and every start after it waits on it forever: if no build is running, delete it (docs/distributed.md)."
    )
