"""Import paths of the flat layout (0.1), kept working for one release after the move into wings.

Users' conftest files, benchmarks and notes import ``spotchaos.engine`` or ``spotchaos.plan``; the
modules now live in ``training/``, ``faults/``, ``host/``... Rather than a shim file per old module
(which would put the flat layout back), the finder ``spotchaos/__init__.py`` puts at the *end* of
``sys.meta_path`` asks this table only for names no other finder found: ``spotchaos.engine`` is the
very module object ``spotchaos.training.engine.run`` (so a monkeypatch through either name patches
both), with one ``DeprecationWarning`` naming the new path. Ordinary imports never reach it.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

REMOVED_IN = "0.3"

MOVED: dict[str, str] = {
    "spotchaos.engine": "spotchaos.training.engine.run",
    "spotchaos.hold": "spotchaos.training.engine.hold",
    "spotchaos.landing": "spotchaos.training.engine.landing",
    "spotchaos.events": "spotchaos.training.events",
    "spotchaos.logadapter": "spotchaos.training.logadapter",
    "spotchaos.trajectory": "spotchaos.training.trajectory",
    "spotchaos.verdict": "spotchaos.training.verdict",
    "spotchaos.determinism": "spotchaos.training.determinism",
    "spotchaos.restarts": "spotchaos.training.restarts",
    "spotchaos.frameworks": "spotchaos.training.frameworks",
    "spotchaos.torchrun": "spotchaos.training.multirank.torchrun",
    "spotchaos.ranked": "spotchaos.training.multirank.ranked",
    "spotchaos.rank_verdict": "spotchaos.training.multirank.rank_verdict",
    "spotchaos.backends.raycluster.train": "spotchaos.training.multirank.ray_train",
    "spotchaos.state_diff": "spotchaos.training.state.diff",
    "spotchaos.state_formats": "spotchaos.training.state.formats",
    "spotchaos.checkpoint_reader": "spotchaos.training.state.checkpoint_reader",
    "spotchaos.confined": "spotchaos.training.state.confined",
    "spotchaos.declare": "spotchaos.config.declare",
    "spotchaos.container": "spotchaos.config.container",
    "spotchaos.presets": "spotchaos.config.presets",
    "spotchaos.options": "spotchaos.pytest_glue.options",
    "spotchaos.profiles": "spotchaos.config.profiles",
    "spotchaos.plan": "spotchaos.faults.plan",
    "spotchaos.notices": "spotchaos.faults.notices",
    "spotchaos.crashpoint": "spotchaos.faults.crashpoint",
    "spotchaos.processes": "spotchaos.host.processes",
    "spotchaos.leftovers": "spotchaos.host.leftovers",
    "spotchaos.gpu": "spotchaos.host.gpu",
    "spotchaos.gpu_leases": "spotchaos.host.gpu_leases",
    "spotchaos.ports": "spotchaos.host.ports",
    "spotchaos.safefs": "spotchaos.safety.safefs",
    "spotchaos.redact": "spotchaos.safety.redact",
    "spotchaos.sanitize": "spotchaos.safety.sanitize",
    "spotchaos.overhead": "spotchaos.budgets.overhead",
    "spotchaos.advisor": "spotchaos.budgets.advisor",
    "spotchaos.cost": "spotchaos.budgets.cost",
    "spotchaos.pytest_session": "spotchaos.pytest_glue.pytest_session",
    "spotchaos.scenario": "spotchaos.pytest_glue.scenario",
    "spotchaos.stash": "spotchaos.pytest_glue.stash",
    "spotchaos.hooks": "spotchaos.pytest_glue.hooks",
    "spotchaos.needs": "spotchaos.families.needs",
    "spotchaos.serving.spec": "spotchaos.config.services",
    "spotchaos.testimage": "spotchaos.backends.testimage",
    "spotchaos.runner": "spotchaos.session",  # 0.2: Session is the session; its core is spotchaos.core
}


def new_path(old: str) -> str | None:
    """Where an old dotted path lives now (a moved package carries its submodules along)."""
    if old in MOVED:
        return MOVED[old]
    head = old.rpartition(".")[0]
    while head:
        if head in MOVED:
            return MOVED[head] + old[len(head) :]
        head = head.rpartition(".")[0]
    return None


class _Alias:
    """A loader that hands over the module already imported under its new name. importlib sets
    ``__spec__`` on whatever ``create_module`` returns; the module's own spec is put back."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.own_spec = None

    def create_module(self, spec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:  # the target ran already, under its own name
        module.__spec__ = self.own_spec


def find_spec(fullname: str):
    """The spec of an old path: the new module under the old name; None for a name never moved."""
    moved = new_path(fullname)
    if moved is None:
        return None
    warnings.warn(
        f"{fullname} moved to {moved}; the old path goes in spotchaos {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )
    import importlib.util

    return importlib.util.spec_from_loader(fullname, _Alias(moved))
