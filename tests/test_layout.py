"""The house as docs/architecture.md draws it, held against the code on every run (read, not run).

The layering rules are the design's (``../shared/DESIGN.md``): no module below the pytest glue
imports pytest, the probe imports nothing else of spotchaos, no two wings import each other in a
circle; and the size figures of issue 36: at most 15 modules at the top, no function over 80
lines, no class over 300. A change that breaks one fails here with the file and the name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .helpers import ROOT

PACKAGE = ROOT / "spotchaos"
FILES = sorted(p for p in PACKAGE.rglob("*.py"))
GLUE = {"spotchaos.plugin", "spotchaos.scenarios"}  # and the pytest_glue package
SCRIPTS = ("confined", "crashpoint")  # run inside the job, by path: not part of the import graph


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every spotchaos module ``path`` imports, relative imports resolved (lazy ones included)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # from ..x import y: up level-1 packages from this one
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if (ROOT / full.replace(".", "/")).with_suffix(".py").exists() else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "spotchaos" or name.startswith("spotchaos.") or name == "pytest"}


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@pytest.mark.unit
def test_at_most_fifteen_modules_stand_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 15, top


@pytest.mark.unit
def test_no_function_over_80_lines_and_no_class_over_300():
    long = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            limit = {ast.FunctionDef: 80, ast.AsyncFunctionDef: 80, ast.ClassDef: 300}.get(type(node))
            if limit is not None and size > limit:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {size} lines (at most {limit})")
    assert not long, long


# the probe integrations' step(step, loss, *, model, batch, lr, epoch, seconds): each keyword is what
# a framework's callback hands over, and a parameter object would be one more thing every callback builds
SEVEN_PARAMETERS = {"spotchaos/integrations/_report.py:step"}


@pytest.mark.unit
def test_no_function_takes_more_than_6_parameters_but_the_integrations_step():
    """Issue 62: a parameter object where a function takes more than 6 (``Allowed``, ``StorageChaos``...)."""
    many = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                count = len(names) - (names[:1] in (["self"], ["cls"]))
                where = f"{path.relative_to(ROOT)}:{node.name}"
                if count > 6 and not (count == 7 and where in SEVEN_PARAMETERS):
                    many.append(f"{where} ({count})")
    assert not many, many


@pytest.mark.unit
def test_no_code_below_the_loader_tests_a_launchers_name():
    """A launcher is an object (config/launchers.py): its traits answer the engine, and its way to
    start is registered by name once, at the edge (issue 62: 31 ``launcher ==`` tests)."""
    found = []
    for path in FILES:
        if path.parent.name == "config":
            continue  # the loader checks the declared name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "launcher" for side in (node.left, *node.comparators)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


@pytest.mark.unit
def test_no_code_below_the_loader_tests_a_faults_name():
    """A fault answers what it is (faults/traits.py: reruns, hangs, on_node, warns, metadata,
    armed_by_environment...): no ``fault == "rerun"``, ``fault == "sigkill"`` or
    ``fault.startswith("crash-rank")`` in plans, strategies, the engine, the verdict or the report
    (which tells a crash point by its ``at_fs_event``). Only the loader and the modules that define
    the faults by name are left out."""
    found = []
    for path in FILES:
        if path.parent.name == "config" or (path.parent.name == "faults" and path.name != "plan.py"):
            continue  # where faults are defined by name and declarations checked
        for node in ast.walk(ast.parse(path.read_text())):
            named = None
            strings = [c for c in getattr(node, "comparators", []) if isinstance(c, ast.Constant)]
            if isinstance(node, ast.Compare) and any(isinstance(c.value, str) for c in strings):
                named = node.left
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                named = node.func.value if node.func.attr in ("startswith", "endswith", "removeprefix") else None
            if (
                (isinstance(named, ast.Attribute) and named.attr == "fault")
                or (isinstance(named, ast.Name) and named.id == "fault")
                or (named is not None and _is_fault_get(named))
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def _is_fault_get(node: ast.AST) -> bool:
    """``x.get("fault")``: a fault's name read from a record."""
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "fault"
    )


@pytest.mark.unit
def test_only_the_pytest_glue_imports_pytest_and_the_probe_imports_nothing_of_spotchaos():
    offenders = []
    for path in FILES:
        module = _module(path)
        imported = _imports(path)
        in_glue = module.startswith(("spotchaos.pytest_glue", *GLUE))
        if "pytest" in imported and not in_glue:
            offenders.append(f"{module} imports pytest")
        # what runs in the job's own process: the probe, the warm interpreter that forks its attempts
        in_the_job = ("spotchaos.probe", "spotchaos.host.warm.zygote", "spotchaos.host.warm.torchrun_ranks")
        if module in in_the_job and imported - {"pytest"}:
            offenders.append(f"{module} (run in the job's process) imports {sorted(imported)}")
    assert not offenders, offenders


@pytest.mark.unit
def test_no_two_wings_import_each_other_in_a_circle():
    arrows: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for path in FILES:
        module = _module(path)
        if any(part in SCRIPTS for part in module.split(".")):
            continue
        for target in _imports(path) - {"pytest", "spotchaos"}:
            a, b = _wing(module), _wing(target)
            if a != b:
                arrows.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{module} -> {target}")

    def path_back(start: str, goal: str, seen: frozenset = frozenset()) -> list[str] | None:
        if start == goal:
            return [goal]
        for step in sorted(arrows.get(start, ())):
            if step not in seen and (rest := path_back(step, goal, seen | {start})) is not None:
                return [start, *rest]
        return None

    circles = []
    for a, targets in sorted(arrows.items()):
        for b in sorted(targets):
            back = path_back(b, a)
            if back is not None:
                circles.append(f"{why[(a, b)]}, and back: {' -> '.join(back)}")
    assert not circles, circles
