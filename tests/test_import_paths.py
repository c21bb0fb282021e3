"""The house's layout holds, and the import paths of the flat layout (0.1) still work for one release.

The modules moved into wings (``training/``, ``config/``, ``faults/``, ``host/``, ``safety/``,
``budgets/``, ``pytest_glue/``); a user's ``from spotchaos.engine import run_job`` must still give
the very object the new path does (a monkeypatch through either name patches both), with a warning
that names the new path.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import spotchaos
from spotchaos import _moved

from .helpers import ROOT


@pytest.mark.unit
@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_import_path_is_the_new_module(old):
    new = _moved.MOVED[old]
    if "confined" in old or "crashpoint" in old:  # folders of scripts the job runs, not packages
        assert (ROOT / new.replace(".", "/")).is_dir()
        return
    assert importlib.util.find_spec(new) is not None, f"{new} is gone"
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert new.__spec__.name == {new!r}, new.__spec__\n"
        f"assert any({new!r} in str(w.message) and w.category is DeprecationWarning for w in seen), seen\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.unit
def test_the_documented_paths_still_import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from spotchaos.plan import Plan

        from spotchaos.config import JobSpec
        from spotchaos.strategies import preemption_plans

    assert JobSpec is spotchaos.JobSpec and Plan is spotchaos.Plan and callable(preemption_plans)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = importlib.import_module("spotchaos.config").NoSuchName


@pytest.mark.unit
def test_an_unknown_old_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spotchaos.no_such_module")
