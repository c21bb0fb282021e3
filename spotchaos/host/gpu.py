"""The one way the harness asks the NVIDIA driver anything: ``nvidia-smi``, if it is there."""

from __future__ import annotations

import shutil
import subprocess


def nvidia_smi(*args: str, timeout: float = 20) -> str | None:
    """``nvidia-smi ARGS``'s output, or None when there is no driver, it fails or it hangs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def gpus_present() -> bool:
    """An NVIDIA GPU the host's driver lists (what Docker's ``device_requests`` with ``gpu`` hands out)."""
    return "GPU" in (nvidia_smi("-L") or "")


def driver_version() -> str | None:
    lines = (nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader", timeout=10) or "").strip().splitlines()
    return lines[0] if lines else None
