"""A light core: the wheel built from the checkout (``pip wheel .``) installs no torch, moto,
matplotlib or docker SDK, holds what runs from the package (the built-in scenarios, the zygote, the
report's template), and a job that only uses the probe is still gated by ``pytest --spotchaos``, for
real, in a fresh venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

from .helpers import ROOT, fresh_venv

TRAINER = """
    import json, os, signal, time
    from spotchaos.probe import Probe, checkpoint_dir_from_env

    stop = False
    def on_sigterm(signum, frame):
        global stop
        stop = True
    signal.signal(signal.SIGTERM, on_sigterm)

    probe = Probe.from_env()
    probe.start()
    root = checkpoint_dir_from_env()
    path = os.path.join(root, "state.json")
    step, weights = 0, [0.5, -0.25]
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        step, weights = saved["step"] + 1, saved["weights"]
        probe.resume(saved["step"], "file://" + path)
    for step in range(step, 12):
        weights = [w * 0.9 + 0.01 * step for w in weights]
        probe.step(step, sum(weights))
        if step % 3 == 2 or stop:
            with open(path + ".tmp", "w") as f:
                json.dump({"step": step, "weights": weights}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            probe.checkpoint(step, seconds=0.0, nbytes=os.path.getsize(path), uri="file://" + path)
        if stop:
            raise SystemExit(0)
        time.sleep(0.05)
    probe.final({"weights": weights}, step=11)
"""


def test_the_core_install_has_no_heavy_package_and_gates_a_probe_only_job(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY")
    }  # the installed copy only
    # what a user without a package index does: build the wheel from the checkout, install it
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("spotchaos-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    needed = {
        "spotchaos/scenarios/test_preemption.py",  # the built-in scenarios run from the installed package
        "spotchaos/templates/report.html.j2",
        "spotchaos/host/warm/zygote.py",  # run by the job's own interpreter, by path
        "spotchaos/host/warm/torchrun_ranks.py",  # torchrun's agent, forking its ranks, by path
        "spotchaos/py.typed",
    }
    assert needed <= names, f"the wheel lacks {sorted(needed - names)}"
    venv = tmp_path / "venv"
    python = fresh_venv(venv, str(wheel), env=env, timeout=900)
    heavy = ("torch", "moto", "boto3", "matplotlib", "jinja2", "docker", "numpy", "pytest_benchmark")
    probe = f"import importlib.util as u; print([m for m in {heavy!r} if u.find_spec(m)])"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, timeout=60, env=env)
    assert found.stdout.strip() == "[]", f"the core install brought {found.stdout.strip()}"

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent(TRAINER))
    (project / "pyproject.toml").write_text('[tool.spotchaos.jobs.probe-only]\ncommand = ["python", "train.py"]\n')
    (project / "test_gate.py").write_text(
        "def test_gate(spotchaos, spotchaos_job):\n"
        "    spotchaos.check(spotchaos_job, 'sigkill@4')\n"
        "    spotchaos.check(spotchaos_job, 'sigterm@7')\n"
    )
    result = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "--spotchaos", "test_gate.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    where = subprocess.run(
        [python, "-c", "import spotchaos; print(spotchaos.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    assert str(venv) in where.stdout, f"spotchaos came from {where.stdout.strip()}, not the install under test"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "report.html not written:" in result.stdout
    assert "pip install 'spotchaos[html]'" in result.stdout
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    assert report["summary"] == {"scenarios": 2, "passed": 2, "failed": 0}
    assert report["environment"]["torch"] is None
    assert (project / "spotchaos-report" / "report.md").is_file()
