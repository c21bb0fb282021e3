"""The job's own run-to-run noise, measured before any preemption is blamed for a difference.

On GPUs two uninterrupted runs of the same job often differ (atomics in ``index_add_`` and
``scatter_add_`` backward, cuBLAS workspaces, cuDNN autotuning, TF32, NCCL's algorithm choice),
and so does a CPU job with an unseeded RNG. A bit-exact gate would call that a resume bug. So
the uninterrupted run is repeated (``determinism_runs``): if the runs differ, that is its own
verdict, with the first step where they part and a checklist; or, in envelope mode
(``exactness = "envelope"``), the spread they show per step and per tensor becomes the
tolerance a resumed run must stay inside, widened by ``envelope_factor``.

Pure functions over run records, no I/O, like the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .trajectory import RunRecord, StepRecord

CHECKLIST = (
    "torch.use_deterministic_algorithms(True)",
    "CUBLAS_WORKSPACE_CONFIG=:4096:8 in the job's env (cuBLAS workspaces)",
    "torch.backends.cudnn.benchmark = False (autotuning picks kernels by timing)",
    "TF32 off: torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = False",
    "a seeded DataLoader generator and a worker_init_fn that seeds each worker",
    "every RNG seeded: random, numpy (no np.random.default_rng() without a seed), torch",
    "no wall-clock time, host name or process id in anything the job computes",
    "fixed thread counts (torch.set_num_threads, OMP_NUM_THREADS)",
)
HINT = (
    "make it deterministic: "
    + "; ".join(CHECKLIST)
    + ('. If it cannot be (NCCL, atomics), set exactness = "envelope" to judge within its measured noise')
)


@dataclass
class Audit:
    """What ``runs`` uninterrupted runs of one job showed about its determinism."""

    runs: int
    reproducible: bool
    first_difference: dict[str, Any] | None = None  # step, field, values (one per run)
    max_loss_drift: float = 0.0  # the largest |loss - reference loss| at any step, in any run
    drift_step: int | None = None
    loss_spread: dict[int, float] = field(default_factory=dict)  # step -> largest |loss - reference|
    fingerprint_spread: dict[str, dict[int, float]] = field(default_factory=dict)  # numeric fingerprints
    varying_fingerprints: list[str] = field(default_factory=list)  # non-numeric ones that differ between runs
    varying_tensors: list[str] = field(default_factory=list)  # final digests that differ between runs
    tensor_spread: dict[str, list[float]] = field(default_factory=dict)  # name -> [max abs difference, scale]

    def text(self) -> str:
        if self.reproducible:
            return f"bit-reproducible: {self.runs} uninterrupted runs agree bit for bit (losses, fingerprints, weights)"
        where = ""
        if self.first_difference is not None:
            d = self.first_difference
            where = f"; they first differ at step {d['step']} ({d['field']}: {', '.join(map(_show, d['values']))})"
        drift = f"; losses drift apart by up to {self.max_loss_drift:.3g}" + (
            f" (step {self.drift_step})" if self.drift_step is not None else ""
        )
        tensors = f"; {len(self.varying_tensors)} final tensor(s) differ" if self.varying_tensors else ""
        return f"not bit-reproducible: {self.runs} uninterrupted runs differ{where}{drift}{tensors}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["loss_spread"] = {str(k): v for k, v in self.loss_spread.items()}
        data["fingerprint_spread"] = {n: {str(k): v for k, v in s.items()} for n, s in self.fingerprint_spread.items()}
        data["text"] = self.text()
        return data


def _show(value: Any) -> str:
    if isinstance(value, str) and value.startswith(("0x", "-0x")):
        try:
            return repr(float.fromhex(value))
        except ValueError:
            pass
    return repr(value)


def as_number(value: Any) -> float | None:
    """A loss (float.hex text) or a numeric fingerprint as a float; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.startswith(("0x", "-0x", "inf", "-inf", "nan")):
        try:
            return float.fromhex(value)
        except ValueError:
            return None
    return None


def _distance(a: Any, b: Any) -> float:
    """|a - b| for numbers (inf when only one is a number or either is not finite but they differ)."""
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return 0.0 if a == b else math.inf
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    return abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf


def audit(runs: list[RunRecord], tensor_spread: dict[str, list[float]] | None = None) -> Audit:
    """Compare each uninterrupted run with the first (the reference), step by step."""
    reference = runs[0]
    result = Audit(runs=len(runs), reproducible=True, tensor_spread=tensor_spread or {})
    by_step = [{s.step: s for s in run.steps} for run in runs]
    varying: set[str] = set()
    for ref in reference.steps:
        others = [steps.get(ref.step) for steps in by_step[1:]]
        for other in others:
            if other is None:
                _note(result, ref.step, "steps", ["ran", "missing"])
                continue
            drift = _distance(ref.loss, other.loss)
            if drift:
                _note(result, ref.step, "loss", [ref.loss, other.loss])
                result.loss_spread[ref.step] = max(result.loss_spread.get(ref.step, 0.0), drift)
                if drift > result.max_loss_drift:
                    result.max_loss_drift, result.drift_step = drift, ref.step
            for name in sorted(set(ref.fingerprints) | set(other.fingerprints)):
                a, b = ref.fingerprints.get(name), other.fingerprints.get(name)
                if a == b:
                    continue
                _note(result, ref.step, name, [a, b])
                if as_number(a) is not None and as_number(b) is not None:
                    spread = result.fingerprint_spread.setdefault(name, {})
                    spread[ref.step] = max(spread.get(ref.step, 0.0), _distance(a, b))
                else:
                    varying.add(name)
    result.varying_fingerprints = sorted(varying)
    ref_digests = (reference.final or {}).get("digests") or {}
    differing = {
        name
        for run in runs[1:]
        for name, digest in ((run.final or {}).get("digests") or {}).items()
        if ref_digests.get(name) != digest
    }
    result.varying_tensors = sorted(differing)
    if differing and result.reproducible:
        result.reproducible = False
        result.first_difference = {"step": "final", "field": "weights", "values": sorted(differing)[:3]}
    return result


def _note(result: Audit, step: int, field_name: str, values: list[Any]) -> None:
    if result.reproducible:
        result.reproducible = False
        result.first_difference = {"step": step, "field": field_name, "values": values}


@dataclass(frozen=True)
class Envelope:
    """The tolerance a resumed run is judged with: the audit's spread, widened by ``factor``.

    Every step's tolerance is the widest spread the uninterrupted runs showed at any step. A
    per-step spread from a few runs is a poor estimate: where they happened to agree (early
    steps, before the noise is trained into the weights) a fresh run of the same job strays
    further, and the gate would call the job's own noise a failure. (Measured: with per-step
    tolerances a 4th uninterrupted run of the noisy fixture left a 3-run envelope at step 2 or 4
    in about one plan in ten.)"""

    audit: Audit
    factor: float

    def tolerance(self, spread: dict[int, float], step: int) -> float:
        return self.factor * max(spread.values(), default=0.0)

    def step_differences(self, ref: StepRecord, got: StepRecord) -> list[str]:
        """The fields of a step outside the envelope: the loss first, then fingerprints."""
        fields = []
        if _distance(ref.loss, got.loss) > self.tolerance(self.audit.loss_spread, ref.step):
            fields.append("loss")
        for name in sorted(set(ref.fingerprints) & set(got.fingerprints)):
            a, b = ref.fingerprints[name], got.fingerprints[name]
            if a == b or name in self.audit.varying_fingerprints:
                continue  # a fingerprint that differs between uninterrupted runs says nothing here
            limit = self.tolerance(self.audit.fingerprint_spread.get(name, {}), ref.step)
            if _distance(a, b) > limit:
                fields.append(name)
        return fields

    def final_differences(self, differing: list[str], chaos: RunRecord) -> list[str]:
        """Final tensors outside the envelope: a digest that differs is a difference unless the
        tensor also differs between uninterrupted runs, and then only when its values (known when
        the run left them readable) are further from the reference's than ``factor`` x the spread."""
        values = (chaos.final or {}).get("tensor_spread") or {}
        spreads = self.audit.tensor_spread
        return [
            name
            for name in differing
            if name not in self.audit.varying_tensors
            or (name in spreads and name in values and values[name][0] > self.tensor_tolerance(name))
        ]

    def tensor_tolerance(self, name: str) -> float:
        """How far a final tensor may stray: ``factor`` x the widest spread any tensor showed
        relative to its own scale, at this tensor's scale. One tensor's own spread, from a few runs
        and maybe a single value (a bias's moment), is no estimate: it let a fourth run's optimizer
        moment fail the noisy fixture."""
        spreads = self.audit.tensor_spread
        relative = max((d / s for d, s in spreads.values() if s > 0), default=0.0)
        difference, scale = spreads[name]
        return self.factor * max(difference, relative * scale)

    def note(self) -> str:
        """What envelope mode compared, and what it cannot see."""
        spread = self.audit.max_loss_drift
        tensors = self.audit.varying_tensors
        weights = (
            f"{len(tensors)} final tensor(s) that differ between uninterrupted runs compared within "
            f"{self.factor:g}x their spread"
            if tensors and self.audit.tensor_spread
            else f"{len(tensors)} final tensor(s) that differ between uninterrupted runs not compared bit for bit"
            if tensors
            else "final weights compared bit for bit"
        )
        return (
            f"within the envelope of {self.audit.runs} uninterrupted runs widened {self.factor:g}x (their losses "
            f"differ by up to {spread:.3g}); {weights}; a defect smaller than the job's own noise cannot be seen"
        )
