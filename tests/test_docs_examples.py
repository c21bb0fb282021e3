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
import textwrap
from pathlib import Path

import pytest

from .helpers import ROOT

FENCE = re.compile(r"^```python( fragment)?\n(.*?)^```", re.S | re.M)
TOML_FENCE = re.compile(r"^([ \t]*)```toml\n(.*?)^\1```", re.S | re.M)  # indented in a list item too
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


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


def _toml_blocks() -> list[tuple[str, str]]:
    found = []
    for page in DOCS:
        text = page.read_text()
        for match in TOML_FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))))
    return found


TOML_BLOCKS = _toml_blocks()


@pytest.mark.unit
def test_the_docs_have_toml_blocks_to_check():
    assert len(TOML_BLOCKS) >= 30


@pytest.mark.unit
@pytest.mark.parametrize(("where", "code"), TOML_BLOCKS, ids=[w for w, _ in TOML_BLOCKS])
def test_a_docs_toml_block_loads_as_a_pyproject_would(where, code, tmp_path):
    """Every declaration a user copies loads through the same loader as their pyproject.toml: a key
    renamed or a value's shape changed fails here, not in their first run (issue 62)."""
    from spotchaos.config.jobs import load_settings

    assert "[tool.spotchaos" in code, f"{where}: a block a user copies names its table"
    (tmp_path / "pyproject.toml").write_text(code)
    settings = load_settings(tmp_path / "pyproject.toml")
    declared = {
        (kind, name) for kind, name in re.findall(r"^\[tool\.spotchaos\.(jobs|services)\.([\w-]+)\]", code, re.M)
    }
    loaded = {("jobs", j.name) for j in settings.jobs} | {("services", s.name) for s in settings.services}
    assert declared <= loaded, f"{where}: {sorted(declared - loaded)} did not load"


@pytest.mark.unit
def test_the_job_key_table_is_generated_from_the_dataclass_and_covers_every_key():
    """docs/job-keys.md replaces the hand-kept copies (issue 62): a key added to the loader without
    a meaning, or a page not regenerated, fails here."""
    from spotchaos.config.jobs import _JOB_KEYS
    from spotchaos.config.keys import MEANINGS, job_keys_markdown

    assert set(MEANINGS) == set(_JOB_KEYS), set(_JOB_KEYS) ^ set(MEANINGS)
    page = (ROOT / "docs" / "job-keys.md").read_text()
    assert page == job_keys_markdown(), "regenerate: python -m spotchaos.config.keys > docs/job-keys.md"


@pytest.mark.unit
def test_every_relative_link_of_the_readme_and_docs_names_a_file_that_exists():
    """A page moved or split (docs/measurements.md into docs/measurements/, issue 62) must not leave
    a reader at a link to nothing: every relative link resolves from the page that holds it."""
    broken = []
    for page in DOCS:
        text = re.sub(r"(?s)```.*?```", "", page.read_text())  # links inside code blocks are examples
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


# a command line a reader types: pytest or the spotchaos CLI, from the venv or not, in a chain of commands
COMMAND = re.compile(r"^(?:\.venv/bin/)?(pytest|spotchaos|python3? -m (?:pytest|spotchaos))(?=\s|$)")
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}


def _shell_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each fenced block in a shell's language or none, fences paired
    in order (a regex would pair a block's closing fence with the next one's opening)."""
    blocks, current, language, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and current is None:
            current, language, start = [], fence.group(1).split()[0] if fence.group(1) else "", number + 1
        elif fence:
            if language in SHELL_BLOCKS:
                blocks.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands() -> list[tuple[str, str, list[str]]]:
    """(where, which program, its arguments) of every command line in a shell block of the README and docs."""
    import shlex

    found = []
    for page in DOCS:
        for start, lines in _shell_blocks(page.read_text()):
            logical = "\n".join(lines).replace("\\\n", " ")  # a command continued on the next line
            for offset, line in enumerate(logical.splitlines()):
                for part in re.split(r"\s&&\s", line.split(" #")[0].strip()):
                    program = COMMAND.match(part.strip())
                    if program is None:
                        continue
                    args = shlex.split(part.strip()[program.end() :])
                    found.append((f"{page.relative_to(ROOT)}:{start + offset}", program.group(1).split()[-1], args))
    return found


COMMANDS = _commands()


@pytest.mark.unit
def test_the_docs_have_commands_to_check():
    programs = {program for _, program, _ in COMMANDS}
    assert len(COMMANDS) >= 15 and programs == {"pytest", "spotchaos"}, COMMANDS


@pytest.mark.unit
@pytest.mark.parametrize(("where", "program", "args"), COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_a_documented_command_parses_as_its_program_would(where, program, args, pytestconfig):
    """Every pytest or spotchaos command of the README and docs, held to the real parsers: a
    ``--spotchaos-*`` option the plugin declares, a marker expression of declared markers, a path
    that exists; a CLI command the ``spotchaos`` parser accepts. What it does is the other tests'."""
    if program == "spotchaos":
        from spotchaos.cli import _parser

        try:
            _parser().parse_args(args)
        except SystemExit as exc:  # --version exits 0 once it printed; a refusal exits 2
            assert exc.code == 0, f"{where}: spotchaos {' '.join(args)}: the CLI refuses it"
        return
    declared = set(re.findall(r'"(--spotchaos[a-z-]*)"', (ROOT / "spotchaos" / "plugin.py").read_text()))
    markers = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    from spotchaos.faults.plan import Plan

    pyargs = "--pyargs" in args
    for index, arg in enumerate(args):
        option, _, value = arg.partition("=")
        if option.startswith("--spotchaos"):
            assert option in declared, f"{where}: {option} is no option of the plugin"
        if option == "--spotchaos-plan" and value:
            Plan.parse(value)  # ConfigError: the plan a reader copies does not parse
        elif index and args[index - 1] == "--spotchaos-plan":
            Plan.parse(arg)
        if pyargs and not arg.startswith("-") and arg.startswith("spotchaos."):
            module = arg.split("::")[0]
            assert importlib.util.find_spec(module) is not None, f"{where}: --pyargs {module}: no such module"
        elif args[index - 1] == "-m" and index:
            names = set(re.findall(r"[A-Za-z_]\w*", arg)) - {"not", "and", "or"}
            assert names <= markers, f"{where}: -m {arg!r} names undeclared markers {names - markers}"
        elif not arg.startswith("-") and "/" in arg and not args[index - 1].startswith("-"):
            path = arg.split("::")[0]
            assert (ROOT / path).exists() or path.startswith("spotchaos-report/"), f"{where}: {path} does not exist"
