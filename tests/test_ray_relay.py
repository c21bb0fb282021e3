"""An attempt's folder relayed through Ray, for worker nodes that share no folder with the harness
(issue 40, item 1): the job writes its events, logs and exit status and holds at its step in a
folder of its own node; the harness pulls them over the agent actor into the attempt's folder.

The first test drives the two halves of the protocol against each other in this process (the
node's folder and the harness's relay, the real hold's FIFOs, the probe's own hold in a real
process). The others run the reference trainer on a real local Ray cluster whose worker nodes each
have a temporary folder of their own: a fault lands exactly on its planned step, the events are
the harness's copy, and a job whose checkpoints would be in a folder of this machine is one clear
error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotchaos.backends.raycluster import LocalRayCluster
from spotchaos.backends.raycluster.relay import NodeFolder, Relay
from spotchaos.errors import SpotchaosError
from spotchaos.faults.plan import Plan
from spotchaos.probe import ENV_EVENTS, ENV_HOLD_DIR
from spotchaos.session import Session
from spotchaos.training.engine.hold import Hold

from .helpers import ROOT, trainer_job

HELD_JOB = f"""
import json, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from spotchaos.probe import StepHold
events = os.environ[{ENV_EVENTS!r}]
with open(events, "a") as f:
    f.write(json.dumps({{"event": "step", "step": 3, "tmp": os.environ["TMPDIR"]}}) + "\\n")
hold = StepHold.from_env()
started = time.monotonic()
hold.wait(3)
with open(events, "a") as f:
    f.write(json.dumps({{"event": "released", "waited": time.monotonic() - started}}) + "\\n")
"""


def test_a_held_step_its_events_and_its_release_cross_the_relay(tmp_path):
    attempt = tmp_path / "attempt-0"
    attempt.mkdir()
    hold = Hold(attempt / "hold", 3, seconds=30)
    env = {**os.environ, ENV_EVENTS: str(attempt / "events.jsonl"), **hold.environment(), "PYTHONUNBUFFERED": "1"}
    node = NodeFolder(str(attempt))
    try:
        local = node.localize(env)
        assert local[ENV_EVENTS].startswith(node.path) and local[ENV_HOLD_DIR].startswith(node.path)
        assert local["TMPDIR"].startswith(node.path) and not local[ENV_HOLD_DIR].startswith(str(tmp_path))
        calls = {"relay_pull": node.pull, "relay_release": node.release}
        relay = Relay(lambda method, *args, timeout=30: calls[method](*args), attempt, ("hold",)).start()
        job = subprocess.Popen([sys.executable, "-c", HELD_JOB], env=local)
        deadline = time.monotonic() + 60
        while hold.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hold.held_step == 3  # the job's announcement on its node, read from the harness's own FIFO
        lines = [json.loads(line) for line in (attempt / "events.jsonl").read_text().splitlines()]
        assert lines == [{"event": "step", "step": 3, "tmp": local["TMPDIR"]}]  # relayed before the release
        time.sleep(0.3)
        assert job.poll() is None, "the job must wait for its release"
        hold.release()
        assert job.wait(30) == 0
        relay.stop()
        lines = [json.loads(line) for line in (attempt / "events.jsonl").read_text().splitlines()]
        assert lines[-1]["event"] == "released" and lines[-1]["waited"] >= 0.3, lines
        assert relay.offsets["events.jsonl"] == (attempt / "events.jsonl").stat().st_size
    finally:
        hold.close()
        node.close()
    assert not Path(node.path).exists()  # the node's folder goes once the harness has it all


@pytest.mark.unit
def test_a_relayed_answer_never_writes_outside_the_attempts_folder(tmp_path):
    attempt = tmp_path / "attempt-0"
    attempt.mkdir()
    (tmp_path / "outside").write_text("mine")
    (attempt / "link").symlink_to(tmp_path / "outside")
    answers = {"files": {"../outside": b"x", "/etc/passwd": b"x", "link": b"x", "ok.log": b"fine"}, "held": {}}
    relay = Relay(lambda method, *args, timeout=30: answers, attempt, ())
    relay.pull_once()
    assert (tmp_path / "outside").read_text() == "mine"  # neither by '..' nor through a link
    assert (attempt / "ok.log").read_text() == "fine" and relay.offsets == {"ok.log": 4}


@pytest.fixture(scope="module")
def apart_runner(tmp_path_factory):
    """A local cluster of two worker nodes whose temporary folders are their own (TMPDIR), with the
    attempts' folders relayed: hosts that share no folder with the harness, on one machine."""
    runs = tmp_path_factory.mktemp("relay-runs")
    with (
        LocalRayCluster(workers=2, cpus=1, separate_folders=True) as cluster,
        Session(ROOT, workdir=runs) as runner,
    ):
        runner.use_ray_cluster(cluster)
        yield runner


def test_on_nodes_that_share_no_folder_held_faults_land_on_their_steps(apart_runner):
    """A notice (the node drained, SIGTERM, the job's checkpoint and exit 0 relayed) and a kill (the
    node removed after one last pull), each held at its step on a node whose folder is its own."""
    job = replace(trainer_job("reference_trainer", name="relayed-s3"), backend="ray", storage="s3", grace_seconds=20)
    run, verdict = apart_runner.run(job, Plan.parse("sigterm@5,sigkill@10"))
    assert verdict.passed, verdict.message()
    assert [(f.held, f.landed_step, f.steps_late) for f in run.faults] == [(True, 5, 0), (True, 10, 0)], run.faults
    assert [a.exit_code for a in run.attempts[:2]] == [0, -9]  # the notice's exit read as the job exited
    cluster = apart_runner.ray_cluster()
    nodes_folder = Path(str(cluster.temp_dir)) / "nodes"
    for attempt in run.attempts:
        placement = attempt.placement
        assert placement["node_folder"].startswith(str(nodes_folder)), placement  # the job's folder: its node's
        assert placement["relayed_bytes"] > 0, placement
        steps = [e for e in attempt.events if e["event"] == "step"]
        assert steps, "the harness has the job's events only through the relay"
    resumed = [e["from_step"] for a in run.attempts[1:] for e in a.events if e["event"] == "resume"]
    assert resumed == [5, 7]  # the notice's checkpoint, then the one after step 7, both in the harness's S3


def test_a_local_checkpoint_folder_on_nodes_that_share_none_is_one_clear_error(apart_runner):
    job = replace(trainer_job("reference_trainer", name="relayed-local"), backend="ray", grace_seconds=20)
    with pytest.raises(SpotchaosError, match=r"nodes do not share this machine's files: give the job storage = \"s3\""):
        apart_runner.run(job, Plan.parse("sigkill@6"))


@pytest.mark.unit
def test_relay_settings_are_checked():
    from spotchaos.config.jobs import ConfigError, _ray_settings

    assert _ray_settings({"relay": "on", "shared_folder": "/mnt/runs"}, "ray").relay == "on"
    with pytest.raises(ConfigError, match=r"relay: must be \"auto\", \"on\" or \"off\""):
        _ray_settings({"relay": "yes"}, "ray")
    with pytest.raises(ConfigError, match=r"shared_folder: must be an absolute path"):
        _ray_settings({"shared_folder": "runs"}, "ray")
    with pytest.raises(ConfigError, match=r"separate_node_folders: must be true or false"):
        _ray_settings({"separate_node_folders": "yes"}, "ray")
