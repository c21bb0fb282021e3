"""Jobs under test and how they are declared.

A job is declared once, in ``[tool.spotchaos.jobs.NAME]`` of pyproject.toml or in Python as a
:class:`JobSpec`, and every scenario runs against it. Validation names the file and the key,
because a typo in a CI config should cost one glance, not a debugging session.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..safety.redact import secret_values
from . import exit_status
from .container import ContainerSpec, container_from_mapping
from .declare import JOB_NAME, PHASE_NAME, PYTHON_ALIASES, checked_table, command_of, only_known
from .launchers import KINDS, LAUNCHERS, LauncherKind
from .logspec import LogSpec, log_from_mapping
from .placeholders import check_latest
from .presets import GRACE_WINDOWS, MTBF_PRESETS
from .prices import MAX_PRICE, PRICE_KEYS, CostInputs

MODULE_NAME = re.compile(r"\??[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # "?name": only where it imports

STORAGES = ("local", "s3")
EXACTNESS = ("bit", "envelope")
BACKENDS = ("subprocess", "ray")
FRAMEWORKS = ("transformers", "lightning", "accelerate")


@dataclass(frozen=True)
class JobSpec:
    """One training job: how to start it, resume it, and how long to wait for it.

    ``command`` and ``resume_command`` starting with ``python`` run under the interpreter that
    runs pytest, so a virtual environment's torch is the one tested.
    """

    name: str
    command: tuple[str, ...]
    resume_command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    grace_seconds: float | None = None  # None: the provider's window, else 30 s
    start_timeout_seconds: float = 120.0
    event_timeout_seconds: float = 60.0
    attempt_timeout_seconds: float = 1800.0
    provider: str | None = None  # aws, gcp, azure, alibaba-pai-eas, kubernetes
    # where the job runs, for what it reads of the exit after a notice: kubernetes-job, wandb-sweep,
    # skypilot, slurm-requeue (config/exit_status.py); and the exit it must make: 0, "nonzero", 143, "any"
    platform: str | None = None
    exit_after_notice: int | str | None = None
    slurm_signal: str = "USR1@10"  # on a Slurm platform: the warning signal and its lead before SIGTERM
    # the job's own hang watchdog: a hung collective ends it, non-zero, within this many seconds
    watchdog_seconds: float | None = None
    overhead_budget: float = 0.05  # checkpoint time / training time
    # the longest one checkpoint may hold training up under storage faults (a SlowDown storm):
    # finish within it, or give up and say so (probe.checkpoint_failed)
    checkpoint_budget_seconds: float = 60.0
    mtbf_seconds: float | None = None  # mean time between preemptions, for the interval advisor
    cost: CostInputs = field(default_factory=CostInputs)
    container: ContainerSpec | None = None  # None: a local process group (the subprocess backend)
    log: LogSpec | None = None  # read steps from printed output instead of probe events
    resume_args: tuple[str, ...] = ()  # appended to command on restarts ("--resume", "init_from=resume")
    # a glob under the checkpoint directory: a restart resumes (resume_args, resume_command) only
    # when something matches it, else it starts fresh, for scripts whose resume flag fails without one
    resume_if_exists: str | None = None
    # How many uninterrupted runs measure the job's own run-to-run noise (1: just the reference).
    # None: 1 when exactness is "bit", 5 when it is "envelope" (docs/determinism.md: why 5).
    determinism_runs: int | None = None
    # "bit": the resumed run must equal the uninterrupted one bit for bit. "envelope": for jobs that
    # cannot be made deterministic, it must stay inside the spread the uninterrupted runs showed,
    # widened by envelope_factor.
    exactness: str = "bit"
    envelope_factor: float = 6.0
    # The checkpoints a run writes after a resume are compared with the uninterrupted run's of the
    # same step; entries matching these patterns ("trainer.pt:timestamp", "*.host") may differ.
    # None: on for one process, off for ranks (a DCP .metadata holds a save's own id), true turns it on.
    state_diff: bool | None = None
    state_diff_ignore: tuple[str, ...] = ()
    # the phases the job marks with its probe's phase(NAME) ("eval", "save"): the built-in scenario
    # lands a notice and a kill inside each (plan sigterm@S/eval), where real notices come too
    phases: tuple[str, ...] = ()
    parametrize: bool = True  # False: only tests that name it (@pytest.mark.spotchaos(jobs=[...])) get it
    storage: str = "local"  # "s3": checkpoints go to s3://<fresh bucket>/ckpt on the harness's moto
    # "torchrun": the command runs under torchrun (TorchElastic), nproc_per_node ranks on each of
    # nnodes "nodes" (agents on this machine, meeting at a c10d rendezvous on 127.0.0.1).
    # "ray-train": the command is a Ray Train driver, run here against the session's Ray cluster;
    # nproc_per_node is its number of Train workers (spotchaos/training/multirank/ray_train.py)
    launcher: str = "python"
    nproc_per_node: int = 1
    nnodes: int = 1
    max_restarts: int = 0  # torchrun's --max-restarts: how often the agent restarts a failed group
    rdzv_port: int | None = None  # the rendezvous port of a multi-node job; None: a free one
    # torchrun's --shutdown-timeout (torch >= 2.11): how long its agent waits between forwarding a
    # SIGTERM and SIGKILLing the ranks. None: what the job's launch gets without the flag, its
    # TORCH_ELASTIC_SHUTDOWN_TIMEOUT or torchrun's 30 s; set it as the production launch does
    shutdown_timeout_seconds: int | None = None
    # the ranks per node a resume may use instead of nproc_per_node: declaring it says the job
    # reshards its checkpoints, so the built-in resharding scenario runs (None: it is skipped)
    reshard_nproc_per_node: int | None = None
    # GPUs each attempt leases for its whole life, its own on this machine (host/gpu_leases.py), handed
    # over as CUDA_VISIBLE_DEVICES or a container's device ids. None: a container's own gpus, else none
    gpus: int | None = None
    # how long every rank may go without an event before a hung rank is named (after a hang-rank
    # fault, say); None: event_timeout_seconds
    hang_timeout_seconds: float | None = None
    # the framework the job trains with (transformers, lightning, accelerate): what its checkpoints hold that
    # may differ between runs, what its resumes get wrong (training/frameworks.py). None: as its integration says
    framework: str | None = None
    # "ray": each attempt on a worker node of a Ray cluster (spotchaos/backends/raycluster), with
    # these resources (num_cpus, num_gpus, custom ones); "subprocess": a local process group
    backend: str = "subprocess"
    ray_resources: tuple[tuple[str, float], ...] = ()
    # how a notice reaches a Ray Train job's nodes: "drain" (the GCS drains them for preemption with
    # the grace window as deadline, as an autoscaler does) or "kuberay" (SIGTERM to the node's own
    # `ray start`, as the kubelet sends a reclaimed pod: Ray drains it for its drain timeout, then
    # ends it; the job is not signalled, and its window is the cluster's drain_timeout_seconds)
    notice: str = "drain"
    # attempts fork from one interpreter that imported ``preload`` once (false: cold; RESTARTS_COLD: the first)
    warm: bool | str = True
    preload: tuple[str, ...] | None = None  # None: torch, where the job's Python has it
    # plans may start from the reference's checkpoints (training/reference/prefix.py); their copies' bytes
    # (None: a quarter of the free disk)
    prefix: bool = True
    snapshot_budget: int | None = None
    # its reference may be kept across sessions in the user's cache (training/reference/cache.py)
    cache_reference: bool = True
    source: str = "python"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def multi_rank(self) -> bool:
        """Whether its ranks are processes of their own that each report (torchrun, Ray Train)."""
        return self.kind.multi_rank

    @property
    def kind(self) -> LauncherKind:
        """What its launcher is, as the engine asks it (config/launchers.py)."""
        return KINDS[self.launcher]

    @property
    def kuberay_notice(self) -> bool:
        """Whether a notice reaches its Ray Train nodes as KubeRay's does: SIGTERM to each node's own
        ``ray start``, which drains for its own timeout, instead of the GCS draining them."""
        return self.notice == "kuberay"

    @property
    def ray_backend(self) -> bool:
        """Whether the Ray backend starts its processes on the session's Ray cluster's nodes."""
        return self.backend == "ray"

    @property
    def on_ray_cluster(self) -> bool:
        """Whether its attempts take the session's Ray cluster (the Ray backend, Ray Train's workers)."""
        return self.ray_backend or self.kind.cluster_ranks

    @property
    def gpu_request(self) -> int | str | None:
        """The GPUs an attempt leases: a count, "all", or None (it needs none)."""
        if self.gpus is not None:
            return self.gpus
        return self.container.gpus if self.container is not None else None

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def hang_seconds(self) -> float:
        """How long ranks may be silent before the harness names a hang: with the job's own
        watchdog declared, never before it and the launcher's teardown could act (the backstop)."""
        limit = self.hang_timeout_seconds if self.hang_timeout_seconds is not None else self.event_timeout_seconds
        if self.watchdog_seconds is not None:
            limit = max(limit, self.watchdog_seconds + self.teardown_seconds + 15)
        return limit

    @property
    def teardown_seconds(self) -> float:
        """How long torchrun's agent gives its other ranks after one fails (its --shutdown-timeout)."""
        return float(self.shutdown_timeout_seconds) if self.shutdown_timeout_seconds is not None else 30.0

    @property
    def uninterrupted_runs(self) -> int:
        """How many uninterrupted runs the job gets: the reference and the ones measuring its noise."""
        if self.determinism_runs is not None:
            return self.determinism_runs
        return 5 if self.exactness == "envelope" else 1

    def where(self, key: str) -> str:
        if self.source == "python":
            return f"JobSpec(name={self.name!r}).{key}"
        return f"{self.source} [tool.spotchaos.jobs.{self.name}].{key}"

    def argv(self, resume: bool) -> list[str]:
        """The command of this attempt. On the host, ``python`` is the interpreter running pytest;
        in a container it is the image's own ``python``."""
        if resume and self.resume_command:
            argv = list(self.resume_command)
        else:
            argv = [*self.command, *(self.resume_args if resume else ())]
        if argv[0] in PYTHON_ALIASES and self.container is None:
            argv[0] = sys.executable
        return argv

    def ray_needs(self) -> dict[str, float]:
        """What one attempt asks of a Ray node: a CPU unless told, the job's GPUs, its custom resources."""
        declared = dict(self.ray_resources)
        needs = {"CPU": declared.pop("num_cpus", 1.0), "GPU": declared.pop("num_gpus", float(self.gpus or 0))}
        return {**needs, **declared}

    def on_backend(self, backend: str) -> JobSpec:
        """This job on ``backend`` (--spotchaos-backend); a container job keeps its container, a Ray
        Train job its local driver (its workers are on the cluster already)."""
        keeps = self.container is not None or self.launcher == "ray-train"  # a Ray Train driver runs here
        return self if keeps or backend == self.backend else replace(self, backend=backend)

    def in_image(self, image: str) -> JobSpec:
        """This job in a container of ``image`` (``--spotchaos-image``), keeping its own options."""
        base = self.container or ContainerSpec(image=image, where=self.where("container"))
        return replace(self, container=replace(base, image=image))

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def secrets(self) -> list[str]:
        """Values of this job's environment that the report must never show."""
        return secret_values({**self.environment(), **dict(self.container.env if self.container else ())})

    def key(self) -> str:
        """Identifies everything that shapes the trajectory; the reference run is cached by it."""
        shaping = {
            "command": self.command,
            "resume": self.resume_command,
            "resume_args": self.resume_args,
            "resume_if_exists": self.resume_if_exists,
            # envelope mode runs the job so it leaves its final tensors readable: its own reference
            "exactness": self.exactness,
            "env": self.env,
            "cwd": self.cwd,
            "log": self.log.describe() if self.log else None,
            "storage": self.storage,
            # a reference run without the state diff keeps no checkpoint: a job that has it on needs its own
            "state_diff": self.state_diff,
        }
        if self.launcher != "python":  # another world size is another trajectory: its own reference
            shaping["launcher"] = [self.launcher, self.nproc_per_node, self.nnodes]
        if self.container is not None:  # another image may hold another torch: its own reference
            shaping["container"] = self.container.describe()
        if self.gpu_request is not None:  # the devices it is handed (how many, which kind): its own reference
            shaping["gpus"] = self.gpu_request
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        data = asdict(self)  # cost (prices) included: they are the user's figures, not secrets
        data["env"] = sorted(k for k, _ in self.env)  # names only: values may be secrets
        data["container"] = self.container.describe() if self.container else None
        data["log"] = self.log.describe() if self.log else None
        return data


@dataclass(frozen=True)
class Settings:
    """Project-wide options from ``[tool.spotchaos]``."""

    output: str = "spotchaos-report"
    # the scenarios that ship in the package (spotchaos/scenarios) on every declared job: True always,
    # False never, None (the default) when the project has no spotchaos scenario of its own
    builtin: bool | None = None
    jobs: tuple[JobSpec, ...] = field(default_factory=tuple)
    services: tuple[Any, ...] = field(default_factory=tuple)  # ServiceSpec (spotchaos.config.services)
    gpus: tuple[str, ...] | None = None  # the machine's GPUs to lease (None: what nvidia-smi lists)
    ray: Any = None  # RaySettings: the Ray cluster of jobs with backend = "ray"

    def service(self, name: str) -> Any:
        """The service declared as ``name``, or a ConfigError listing the declared ones."""
        for service in self.services:
            if service.name == name:
                return service
        known = ", ".join(s.name for s in self.services) or "none"
        raise ConfigError(f"no service {name!r} in [tool.spotchaos.services] (declared: {known})")


NOTICE_MODES = ("drain", "kuberay")
_NUMBER_KEYS = (
    "grace_seconds",
    "start_timeout_seconds",
    "event_timeout_seconds",
    "attempt_timeout_seconds",
    "overhead_budget",
    "checkpoint_budget_seconds",
    "hang_timeout_seconds",
    "watchdog_seconds",
)
# Old names that still work, with a DeprecationWarning naming the new one (one name per concept:
# every duration ends in _seconds).
_RENAMED = {
    "start_timeout": "start_timeout_seconds",
    "event_timeout": "event_timeout_seconds",
    "attempt_timeout": "attempt_timeout_seconds",
}


def _validate(job: JobSpec) -> None:
    """Every key's value checked once, where the job is made: a message names the key and where it
    was declared."""
    if not isinstance(job.name, str) or not JOB_NAME.fullmatch(job.name):
        raise ConfigError(
            f"job name {job.name!r}: use letters, digits, '.', '_' and '-' (at most 64, not starting with "
            "'.' or '-'): the name becomes part of file, directory and container names"
        )
    if not job.command:
        raise ConfigError(f"{job.where('command')}: must not be empty")
    if job.provider is not None and job.provider not in GRACE_WINDOWS:
        known = ", ".join(GRACE_WINDOWS)
        raise ConfigError(f"{job.where('provider')}: unknown provider {job.provider!r} (known: {known})")
    if job.grace_seconds is None:
        object.__setattr__(job, "grace_seconds", GRACE_WINDOWS.get(job.provider or "", 30.0))
    unprinted = [p for p in job.phases if job.log is not None and job.log.phase_pattern(p) is None]
    if unprinted:
        raise ConfigError(
            f"{job.where('phases')}: {unprinted[0]!r}: the log adapter knows a phase by the line that begins it: "
            f"add it to log.phases ({unprinted[0]} = 'Running Evaluation'), or mark it with the probe's phase(NAME)"
        )
    for key in (
        "grace_seconds",
        "start_timeout_seconds",
        "event_timeout_seconds",
        "attempt_timeout_seconds",
        "checkpoint_budget_seconds",
    ):
        _check_number(getattr(job, key), job.where(key), "a number of seconds", 0, 1e6)
    _check_number(job.overhead_budget, job.where("overhead_budget"), "a fraction such as 0.05", 0, 0.9)
    if job.mtbf_seconds is not None:
        _check_number(job.mtbf_seconds, job.where("mtbf_seconds"), "seconds (at least 60)", 59.999, 1e9)
    for key in PRICE_KEYS:
        value = getattr(job.cost, key)
        if value is not None:
            _check_number(value, job.where(f"cost.{key}"), "a price", -1e-12, MAX_PRICE)
    if job.resume_if_exists is not None and (
        not isinstance(job.resume_if_exists, str)
        or not job.resume_if_exists
        or job.resume_if_exists.startswith("/")
        or ".." in job.resume_if_exists
    ):
        raise ConfigError(
            f"{job.where('resume_if_exists')}: must be a glob under the checkpoint directory, "
            f"got {job.resume_if_exists!r}"
        )
    if job.backend not in BACKENDS:
        raise ConfigError(f"{job.where('backend')}: must be one of {', '.join(BACKENDS)}, got {job.backend!r}")
    if job.backend == "ray" and job.container is not None:
        raise ConfigError(
            f"{job.where('backend')}: a Ray job runs in its nodes' own environment; drop image/container "
            "(the nodes' image is the cluster's)"
        )
    if job.exactness not in EXACTNESS:
        raise ConfigError(f"{job.where('exactness')}: must be 'bit' or 'envelope', got {job.exactness!r}")
    runs = job.determinism_runs
    if runs is not None and (not isinstance(runs, int) or isinstance(runs, bool) or not 1 <= runs <= 20):
        raise ConfigError(f"{job.where('determinism_runs')}: must be an integer from 1 to 20, got {runs!r}")
    if job.exactness == "envelope" and runs == 1:
        raise ConfigError(
            f"{job.where('determinism_runs')}: envelope mode measures the spread of at least 2 uninterrupted "
            "runs; leave it unset (5) or give 2 or more"
        )
    _check_number(job.envelope_factor, job.where("envelope_factor"), "a factor such as 4", 0.999, 1e6)
    _check_launcher(job)
    if job.framework is not None and job.framework not in FRAMEWORKS:
        raise ConfigError(f"{job.where('framework')}: must be one of {', '.join(FRAMEWORKS)}, got {job.framework!r}")
    steps = job.cost.production_steps
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ConfigError(f"{job.where('cost.production_steps')}: must be a positive integer, got {steps!r}")


def _check_launcher(job: JobSpec) -> None:
    if job.launcher not in LAUNCHERS:
        raise ConfigError(f"{job.where('launcher')}: must be 'python' or 'torchrun', got {job.launcher!r}")
    for key, high in (("nproc_per_node", 64), ("nnodes", 8), ("max_restarts", 100)):
        value = getattr(job, key)
        low = 0 if key == "max_restarts" else 1
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"{job.where(key)}: must be an integer from {low} to {high}, got {value!r}")
    gpus = job.gpus
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 64):
        raise ConfigError(f"{job.where('gpus')}: must be a count of GPUs from 1 to 64, got {gpus!r}")
    reshard = job.reshard_nproc_per_node
    if reshard is not None:
        if not isinstance(reshard, int) or isinstance(reshard, bool) or not 1 <= reshard <= 64:
            raise ConfigError(
                f"{job.where('reshard_nproc_per_node')}: must be an integer from 1 to 64, got {reshard!r}"
            )
        if job.launcher != "torchrun":
            raise ConfigError(f'{job.where("reshard_nproc_per_node")}: resharding needs launcher = "torchrun"')
    _check_shutdown_timeout(job)
    port = job.rdzv_port
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535):
        raise ConfigError(f"{job.where('rdzv_port')}: must be a port from 1024 to 65535, got {port!r}")
    object.__setattr__(job, "slurm_signal", exit_status.slurm_signal(job.slurm_signal, job.where("slurm_signal")))
    if job.platform is not None:  # a job declared in Python is checked as one from pyproject.toml
        exit_status.platform(job.platform, job.where("platform"))
    if job.exit_after_notice is not None:
        exit_status.exit_after_notice(job.exit_after_notice, job.where("exit_after_notice"))
    if job.watchdog_seconds is not None:
        _check_number(job.watchdog_seconds, job.where("watchdog_seconds"), "a number of seconds", 0, 1e6)
    if job.hang_timeout_seconds is not None:
        _check_number(job.hang_timeout_seconds, job.where("hang_timeout_seconds"), "a number of seconds", 0, 1e6)
    if job.launcher == "python" and (job.nproc_per_node, job.nnodes) != (1, 1):
        raise ConfigError(
            f'{job.where("nproc_per_node")}: ranks need launcher = "torchrun" (one process per rank); '
            "a plain python job is one rank"
        )
    if job.launcher == "ray-train":
        _check_ray_train(job)
    _check_notice(job)
    if job.launcher == "torchrun" and job.container is not None:
        raise ConfigError(
            f"{job.where('launcher')}: torchrun jobs run as local processes for now; a container's torchrun "
            "(docker exec per rank) is not supported yet"
        )


def _check_ray_train(job: JobSpec) -> None:
    """A Ray Train driver runs here and places its own workers: no container, one node's worth
    of ranks (Ray decides the nodes), the probe's events, not a log."""
    if job.container is not None or job.backend != "subprocess":
        where = job.where("container" if job.container is not None else "backend")
        raise ConfigError(
            f"{where}: a Ray Train job's driver runs as a local process and Ray places its workers on the "
            "cluster; leave out container and backend (--spotchaos-ray-address names the cluster)"
        )
    if job.nnodes != 1:
        raise ConfigError(
            f"{job.where('nnodes')}: a Ray Train job's workers are placed by Ray; give their number as "
            "nproc_per_node (ScalingConfig's num_workers) and leave nnodes at 1"
        )
    if job.log is not None:
        raise ConfigError(f"{job.where('log')}: a Ray Train job reports per rank through the probe")
    if job.storage != "local":
        raise ConfigError(
            f"{job.where('storage')}: a Ray Train job's checkpoints are its run's storage_path on a folder "
            "every node sees; the harness's S3 credentials are not handed to Train workers"
        )


def _check_notice(job: JobSpec) -> None:
    """How a notice reaches the job: "kuberay" only where KubeRay gives one at all (Ray Train)."""
    if job.notice not in NOTICE_MODES:
        raise ConfigError(f"{job.where('notice')}: must be one of {', '.join(NOTICE_MODES)}, got {job.notice!r}")
    if job.notice == "kuberay" and job.launcher != "ray-train":
        raise ConfigError(
            f'{job.where("notice")}: "kuberay" is the notice of a Ray Train job (launcher = "ray-train"): a '
            "reclaimed KubeRay pod signals its `ray start` only, so any other job on it gets no notice at all "
            "and dies with its worker at the drain's deadline; plan sigkill for that"
        )


def _check_shutdown_timeout(job: JobSpec) -> None:
    """torchrun's --shutdown-timeout: whole seconds, and only where torchrun launches the job."""
    timeout = job.shutdown_timeout_seconds
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 0 <= timeout <= 86400:
            raise ConfigError(
                f"{job.where('shutdown_timeout_seconds')}: must be a whole number of seconds from 0 to 86400 "
                f"(torchrun's --shutdown-timeout), got {timeout!r}"
            )
        if job.launcher != "torchrun":
            raise ConfigError(
                f"{job.where('shutdown_timeout_seconds')}: is torchrun's --shutdown-timeout; "
                'it needs launcher = "torchrun"'
            )


def _check_number(value: Any, where: str, what: str, low: float, high: float) -> None:
    """``low < value <= high``; booleans are not numbers here."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not low < value <= high:
        raise ConfigError(f"{where}: must be {what} in ({low:g}, {high:g}], got {value!r}")


def _mtbf(value: Any, where: str) -> float:
    if isinstance(value, str):
        if value not in MTBF_PRESETS:
            raise ConfigError(f"{where}: unknown preset {value!r} (known: {', '.join(MTBF_PRESETS)}, or seconds)")
        return MTBF_PRESETS[value]
    return value


def _cost(table: Any, where: str) -> CostInputs:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table")
    known = {*PRICE_KEYS, "production_steps"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    return CostInputs(**table)


_TOP_KEYS = {"output", "builtin", "jobs", "services", "gpus", "ray"}


def _ray_resources(table: Any, where: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(table, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        for k, v in table.items()
    ):
        raise ConfigError(f"{where}: must be a table of amounts, such as {{num_cpus = 1, num_gpus = 1, spot = 1}}")
    return tuple(sorted((k, float(v)) for k, v in table.items()))


def _modules(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(m, str) and MODULE_NAME.fullmatch(m) for m in value):
        raise ConfigError(f"{where}: must be a list of installed modules to import first, such as ['torch', 'numpy']")
    return tuple(value)


def _byte_count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}: must be a number of bytes (an integer, 0 or more), got {value!r}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false")
    return value


def _storage(value: Any, where: str) -> str:
    if value not in STORAGES:
        raise ConfigError(f"{where}: must be one of {', '.join(STORAGES)}, got {value!r}")
    return value


def _phases(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and PHASE_NAME.fullmatch(p) for p in value):
        raise ConfigError(f"{where}: must be a list of the phases the job marks with probe.phase(NAME): ['eval']")
    return tuple(dict.fromkeys(value))


def _ignore_patterns(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"{where}: must be a list of patterns such as 'trainer.pt:timestamp'")
    return tuple(value)


# Keys handed to JobSpec as they are (its __post_init__ checks each), and keys read through a
# parser: (JobSpec's field, the parser of (value, where)). With command, resume_command, env, cwd,
# image and container, and the old names, they are every key a job table may hold.
_PLAIN_KEYS = (
    *_NUMBER_KEYS,
    "provider",
    "resume_if_exists",
    "determinism_runs",
    "exactness",
    "envelope_factor",
    "launcher",
    "nproc_per_node",
    "nnodes",
    "max_restarts",
    "rdzv_port",
    "shutdown_timeout_seconds",
    "reshard_nproc_per_node",
    "gpus",
    "framework",
    "backend",
    "notice",
)
_PARSED_KEYS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "mtbf": ("mtbf_seconds", _mtbf),
    "cost": ("cost", _cost),
    "log": ("log", log_from_mapping),
    "storage": ("storage", _storage),
    "parametrize": ("parametrize", _flag),
    "warm": ("warm", _flag),
    "preload": ("preload", _modules),
    "prefix": ("prefix", _flag),
    "snapshot_budget": ("snapshot_budget", _byte_count),
    "cache_reference": ("cache_reference", _flag),
    "resume_args": ("resume_args", command_of),
    "state_diff": ("state_diff", _flag),
    "state_diff_ignore": ("state_diff_ignore", _ignore_patterns),
    "phases": ("phases", _phases),
    "ray_resources": ("ray_resources", _ray_resources),
    "platform": ("platform", exit_status.platform),
    "exit_after_notice": ("exit_after_notice", exit_status.exit_after_notice),
    "slurm_signal": ("slurm_signal", exit_status.slurm_signal),
}
_JOB_KEYS = {
    "command",
    "resume_command",
    "env",
    "cwd",
    "image",
    "container",
    *_PLAIN_KEYS,
    *_PARSED_KEYS,
    *_RENAMED,
}


def job_from_mapping(name: str, table: Mapping[str, Any], source: str) -> JobSpec:
    """Build a job from one ``[tool.spotchaos.jobs.NAME]`` table, naming any bad key."""
    table, where = checked_table("jobs", name, table, source, _JOB_KEYS)
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where('env')}: must be a table of strings")
    cwd = table.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where('cwd')}: must be a string")
    table = _renamed(table, where)
    kwargs: dict[str, Any] = {key: table[key] for key in _PLAIN_KEYS if key in table}
    for key, (field_name, parse) in _PARSED_KEYS.items():
        if key in table:
            kwargs[field_name] = parse(table[key], where(key))
    if "container" in table and "image" not in table:
        raise ConfigError(f'{where("container")}: needs an image: add image = "..." to the job')
    if "image" in table:
        kwargs["container"] = container_from_mapping(
            table["image"], table.get("container"), f"{source} [tool.spotchaos.jobs.{name}]"
        )
    resume = table.get("resume_command")
    check_latest(command_of(table["command"], where("command")), env.values(), cwd, where("command"))
    return JobSpec(
        name=name,
        command=command_of(table["command"], where("command")),
        resume_command=command_of(resume, where("resume_command")) if resume is not None else None,
        env=tuple(sorted(env.items())),
        cwd=cwd,
        source=source,
        **kwargs,
    )


def _renamed(table: Mapping[str, Any], where: Callable[[str], str]) -> Mapping[str, Any]:
    """The table with old key names under their new ones, each with a DeprecationWarning."""
    for old_key, new_key in _RENAMED.items():
        if old_key in table:
            if new_key in table:
                raise ConfigError(f"{where(old_key)}: give {new_key} only (the old name is deprecated)")
            warnings.warn(
                f"{where(old_key)} is deprecated: call it {new_key} (it will stop working in a later release)",
                DeprecationWarning,
                stacklevel=3,  # the caller of job_from_mapping, as before
            )
            table = {**table, new_key: table[old_key]}
    return table


@dataclass(frozen=True)
class RaySettings:
    """``[tool.spotchaos.ray]``: the user's cluster (``address``) or the local one the gate starts."""

    address: str | None = None
    workers: int = 2
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0  # declared as resources: Ray hands them out, nvidia-smi need not agree
    resources_per_worker: tuple[tuple[str, float], ...] = ()
    # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of the local cluster's worker nodes: how long a `ray start`
    # that gets SIGTERM drains its node before it ends it (Ray's default 30 s; KubeRay tunes it)
    drain_timeout_seconds: float = 30.0
    # each attempt's folder relayed through its node's agent ("auto": where the nodes are other hosts,
    # or the local cluster's have folders of their own); a shared folder the runs may live in
    relay: str = "auto"
    shared_folder: str | None = None
    separate_node_folders: bool = False  # the local cluster's worker nodes share no folder with the harness


def _ray_settings(table: Any, where: str) -> RaySettings:
    known = {
        "address",
        "workers",
        "cpus_per_worker",
        "gpus_per_worker",
        "resources_per_worker",
        "drain_timeout_seconds",
        "relay",
        "shared_folder",
        "separate_node_folders",
    }
    table = only_known(table, where, known, "a table (address, workers, cpus_per_worker, ...)")
    address = table.get("address")
    if address is not None and (not isinstance(address, str) or not address):
        raise ConfigError(f"{where}.address: must be a Ray address such as '127.0.0.1:6379'")
    workers = table.get("workers", 2)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 16:
        raise ConfigError(f"{where}.workers: must be a whole number of worker nodes from 1 to 16, got {workers!r}")
    for key in ("cpus_per_worker", "gpus_per_worker"):
        _check_number(table.get(key, 0), f"{where}.{key}", "an amount", -1e-12, 1024)
    resources = _ray_resources(table.get("resources_per_worker", {}), f"{where}.resources_per_worker")
    drain = table.get("drain_timeout_seconds", 30.0)
    _check_number(drain, f"{where}.drain_timeout_seconds", "a number of seconds", 0, 3600)
    relay = table.get("relay", "auto")
    if relay not in ("auto", "on", "off"):
        raise ConfigError(f'{where}.relay: must be "auto", "on" or "off", got {relay!r}')
    shared = table.get("shared_folder")
    if shared is not None and (not isinstance(shared, str) or not shared.startswith("/")):
        raise ConfigError(f"{where}.shared_folder: must be an absolute path every node mounts, got {shared!r}")
    separate = table.get("separate_node_folders", False)
    if not isinstance(separate, bool):
        raise ConfigError(f"{where}.separate_node_folders: must be true or false, got {separate!r}")
    return RaySettings(
        relay=relay,
        shared_folder=shared,
        separate_node_folders=separate,
        drain_timeout_seconds=float(drain),
        address=address,
        workers=workers,
        cpus_per_worker=table.get("cpus_per_worker", 1),
        gpus_per_worker=table.get("gpus_per_worker", 0),
        resources_per_worker=resources,
    )


def load_settings(pyproject: Path) -> Settings:
    """Read ``[tool.spotchaos]``; a missing file or table gives empty settings."""
    if not pyproject.is_file():
        return Settings()
    try:
        data = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject}: not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("spotchaos")
    if table is None:
        return Settings()
    if not isinstance(table, Mapping):
        raise ConfigError(f"{pyproject} [tool.spotchaos]: must be a table")
    unknown = sorted(set(table) - _TOP_KEYS)
    if unknown:
        known = ", ".join(sorted(_TOP_KEYS))
        raise ConfigError(f"{pyproject} [tool.spotchaos].{unknown[0]}: unknown key (known: {known})")
    output = table.get("output", Settings.output)
    if not isinstance(output, str) or not output:
        raise ConfigError(f"{pyproject} [tool.spotchaos].output: must be a non-empty string")
    builtin = table.get("builtin")
    if builtin is not None and not isinstance(builtin, bool):
        raise ConfigError(f"{pyproject} [tool.spotchaos].builtin: must be true or false, got {builtin!r}")
    jobs_table = table.get("jobs", {})
    if not isinstance(jobs_table, Mapping):
        raise ConfigError(f"{pyproject} [tool.spotchaos].jobs: must be a table of jobs")
    jobs = tuple(job_from_mapping(name, job, str(pyproject)) for name, job in jobs_table.items())
    services_table = table.get("services", {})
    if not isinstance(services_table, Mapping):
        raise ConfigError(f"{pyproject} [tool.spotchaos].services: must be a table of services")
    from .services import service_from_mapping  # the services' own module: config stays about jobs

    services = tuple(service_from_mapping(name, t, str(pyproject)) for name, t in services_table.items())
    gpus = None
    if "gpus" in table:
        from ..host.gpu_leases import parse_devices

        gpus = parse_devices(table["gpus"], f"{pyproject} [tool.spotchaos].gpus")
    ray = _ray_settings(table["ray"], f"{pyproject} [tool.spotchaos.ray]") if "ray" in table else RaySettings()
    return Settings(output=output, builtin=builtin, jobs=jobs, services=services, gpus=gpus, ray=ray)
