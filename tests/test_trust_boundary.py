"""The job under test is untrusted code: the harness never follows its links, never unpickles
its files in the pytest process, never reports its own crash (or a fault that never fired) as a
pass, never blocks on its events file, never leaves its processes running, and never lets a
secret reach an artifact. Each test here plays a hostile or careless job for real."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from spotchaos.config.jobs import JobSpec
from spotchaos.errors import ConfigError, JobError
from spotchaos.faults.checkpoint import UnsafeCheckpoint
from spotchaos.faults.plan import Plan
from spotchaos.session import ChaosFailure
from spotchaos.training.engine.run import EngineOptions, run_job

from .helpers import FIXTURES, ROOT, hostile_pickle_job, is_alive, run_pytest, sigint_as_from_a_terminal

VICTIM_TEXT = '{"files": {"model.pt": {"crc32c": "0123abcd"}}}\n' + "precious user data\n" * 64


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- 1. checkpoint faults never follow a link out of the run -------------------------------------


@pytest.mark.parametrize(
    ("link", "hard", "fault", "says"),
    [
        ("model", False, "truncate-zero", "symbolic link"),
        ("model", False, "flip-bit-data", "symbolic link"),
        ("model", False, "swap-older", "symbolic link"),
        ("model", True, "truncate-half", "hard-linked"),
        ("manifest", False, "corrupt-manifest", "symbolic link"),
        ("latest", False, "stale-latest", "symbolic link"),
        ("latest", False, "torn-latest", "symbolic link"),
        ("folder", False, "flip-bit-data", "symbolic link"),
    ],
)
def test_a_checkpoint_holding_a_link_is_refused_and_the_victim_is_untouched(runner, tmp_path, link, hard, fault, says):
    victim = tmp_path / "outside" / "model.pt"
    victim.parent.mkdir()
    victim.write_text(VICTIM_TEXT)
    before = digest(victim)
    command = ["python", str(FIXTURES / "hostile_links.py"), "--victim", str(victim), "--link", link]
    job = JobSpec(name=f"links-{link}", command=(*command, *(["--hard"] if hard else [])), grace_seconds=5)
    with pytest.raises(UnsafeCheckpoint, match=rf"checkpoint .* holds .*{says}.* refuses this checkpoint"):
        runner.check(job, Plan.parse(f"sigkill@3:{fault}"))
    assert digest(victim) == before, "the harness changed a file outside the run"


# --- 2. nothing the job wrote is unpickled in the pytest process ---------------------------------


def test_a_checkpoint_that_runs_code_when_unpickled_never_runs_it_in_pytest(runner, tmp_path):
    """The script's checkpoint holds an object whose unpickling appends the loading process's pid
    to a marker file. The harness reads the step and the final weights from it, but the pickle's
    code may only run in the job's own processes (the script itself, or the confined loader)."""
    marker = tmp_path / "marker"
    job = hostile_pickle_job("pickle-bomb", str(marker), steps=6)
    verdict = runner.check(job, Plan.parse("sigkill@3"))
    assert verdict.passed and verdict.damage == []
    loaders = marker.read_text().split()
    assert loaders, "the checkpoint was never read in full: the test proves nothing"
    assert str(os.getpid()) not in loaders, "the job's pickle ran code inside the pytest process"


# --- 3 and 9. a crash of the harness, or of the test, is never a pass ---------------------------

CRASHING_PROJECT = {
    "pyproject.toml": """
        [tool.spotchaos.jobs.bad-fp]
        command = ["python", "bad_fp.py"]
        parametrize = false
        [tool.spotchaos.jobs.fine]
        command = ["python", "fine.py"]
        parametrize = false
    """,
    "bad_fp.py": """
        import sys
        from spotchaos.probe import Probe
        probe = Probe.from_env()
        probe.start()
        sys.stderr.write("\\x1b[2J\\x1b[32mALL GREEN [click](http://evil.example)\\n")
        sys.stderr.flush()
        probe.emit("step", step=0, loss=(1.0).hex(), fp=["a", "b"])
    """,
    "fine.py": """
        import time
        from spotchaos.probe import Probe
        probe = Probe.from_env()
        probe.start()
        for step in range(6):
            probe.step(step, 1.0 / (step + 1))
            time.sleep(0.05)
        probe.final({}, step=5)
    """,
    "test_crash.py": """
        import pytest

        @pytest.mark.spotchaos(jobs=["bad-fp"])
        def test_malformed_event(spotchaos, spotchaos_job):
            spotchaos.check(spotchaos_job, "sigkill@2")

        @pytest.mark.spotchaos(jobs=["fine"])
        def test_fails_after_the_verdict(spotchaos, spotchaos_job):
            spotchaos.check(spotchaos_job, "sigkill@2")
            raise ValueError("boom after the verdict")
    """,
}


def write_project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def test_a_crash_while_running_or_judging_is_an_error_everywhere_never_a_pass(tmp_path):
    project = write_project(tmp_path, CRASHING_PROJECT)
    result = run_pytest(project, "--spotchaos", "-p", "no:randomly", "test_crash.py")
    assert result.returncode == 1, result.stdout[-3000:]
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    by_test = {s["scenario"].split("::")[1].split("[")[0]: s for s in report["scenarios"]}
    malformed, after = by_test["test_malformed_event"], by_test["test_fails_after_the_verdict"]
    assert not malformed["passed"] and "field 'fp' must map names to strings or numbers" in malformed["error"]
    assert not after["passed"] and "ValueError: boom after the verdict" in after["error"]
    assert report["decision"]["decision"] == "change" and report["summary"]["passed"] == 0
    markdown = (project / "spotchaos-report" / "report.md").read_text()
    assert markdown.count("❌ error") == 2 and "✅" not in markdown
    assert "[click](" not in markdown and "\x1b" not in markdown  # the job's markup and escapes are inert
    summary = result.stdout.split("spotchaos ==")[-1]
    assert "bit-exact" not in summary and summary.count("ERROR") == 2, summary
    assert "\x1b[2J" not in result.stdout and "\\x1b[2J" in result.stdout  # shown, never sent to the terminal


# --- 4. the events file: a regular file, read without blocking, bounded --------------------------


def run_guarded(job: JobSpec, workdir: Path, seconds: float = 60):
    """run_job in a thread, so a harness that blocks fails this test instead of hanging the suite."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["record"] = run_job(job, Plan(), workdir, EngineOptions(root=ROOT))
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the harness was still blocked after {seconds} s"
    return outcome


@pytest.mark.parametrize(
    ("trick", "says"),
    [
        ("os.mkfifo(path)", r"events.jsonl is a FIFO"),
        ("os.symlink('/dev/zero', path)", r"events.jsonl is a symbolic link \(events.jsonl -> /dev/zero\)"),
        ("open(path, 'wb').write(b'x' * (3 << 20))", r"longer than 1048576 bytes"),
        (
            """open(path, 'w').write('{"event": "start", "schema": 1}\\n{"event": "step", "step": 0, '
            '"loss": "0x1p+0", "memory": {"max_rss": ' + '9' * 4000 + '}}\\n')""",
            r"events.jsonl line 2: 'step' event field 'memory.max_rss' holds an integer of 4000 digits",
        ),
        (
            "open(path, 'w').write('{\"event\": \"x\", \"a\": ' + '[' * 100000 + '\\n')",
            r"events.jsonl line 1: an event nested deeper",
        ),
    ],
    ids=["fifo", "dev-zero", "endless-line", "4000-digit-number", "100000-deep"],
)
def test_events_file_tricks_end_in_one_clear_error(script, tmp_path, trick, says):
    command = script(
        f"""
        import os, time
        path = os.environ["SPOTCHAOS_EVENTS"]
        {trick}
        time.sleep(60)
        """
    )
    outcome = run_guarded(JobSpec(name="tricky", command=command, start_timeout_seconds=30), tmp_path / "run")
    assert isinstance(outcome.get("error"), JobError), outcome
    assert __import__("re").search(says, str(outcome["error"])), outcome["error"]


# --- 5. a fault that never fired fails; an empty plan is an error --------------------------------


def probe_steps(count: int, pause: float) -> str:
    """A job of ``count`` probe steps and no checkpoint (a restart starts it over), indented as the
    project files of these tests are (each is dedented when written)."""
    body = f"""import time
from spotchaos.probe import Probe
probe = Probe.from_env()
probe.start()
for step in range({count}):
    probe.step(step, 1.0)
    time.sleep({pause})
probe.final({{}}, step={count - 1})
"""
    return "\n" + textwrap.indent(body, " " * 8)


NINE_STEPS = probe_steps(9, 0.02)


def test_a_planned_fault_that_never_fired_fails_naming_it(runner, script):
    job = JobSpec(name="nine-steps", command=script(NINE_STEPS))
    with pytest.raises(ChaosFailure, match=r"sigterm@99999 never fired: attempt 0 ended after step 8"):
        runner.check(job, Plan.parse("sigterm@99999"))
    with pytest.raises(ConfigError, match="an empty plan preempts nothing"):
        runner.check(job, Plan())


@pytest.mark.unit
@pytest.mark.unit
def test_a_fault_the_job_could_not_receive_is_not_reached_and_one_it_outran_never_fired():
    from spotchaos.training.engine.run import _unfired
    from spotchaos.training.trajectory import Attempt, FaultRecord

    def attempt(index, steps, final=True, fault=None):
        events = [{"event": "step", "step": s, "loss": "0x1p+0"} for s in steps]
        events += [{"event": "final", "step": 23, "digests": {}}] if final else []
        return Attempt(index=index, exit_code=0, wall_seconds=1, start_seconds=0.1, events=events, fault=fault)

    notice = FaultRecord("sigterm", 20, 20, 1.0, 1.0)
    plan = Plan.parse("sigterm@20,sigterm@0,sigterm@0")
    # attempt 1 resumed after the last step (nothing to preempt), and there never was an attempt 2
    unfired, not_reached = _unfired(plan, [attempt(0, range(21), final=False, fault=notice), attempt(1, [])])
    assert unfired == [] and len(not_reached) == 2
    assert (
        "no training was left when it started" in not_reached[0] and "training finished in attempt 1" in not_reached[1]
    )
    # the job ran its steps and ended before the planned one: the plan proved nothing
    unfired, _ = _unfired(Plan.parse("sigterm@99"), [attempt(0, range(24))])
    assert unfired == ["sigterm@99 never fired: attempt 0 ended after step 23, before step 99"]


# superscript two, fullwidth five, Arabic-Indic three: str.isdigit() says yes to each
@pytest.mark.parametrize("text", ["sigterm@\u00b2", "sigkill@\uff15", "sigkill@\u0663"])
def test_a_plan_with_non_ascii_digits_is_one_clear_error(text):
    with pytest.raises(ConfigError, match="must look like FAULT@STEP"):
        Plan.parse(text)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["a/b", "..", "../escape", "-x", "a b", ""])
def test_job_names_are_limited_to_a_safe_character_set(name):
    with pytest.raises(ConfigError, match="use letters, digits"):
        JobSpec(name=name, command=("python", "x.py"))


# --- 6. nothing left running: signals to pytest, a SIGKILL of pytest, escaped processes ---------

SLOW_PROJECT = {
    "pyproject.toml": """
        [tool.spotchaos.jobs.slow]
        command = ["python", "slow.py"]
    """,
    "slow.py": """
        import os, subprocess, sys, time
        from spotchaos.probe import Probe
        here = os.path.dirname(os.path.abspath(__file__))
        # a daemon that leaves the job's process group, as a careless launcher does
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        with open(os.path.join(here, "pids"), "w") as f:
            f.write(f"{os.getpid()} {daemon.pid}")
        with open(os.path.join(here, "tmpdir"), "w") as f:
            f.write(os.environ["TMPDIR"])
        probe = Probe.from_env()
        probe.start()
        for step in range(600):
            probe.step(step, 1.0)
            time.sleep(0.2)
        probe.final({}, step=599)
    """,
    "test_slow.py": """
        def test_slow(spotchaos, spotchaos_job):
            spotchaos.check(spotchaos_job, "sigkill@500")
    """,
}


def start_pytest(project: Path, live: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env["SPOTCHAOS_LIVE_DIR"] = str(live)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--spotchaos", *args, "test_slow.py"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )


def wait_for_pids(path: Path, process: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if path.is_file() and len(path.read_text().split()) == 2:
            time.sleep(0.5)  # the job is past its start
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(
        f"the job never started: {process.communicate()[0][-3000:] if process.poll() is not None else ''}"
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_stopping_pytest_ends_every_job_and_writes_a_report_marked_interrupted(tmp_path, signum):
    project = write_project(tmp_path, SLOW_PROJECT)
    pytest_process = start_pytest(project, tmp_path / "live")
    job, daemon = wait_for_pids(project / "pids", pytest_process)
    pytest_process.send_signal(signum)
    output = pytest_process.communicate(timeout=90)[0]
    assert not is_alive(job) and not is_alive(daemon), f"a process of the job survived pytest's {signum.name}"
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    assert report["interrupted"] == signum.name, output[-3000:]
    (scenario,) = report["scenarios"]
    assert scenario["outcome"] == "interrupted" and not scenario["passed"]
    assert report["decision"]["decision"] == "unknown"
    assert f"INTERRUPTED by {signum.name}" in output
    assert f"Interrupted by {signum.name}" in (project / "spotchaos-report" / "report.html").read_text()
    assert f"**Interrupted by {signum.name}**" in (project / "spotchaos-report" / "report.md").read_text()


def test_stopping_an_xdist_controller_ends_the_jobs_its_workers_run(tmp_path):
    """CI cancels the job: SIGTERM reaches the controller only; execnet would SIGKILL a busy worker
    and orphan its trainer, so the controller passes the signal on and the worker ends its jobs."""
    project = write_project(tmp_path, SLOW_PROJECT)
    pytest_process = start_pytest(project, tmp_path / "live", "-n", "1")
    job, daemon = wait_for_pids(project / "pids", pytest_process)
    pytest_process.send_signal(signal.SIGTERM)
    output = pytest_process.communicate(timeout=90)[0]
    time.sleep(0.5)
    assert not is_alive(job) and not is_alive(daemon), f"the worker's job survived: {output[-2000:]}"
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    assert report["interrupted"] == "SIGTERM"


def test_after_a_sigkill_of_pytest_the_next_session_ends_what_it_left(tmp_path):
    project = write_project(tmp_path, SLOW_PROJECT)
    live = tmp_path / "live"
    pytest_process = start_pytest(project, live)
    job, daemon = wait_for_pids(project / "pids", pytest_process)
    pytest_process.kill()
    pytest_process.communicate(timeout=30)
    try:
        assert is_alive(job) and is_alive(daemon), "nothing was left to end: the test proves nothing"
        env = {**os.environ, "SPOTCHAOS_LIVE_DIR": str(live)}
        result = run_pytest(project, "--spotchaos", "test_slow.py", "--collect-only", env=env)
        assert "pytest runs which died had left running" in result.stdout, result.stdout[-3000:]
        assert f"job process group {job}" in result.stdout
        deadline = time.monotonic() + 10
        while (is_alive(job) or is_alive(daemon)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_alive(job) and not is_alive(daemon), "a process the dead session left is still running"
        scratch = Path((project / "tmpdir").read_text())
        assert scratch.name.startswith("spotchaos-tmp-") and not scratch.exists(), "its temporary folder is left"
    finally:
        for pid in (job, daemon):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_that_escapes_the_group_is_ended_with_a_warning_and_temp_files_go_with_the_run(script, tmp_path):
    command = script(
        """
        import os, subprocess, sys, tempfile, time
        from spotchaos.probe import Probe
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        scratch = tempfile.mkdtemp(prefix="pymp-")  # what a DataLoader worker's multiprocessing leaves
        with open(os.path.join(os.path.dirname(__file__), "pids"), "w") as f:
            f.write(f"{daemon.pid} {scratch}")
        probe = Probe.from_env()
        probe.start()
        probe.step(0, 1.0)
        probe.final({}, step=0)
        """
    )
    record = run_job(JobSpec(name="escapes", command=command), Plan(), tmp_path / "run", EngineOptions(root=ROOT))
    daemon, scratch = (tmp_path / "pids").read_text().split()
    time.sleep(0.2)
    assert not is_alive(int(daemon)), "the escaped daemon is still running"
    (escaped,) = record.attempts[0].escaped
    assert escaped.startswith(f"pid {daemon} (")
    assert Path(scratch).name.startswith("pymp-") and Path(scratch).parent.name.startswith("spotchaos-tmp-")
    assert not Path(scratch).exists() and not Path(scratch).parent.exists()  # gone with the attempt


def test_a_process_that_drops_its_environment_and_its_group_is_still_found_by_ancestry(script, tmp_path):
    """What ``env -i``, ``sudo`` or a launcher does: a helper in a session of its own with a clean
    environment (no run marker), which starts a grandchild the same way. The harness is the
    subreaper: both come back to it as orphans and are ended, named in the warning."""
    command = script(
        """
        import os, subprocess, sys
        from spotchaos.probe import Probe
        here = os.path.dirname(os.path.abspath(__file__))
        grandchild = (
            "import subprocess, sys, time; "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True, env={}); "
            f"open({os.path.join(here, 'grandchild')!r}, 'w').write(str(g.pid)); time.sleep(300)"
        )
        helper = subprocess.Popen([sys.executable, "-c", grandchild], start_new_session=True, env={})
        with open(os.path.join(here, "helper"), "w") as f:
            f.write(str(helper.pid))
        probe = Probe.from_env()
        probe.start()
        probe.step(0, 1.0)
        while not os.path.exists(os.path.join(here, "grandchild")):
            pass
        probe.final({}, step=0)
        """
    )
    record = run_job(JobSpec(name="drops-env", command=command), Plan(), tmp_path / "run", EngineOptions(root=ROOT))
    helper = int((tmp_path / "helper").read_text())
    grandchild = int((tmp_path / "grandchild").read_text())
    try:
        assert not is_alive(helper) and not is_alive(grandchild), "a process that dropped its environment survived"
        escaped = record.attempts[0].escaped
        assert any(e.startswith(f"pid {helper} (") for e in escaped), escaped
        assert any(e.startswith(f"pid {grandchild} (") for e in escaped), escaped
    finally:
        for pid in (helper, grandchild):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- 7. secrets: every window, every encoding, the jobs' own env secrets, kept run logs ----------

SECRET = "sk-live-7fQ2mZ9xLp4RtW8vN3bK"

LEAKY_PROJECT = {
    "pyproject.toml": f"""
        [tool.spotchaos.jobs.leaky]
        command = ["python", "leaky.py"]
        env = {{ HF_TOKEN = "{SECRET}" }}
    """,
    "leaky.py": """
        import os, sys, time
        from spotchaos.probe import Probe
        token = os.environ["HF_TOKEN"]
        print("retrying with token tail", token[len(token) // 2 :], file=sys.stderr, flush=True)
        probe = Probe.from_env()
        probe.start()
        for step in range(4):
            probe.step(step, 1.0)
            time.sleep(0.05)
        probe.final({}, step=3)
    """,
    "test_leaky.py": f"""
        import base64

        def test_leaky(spotchaos, spotchaos_job, record_property):
            record_property("auth", base64.b64encode(b"user:{SECRET}").decode())
            spotchaos.check(spotchaos_job, "sigkill@1")
    """,
}


def test_a_jobs_own_env_secret_fails_its_scenario_is_redacted_in_kept_logs_and_its_encoding_fails_the_session(
    tmp_path,
):
    project = write_project(tmp_path, LEAKY_PROJECT)
    result = run_pytest(project, "--spotchaos", "--spotchaos-keep-runs", "--junitxml=junit.xml", "test_leaky.py")
    assert "1 failed" in result.stdout, result.stdout[-3000:]
    assert "a secret (HF_TOKEN, or 8 characters of it, or its encoding) appears in: attempt-0/stderr.log" in (
        result.stdout
    ), "a job printing its own secret fails the scenario that ran it"
    assert result.returncode == 1
    leaks = result.stdout.split("FAILED: a secret (or 8 characters of one, or its encoding) appears in:")[1]
    leaks = leaks.splitlines()[0]
    assert "junit.xml" in leaks and "stderr.log" not in leaks and "report" not in leaks
    logs = list((project / "spotchaos-report" / "runs").rglob("stderr.log"))
    assert logs and all(SECRET[len(SECRET) // 2 :] not in log.read_text() for log in logs)
    assert any("[REDACTED]" in log.read_text() for log in logs)


@pytest.mark.unit
@pytest.mark.parametrize(
    "leak",
    [
        SECRET,
        SECRET[len(SECRET) // 2 :],  # its second half, on its own line
        SECRET[5:13],  # any 8 characters
        base64.b64encode(f"user:{SECRET}".encode()).decode(),  # HTTP basic auth
        base64.urlsafe_b64encode(SECRET.encode()).decode(),
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
        "https://hub.example/?token=" + SECRET.replace("-", "%2D"),
    ],
    ids=["whole", "second-half", "window", "basic-auth", "urlsafe-b64", "hex", "HEX", "url-encoded"],
)
def test_every_window_and_encoding_of_a_secret_is_redacted_and_found(leak):
    from spotchaos.safety.redact import REDACTED, find_leaks, redact

    text = f"job said: {leak} (done)"
    clean = redact(text, [SECRET])
    assert REDACTED in clean and clean.startswith("job said: ") and clean.endswith(" (done)")
    assert find_leaks({"stderr.log": text, "clean.log": clean}, SECRET) == ["stderr.log"]


GITHUB_PAT = "ghp_" + "Zq7Lm2Xv9Rt4Wb8Nc3Kd5Hj6Fg1Ps0Ay2Eu7I"[:36]
SIGNING_KEY = "Zx81kQp0LmA7vR3tYw9eBn4C"
WEBHOOK = "https://hooks.slack.com/services/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"
OTHER_WEBHOOK = "https://alerts.example.internal/hooks/T0ABC1234/Xk2Lr8Vb4Nq7Wm1Zt5Yc9Hd3"  # a host no detector knows
DB_PASSWORD_IN_URL = "s3cretDBpw1"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaS1ib3QifQ.Qm9ndXNTaWduYXR1cmVGb3JUZXN0cw"
SHAPED_PROJECT = {
    "pyproject.toml": f"""
        [tool.spotchaos.jobs.shaped]
        command = ["python", "shaped.py"]

        [tool.spotchaos.jobs.shaped.env]
        DATABASE_URL = "postgresql://admin:{DB_PASSWORD_IN_URL}@db.internal/app"
        GITHUB_PAT = "{GITHUB_PAT}"
        SLACK_WEBHOOK_URL = "{WEBHOOK}"
        ALERT_WEBHOOK_URL = "{OTHER_WEBHOOK}"
        SIGNING_KEY = "{SIGNING_KEY}"
    """,
    ".env": f"GITHUB_PAT={GITHUB_PAT}\n",
    "shaped.py": f"""
        import json, os, sys
        from spotchaos.probe import Probe, checkpoint_dir_from_env
        folder = checkpoint_dir_from_env()
        os.makedirs(folder, exist_ok=True)
        names = ("DATABASE_URL", "GITHUB_PAT", "SLACK_WEBHOOK_URL", "ALERT_WEBHOOK_URL", "SIGNING_KEY")
        with open(os.path.join(folder, "run_config.json"), "w") as f:  # a kept file of no log's name
            json.dump({{n: os.environ[n] for n in names}}, f)
        with open(os.path.join(folder, "train_log.txt"), "w") as f:
            f.write("session token {JWT}\\n")  # a credential by its shape alone
        notes = os.path.join(folder, "notes.log")
        if not os.path.exists(notes):
            os.link(os.path.abspath(".env"), notes)  # a kept log that is a hard link to the project's .env
        filler = ("step 0 loss 1.0 " * 8 + "\\n").encode()
        out = sys.stdout.buffer
        for _ in range((17 << 20) // len(filler)):  # past the first 16 MiB of the log
            out.write(filler)
        out.write(("late: " + os.environ["GITHUB_PAT"] + "\\n").encode())
        out.flush()
        print("connecting to", os.environ["DATABASE_URL"], "as", os.environ["SIGNING_KEY"], flush=True)
        print("alerts go to", os.environ["ALERT_WEBHOOK_URL"], flush=True)
        probe = Probe.from_env()
        probe.start()
        for step in range(3):
            probe.step(step, 1.0)
        probe.final({{}}, step=2)
    """,
    "test_shaped.py": """
        def test_shaped(spotchaos, spotchaos_job):
            spotchaos.check(spotchaos_job, "sigkill@1")
    """,
}


def test_credentials_found_by_shape_never_reach_an_artifact_and_a_hard_linked_log_is_replaced_not_written(tmp_path):
    """Credentials whose variable is not named like a secret, in files of any name, past 16 MiB of
    a log, and in a kept log hard-linked to the project's .env (which must stay as it was)."""
    project = write_project(tmp_path, SHAPED_PROJECT)
    env_before = (project / ".env").read_bytes()
    result = run_pytest(project, "--spotchaos", "--spotchaos-keep-runs", "--junitxml=junit.xml", "test_shaped.py")
    assert "1 failed" in result.stdout, result.stdout[-3000:]
    named = "a secret (ALERT_WEBHOOK_URL, DATABASE_URL, GITHUB_PAT, SIGNING_KEY, SLACK_WEBHOOK_URL"
    assert named in result.stdout, result.stdout[-3000:]
    assert (project / ".env").read_bytes() == env_before, "redaction wrote through a hard link"
    report = project / "spotchaos-report"
    artifacts = [report / "report.json", report / "report.md", report / "report.html", project / "junit.xml"]
    artifacts += [p for p in (report / "runs").rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "run_config.json" for p in artifacts) and any(p.name == "notes.log" for p in artifacts)
    raw = [GITHUB_PAT, SIGNING_KEY, WEBHOOK, DB_PASSWORD_IN_URL, JWT, GITHUB_PAT[10:18], WEBHOOK[-12:]]
    raw += [OTHER_WEBHOOK[-24:], OTHER_WEBHOOK[-12:]]
    for path in artifacts:
        data = path.read_bytes()
        assert not [r for r in raw if r.encode() in data], f"a raw credential in {path}"
    assert not [r for r in raw if r in result.stdout + result.stderr], "a raw credential on the terminal"
    stdout_logs = list((report / "runs").rglob("stdout.log"))
    assert stdout_logs and all(p.stat().st_size > 16 << 20 for p in stdout_logs), "the log was cut, not redacted"


@pytest.mark.unit
def test_redaction_streams_whole_files_and_finds_a_secret_across_a_chunk_edge(tmp_path):
    from spotchaos.safety.redact import CHUNK, REDACTED, SecretMatcher, leaking_files, redact_files

    matcher = SecretMatcher([SECRET])
    edge = CHUNK - len(SECRET) // 2  # the secret straddles the first chunk's end
    data = b"x" * edge + SECRET.encode() + b"\n" + b"y" * (CHUNK // 2) + SECRET.encode()[-9:]
    (tmp_path / "big.bin").write_bytes(data)
    (tmp_path / "clean.txt").write_bytes(b"nothing here\n")
    assert leaking_files(tmp_path, [SECRET]) == ["big.bin"]
    assert redact_files(tmp_path, matcher) == ["big.bin"]
    out = (tmp_path / "big.bin").read_bytes()
    assert out == b"x" * edge + REDACTED.encode() + b"\n" + b"y" * (CHUNK // 2) + REDACTED.encode()
    assert leaking_files(tmp_path, [SECRET]) == [] and not list(tmp_path.glob(".*redacted"))


def test_a_log_pattern_that_would_backtrack_forever_cannot_stall_the_timeouts(script, tmp_path):
    """``(?:x+x+)+y`` on a line of 40 x's takes Python's ``re`` longer than the age of the universe;
    RE2 answers at once, so the job that then hangs is ended by its 5 s timeout."""
    from spotchaos.config.logspec import LogSpec

    command = script(
        """
        import time
        print("step 1 " + "x" * 40 + " loss 1.0", flush=True)
        time.sleep(300)
        """
    )
    log = LogSpec(pattern=r"step (?P<step>\d+) (?:x+x+)+y loss (?P<loss>[0-9.]+)")
    job = JobSpec(name="backtracks", command=command, log=log, start_timeout_seconds=5, event_timeout_seconds=5)
    started = time.monotonic()
    with pytest.raises(JobError) as caught:
        run_job(job, Plan(), tmp_path / "run", EngineOptions(root=ROOT))
    assert time.monotonic() - started < 30
    assert "5" in str(caught.value).splitlines()[0]


@pytest.mark.unit
@pytest.mark.parametrize("pattern", [r"step (?P<step>\d+)(?=,) loss (?P<loss>\S+)", r"(?P<step>\d+) (?P<loss>\S+) \1"])
def test_a_log_pattern_that_needs_backtracking_is_one_clear_error(pattern):
    from spotchaos.config.logspec import LogSpec

    with pytest.raises(ConfigError) as caught:
        LogSpec(pattern=pattern)
    message = str(caught.value)
    assert "\n" not in message and "linear time" in message and "look-arounds or back-references" in message


FOUR_STEPS = probe_steps(4, 0.05)


BROKEN_RESUME_PROJECT = {
    "pyproject.toml": """
        [tool.spotchaos.jobs.no-resume]
        command = ["python", "no_resume.py"]
    """,
    "no_resume.py": """
        import os, sys
        if os.environ.get("SPOTCHAOS_ATTEMPT", "0") != "0":
            sys.exit("no checkpoint to resume from")
    """
    + FOUR_STEPS,
    "test_no_resume.py": """
        import os, shutil

        def test_no_resume(spotchaos, spotchaos_job):
            try:
                spotchaos.check(spotchaos_job, "sigkill@1")
            finally:  # the report folder is gone mid-run, a file in its place: nothing can be written there
                shutil.rmtree("spotchaos-report")
                with open("spotchaos-report", "w") as f:
                    f.write("not a folder")
    """,
}


def test_a_report_folder_that_cannot_be_written_is_one_line_and_the_scenarios_failure_still_shows(tmp_path):
    project = write_project(tmp_path, BROKEN_RESUME_PROJECT)
    result = run_pytest(project, "--spotchaos", "test_no_resume.py")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "1 failed" in result.stdout and "no checkpoint to resume from" in result.stdout, out[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("ERROR: spotchaos could not write its report")]
    assert "spotchaos-report" in line and "--spotchaos-output" in line


# --- 8. the fault proxy never forwards moto's admin API ------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["/moto-api/reset", "//moto-api/reset", "/%6Doto-api/reset", "/./x/../moto-api/reset", "/MOTO-API/reset"],
)
def test_the_job_cannot_reach_motos_admin_api(spotchaos_s3, target):
    import http.client
    from urllib.parse import urlsplit

    spotchaos_s3.client().create_bucket(Bucket="precious")
    for endpoint in (spotchaos_s3.proxy.endpoint, spotchaos_s3.moto.endpoint):  # through the proxy, and straight
        parts = urlsplit(endpoint)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        connection.request("POST", target, body=b"")
        status = connection.getresponse().status
        connection.close()
        assert status == 403, f"{endpoint}{target} answered {status}"
    names = [b["Name"] for b in spotchaos_s3.client().list_buckets()["Buckets"]]
    assert "precious" in names, "moto was reset by a request the job could make"


# --- 9. small cases: strict JSON, an unwritable output, a report file's content never echoed ----


@pytest.mark.unit
def test_a_nan_loss_is_written_as_strict_json(tmp_path):
    from spotchaos.report import number, write_json

    path = write_json({"loss": float("nan"), "limits": [float("inf"), -float("inf"), 1.5]}, tmp_path / "r.json")

    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant} is not JSON")

    document = json.loads(path.read_text(), parse_constant=refuse)
    assert document == {"limits": ["Infinity", "-Infinity", 1.5], "loss": "NaN"}
    assert [number(v) for v in document["limits"]] == [float("inf"), -float("inf"), 1.5]


def test_an_unwritable_report_directory_is_one_clear_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.spotchaos.jobs.a]\ncommand = ["python", "x.py"]\n')
    (tmp_path / "taken").write_text("a file where the report directory should go")
    result = run_pytest(tmp_path, "--spotchaos", "--spotchaos-output=taken/report")
    assert result.returncode == 4 and "Traceback" not in result.stdout + result.stderr
    assert "spotchaos: cannot write the report to" in result.stderr and "taken/report" in result.stderr


def test_spotchaos_report_never_echoes_the_content_of_the_file_it_was_given(tmp_path):
    private = tmp_path / "id_rsa"
    private.write_text("-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n")
    result = subprocess.run(
        [sys.executable, "-m", "spotchaos.cli", "report", str(private), "--format", "md"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "not a valid JSON report" in result.stderr
    content, shown = private.read_text(), result.stderr + result.stdout
    echoed = [content[i : i + 8] for i in range(len(content) - 7) if content[i : i + 8] in shown]
    assert not echoed, f"the error quotes the file: {echoed}"


def _minimal_report(**changes) -> dict:
    return {"tool": "spotchaos", "schema_version": 1, "scenarios": [], "summary": {}, "environment": {}, **changes}


WRONG_SHAPES = {
    "scenarios-a-string": _minimal_report(scenarios="all passed"),
    "scenario-a-number": _minimal_report(scenarios=[42]),
    "runs-a-string": _minimal_report(scenarios=[{"scenario": "s", "runs": "x"}]),
    "run-a-list": _minimal_report(scenarios=[{"scenario": "s", "runs": [[1, 2]]}]),
    "figures-a-list": _minimal_report(scenarios=[{"scenario": "s", "figures": [1]}]),
    "name-a-number": _minimal_report(scenarios=[{"scenario": 7}]),
    "summary-a-list": _minimal_report(summary=[]),
    "environment-null": _minimal_report(environment=None),
    "run-null": _minimal_report(scenarios=[{"scenario": "s", "runs": [None]}]),
    "deep": None,  # 100,000 nested lists
}


@pytest.mark.unit
@pytest.mark.parametrize("shape", list(WRONG_SHAPES))
def test_spotchaos_report_and_compare_on_a_report_of_the_wrong_shape_are_one_line_and_exit_2(tmp_path, capsys, shape):
    from spotchaos.cli import main

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_minimal_report()))
    bad = tmp_path / "bad.json"
    document = WRONG_SHAPES[shape]
    bad.write_text('{"tool": "spotchaos", "x": ' + "[" * 100000 if document is None else json.dumps(document))
    for args in (["report", str(bad), "--format", "md"], ["compare", str(good), str(bad), "--fail-on", "verdict"]):
        code = main(args)  # an exception escaping main is the traceback a user would see
        err = capsys.readouterr().err
        assert code == 2, (args, code, err)
        assert len(err.strip().splitlines()) == 1 and str(bad) in err, err


@pytest.mark.unit
def test_bidi_and_zero_width_characters_from_a_job_are_escaped_for_the_terminal_and_markdown():
    from spotchaos.safety.sanitize import markdown_text, visible

    trojan = "loss ok\u202e\u2066 }if (admin) {\u2069\u2067 \u200bx\ufeff"
    for shown in (visible(trojan), markdown_text(trojan)):
        assert not any(c in shown for c in "\u202e\u2066\u2069\u2067\u200b\ufeff"), shown
        assert "\\u202e" in shown and "\\u200b" in shown


@pytest.mark.unit
def test_emphasis_and_strike_through_from_a_job_stay_plain_text_in_markdown():
    from spotchaos.safety.sanitize import markdown_text

    shown = markdown_text("resumed from **best** ~~stale~~ _latest_ checkpoint")
    assert shown == r"resumed from \*\*best\*\* \~\~stale\~\~ \_latest\_ checkpoint", shown


@pytest.mark.unit
@pytest.mark.parametrize("step", ["9" * 30, "9" * 4000])
def test_a_printed_step_out_of_range_is_one_clear_error(tmp_path, step):
    from spotchaos.config.logspec import LogSpec
    from spotchaos.training.events import LineReader
    from spotchaos.training.logadapter import LogEventReader

    log = tmp_path / "stdout.log"
    log.write_text(f"step 0 loss 1.0\nstep {step} loss 1.0\n")
    reader = LogEventReader(
        LineReader(log), LogSpec(pattern=r"step (?P<step>\d+) loss (?P<loss>\S+)"), tmp_path, "script"
    )
    with pytest.raises(JobError) as caught:
        reader.read_new()
    message = str(caught.value)
    assert "\n" not in message and ("out of range" in message or "not an integer" in message), message


TWO_CHECKS_PROJECT = {
    "pyproject.toml": """
        [tool.spotchaos.jobs.good]
        command = ["python", "good.py"]

        [tool.spotchaos.jobs.no-resume]
        command = ["python", "no_resume.py"]
    """,
    "good.py": FOUR_STEPS,
    "no_resume.py": BROKEN_RESUME_PROJECT["no_resume.py"],
    "test_two.py": """
        import pathlib
        from spotchaos.config import load_settings

        def test_two_checks(spotchaos):
            jobs = {j.name: j for j in load_settings(pathlib.Path("pyproject.toml")).jobs}
            spotchaos.check(jobs["good"], "sigkill@1")
            spotchaos.check(jobs["no-resume"], "sigkill@1")
    """,
}


def test_a_check_that_passed_stays_a_pass_when_a_later_check_of_its_test_fails_and_the_replay_shows_once(tmp_path):
    project = write_project(tmp_path, TWO_CHECKS_PROJECT)
    result = run_pytest(project, "--spotchaos", "test_two.py")
    assert "1 failed" in result.stdout, result.stdout[-3000:]
    report = json.loads((project / "spotchaos-report" / "report.json").read_text())
    verdicts = {s["job"]: (s["passed"], s.get("error")) for s in report["scenarios"]}
    assert verdicts["good"] == (True, None) and verdicts["no-resume"][0] is False, verdicts
    markdown = (project / "spotchaos-report" / "report.md").read_text()
    good = next(line for line in markdown.splitlines() if "| good |" in line)
    assert good.startswith("| ✅ pass |"), good
    summary = result.stdout.split("spotchaos ==")[-1].splitlines()
    words = sorted(line.split()[0] for line in summary if " plans=" in line)
    assert words == ["FAILED", "bit-exact"], summary  # the check that passed is no error in the terminal either
    failures = result.stdout.split("short test summary info")[0]  # pytest's own summary repeats it under CI=true
    assert failures.count("replay: ") == 1, result.stdout[-3000:]
