"""Warm starts: an attempt forked from the job's warm interpreter is the process a cold start makes.

Each check drives the real interpreter: a zygote in the venv's Python that imported what it was
told, forking real attempts, ended by the leftover sweep when the pytest that started it dies.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.config.jobs import JobSpec, job_from_mapping
from spotchaos.faults.plan import Plan
from spotchaos.host.leftovers import LiveJobs
from spotchaos.host.processes import carries, is_running, start_time
from spotchaos.host.warm.pool import ColdStart, WarmStarts, plan_launch
from spotchaos.record import ScenarioRecord
from spotchaos.report.gate_cost import cost_line
from spotchaos.session import Session

from .helpers import ROOT
from .test_fault_landing import fast_reference

WHO = """
import json, os, random, sys
environ = open("/proc/self/environ", "rb").read().split(b"\\0")
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
    "flavour": os.environ.get("FLAVOUR"), "tmp": os.environ.get("TMPDIR"),
    "leader": os.getpgid(0) == os.getpid() == os.getsid(0),
    "marker": [e.decode() for e in environ if e.startswith(b"SPOTCHAOS_RUN_ID=")],
    "random": random.random(), "torch": "torch" in sys.modules, "parent": os.getppid(),
}))
sys.stderr.write("to stderr\\n")
if sys.argv[1] == "raise":
    raise ValueError("the job's own error")
if sys.argv[1] == "sleep":
    import time
    time.sleep(600)
sys.exit(int(sys.argv[1]))
"""


def _base(**more: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", **more}


def _fork(pool: WarmStarts, folder: Path, arg: str, run_id: str, preload=("json",), imports_from=None, **env: str):
    """One attempt of who.py from ``pool``; ``imports_from``: a folder on PYTHONPATH from the warm
    interpreter's start (where a preload of a test's own module is found)."""
    start = _base(PYTHONPATH=str(imports_from)) if imports_from is not None else _base()
    out, err = folder / f"{run_id}.out", folder / f"{run_id}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        handle = pool.start(
            (sys.executable, "who.py", arg),
            {**start, "SPOTCHAOS_RUN_ID": run_id, **env},
            start,
            folder,
            preload,
            (stdout.fileno(), stderr.fileno()),
        )
    return handle, out, err


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "who.py").write_text(WHO)
    return tmp_path


def test_a_forked_attempt_is_the_script_as_python_runs_it_with_its_own_marker_and_random_state(folder):
    with WarmStarts(live=LiveJobs(folder / "live")) as pool:
        seen = []
        for index, code in enumerate(("0", "3")):
            run_id = f"{index:012d}"
            handle, out, err = _fork(pool, folder, code, run_id, FLAVOUR=f"f{index}", TMPDIR=str(folder))
            assert handle.start_kind == "warm"
            assert handle.wait(60) == int(code)
            handle.cleanup()
            seen.append(json.loads(out.read_text()))
            assert err.read_text() == "to stderr\n"
        for index, who in enumerate(seen):
            assert who["argv"] == ["who.py", ("0", "3")[index]] and who["name"] == "__main__"
            assert who["cwd"] == str(folder) and who["path0"] == str(folder.resolve())
            assert who["flavour"] == f"f{index}" and who["tmp"] == str(folder) and who["leader"]
            assert who["marker"] == [f"SPOTCHAOS_RUN_ID={index:012d}"], who["marker"]
        assert seen[0]["random"] != seen[1]["random"], "each child must seed its own random state"


def test_a_module_run_with_dash_m_is_forked_as_python_runs_it(folder):
    """``python -m module`` (torchrun's agent is ``python -m torch.distributed.run``): the module as
    ``__main__`` with its file as argv[0] and the working folder first on the path, as Python does."""
    cold = subprocess.run(
        [sys.executable, "-m", "who", "0", "x"], cwd=folder, capture_output=True, text=True, check=True,
        env={**_base(), "SPOTCHAOS_RUN_ID": "h" * 12},
    )  # fmt: skip
    with WarmStarts(live=LiveJobs(folder / "live")) as pool, open(folder / "m.out", "w") as out:
        env = {**_base(), "SPOTCHAOS_RUN_ID": "i" * 12}
        handle = pool.start((sys.executable, "-m", "who", "0", "x"), env, _base(), folder, ("json",), (out.fileno(), 2))
        assert handle.start_kind == "warm" and handle.wait(60) == 0
        handle.cleanup()
    warm, expected = json.loads((folder / "m.out").read_text()), json.loads(cold.stdout)
    for key in ("argv", "cwd", "path0", "name"):
        assert warm[key] == expected[key], (key, warm[key], expected[key])
    assert warm["argv"] == [str(folder / "who.py"), "0", "x"] and warm["name"] == "__main__"


def test_a_warm_attempts_error_signal_and_marker_are_a_cold_ones(folder):
    with WarmStarts(live=LiveJobs(folder / "live")) as pool:
        handle, _, err = _fork(pool, folder, "raise", "aaaaaaaaaaaa")
        assert handle.wait(60) == 1 and "ValueError: the job's own error" in err.read_text()
        handle.cleanup()
        handle, _, _ = _fork(pool, folder, "sleep", "bbbbbbbbbbbb")
        deadline = time.monotonic() + 30
        while not carries(handle.pid, "SPOTCHAOS_RUN_ID=bbbbbbbbbbbb") and time.monotonic() < deadline:
            time.sleep(0.05)  # the child writes its marker before the script starts
        assert carries(handle.pid, "SPOTCHAOS_RUN_ID=bbbbbbbbbbbb")
        handle.notify(signal.SIGTERM, whole_group=False)
        assert handle.wait(30) == -signal.SIGTERM
        handle.cleanup()
        assert not handle.survivors()


def test_a_preload_that_fails_or_leaves_a_thread_running_means_cold_with_the_reason(folder):
    (folder / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    with WarmStarts(live=LiveJobs(folder / "live")) as pool:
        with pytest.raises(ColdStart, match=r"preloading 'no_such_module_xyz' failed: ModuleNotFoundError"):
            _fork(pool, folder, "0", "cccccccccccc", preload=("no_such_module_xyz",))
        with pytest.raises(
            ColdStart, match=r"2 threads were running after preloading threaded: a fork would not be safe"
        ):
            _fork(pool, folder, "0", "d" * 12, preload=("threaded",), imports_from=folder)


def test_a_preload_that_loads_the_cuda_driver_means_cold_with_the_reason(folder):
    """An import that asks for a GPU maps the driver (``libcuda.so.1``) into the interpreter: a fork
    of it could not use CUDA. A real shared library under the driver's name, loaded as DeepSpeed's
    accelerator detection loads the real one, is refused the same way."""
    driver = folder / "libcuda.so.1"
    driver.write_bytes(Path(_loaded_path("libm.so")).read_bytes())
    (folder / "asks_for_a_gpu.py").write_text(f"import ctypes\nctypes.CDLL({str(driver)!r})\n")
    with (
        WarmStarts(live=LiveJobs(folder / "live")) as pool,
        pytest.raises(
            ColdStart, match=r"preloading asks_for_a_gpu loaded the CUDA driver \(libcuda\.so\.1\): a forked attempt"
        ),
    ):
        _fork(pool, folder, "0", "e" * 12, preload=("asks_for_a_gpu",), imports_from=folder)


def _loaded_path(prefix: str) -> str:
    """Where this process mapped a library whose file name starts with ``prefix``."""
    with open("/proc/self/maps") as maps:
        return next(line.split()[-1] for line in maps if line.rsplit("/", 1)[-1].startswith(prefix))


def test_an_optional_preload_that_does_not_import_is_left_to_the_attempt_and_the_start_stays_warm(folder):
    """The default preload names torch's compiler stack as optional: on a Python or a torch where it
    is missing or fails to import, the interpreter goes on without it, as a cold start would."""
    (folder / "breaks.py").write_text("raise RuntimeError('not on this Python')\n")
    base = _base(PYTHONPATH=str(folder))
    with WarmStarts(live=LiveJobs(folder / "live")) as pool, open(folder / "o", "w") as out:
        preload = ("json", "?breaks", "?no_such_package.sub")
        argv, fds = (sys.executable, "who.py", "0"), (out.fileno(), out.fileno())
        handle = pool.start(argv, {**base, "SPOTCHAOS_RUN_ID": "f" * 12}, base, folder, preload, fds)
        assert handle.start_kind == "warm" and handle.wait(60) == 0
        handle.cleanup()
        with pytest.raises(ColdStart, match=r"preloading 'breaks' failed: RuntimeError: not on this Python"):
            pool.start(argv, {**base, "SPOTCHAOS_RUN_ID": "g" * 12}, base, folder, ("breaks",), fds)


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv, env, reason",
    [
        (("bash", "who.py"), {}, r"not a Python command \(bash\)"),
        (("python3", "-m", "who;rm"), {}, r"the interpreter flag -m"),
        (("python3", "-c", "pass"), {}, r"the interpreter flag -c"),
        (("python3", "missing.py"), {}, r"missing.py is not a file"),
        (("python3", "who.py"), {"LD_PRELOAD": "/x.so"}, r"the attempt sets LD_PRELOAD, read when Python starts"),
        (("python3", "who.py"), {"OMP_NUM_THREADS": "1"}, r"sets OMP_NUM_THREADS"),
        (("python3", "who.py"), {"PYTHONPATH": "/elsewhere"}, r"changes PYTHONPATH"),
    ],
)
def test_what_python_reads_at_start_differing_means_a_cold_start_naming_it(folder, argv, env, reason):
    start = _base(PYTHONPATH="/job")
    if "PYTHONPATH" not in env:
        env = {**env, "PYTHONPATH": "/job"}
    with pytest.raises(ColdStart, match=reason):
        plan_launch(argv, {**start, "SPOTCHAOS_RUN_ID": "e" * 12, **env}, start, folder, ())


@pytest.mark.unit
def test_a_folder_put_first_on_pythonpath_is_added_and_its_sitecustomize_run_as_a_cold_start_would(folder):
    hook = folder / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("")
    start = _base(PYTHONPATH="/job")
    env = {**start, "PYTHONPATH": f"{hook}{os.pathsep}/job", "SPOTCHAOS_RUN_ID": "f" * 12, "EXTRA": "1"}
    launch = plan_launch((sys.executable, "-u", "who.py", "x"), env, start, folder, ("torch",))
    assert launch.interpreter == (sys.executable, "-u") and launch.request["argv"] == ["who.py", "x"]
    assert launch.request["path_prepend"] == [str(hook)]
    assert launch.request["site_hooks"] == [str(hook / "sitecustomize.py")]
    # what only the attempt sets (its marker, its own variables) does not make another interpreter
    other = plan_launch(
        (sys.executable, "-u", "who.py"), {**env, "SPOTCHAOS_RUN_ID": "g" * 12}, start, folder, ("torch",)
    )
    assert other.key == launch.key


def test_the_tests_of_a_session_fork_from_one_warm_interpreter_whatever_pytest_says_runs_now(folder):
    """pytest sets PYTEST_CURRENT_TEST for each test and phase, in the environment every job starts
    with: the attempts of two tests still fork from one interpreter; another variable of the
    job's start makes another (each costs the job's imports: 2.4-4.3 CPU-seconds here)."""
    parents = []
    with WarmStarts(live=LiveJobs(folder / "live")) as pool:
        for index, start in enumerate(
            (
                _base(PYTEST_CURRENT_TEST="tests/a.py::test_one (call)"),
                _base(PYTEST_CURRENT_TEST="tests/a.py::test_two (setup)"),
                _base(PYTEST_CURRENT_TEST="tests/a.py::test_two (call)", FLAVOUR="other"),
            )
        ):
            run_id, out = f"{index:012d}", folder / f"{index}.out"
            with open(out, "w") as stdout, open(folder / f"{index}.err", "w") as stderr:
                handle = pool.start(
                    (sys.executable, "who.py", "0"), {**start, "SPOTCHAOS_RUN_ID": run_id}, start, folder, ("json",),
                    (stdout.fileno(), stderr.fileno()),
                )  # fmt: skip
            assert handle.start_kind == "warm" and handle.wait(60) == 0
            handle.cleanup()
            parents.append(json.loads(out.read_text())["parent"])
    assert parents[0] == parents[1] != parents[2], parents


def test_consecutive_attempts_hash_strings_differently_unless_the_job_fixes_its_hash_seed(folder):
    """Fresh processes hash strings with their own secret; children of one interpreter share it. An
    attempt forks from the job's other seeded interpreter than the attempt before it, so a resume
    hashes differently from the attempt that wrote its checkpoint, as it would cold; a job whose
    environment fixes PYTHONHASHSEED hashes alike in every attempt, as it would cold."""
    (folder / "hashes.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'hash': hash('spotchaos'), 'env': os.environ.get('PYTHONHASHSEED')}))\n"
    )

    def hashes(start: dict[str, str]) -> list[dict]:
        seen = []
        with WarmStarts(live=LiveJobs(folder / "live")) as pool:
            for attempt in range(4):
                out = folder / f"h{attempt}.out"
                env = {**start, "SPOTCHAOS_RUN_ID": f"{attempt:012d}", "SPOTCHAOS_ATTEMPT": str(attempt)}
                with open(out, "w") as stdout, open(folder / f"h{attempt}.err", "w") as stderr:
                    handle = pool.start(
                        (sys.executable, "hashes.py"), env, start, folder, ("json",), (stdout.fileno(), stderr.fileno())
                    )
                assert handle.start_kind == "warm" and handle.wait(60) == 0, (folder / f"h{attempt}.err").read_text()
                handle.cleanup()
                seen.append(json.loads(out.read_text()))
        return seen

    salted = hashes(_base())
    assert all(a["hash"] != b["hash"] for a, b in itertools.pairwise(salted)), salted
    assert {s["env"] for s in salted} == {None}, "the interpreter's seed stays out of the job's environment"
    fixed = hashes(_base(PYTHONHASHSEED="7"))
    assert len({s["hash"] for s in fixed}) == 1 and {s["env"] for s in fixed} == {"7"}, fixed


def test_a_job_whose_resume_depends_on_string_hashing_fails_warm_as_it_fails_cold(tmp_path):
    """``broken_set_ordered_params``: the optimizer's order comes from a set of names, so a resume
    in a process that hashes differently hands moments to the wrong layers. Forked attempts once
    shared one secret and passed; each start kind must fail it."""
    script = str(ROOT / "fixtures" / "broken_set_ordered_params.py")
    command = ("python", script, "--steps", "16", "--step-seconds", "0")
    job = JobSpec(name="set-ordered", command=command, grace_seconds=10, state_diff=False)
    for warm in (True, False):
        with Session(ROOT, workdir=tmp_path / f"warm-{warm}", warm=warm, prefix=False) as runner:
            # judged as it ran, without the shortcuts' rule (a warm failure is judged again cold)
            judged = runner.judged(job, Plan.parse("sigterm@6"), None)
            kinds = {a.start_kind.split(" ")[0] for a in judged.record.attempts}
            assert kinds == ({"warm"} if warm else {"cold"}), kinds
            assert not judged.verdict.passed, f"warm={warm}: a resume that hands moments to other layers passed"
            assert "step 7" in judged.verdict.message(), judged.verdict.message()


def _last_variables(pid: int) -> list[bytes] | str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read().split(b"\0")[-3:]
    except OSError as exc:
        return f"gone ({exc.strerror})"


def test_a_killed_pytest_leaves_its_warm_interpreter_and_attempt_to_the_next_session(folder):
    live = folder / "live"
    driver = textwrap.dedent(
        f"""
        import json, os, sys, time
        from pathlib import Path
        from spotchaos.host.leftovers import LiveJobs
        from spotchaos.host.warm.pool import WarmStarts
        pool = WarmStarts(live=LiveJobs(Path({str(live)!r})))
        out = open({str(folder / "child.out")!r}, "w")
        base = {{"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}}
        handle = pool.start((sys.executable, "who.py", "sleep"), {{**base, "SPOTCHAOS_RUN_ID": "h" * 12}}, base,
                            Path({str(folder)!r}), ("json",), (out.fileno(), out.fileno()))
        LiveJobs(Path({str(live)!r})).add("h" * 12, handle.identity)
        print(json.dumps([handle.pid, pool._zygotes[next(iter(pool._zygotes))].process.pid]), flush=True)
        time.sleep(600)
        """
    )
    pytest_like = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        attempt, zygote = json.loads(pytest_like.stdout.readline())
        started = {pid: start_time(pid) for pid in (attempt, zygote)}
        pytest_like.send_signal(signal.SIGKILL)
        pytest_like.wait(30)
        assert all(is_running(pid, s) for pid, s in started.items()), "both outlive the pytest that started them"
        ended = LiveJobs(live).reap()
        deadline = time.monotonic() + 10
        while any(is_running(pid, s) for pid, s in started.items()) and time.monotonic() < deadline:
            time.sleep(0.05)
        # which one outlived the reaper, and the marker it carried then (seen under load once in ~8 runs,
        # on this stop's code and the last's alike)
        survivors = {pid: _last_variables(pid) for pid, s in started.items() if is_running(pid, s)}
        assert not survivors, (ended, {"attempt": attempt, "zygote": zygote}, survivors)
    finally:
        pytest_like.kill()
        pytest_like.wait(30)


def test_a_gate_runs_its_attempts_warm_and_its_reference_cold_and_off_means_cold(runner, tmp_path):
    job = replace(fast_reference(), name="warm-reference")
    run, verdict = runner.run(job, Plan.parse("sigkill@5,sigterm@11"))
    assert verdict.passed, verdict.message()
    assert [a.start_kind for a in run.attempts] == ["warm"] * 3
    assert {a.start_kind for a in runner.reference(job).attempts} == {"cold"}
    with ScenarioRecord(scenario="warm", job=job.name, seed=None) as record:
        runner.check(job, "sigterm@7")
    assert record.runs[-1]["starts"] == ["warm", "warm"], record.runs[-1]
    assert record.cost["warm_starts"] == 2 and record.cost["cold_because"] == {}, record.cost
    assert "(2 warm: " in cost_line(job.name, {**record.cost, "runs_worth": None})
    cold_job = job_from_mapping(
        "cold-reference", {"command": list(job.command), "warm": False, "grace_seconds": 10}, "test"
    )
    with Session(ROOT, workdir=tmp_path / "off", warm=False) as off:
        run, verdict = off.run(cold_job, Plan.parse("sigkill@5"))
        assert verdict.passed and {a.start_kind for a in run.attempts} == {"cold"}
    with pytest.raises(Exception, match=r"warm: must be true or false"):
        job_from_mapping("bad", {"command": ["python", "x.py"], "warm": "yes"}, "test")
    with pytest.raises(Exception, match=r"preload: must be a list of installed modules"):
        job_from_mapping("bad", {"command": ["python", "x.py"], "preload": ["torch; rm -rf /"]}, "test")
    optional = job_from_mapping("ok", {"command": ["python", "x.py"], "preload": ["torch", "?deepspeed"]}, "test")
    assert optional.preload == ("torch", "?deepspeed")  # "?name": imported only where it imports


def test_the_state_diff_reads_a_jobs_pickles_in_a_child_of_its_warm_interpreter(folder):
    """A checkpoint only a full unpickle reads (numpy's RNG state: a Trainer's ``rng_state.pth``) is
    compared in the job's confinement; forked from the job's warm interpreter, as its attempts are,
    that costs a fork instead of a cold ``import torch`` for every file of every resumed run."""
    import numpy
    import torch

    from spotchaos.backends import SubprocessBackend
    from spotchaos.training.judgement import confined_reader
    from spotchaos.training.state.kept import kept_dir

    runs = {}
    for name, seed in (("reference", 1), ("chaos", 2)):
        run = folder / name
        run.mkdir()
        kept_dir(run).mkdir()
        state = {"numpy": numpy.random.RandomState(seed).get_state(), "step": 5}
        torch.save(state, kept_dir(run) / "rng_state.pth")
        runs[name] = run
    job = job_from_mapping("pickles", {"command": [sys.executable, "who.py"], "preload": ["torch"]}, "test")
    files = [kept_dir(runs[name]) / "rng_state.pth" for name in ("reference", "chaos")]
    with WarmStarts(live=LiveJobs(folder / "live")) as pool:
        reader = confined_reader(job, SubprocessBackend(warm=pool), folder, runs["reference"], runs["chaos"])
        first, again = reader.diff(*files, 10), reader.diff(files[0], files[0], 10)
    assert [d["entry"] for d in first["differences"]] == ["numpy.1"], first  # the RNG's keys, not its name
    assert again == {"differences": [], "more": 0}
    assert reader.start_kinds == ["warm", "warm"], reader.start_kinds
    (folder / "cold").mkdir()  # a run folder of its own: a helper's answer file is never written twice
    cold = confined_reader(job, SubprocessBackend(), folder, runs["reference"], folder / "cold")
    assert cold.diff(*files, 10) == first and cold.start_kinds == ["cold"]  # no warm interpreter: the same answer


def test_the_report_reads_torchs_cuda_build_without_importing_torch():
    from spotchaos.report.document import cuda_of

    assert cuda_of("__version__ = '2.13.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\n") == "12.8"
    assert cuda_of("cuda: Optional[str] = None\nhip: Optional[str] = None\n") is None
    check = "import sys; from pathlib import Path; from spotchaos.report.document import environment; "
    check += "e = environment(Path('.')); print(e['torch'] is not None, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"], done.stdout + done.stderr
