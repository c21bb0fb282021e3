"""Every benchmark script still imports against the package it measures: two had rotted (a
function renamed, one moved to another module) and failed before measuring anything. Importing
runs none of them (each measures under ``main()``)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from .helpers import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.unit
@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_a_benchmark_script_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(path.parent))  # benchmarks import each other's timers
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
