"""Optional features and the extras that bring them: a missing one is one line saying what to install.

``pip install spotchaos`` brings what the core needs (the plugin, the engine, the verdict, the
JSON and Markdown reports). The rest is opt-in: ``spotchaos[s3]`` (moto's server and boto3),
``spotchaos[docker]`` (the docker SDK), ``spotchaos[html]`` (Jinja2 and matplotlib for
report.html), ``spotchaos[bench]`` (pytest-benchmark), ``spotchaos[serve]`` (httpx, uvicorn,
Starlette), ``spotchaos[ray]`` (Ray, for the Ray backend), ``spotchaos[fixtures]`` (torch, numpy and
crc32c for the bundled trainers), ``spotchaos[all]``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import SpotchaosError


class MissingExtra(SpotchaosError):
    """A feature needs a package that is not installed; the message names the extra."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``import module``, or :class:`MissingExtra` saying which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = "pip install torch" if extra == "torch" else f"pip install 'spotchaos[{extra}]'"
        raise MissingExtra(f"{feature} needs {module.split('.')[0]}, which is not installed ({exc}): {hint}") from None
