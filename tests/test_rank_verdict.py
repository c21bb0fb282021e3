"""The per-rank verdict on hand-made run records: pure, no process."""

from pathlib import Path

import pytest

from spotchaos.training.multirank.rank_verdict import (
    add_rank_verdicts,
    optimizer_untested,
    restored_differences,
    sample_coverage,
    shared_rng,
)
from spotchaos.training.trajectory import Attempt, RunRecord

pytestmark = pytest.mark.unit


def run(*attempts: list[dict]) -> RunRecord:
    return RunRecord(
        job="j",
        plan="p",
        attempts=[
            Attempt(index=i, exit_code=0, wall_seconds=1, start_seconds=0, events=e) for i, e in enumerate(attempts)
        ],
        wall_seconds=1,
        workdir="/nowhere",
    )


def samples(rank: int, step: int, epoch: int, ids: list[int]) -> dict:
    return {"event": "samples", "rank": rank, "step": step, "epoch": epoch, "ids": ids}


def test_every_sample_once_passes_and_a_replayed_step_replaces_its_first_run():
    first = [samples(0, 0, 0, [0, 1]), samples(1, 0, 0, [2, 3]), samples(0, 1, 0, [4, 5])]
    again = [samples(0, 1, 0, [4, 5]), samples(1, 1, 0, [6, 7]), samples(0, 2, 1, [3, 1])]
    assert sample_coverage(run(first, again)) == []


def test_a_sample_twice_in_an_epoch_and_one_never_seen_are_failures():
    events = [samples(0, 0, 0, [0, 1]), samples(1, 0, 0, [0, 3]), samples(0, 1, 1, [0, 1, 2, 3])]
    failures = sample_coverage(run(events))
    assert "1 sample(s) of epoch 0 were trained on more than once" in failures[0]
    assert "sample 0: step 0 on rank 0, step 0 on rank 1" in failures[0]
    assert "1 sample(s) of epoch 0 were never trained on (e.g. sample 2)" in failures[1]


def test_restored_tensors_must_equal_the_saved_ones():
    saved = {"event": "saved", "uri": "file:///c/step-3", "digests": {"w": "a", "b": "b"}}
    good = {"event": "restored", "rank": 1, "uri": "file:///c/step-3", "digests": {"w": "a", "b": "b"}}
    bad = {**good, "digests": {"w": "a", "b": "x"}}
    assert restored_differences(run([saved], [good])) == []
    assert (
        "rank 1 (attempt 1) restored step-3 but 1 of 2 tensor(s) differ from what was saved: b"
        in (restored_differences(run([saved], [bad]))[0])
    )
    assert "only the optimizer's state" not in restored_differences(run([saved], [bad]))[0]


def test_ranks_sharing_one_rng_state_after_a_resume_are_named():
    def step(rank, number, rng):
        return {"event": "step", "rank": rank, "step": number, "loss": "0x1p+0", "fp": {"rng": rng}}

    reference = run([step(0, 1, "a"), step(1, 1, "b")])
    assert shared_rng(reference, run([], [step(0, 1, "a"), step(1, 1, "b")])) == []
    failure = shared_rng(reference, run([], [step(0, 1, "a"), step(1, 1, "a")]))
    assert "ranks 0, 1 drew from the same RNG state at step 1" in failure[0]


def test_restored_weights_with_the_optimizer_moments_lost_name_the_optimizer_template():
    digests = {"0.weight": "w", "optim.0.weight.exp_avg": "m", "optim.0.weight.exp_avg_sq": "v"}
    saved = {"event": "saved", "uri": "file:///c/step-7", "digests": digests}
    lost = {
        "event": "restored",
        "rank": 0,
        "uri": "file:///c/step-7",
        "digests": {**digests, "optim.0.weight.exp_avg": "0"},
    }
    (failure,) = restored_differences(run([saved], [lost]))
    assert "1 of 3 tensor(s) differ from what was saved: optim.0.weight.exp_avg; only the optimizer's state" in failure
    assert "get_state_dict(model, optimizer)" in failure


def test_a_checkpoint_without_metadata_is_torn_only_when_it_is_dcps(tmp_path):
    from spotchaos.training.multirank.torchrun import published_without_metadata

    def published(name: str, *files: str) -> dict:
        folder = tmp_path / name
        folder.mkdir()
        for file in files:
            (folder / file).write_bytes(b"x")
        return {"event": "checkpoint", "step": 7, "uri": folder.as_uri()}

    events = [
        published("step_7", "model.safetensors", "optimizer.bin", "random_states_0.pkl"),  # accelerate's: no .metadata
        published("step-000011", "__0_0.distcp", "manifest.json"),  # DCP's shard without its .metadata: torn
    ]
    (found,) = published_without_metadata(run(events).attempts, tmp_path)
    assert found.startswith(
        "checkpoint step-000011 (after step 7, attempt 0) was reported durable but has no .metadata"
    )
    assert published_without_metadata(run([published("step-000015", "manifest.json")]).attempts, tmp_path)


def test_the_crash_points_of_a_save_include_its_temporary_folder_renamed_into_place():
    from spotchaos.families.distributed import _save_points, _written_as

    root = Path("/r/ckpt")
    log = [
        {"rank": 0, "index": 1, "event": "open-write", "path": f"{root}/.partial-4/model.safetensors"},
        {"rank": 0, "index": 2, "event": "rename", "path": f"{root}/.partial-4 -> {root}/step_4"},
        {"rank": 0, "index": 3, "event": "open-write", "path": f"{root}/.partial-9/model.safetensors"},
        {"rank": 0, "index": 4, "event": "rename", "path": f"{root}/.partial-9 -> {root}/step_9"},
    ]
    folders = [_written_as(log, root / "step_4"), _written_as(log, root / "step_9")]
    assert folders[0] == [root / "step_4", root / ".partial-4"]
    points = _save_points(log, folders, 0)
    assert [(p["index"], p["path"]) for p in points] == [(1, ".partial-4/model.safetensors"), (2, ".partial-4")]


def test_a_resume_from_a_checkpoint_saved_before_any_optimizer_step_says_it_tests_no_optimizer_restore():
    from spotchaos.training.verdict import judge

    weights = {"model.w": "a1"}
    early = {"event": "saved", "step": 0, "uri": "file:///c/step-000000", "digests": weights}
    moments = {**weights, "optim.w.exp_avg": "b"}
    later = {"event": "saved", "step": 3, "uri": "file:///c/step-000003", "digests": moments}
    steps = [{"event": "step", "step": s, "loss": "0x1p+0"} for s in range(5)]
    steps.append({"event": "final", "step": 4, "digests": weights})
    reference = run([*steps[:1], early, *steps[1:4], later, *steps[4:]])
    resumed = {"event": "resume", "from_step": 0, "uri": "file:///c/step-000000"}
    chaos = run([*steps[:1], early], [resumed, *steps[1:4], later, *steps[4:]])
    notes = optimizer_untested(reference, chaos)
    assert notes == [
        "attempt 1 resumed from step-000000, saved before any optimizer step (it holds no optimizer state): "
        "this resume tests no optimizer restore"
    ]
    verdict = judge(reference, chaos, None)
    add_rank_verdicts(verdict, reference, chaos, [])
    assert verdict.passed and verdict.precision == f"bit-exact; {notes[0]}", verdict  # said, not failed
    from_later = run([*steps[:4], later], [{**resumed, "from_step": 3, "uri": later["uri"]}, *steps[4:]])
    assert optimizer_untested(reference, from_later) == []  # a checkpoint holding moments: tested
    plain = {**later, "digests": weights}  # a job that reports no optimizer state at all: nothing to tell
    assert optimizer_untested(run([*steps[:1], early, *steps[1:4], plain]), run([early], [resumed, plain])) == []
