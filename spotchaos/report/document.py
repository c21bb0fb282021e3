"""The reproducibility report (JSON, the machine format).

One document per test session: the environment the verdicts hold for, the jobs, and one entry
per scenario with its verdict, the faults applied, the first divergent step, lost work, timings
and a command line that replays it. ``schema_version`` changes whenever a field changes meaning.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import ReportError
from ..host.gpu import driver_version, nvidia_smi
from ..host.machine import cpu_model, packages_digest
from ..safety.redact import redact
from .gate_cost import per_job

SCHEMA_VERSION = 1
MAX_REPORT_BYTES = 256 << 20


# what is left after the parser's error when a document was cut: nothing, or a last token cut short
_CUT_TOKEN = re.compile(r"|-?[0-9.eE+-]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or platform.system()
    except OSError:
        return f"{platform.system()} {platform.release()}"


def environment(root: Path) -> dict[str, Any]:
    """What the verdicts were measured on; torch and the GPU are described only if present."""
    digest, count = packages_digest()
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "os": _os_name(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "spotchaos": __version__,
        "git_commit": _git_commit(root),
        "packages_sha256": digest,
        "packages": count,
    }
    torch = sys.modules.get("torch")  # loaded by the harness already: described by itself, free
    env.update(_torch_loaded(torch) if torch is not None else _torch_installed())
    return env


def _torch_loaded(torch: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    if env["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_bytes=props.total_memory, gpu_count=torch.cuda.device_count())
        env["nvidia_driver"] = driver_version()
    return env


def cuda_of(version_py: str) -> str | None:
    """The CUDA version a torch build names in its ``torch/version.py`` (None: a CPU build)."""
    found = re.search(r"^cuda\b[^=]*=\s*['\"]([^'\"]+)['\"]", version_py, re.MULTILINE)
    return found.group(1) if found else None


def _torch_installed() -> dict[str, Any]:
    """torch as installed, without importing it (2-3 CPU-seconds a session, and a CUDA context in
    the harness): its version from its metadata, its CUDA build from ``torch/version.py``, the
    GPUs from the driver. cuDNN's version is known only where torch is loaded (null here)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return {"torch": None}
    spec = importlib.util.find_spec("torch")
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec is not None else None
    try:
        text = (folder / "version.py").read_text() if folder is not None else ""
    except OSError:
        text = ""
    env: dict[str, Any] = {"torch": version, "cuda": cuda_of(text), "cudnn": None}
    listed = (nvidia_smi("--query-gpu=name,memory.total", "--format=csv,noheader,nounits") or "").strip()
    gpus = [line.rsplit(",", 1) for line in listed.splitlines() if "," in line]
    env["cuda_available"] = bool(env["cuda"] and gpus)
    if env["cuda_available"]:
        name, mib = gpus[0]
        env.update(gpu=name.strip(), gpu_memory_bytes=int(float(mib)) * 1024 * 1024, gpu_count=len(gpus))
        env["nvidia_driver"] = driver_version()
    return env


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class SessionOutcome:
    """What a pytest session gathered for its report: the glue fills it, this module writes it."""

    seed: int
    profile: str
    started: str
    jobs: list[dict[str, Any]]
    scenarios: list[dict[str, Any]]
    secrets: list[str] = field(default_factory=list)
    containers: list[dict[str, Any]] = field(default_factory=list)
    interrupted: str | None = None  # the signal that stopped the session early
    reaped: list[str] = field(default_factory=list)  # what dead pytest runs had left running


def build_report(root: Path, outcome: SessionOutcome) -> dict[str, Any]:
    """The whole document, with every leaked window of a secret (and its encodings) redacted."""
    scenarios, interrupted = outcome.scenarios, outcome.interrupted
    passed = sum(1 for s in scenarios if s.get("passed"))
    env = environment(root)
    if outcome.containers:
        env["containers"] = outcome.containers  # image names and digests when jobs ran in Docker
    document = {
        "schema_version": SCHEMA_VERSION,
        "tool": "spotchaos",
        "started": outcome.started,
        "finished": now_iso(),
        "seed": outcome.seed,
        "profile": outcome.profile,
        "environment": env,
        "jobs": outcome.jobs,
        "summary": {"scenarios": len(scenarios), "passed": passed, "failed": len(scenarios) - passed},
        "cost": per_job(scenarios),  # what the gate cost, per job (docs/report-schema.md)
        "scenarios": scenarios,
        "decision": decide(scenarios, interrupted),
        # the signal that stopped the session before every scenario ran (None: it ran to its end)
        "interrupted": interrupted,
        "leftovers_ended": list(outcome.reaped),  # what pytest runs that died had left running, ended at start
    }
    return redact(document, outcome.secrets)


def decide(scenarios: list[dict[str, Any]], interrupted: str | None = None) -> dict[str, str]:
    """Continue, change or roll back: what the run says about shipping this trainer.

    A failed resume verdict means the job would lose or corrupt work on a real preemption (change
    the trainer); a failed budget only costs money or grace headroom (change the configuration).
    ``spotchaos compare`` decides "roll back" against a baseline.
    """
    if not scenarios:
        return {"decision": "unknown", "why": "no scenario ran"}
    judged = [s for s in scenarios if s.get("outcome") != "interrupted"]
    broken = [s["scenario"] for s in judged if not s.get("passed") and (s.get("verdict") or s.get("error"))]
    over_budget = [s["scenario"] for s in judged if not s.get("passed") and s["scenario"] not in broken]
    if broken:
        return {"decision": "change", "why": f"{len(broken)} scenario(s) did not resume correctly: fix the trainer"}
    if interrupted is not None:
        return {"decision": "unknown", "why": f"the session was interrupted ({interrupted}) before every scenario ran"}
    if over_budget:
        return {"decision": "change", "why": f"{len(over_budget)} scenario(s) over budget: change the configuration"}
    return {"decision": "continue", "why": f"all {len(scenarios)} scenario(s) passed"}


def load_report(path: Path) -> dict[str, Any]:
    """Read a saved report, refusing what this version cannot read correctly.

    A report from a newer schema might mean something else by the same field; a truncated file
    (pytest killed mid-write by an older tool, a partial download) must not render as a pass.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report: {exc.strerror or exc}") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"{path}: over {MAX_REPORT_BYTES >> 20} MiB, not a spotchaos report")
    text = raw.decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except RecursionError:
        raise ReportError(f"{path}: nested deeper than a spotchaos report ever is: not a report") from None
    except json.JSONDecodeError as exc:
        # the file's content is never echoed: the path may name any file (a key, a password file)
        # the parser ran off the end of the text: the document stops mid-object, whatever its last byte
        # (or inside its last token: a number or a true/false/null cut short)
        ended_early = exc.msg.startswith("Unterminated string") or bool(_CUT_TOKEN.fullmatch(text[exc.pos :].strip()))
        truncated = " (it looks truncated: it ends before the document closes)" if ended_early else ""
        raise ReportError(
            f"{path}: not a valid JSON report{truncated}: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(document, dict) or document.get("tool") != "spotchaos":
        raise ReportError(f'{path}: not a spotchaos report (no "tool": "spotchaos" field)')
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ReportError(f"{path}: the report has no integer schema_version")
    if version > SCHEMA_VERSION:
        raise ReportError(
            f"{path}: written with report schema {version}, but this spotchaos ({__version__}) reads "
            f"schema {SCHEMA_VERSION} and older: upgrade spotchaos to read it"
        )
    for key, kind in (("scenarios", list), ("summary", dict), ("environment", dict)):
        if not isinstance(document.get(key), kind):
            raise ReportError(f"{path}: the report's {key!r} is missing or not a {kind.__name__}")
    for index, scenario in enumerate(document["scenarios"]):
        where = f"{path}: scenario {index + 1}"
        if not isinstance(scenario, dict):
            raise ReportError(f"{where} is not an object")
        for key, kind in (("runs", list), ("figures", dict), ("scenario", str)):
            if key in scenario and not isinstance(scenario[key], kind | None):
                raise ReportError(f"{where}: its {key!r} is not a {kind.__name__}")
        if not all(isinstance(run, dict) for run in scenario.get("runs") or []):
            raise ReportError(f"{where}: its 'runs' must be objects")
    return document


def write_text(text: str, path: Path) -> Path:
    """Write atomically: a reader never sees half a report, even if pytest is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide the report from the CI's artifact upload
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def strict_json(value: Any) -> Any:
    """``value`` with every NaN and infinity as the string JavaScript would print ("NaN",
    "Infinity", "-Infinity"): bare ``NaN`` is not JSON, and browsers and ``jq`` reject it (a
    diverged run's loss is exactly where it shows up)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def number(value: Any) -> float | None:
    """A figure read back from a report: a number, one of the strings above, or None."""
    if isinstance(value, str):
        return NON_FINITE.get(value)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def write_json(document: dict[str, Any], path: Path) -> Path:
    text = json.dumps(strict_json(document), indent=2, sort_keys=True, default=str, allow_nan=False)
    return write_text(text + "\n", path)
