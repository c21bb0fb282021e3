"""Every Python example of the README and docs/: it parses, every name it uses is defined, every
spotchaos name it imports exists, and the examples that can run on their own are run for real.

Excerpts of a user's own code (a ``Trainer`` they built, their ``train_step``) are fenced
```` ```python fragment ````: they are checked to parse and to import what exists, not for names
they leave to the reader.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .helpers import ROOT

FENCE = re.compile(r"^```python( fragment)?\n(.*?)^```", re.S | re.M)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _examples() -> list[tuple[str, bool, str]]:
    found = []
    for page in DOCS:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", bool(match.group(1)), match.group(2)))
    return found


EXAMPLES = _examples()
# the examples that run on their own, from the repository's root, against its own pyproject.toml
RUNNABLE = {"docs/usage.md", "docs/serving.md"}


@pytest.mark.unit
def test_the_docs_have_python_examples_to_check():
    assert len(EXAMPLES) >= 14 and sum(not fragment for _, fragment, _ in EXAMPLES) >= 7


@pytest.mark.unit
@pytest.mark.parametrize(("where", "fragment", "code"), EXAMPLES, ids=[w for w, _, _ in EXAMPLES])
def test_a_docs_example_parses_and_imports_what_exists(where, fragment, code):
    tree = ast.parse(code, filename=where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "spotchaos":
            defined = _defined_names(node.module)
            missing = [a.name for a in node.names if a.name not in defined]
            assert not missing, f"{where}: {node.module} has no {', '.join(missing)}"


def _defined_names(module: str) -> set[str]:
    """The names a spotchaos module defines, read from its source without importing it (an
    integration would import its framework): top-level definitions, imports and lazy names."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    names: set[str] = set()
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    if spec.submodule_search_locations:  # a package: its submodules too
        names.update(p.stem for p in Path(spec.origin).parent.iterdir() if p.suffix == ".py" or p.is_dir())
    return names


@functools.cache
def _undefined_names() -> dict[str, str]:
    """ruff's pyflakes checks for undefined names over every complete example at once, by example."""
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for index, (where, fragment, code) in enumerate(EXAMPLES):
            if not fragment:
                path = Path(folder, f"example_{index}.py")
                path.write_text(code)
                files[path.name] = where
        ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
        result = subprocess.run(
            [
                ruff,
                "check",
                "--no-cache",
                "--isolated",
                "--select",
                "F821,F822,F823",
                "--output-format",
                "concise",
                ".",
            ],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
    found: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name = line.split(":", 1)[0]
        if name in files:
            found[files[name]] = found.get(files[name], "") + line + "\n"
    return found


@pytest.mark.unit
@pytest.mark.parametrize("where", [w for w, f, _ in EXAMPLES if not f])
def test_a_docs_example_defines_every_name_it_uses(where):
    """An undefined name (docs/serving.md once used a ``settings`` it never made) is what a reader
    copying the example meets first: ruff's pyflakes checks find it."""
    assert where not in _undefined_names(), f"{where}:\n{_undefined_names()[where]}"


@pytest.mark.parametrize(
    ("where", "code"),
    [(w, c) for w, f, c in EXAMPLES if not f and w.split(":")[0] in RUNNABLE and "Session(" in c],
    ids=[w for w, f, c in EXAMPLES if not f and w.split(":")[0] in RUNNABLE and "Session(" in c],
)
def test_a_docs_example_of_the_python_api_runs_as_written(where, code, tmp_path):
    """The Python API's examples, run as a user would paste them, from the repository's root."""
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{where}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{where} printed nothing"
