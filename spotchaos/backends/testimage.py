"""A container image for testing without a registry: ``spotchaos test-image``.

No registry is reachable from CI (and spotchaos never pulls), so the image is made here: an
empty root file system imported with ``docker import``, whose label asks the Docker backend to
bind this machine's ``/usr``, Python and virtual environment read-only at the same paths. The
container then runs the host's torch in its own PID namespace, cgroup, /dev/shm and network
namespace: PID 1, ``docker stop`` and shared-memory limits behave as in production.

Two tags: ``spotchaos-test:latest`` runs the command as PID 1 (``exec`` form), and
``spotchaos-test:shell-entrypoint`` wraps it in a shell that does not forward SIGTERM, the classic
broken entrypoint script the gate must catch.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from ..extras import require
from .docker import LABEL_BIND

REPOSITORY = "spotchaos-test"
TAG = "latest"
SHELL_TAG = "shell-entrypoint"
IMAGE = f"{REPOSITORY}:{TAG}"
SHELL_IMAGE = f"{REPOSITORY}:{SHELL_TAG}"
# An entrypoint script as people write them: the command runs as the shell's child, and the
# shell (PID 1, no handler installed) ignores the SIGTERM that docker stop sends it.
SHELL_ENTRYPOINT = '["/bin/sh", "-c", "\\"$@\\"; exit $?", "entrypoint"]'
TOP_LEVEL = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")


def _root_filesystem(binds: list[str]) -> bytes:
    """An almost empty root: mount points, /tmp, a passwd file, and the host's top-level links."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(info)

        def add_file(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))

        for name in ("dev", "proc", "sys", "etc", "root", "run", "usr", "var", "var/tmp", "home"):
            add_dir(name)
        add_dir("tmp", 0o1777)
        for name in TOP_LEVEL:  # merged-/usr hosts: links; others: bound as directories
            host = Path("/") / name
            if host.is_symlink():
                info = tarfile.TarInfo(name)
                info.type, info.linkname, info.mtime = tarfile.SYMTYPE, os.readlink(host), now
                tar.addfile(info)
            elif host.is_dir():
                add_dir(name)
                binds.append(str(host))
        add_file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        add_file("etc/group", "root:x:0:\nnogroup:x:65534:\n")
    return buffer.getvalue()


def host_paths() -> list[str]:
    """What the host's Python needs inside the container: /usr, its prefix, the venv's, and this
    spotchaos (an editable install lives outside the venv) so trainers can import the probe."""
    paths = ["/usr"]
    package_root = Path(__file__).resolve().parents[2]
    for prefix in (sys.base_prefix, sys.prefix, str(package_root)):
        resolved = str(Path(prefix).resolve())
        if not any(resolved == p or resolved.startswith(p + "/") for p in paths):
            paths.append(resolved)
    return paths


def build(client: Any | None = None) -> list[str]:
    """Build (or rebuild) both tags; returns their names. Takes about a second."""
    if client is None:
        client = require("docker", "docker", "spotchaos test-image").from_env(timeout=120)
    binds = host_paths()
    rootfs = _root_filesystem(binds)
    venv_bin = str(Path(sys.prefix) / "bin")
    common = [
        f"ENV PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "ENV HOME=/root",
        f"LABEL {LABEL_BIND}={json.dumps(':'.join(binds))}",
        "WORKDIR /",
    ]
    client.api.import_image_from_data(rootfs, repository=REPOSITORY, tag=TAG, changes=[*common, 'CMD ["python"]'])
    client.api.import_image_from_data(
        rootfs, repository=REPOSITORY, tag=SHELL_TAG, changes=[*common, f"ENTRYPOINT {SHELL_ENTRYPOINT}"]
    )
    return [IMAGE, SHELL_IMAGE]
