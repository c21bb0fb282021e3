"""The exit status a job must end with after a notice, as where it runs reads it.

The contract's default is exit 0 after the notice's checkpoint. Where the job really runs decides
whether that is right: a Kubernetes Job counts exit 0 as Succeeded and never retries it
(kubernetes/kubernetes#120182), a W&B sweep does not requeue a run that exited 0, SkyPilot
recovers a managed job by its exit code (``recover_on_exit_codes``), and Lightning changed its
exit after SIGTERM to 143 for these (Lightning PR #21623). Under Slurm's requeue the job asks
``scontrol requeue`` itself, and its exit status decides nothing.

``exit_after_notice`` on a job: ``0``, ``"nonzero"``, a status (``143``) or ``"any"``; unset, the
``platform``'s preset, else ``0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

# platform: (the exit after a notice that gets the job run again there, why)
PLATFORMS: dict[str, tuple[int | str, str]] = {
    "kubernetes-job": (
        "nonzero",
        "a Kubernetes Job counts exit 0 as Succeeded and never retries it (kubernetes/kubernetes#120182)",
    ),
    "wandb-sweep": ("nonzero", "a W&B sweep does not requeue a run that exited 0"),
    "skypilot": ("nonzero", "SkyPilot recovers a managed job by its exit code (recover_on_exit_codes); 0 is done"),
    "slurm-requeue": ("any", "Slurm requeues the job by its scontrol requeue; the exit status decides nothing"),
    "slurm-cancel": ("any", "Slurm cancels the preempted job; a new submission resumes it, whatever its exit"),
}
SLURM = ("slurm-requeue", "slurm-cancel")
# the warning signal and its lead before SIGTERM: a preset by the library that listens, or "USR1@90"
SLURM_SIGNAL_PRESETS = {"lightning": "USR1@90", "submitit": "USR2@90"}


def slurm_signal(value: Any, where: str) -> str:
    """``"USR1@90"`` / ``"USR2@30"`` (signal, seconds before SIGTERM), or a preset's name."""
    text = SLURM_SIGNAL_PRESETS.get(value, value) if isinstance(value, str) else value
    name, _, lead = text.partition("@") if isinstance(text, str) else ("", "", "")
    try:
        seconds = float(lead)
    except ValueError:
        seconds = -1.0
    if name not in ("USR1", "USR2") or not 0 < seconds <= 3600:
        presets = ", ".join(SLURM_SIGNAL_PRESETS)
        raise ConfigError(f'{where}: must be "USR1@SECONDS" or "USR2@SECONDS" (or {presets}), got {value!r}')
    return text


def slurm_lead(text: str) -> tuple[str, float]:
    """(the fault's name, the seconds from the warning to SIGTERM) of a checked ``slurm_signal``."""
    name, _, lead = text.partition("@")
    return f"slurm-{name.lower()}", float(lead)


# where a job that exits 0 after its notice is over for good: a platform, or the provider "kubernetes"
ENDS_ON_ZERO = {name for name, (expected, _) in PLATFORMS.items() if expected not in (0, "any")}
WORDS = ("nonzero", "any")


@dataclass(frozen=True)
class ExitExpectation:
    """What the job's exit after a notice must be, and where that comes from."""

    expected: int | str = 0  # 0, "nonzero", a status, "any"
    declared: bool = False  # exit_after_notice given on the job (not the platform's preset)
    platform: str | None = None
    ends_on_zero: str | None = None  # why exit 0 ends the job for good where it runs, if it does

    def matches(self, code: int | None) -> bool:
        """A status as the platform reads it: a process killed by SIGTERM (-15 here) is 143 there."""
        if self.expected == "any":
            return True
        if code is None:
            return False
        if self.expected == "nonzero":
            return code != 0
        expected = int(self.expected)
        return code == expected or (expected > 128 and code == -(expected - 128))

    def failure(self, code: int | None, signal: str, seconds: float) -> str:
        """Why ``code`` is the wrong exit after ``signal``."""
        if self.expected == "nonzero":
            where = f" ({PLATFORMS[self.platform][1]})" if self.platform in PLATFORMS else ""
            return (
                f"the job exited 0 {seconds:.2f} s after {signal}, where exit 0 after a notice ends it for good"
                f"{where}: exit non-zero after the checkpoint (143, as after SIGTERM's default), so it is run again"
            )
        source = "exit_after_notice" if self.declared else f"platform = {self.platform!r}"
        return f"the job exited with status {code} {seconds:.2f} s after {signal}; {source} expects {self.expected}"

    def warning(self, code: int | None) -> str | None:
        """A job that exits 0 where 0 ends it for good: its resume is never reached there."""
        if self.ends_on_zero and code == 0 and self.expected == 0:
            return (
                f"the job exits 0 after a notice, but {self.ends_on_zero}: in production it would not be run "
                'again; declare exit_after_notice = "nonzero" and exit 143 after the checkpoint'
            )
        return None


def exit_after_notice(value: Any, where: str) -> int | str:
    """The job key's value, checked."""
    if isinstance(value, str) and value in WORDS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
        return value
    raise ConfigError(f'{where}: must be 0, "nonzero", "any" or an exit status from 1 to 255, got {value!r}')


def platform(value: Any, where: str) -> str:
    if value not in PLATFORMS:
        raise ConfigError(f"{where}: unknown platform {value!r} (known: {', '.join(PLATFORMS)})")
    return value


def expectation(exit_after: int | str | None, platform_name: str | None, provider: str | None) -> ExitExpectation:
    """The job's expectation: declared, else its platform's preset, else 0."""
    ends = PLATFORMS[platform_name][1] if platform_name in ENDS_ON_ZERO else None
    if ends is None and provider == "kubernetes":
        ends = PLATFORMS["kubernetes-job"][1]
    if exit_after is not None:
        return ExitExpectation(exit_after, True, platform_name, ends)
    if platform_name is not None:
        return ExitExpectation(PLATFORMS[platform_name][0], False, platform_name, ends)
    return ExitExpectation(0, False, None, ends)
