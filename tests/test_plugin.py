"""The pytest plugin itself, driven through pytester in real pytest subprocesses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from .helpers import FIXTURES

pytest_plugins = ["pytester"]

SCENARIO = """
from spotchaos.strategies import preemption_plans

def test_resume(spotchaos, spotchaos_job):
    spotchaos.explore(spotchaos_job, lambda steps: preemption_plans(steps, max_preemptions=1))
"""


def pyproject(trainer: str = "reference_trainer", extra: str = "", name: str = "ref") -> str:
    command = ["python", str(FIXTURES / f"{trainer}.py"), "--steps", "12", "--checkpoint-every", "3"]
    return f"""
[tool.spotchaos]
output = "out"
[tool.spotchaos.jobs.{name}]
command = {json.dumps(command)}
grace_seconds = 10
{extra}
"""


def report(pytester) -> dict:
    return json.loads((pytester.path / "out" / "report.json").read_text())


def test_without_the_flag_scenarios_are_skipped_with_a_reason(pytester):
    pytester.makefile(".toml", pyproject=pyproject())
    pytester.makepyfile(
        test_s=SCENARIO
        + """
import pytest

@pytest.mark.spotchaos
def test_marked():
    raise AssertionError("must not run")

def test_plain():
    pass
"""
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*chaos scenario: run with --spotchaos*"])
    assert not (pytester.path / "out").exists()


def test_main_job_passes_on_the_reference_and_writes_the_report(pytester):
    pytester.makefile(".toml", pyproject=pyproject())
    pytester.makepyfile(test_s=SCENARIO)
    summary = pytester.path / "step-summary.md"
    summary.write_text("earlier step\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GITHUB_STEP_SUMMARY", str(summary))
        result = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-seed=42", "--spotchaos-examples=2")
    result.assert_outcomes(passed=1)
    markdown = (pytester.path / "out" / "report.md").read_text()
    assert "**1 of 1 scenarios passed**" in markdown and "| ✅ pass | test_s.py::test_resume[ref] |" in markdown
    assert summary.read_text() == "earlier step\n" + markdown  # appended, not overwritten
    result.stdout.fnmatch_lines(
        [
            "spotchaos: seed 42 (replay with --spotchaos-seed=42)*jobs: ref*",
            "bit-exact test_s.py::test_resume[[]ref[]]  plans=2*",
            "report: *out/report.json (and report.md, report.html beside it)",
            "saved as *.spotchaos/0001_nocommit_*.json*",
        ]
    )
    doc = report(pytester)
    assert doc["schema_version"] == 1 and doc["seed"] == 42
    assert doc["environment"]["torch"] and doc["environment"]["python"]
    assert doc["summary"] == {"scenarios": 1, "passed": 1, "failed": 0}
    (scenario,) = doc["scenarios"]
    assert scenario["job"] == "ref" and scenario["plans_tried"] == 2 and scenario["outcome"] == "passed"
    assert len(scenario["runs"]) == 2 and all(r["passed"] for r in scenario["runs"])
    assert scenario["reference"]["steps"] == 12
    assert scenario["verdict"]["first_divergence"] is None
    assert "--spotchaos-seed=42" in scenario["replay"]
    assert not (pytester.path / "out" / "runs").exists()  # passing runs leave nothing behind
    # the gate's cost: the reference and the two plans, each plan two starts (a fault, a resume),
    # each at least a whole run of training (a resume replays from its checkpoint)
    cost = doc["cost"]["ref"]
    assert cost["runs"] == 3 and cost["starts"] == 5 and cost["reference_steps"] == 12, cost
    # every step of the three runs is trained or (a plan from the reference's checkpoint) credited to it
    assert cost["steps"] + cost["prefix_steps"] >= 36 and cost["runs_worth"] == round(cost["steps"] / 12, 2), cost
    assert cost["startup_seconds"] > 0 and cost["training_seconds"] > 0, cost
    assert scenario["cost"]["runs"] == 3  # charged to the one scenario that made them
    result.stdout.fnmatch_lines([f"gate cost of 'ref': {cost['runs_worth']:g} runs' worth: * steps of a 12-step job*"])
    assert "| ref | " + f"{cost['runs_worth']:g} runs' worth | 3 | 5 |" in markdown


def test_broken_trainer_fails_shrinks_and_prints_a_replay_command(pytester):
    pytester.makefile(".toml", pyproject=pyproject("broken_no_rng_restore"))
    pytester.makepyfile(test_s=SCENARIO)
    result = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-seed=7", "--spotchaos-examples=3")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "loss diverged at step" in out and "RNG state not saved or not restored" in out
    replay = re.search(r"replay: (pytest --spotchaos --spotchaos-seed=7 --spotchaos-plan='(\S+)' \S+)", out)
    assert replay, out
    kept = re.search(r"logs and checkpoints kept in (\S+)\)", out).group(1)
    assert kept.startswith(str(pytester.path / "out" / "runs"))
    assert (pytester.path / kept / "attempt-1" / "stderr.log").is_file()
    doc = report(pytester)
    (scenario,) = doc["scenarios"]
    assert not scenario["passed"] and scenario["failing_plan"] == replay.group(2)
    assert scenario["verdict"]["first_divergence"]["field"] == "loss"
    assert doc["summary"]["failed"] == 1
    # (that the replay command reproduces the verdict is tested in test_report_session.py)


def test_invalid_config_is_a_usage_error_naming_key_and_file(pytester):
    pytester.makefile(".toml", pyproject=pyproject(extra="grace_secs = 3"))
    pytester.makepyfile(test_s=SCENARIO)
    result = pytester.runpytest_subprocess("--spotchaos")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*spotchaos: *pyproject.toml [[]tool.spotchaos.jobs.ref[]].grace_secs: unknown key*"])


def test_no_declared_job_says_how_to_declare_one(pytester):
    pytester.makepyfile(test_s=SCENARIO)
    result = pytester.runpytest_subprocess("--spotchaos")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*spotchaos: no job to test. Declare one in pyproject.toml*"])


def test_bad_option_values_are_usage_errors(pytester):
    pytester.makefile(".toml", pyproject=pyproject())
    pytester.makepyfile(test_s=SCENARIO)
    for args, message in [
        (["--spotchaos-plan=sigint@3"], "*unknown preemption 'sigint'*"),
        (["--spotchaos-job=nope"], "*--spotchaos-job: no job or service named 'nope' (declared: ref)*"),
        (["--spotchaos-seed=x"], "*--spotchaos-seed: expected an integer or 'last'*"),
    ]:
        result = pytester.runpytest_subprocess("--spotchaos", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([message])


def test_jobs_declared_in_python_and_the_report_hook(pytester):
    pytester.makeconftest(
        f"""
from spotchaos.config import JobSpec

def pytest_spotchaos_jobs(config):
    return [JobSpec(name="py-job", command=("python", {str(FIXTURES / "reference_trainer.py")!r}, "--steps", "10"))]

def pytest_spotchaos_report(config, report):
    report["team"] = "ml-infra"
"""
    )
    pytester.makepyfile(test_s=SCENARIO)
    result = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-plan=sigkill@5", "--spotchaos-output=out")
    result.assert_outcomes(passed=1)
    doc = report(pytester)
    assert doc["team"] == "ml-infra"
    assert [j["name"] for j in doc["jobs"]] == ["py-job"]
    assert doc["scenarios"][0]["runs"][0]["plan"] == "sigkill@5"


def test_seed_last_replays_the_previous_session(pytester):
    # builtin = false: the seed is the point, not the built-in scenarios (they would run twice: 4.5 min of CI)
    pytester.makefile(".toml", pyproject=pyproject().replace('output = "out"', 'output = "out"\nbuiltin = false'))
    pytester.makepyfile(test_s="def test_nothing():\n    pass\n")
    first = pytester.runpytest_subprocess("--spotchaos")
    seed = re.search(r"spotchaos: seed (\d+)", first.stdout.str()).group(1)
    second = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-seed=last")
    second.stdout.fnmatch_lines([f"spotchaos: seed {seed} *"])


def test_ctrl_c_in_the_middle_of_a_scenario_leaves_no_process(pytester):
    """SIGINT to pytest while a job runs: pytest stops, and the job's process group is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from .helpers import is_alive, sigint_as_from_a_terminal

    pidfile = pytester.path / "job.pid"
    job = pytester.makepyfile(
        job=f"""
import os, subprocess, sys, time
from spotchaos.probe import Probe
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{helper.pid}}")
probe = Probe.from_env()
probe.start()
for step in range(100000):
    probe.step(step, 1.0)
    time.sleep(0.05)
"""
    )
    pytester.makefile(".toml", pyproject=f'[tool.spotchaos.jobs.slow]\ncommand = ["python", {json.dumps(str(job))}]\n')
    pytester.makepyfile(test_s=SCENARIO)
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--spotchaos", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and process.poll() is None, process.stdout.read().decode()
        time.sleep(0.05)
    pids = [int(p) for p in pidfile.read_text().split()]
    os.kill(process.pid, signal.SIGINT)
    out = process.communicate(timeout=60)[0].decode()
    assert process.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out
    assert not any(is_alive(pid) for pid in pids), f"job processes {pids} survived Ctrl-C"


def test_overhead_scenario_reports_to_pytest_benchmark_json(pytester):
    pytester.makefile(".toml", pyproject=pyproject(extra='overhead_budget = 0.5\nmtbf = "pessimistic"'))
    pytester.makepyfile(
        test_s="""
def test_overhead(spotchaos, spotchaos_job, benchmark):
    spotchaos.check_overhead(spotchaos_job, benchmark=benchmark)
"""
    )
    result = pytester.runpytest_subprocess("--spotchaos", "--benchmark-json=bench.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*overhead *% of training time (budget 50.00%)*", "*advice: *Daly's optimum*"])
    (bench,) = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    info = bench["extra_info"]
    assert 0 < info["checkpoint_overhead_fraction"] < 0.5 and info["overhead_budget"] == 0.5
    (scenario,) = report(pytester)["scenarios"]
    assert scenario["figures"]["advice"]["mtbf_seconds"] == 3600
    assert scenario["figures"]["cost"]["spot"]["compute"] is None  # no price given: unknown, not zero


def test_it_says_what_it_is_doing_under_v_and_nothing_more_under_q(pytester):
    """A scenario exploring plans of several attempts each would otherwise be silent for minutes."""
    pytester.makefile(".toml", pyproject=pyproject())
    pytester.makepyfile(test_s=SCENARIO)
    verbose = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-examples=2", "-v")
    verbose.assert_outcomes(passed=1)
    verbose.stdout.fnmatch_lines(
        [
            "spotchaos: job ref, plan none: 1 attempt(s) in *",  # the reference run
            "spotchaos: job ref: plan 1 of 2 planned: *",
            "spotchaos: job ref, plan *, attempt 0: * sent after step *; exit * after * s",
            "spotchaos: job ref, plan *, attempt 1: no fault; exit 0 after * s",
        ]
    )
    quiet = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-examples=1", "-q")  # one plan says as much
    quiet.assert_outcomes(passed=1)
    assert not [line for line in quiet.outlines if line.startswith("spotchaos: job")]


def test_a_job_named_with_spotchaos_job_runs_every_scenario_even_with_parametrize_false(pytester):
    """A user gating their own script runs the built-in scenarios on it by name; without the
    option a parametrize = false job stays out of scenarios that do not name it."""
    pytester.makefile(".toml", pyproject=pyproject(extra="parametrize = false", name="mine"))
    pytester.makepyfile(test_s=SCENARIO)
    chosen = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-job=mine", "--collect-only", "-q")
    chosen.stdout.fnmatch_lines(["test_s.py::test_resume[[]mine[]]"])
    unnamed = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q")
    assert "test_resume[mine]" not in unnamed.stdout.str()


def test_builtin_distributed_and_service_scenarios_take_a_users_job_by_name_and_say_what_they_need(pytester):
    """The packaged multi-rank and service scenarios on jobs of the user's own, named with
    --spotchaos-job: what a job lacks (several ranks, several nodes, resharding) is a skip that says
    what to declare; run over everything declared, what does not fit is left out, not skipped."""
    ddp = f"""
[tool.spotchaos.jobs.mine]
command = ["python", "{FIXTURES / "ddp_trainer.py"}"]
launcher = "torchrun"
nproc_per_node = 2
[tool.spotchaos.services.svc]
command = ["python", "{FIXTURES / "serve_model.py"}", "--port", "{{port}}"]
"""
    pytester.makefile(".toml", pyproject=pyproject() + ddp)
    named = ["--spotchaos", "--spotchaos-job=ref", "--spotchaos-job=mine", "-rs"]
    modules = ["--pyargs", "spotchaos.scenarios.test_distributed", "-k", "lost_node or another_world_size"]
    skipped = pytester.runpytest_subprocess(*named, *modules)
    skipped.assert_outcomes(skipped=4)  # nothing ran: each pair lacks what its scenario needs
    skipped.stdout.fnmatch_lines_random(
        [
            "*needs a multi-rank job: launcher = \"torchrun\" with 2 or more ranks; 'ref' is launcher = 'python'",
            "*needs several nodes: nnodes = 2 or more; 'mine' has nnodes = 1",
            "*needs resharding: declare reshard_nproc_per_node (the ranks per node a resume may use) for 'mine'*",
        ]
    )
    # a single process's crash points on a job of two ranks: skipped, named, with what it runs instead
    crash_points = ["--pyargs", "spotchaos.scenarios.test_checkpoint_damage", "-k", "crash"]
    crashes = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-job=mine", "-rs", *crash_points)
    crashes.assert_outcomes(skipped=2)
    crashes.stdout.fnmatch_lines(["*needs one process: its crash points count one process's*'mine' runs 2 ranks*"])
    everything = ["--pyargs", "spotchaos.scenarios.test_distributed", "spotchaos.scenarios.test_serving"]
    listed = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q", *everything)
    lines = listed.stdout.str()
    assert "test_ranks_resume_bit_exact_after_preemptions[mine]" in lines
    assert "test_the_service_drains_through_its_reclaim_notice[svc]" in lines
    assert "[ref]" not in lines and "test_a_lost_node" not in lines and "another_world_size" not in lines
    listed.stdout.fnmatch_lines(["*6/17 tests collected (11 deselected)*"])
    service = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-job=ref", "-rs", *everything[:1], everything[2])
    service.assert_outcomes(skipped=1)
    service.stdout.fnmatch_lines(["*spotchaos: none of the selected services is for this test*"])
    pytester.makepyfile(
        test_s="import pytest\n@pytest.mark.spotchaos(needs=['gpus'])\ndef test_x(spotchaos, spotchaos_job): pass\n"
    )
    unknown = pytester.runpytest_subprocess("--spotchaos", "test_s.py")
    assert unknown.ret == pytest.ExitCode.INTERRUPTED  # a collection error: the scenario's own mistake
    known = "known: ranks, nodes, one process, slurm, watchdog, phases, reshard"
    unknown.stdout.fnmatch_lines([f"*test_s.py::test_x: unknown need 'gpus' in its spotchaos marker ({known})*"])


def test_an_image_for_every_job_leaves_torchrun_jobs_local_instead_of_crashing(pytester):
    """--spotchaos-image on a project that also declares a torchrun job: the others go into the
    image, the torchrun job stays a local process group (a container's torchrun is not built)."""
    torchrun = f"""
[tool.spotchaos.jobs.ranks]
command = ["python", "{FIXTURES / "ddp_trainer.py"}"]
launcher = "torchrun"
nproc_per_node = 2
"""
    pytester.makefile(".toml", pyproject=pyproject() + torchrun)
    pytester.makepyfile(test_s=SCENARIO)
    listed = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-image=some/image:1", "--collect-only", "-q")
    assert listed.ret == 0, listed.stdout.str() + listed.stderr.str()
    listed.stdout.fnmatch_lines(["test_s.py::test_resume[[]ref[]]", "test_s.py::test_resume[[]ranks[]]"])


BUILT_IN = [  # node ids relative to the package's scenarios folder
    "test_budgets.py::test_checkpoint_overhead_within_budget[[]ref[]]",
    "test_checkpoint_damage.py::test_damaged_newest_checkpoint_rolls_back[[]ref[]]",
    "test_preemption.py::test_chained_preemptions_are_bit_exact[[]ref[]]",
]


def test_a_project_that_only_declares_a_job_gets_the_built_in_scenarios(pytester):
    """Nothing copied: the scenarios that ship in the package are collected for the declared job."""
    pytester.makefile(".toml", pyproject=pyproject())
    listed = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q")
    assert listed.ret == 0, listed.stdout.str() + listed.stderr.str()
    listed.stdout.fnmatch_lines(BUILT_IN, consecutive=False)
    assert "8/19 tests collected (11 deselected)" in listed.stdout.str()  # multi-rank, Slurm, phases, services: no fit
    off = pytester.runpytest_subprocess("--collect-only", "-q")  # without --spotchaos: nothing of spotchaos
    assert "test_preemption.py" not in off.stdout.str()


def test_a_built_in_scenarios_replay_command_runs_as_printed_in_the_users_project(pytester):
    """The built-in scenarios live in the package (site-packages for a user), outside the
    project: the replay names the scenario's module with --pyargs, and runs as printed."""
    pytester.makefile(".toml", pyproject=pyproject("broken_no_rng_restore"))
    first = pytester.runpytest_subprocess(
        "--spotchaos", "--spotchaos-plan=sigkill@7", "-k", "test_hard_kill_then_resume_is_bit_exact"
    )
    first.assert_outcomes(failed=1)
    (scenario,) = report(pytester)["scenarios"]
    argv = shlex.split(scenario["replay"])
    assert argv[:2] == ["pytest", "--spotchaos"] and "--pyargs" in argv, argv
    assert argv[-1] == "spotchaos.scenarios.test_preemption::test_hard_kill_then_resume_is_bit_exact[ref]", argv
    replayed = subprocess.run(
        [sys.executable, "-m", *argv], cwd=pytester.path, capture_output=True, text=True, check=False
    )
    assert replayed.returncode == 1 and "1 failed" in replayed.stdout, replayed.stdout[-3000:] + replayed.stderr
    (again,) = report(pytester)["scenarios"]
    assert again["failing_plan"] == scenario["failing_plan"] == "sigkill@7"
    assert again["verdict"]["first_divergence"]["field"] == "loss"


@pytest.mark.parametrize(("setting", "built_in"), [("", False), ("builtin = true", True), ("builtin = false", False)])
def test_built_in_scenarios_beside_a_project_own_run_only_when_asked(pytester, setting, built_in):
    pytester.makefile(".toml", pyproject=pyproject().replace('output = "out"', f'output = "out"\n{setting}'))
    pytester.makepyfile(test_s=SCENARIO)
    listed = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q")
    assert listed.ret == 0, listed.stdout.str() + listed.stderr.str()
    listed.stdout.fnmatch_lines(["test_s.py::test_resume[[]ref[]]"])
    assert ("test_preemption.py::" in listed.stdout.str()) is built_in, listed.stdout.str()
    named = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q", "test_s.py")  # a file named: only it
    assert "test_preemption.py::" not in named.stdout.str()


def test_a_jobs_scenarios_run_one_after_another_those_on_the_ray_cluster_first(pytester):
    """pytest lists a module's items test by test; the session runs them job by job (so pytest-xdist
    keeps a job's reference run, warm interpreter and reused plans on one worker), with the jobs of
    the Ray cluster first: the longest chain, on one cluster."""
    jobs = """
[tool.spotchaos.jobs.other]
command = ["python", "other.py"]
[tool.spotchaos.jobs.on-ray]
command = ["python", "x.py"]
backend = "ray"
"""
    pytester.makefile(".toml", pyproject=pyproject() + jobs)
    pytester.makepyfile(
        test_s=SCENARIO + "\n\ndef test_again(spotchaos, spotchaos_job):\n    pass\n\n\ndef test_plain():\n    pass\n"
    )
    listed = pytester.runpytest_subprocess("--spotchaos", "--collect-only", "-q")
    lines = [line for line in listed.outlines if line.startswith("test_s.py::")]
    assert lines == [
        "test_s.py::test_resume[on-ray]",
        "test_s.py::test_again[on-ray]",
        "test_s.py::test_resume[ref]",
        "test_s.py::test_again[ref]",
        "test_s.py::test_resume[other]",
        "test_s.py::test_again[other]",
        "test_s.py::test_plain",
    ], lines


def test_a_damage_scenario_on_a_job_that_checkpoints_once_an_epoch_is_a_skip_saying_why(pytester):
    """Checkpoints after steps 5 and 11 of 13: no step but the last is left after the second. Before,
    the scenario ended in ``ValueError: min_step 12 leaves no step to preempt`` (issue 60)."""
    command = ["python", str(FIXTURES / "reference_trainer.py"), "--steps", "13", "--checkpoint-every", "6"]
    pytester.makefile(
        ".toml",
        pyproject=f"""
[tool.spotchaos]
output = "out"
[tool.spotchaos.jobs.epochs]
command = {json.dumps(command)}
""",
    )
    damage = ["--pyargs", "spotchaos.scenarios.test_checkpoint_damage", "-k", "rolls_back"]
    result = pytester.runpytest_subprocess("--spotchaos", "--spotchaos-job=epochs", "-rs", *damage)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*'epochs' checkpoints after steps [[]5, 11[]] of 13: no step is left*more often*"])
    assert "ValueError" not in result.stdout.str()
