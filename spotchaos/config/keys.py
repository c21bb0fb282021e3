"""Every key of a ``[tool.spotchaos.jobs.NAME]`` table, its default and what it means: one table,
generated from the ``JobSpec`` dataclass, so the manual cannot drift from the loader.

``python -m spotchaos.config.keys`` prints docs/job-keys.md; tests/test_docs_examples.py checks
the page equals it and that every key the loader takes has a line here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .jobs import _JOB_KEYS, _RENAMED, JobSpec

# the TOML key where it is not the field's name
FIELD_OF = {"mtbf": "mtbf_seconds", "image": "container"}

MEANINGS: dict[str, str] = {
    "command": "the job's command (\"python\": pytest's interpreter; `{checkpoint_dir}`: the run's checkpoints)",
    "resume_command": "the command of a restart, where resuming needs other arguments than `resume_args` add",
    "resume_args": "a restart adds to `command`; `{latest_checkpoint}`: its newest checkpoint (docs/log-adapter.md)",
    "resume_if_exists": "a glob under the checkpoint folder: a restart resumes only when one matches",
    "env": "variables for the job (values may name `{checkpoint_dir}`)",
    "cwd": "its working folder, relative to the project root; `{checkpoint_dir}`: the run's checkpoint folder",
    "grace_seconds": "the notice before the kill: the provider's window (AWS 120, GCP/Azure/Kubernetes 30), else 30",
    "provider": "aws, gcp, azure, alibaba-pai-eas or kubernetes: the grace window and cost presets (docs/budgets.md)",
    "platform": "kubernetes-job, wandb-sweep, skypilot, slurm-requeue/-cancel: where it runs (docs/platforms.md)",
    "exit_after_notice": '0, "nonzero", a status (143) or "any": the exit after a notice (docs/platforms.md)',
    "slurm_signal": '"USR1@SECONDS"/"USR2@SECONDS" (or lightning, submitit): Slurm\'s warning before SIGTERM',
    "start_timeout_seconds": 'until the first event, else "never started"',
    "event_timeout_seconds": 'between two events, else "hangs"',
    "attempt_timeout_seconds": "for one attempt",
    "overhead_budget": "checkpoint time over training time allowed (docs/budgets.md)",
    "checkpoint_budget_seconds": "the longest one checkpoint may hold training up under storage faults",
    "mtbf": "mean time between preemptions: seconds or pessimistic/typical/optimistic (docs/budgets.md)",
    "cost": "prices and production steps for the cost figures (docs/budgets.md)",
    "image": "run the job in a container of this local image (docs/containers.md)",
    "container": "the container's settings: memory, GPUs, env (docs/containers.md)",
    "log": "a script without the probe: how it prints its steps and writes its checkpoints (docs/log-adapter.md)",
    "determinism_runs": "uninterrupted runs measuring the job's own noise (unset: 1, or 5 for an envelope)",
    "exactness": '"bit", or "envelope": judged within the noise its uninterrupted runs show (docs/determinism.md)',
    "envelope_factor": "how far past the measured noise an envelope reaches",
    "state_diff": "compare the checkpoints after a resume entry by entry (unset: where the format is readable)",
    "state_diff_ignore": "checkpoint entries that may differ after a resume, as `file:key` patterns",
    "phases": 'the phases the job marks with its probe\'s `phase(NAME)`, such as `["eval"]`: the built-in phase '
    "scenario lands a SIGTERM and a SIGKILL inside each (`sigterm@S/eval`, docs/fault-landing.md)",
    "parametrize": "false: the built-in scenarios leave the job out unless a scenario or --spotchaos-job names it",
    "storage": '"local", or "s3": its checkpoints in the harness\'s S3 (moto on loopback, docs/storage.md)',
    "launcher": '"python", "torchrun" or "ray-train" (docs/distributed.md, docs/ray.md)',
    "nproc_per_node": "ranks per node (torchrun, Ray Train's workers)",
    "nnodes": "torchrun agents (nodes) on this machine",
    "max_restarts": "torchrun's --max-restarts",
    "rdzv_port": "torchrun's rendezvous port on 127.0.0.1 (unset: a free one)",
    "shutdown_timeout_seconds": "torchrun's --shutdown-timeout, as the production launch passes it",
    "reshard_nproc_per_node": "ranks per node a resume may use: the resharding scenario",
    "gpus": "GPUs each attempt leases (docs/gpus.md)",
    "hang_timeout_seconds": "no rank reports for this long: the hung rank is named (torchrun)",
    "watchdog_seconds": "the job's own hang watchdog: a hung collective ends it non-zero within it (docs/platforms.md)",
    "framework": '"transformers", "lightning" or "accelerate": what its checkpoints hold (docs/frameworks.md)',
    "backend": '"subprocess", "docker" or "ray" (docs/ray.md)',
    "ray_resources": "what one attempt asks of a Ray node",
    "notice": 'a Ray Train job\'s notice: "drain", or "kuberay" (docs/ray.md)',
    "warm": "attempts fork from a warm interpreter of the job (docs/usage.md, warm starts)",
    "preload": "what that interpreter imports once (unset: torch, torch._dynamo and the framework's)",
    "prefix": "searched plans may start from the reference's checkpoint copies (docs/usage.md)",
    "snapshot_budget": "bytes those copies may take (unset: a quarter of the free disk)",
    "cache_reference": "the reference is kept across sessions (docs/usage.md)",
}
# old names that still load, with a deprecation warning
for _old, _new in _RENAMED.items():
    MEANINGS[_old] = f"old name of `{_new}` (still loads, with a deprecation warning)"


def _default(key: str) -> str:
    fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    field = fields.get(FIELD_OF.get(key, _RENAMED.get(key, key)))
    if field is None or key in _RENAMED:
        return ""
    value: Any = field.default
    if value is dataclasses.MISSING:
        return "required" if key == "command" else ""
    if value is None or value == ():
        return "unset"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def job_keys_markdown() -> str:
    """The page: one row a key, in the loader's set, the old names last."""
    current = sorted(k for k in _JOB_KEYS if k not in _RENAMED)
    rows = [f"| `{key}` | {_default(key)} | {MEANINGS[key]} |" for key in [*current, *sorted(_RENAMED)]]
    return "\n".join(
        [
            "# Job keys",
            "",
            "Every key of a `[tool.spotchaos.jobs.NAME]` table. Generated from the `JobSpec` dataclass by",
            "`python -m spotchaos.config.keys` (`tests/test_docs_examples.py` checks this page against it).",
            "",
            "| key | default | meaning |",
            "| --- | --- | --- |",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    print(job_keys_markdown(), end="")
