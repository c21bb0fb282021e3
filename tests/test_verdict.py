"""The verdict is pure: synthetic trajectories in, named failures out."""

from __future__ import annotations

import pytest

from spotchaos.training.trajectory import Attempt, FaultRecord, RunRecord
from spotchaos.training.verdict import judge

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)


def step(i, loss=None, **fp):
    return {"event": "step", "step": i, "loss": (loss if loss is not None else 1.0 + i).hex(), "fp": fp}


def ckpt(i):
    return {"event": "checkpoint", "step": i, "seconds": 0.01, "bytes": 10, "uri": f"file:///c{i}"}


def final(**digests):
    return {"event": "final", "step": 9, "digests": digests or {"w": "a", "b": "b"}}


def attempt(index, events, *, code=0, fault=None):
    return Attempt(index=index, exit_code=code, wall_seconds=1, start_seconds=0.5, events=events, fault=fault)


def record(*attempts):
    return RunRecord(job="j", plan="p", attempts=list(attempts), wall_seconds=1, workdir="/tmp/x")


def notice(step, *, exceeded=False, kind="sigterm"):
    return FaultRecord(kind, step, step, 1.0, 1000.0, exit_seconds=0.2, grace_seconds=5, grace_exceeded=exceeded)


REFERENCE = record(attempt(0, [*(step(i, lr=0.1 * i) for i in range(10)), final()]))


def resumed(from_step, steps=None, final_event=None):
    """Attempt 0 preempted (SIGTERM) after ``from_step``; attempt 1 resumes after it.

    ``steps`` maps a step of attempt 1 to the keyword arguments of :func:`step` it gets instead.
    """
    steps = steps or {}
    first = [*(step(i, lr=0.1 * i) for i in range(from_step + 1)), ckpt(from_step)]
    second = [{"event": "resume", "from_step": from_step, "uri": "u"}]
    second += [step(i, **steps.get(i, {"lr": 0.1 * i})) for i in range(from_step + 1, 10)]
    second.append(final_event or final())
    return record(attempt(0, first, fault=notice(from_step)), attempt(1, second))


def test_identical_resume_passes_with_no_lost_work():
    verdict = judge(REFERENCE, resumed(4))
    assert verdict.passed, verdict.failures
    assert verdict.lost_steps == 0 and verdict.grace[0].ok
    assert verdict.message() == "bit-exact"


def test_first_divergence_names_step_values_and_the_fingerprint():
    chaos = resumed(4, {5: {"lr": 0.55, "loss": 7.0}})
    verdict = judge(REFERENCE, chaos)
    assert not verdict.passed
    d = verdict.first_divergence
    assert (d.step, d.attempt, d.field, d.resumed_from) == (5, 1, "loss", 4)
    assert d.also_differs == ["lr"]
    text = verdict.message()
    assert "loss diverged at step 5 (attempt 1, the first step after resuming from step 4)" in text
    assert f"reference {(6.0).hex()} (6.0), got {(7.0).hex()} (7.0)" in text
    assert "learning rate differs" in text


def test_fingerprint_alone_can_be_the_first_divergence():
    verdict = judge(REFERENCE, resumed(4, {7: {"lr": 9.0}}))
    assert verdict.first_divergence.field == "lr" and verdict.first_divergence.step == 7
    assert "3 steps after resuming from step 4" in verdict.message()


def test_a_batch_that_differs_steps_after_the_resume_names_the_later_order_not_the_position():
    batches = {i: {"lr": 0.1 * i, "batch": f"b{i}"} for i in range(10)}
    reference = record(attempt(0, [*(step(i, **batches[i]) for i in range(10)), final()]))
    later = judge(reference, resumed(4, {**batches, 8: {"lr": 0.8, "batch": "other", "loss": 3.0}}))
    text = later.message()
    assert "loss diverged at step 8 (attempt 1, 4 steps after resuming from step 4)" in text, text
    assert "the 3 steps after the resume had the right batches: the position in the epoch was restored" in text
    assert "give the sampler and the loader a generator each" in text and "position in the epoch not" not in text
    first = judge(reference, resumed(4, {**batches, 5: {"lr": 0.5, "batch": "other", "loss": 3.0}}))
    assert "data order or position in the epoch not restored" in first.message()
    assert "had the right batches" not in first.message()


def test_replayed_steps_must_match_too():
    chaos = resumed(4)
    chaos.attempts[1].events.insert(1, step(4, loss=123.0, lr=0.4))  # a replay of step 4 that differs
    verdict = judge(REFERENCE, chaos)
    assert verdict.first_divergence.step == 4 and verdict.lost_steps == 1


def test_missing_steps_and_unexpected_steps_are_listed():
    chaos = resumed(4)
    del chaos.attempts[1].events[2:4]  # steps 6 and 7 never ran
    chaos.attempts[1].events.insert(-1, step(12))
    verdict = judge(REFERENCE, chaos)
    assert "2 step(s) never ran after the preemptions: 6-7" in verdict.message()
    assert "steps the reference never ran: 12" in verdict.message()


def test_a_job_that_exits_0_short_of_the_last_step_is_named_as_ending_early():
    chaos = resumed(4)
    del chaos.attempts[1].events[-4:-1]  # steps 7-9 never ran, and the attempt still exits 0
    text = judge(REFERENCE, chaos).message()
    assert "3 step(s) never ran after the preemptions: 7-9" in text, text
    assert "the job exited 0 after 7 optimizer step(s), 3 fewer than the reference's 10" in text, text
    chaos.attempts[1].exit_code = 1
    assert "exited 0" not in judge(REFERENCE, chaos).message()
    middle = resumed(4)
    del middle.attempts[1].events[2:4]
    assert "exited 0" not in judge(REFERENCE, middle).message()


def test_final_weights_name_the_differing_tensors():
    verdict = judge(REFERENCE, resumed(4, final_event=final(w="a", b="CHANGED")))
    assert verdict.differing_tensors == ["b"]
    assert "final weights differ in 1 of 2 tensor(s): b" in verdict.message()


def test_missing_final_event_fails():
    chaos = resumed(4)
    chaos.attempts[1].events.pop()
    assert "never reported a 'final' event" in judge(REFERENCE, chaos).message()


def test_grace_window_exceeded_is_named():
    chaos = resumed(4)
    chaos.attempts[0].fault = notice(4, exceeded=True)
    chaos.attempts[0].exit_code = -9
    text = judge(REFERENCE, chaos).message()
    assert "did not exit within 5 s of sigterm after step 4" in text
    assert "does the trainer handle SIGTERM" in text


def test_crash_after_group_sigterm_points_at_dataloader_workers():
    chaos = resumed(4)
    chaos.attempts[0].fault = notice(4, kind="sigterm-group")
    chaos.attempts[0].exit_code = 1
    text = judge(REFERENCE, chaos).message()
    assert "exited with status 1" in text and "DataLoader workers" in text


def test_exit_without_checkpoint_after_notice_fails():
    chaos = resumed(4)
    chaos.attempts[0].events.pop()  # no checkpoint event
    assert "no checkpoint at or after step 4" in judge(REFERENCE, chaos).message()


def test_restart_that_ignores_the_durable_checkpoint_is_lost_work():
    chaos = resumed(4)
    second = chaos.attempts[1]
    second.events = [step(i, lr=0.1 * i) for i in range(10)] + [final()]  # started over
    verdict = judge(REFERENCE, chaos)
    assert "resumed after step -1 although a checkpoint after step 4 was durable" in verdict.message()
    assert verdict.lost_steps == 5


def test_rollback_excuses_resuming_from_an_older_checkpoint():
    first = [*(step(i, lr=0.1 * i) for i in range(6)), ckpt(2), ckpt(5)]
    second = [
        {"event": "rollback", "skipped_uri": "file:///c5", "reason": "sha256"},
        {"event": "resume", "from_step": 2, "uri": "file:///c2"},
        *(step(i, lr=0.1 * i) for i in range(3, 10)),
        final(),
    ]
    chaos = record(attempt(0, first, fault=notice(5)), attempt(1, second))
    verdict = judge(REFERENCE, chaos)
    assert verdict.passed, verdict.failures
    assert verdict.lost_steps == 3


def damaged(resume_from, *, rollback=True, fault="truncate-half", unloadable=True, uri="u"):
    """Checkpoints after steps 2 and 5; the one after 5 is damaged before the restart."""
    from spotchaos.faults import Damage

    first = [*(step(i, lr=0.1 * i) for i in range(7)), ckpt(2), ckpt(5)]
    second = [{"event": "rollback", "skipped_uri": "file:///c5", "reason": "crc"}] if rollback else []
    second += [{"event": "resume", "from_step": resume_from, "uri": uri}]
    second += [*(step(i, lr=0.1 * i) for i in range(resume_from + 1, 10)), final()]
    chaos = record(attempt(0, first, fault=notice(5)), attempt(1, second))
    chaos.attempts[0].damage = Damage(
        fault,
        "/run/checkpoints/ckpt-6",
        "model.pt",
        "1 -> 0 bytes",
        makes_unloadable=unloadable,
        damaged_step=5,
        expected_resume=2 if unloadable else 5,
    )
    return chaos


def test_a_one_file_checkpoints_damage_names_its_path_once():
    """``truncate-half on ckpt.pt/ckpt.pt`` named a one-file checkpoint twice (issue 60)."""
    chaos = damaged(5, rollback=False)
    chaos.attempts[0].damage.checkpoint, chaos.attempts[0].damage.file = "/run/checkpoints/ckpt.pt", "ckpt.pt"
    text = judge(REFERENCE, chaos).message()
    assert "truncate-half on ckpt.pt (1 -> 0 bytes)" in text and "ckpt.pt/ckpt.pt" not in text


def test_resuming_from_an_untouched_copy_of_the_damaged_step_beside_it_is_no_bad_load():
    """Lightning saves a step twice (epoch=E-step=S.ckpt and last.ckpt): one damaged, the other whole."""
    verdict = judge(REFERENCE, damaged(5, rollback=False, uri="file:///run/checkpoints/last.ckpt"))
    assert verdict.passed, verdict.failures
    assert "silent bad load" in judge(REFERENCE, damaged(5, rollback=False, uri="/run/checkpoints/ckpt-6")).message()


def test_rollback_to_the_newest_intact_checkpoint_passes():
    verdict = judge(REFERENCE, damaged(2))
    assert verdict.passed, verdict.failures
    (outcome,) = verdict.damage
    assert outcome.ok and outcome.rolled_back and outcome.resumed_from == 2


def test_loading_the_damaged_checkpoint_is_a_silent_bad_load():
    text = judge(REFERENCE, damaged(5, rollback=False)).message()
    assert "silent bad load: attempt 1 resumed from the damaged checkpoint after step 5" in text
    assert "truncate-half on ckpt-6/model.pt (1 -> 0 bytes)" in text and "without reporting a rollback" in text


def test_skipping_damage_without_saying_so_fails():
    text = judge(REFERENCE, damaged(2, rollback=False)).message()
    assert "skipped the damaged checkpoint" in text and "report a 'rollback' event" in text


def test_trusting_a_stale_pointer_is_lost_work():
    text = judge(REFERENCE, damaged(2, rollback=False, fault="stale-latest", unloadable=False)).message()
    assert "resumed after step 2, but the newest intact checkpoint was after step 5" in text
    assert "stale or torn 'latest' pointer" in text


def test_a_crash_that_leaves_nothing_loadable_names_the_crash_point():
    first = [*(step(i, lr=0.1 * i) for i in range(7)), ckpt(5)]
    crash = FaultRecord("crash", 9, 6, 1.0, 1000.0, detail="before os.rename ckpt-7 (file-system event 9)")
    chaos = record(
        attempt(0, first, code=-9, fault=crash), attempt(1, [*(step(i, lr=0.1 * i) for i in range(10)), final()])
    )
    text = judge(REFERENCE, chaos).message()
    # the restart reported no rollback: that nothing was loadable is not proven, and not said (issue 60)
    assert "crash before os.rename ckpt-7 (file-system event 9) in attempt 0: attempt 1 started from scratch" in text
    assert "whether none was loadable or none was looked for is not known" in text
    assert "left neither" not in text
    skipped = {"event": "rollback", "skipped_uri": "file:///c/ckpt-5", "t": 0.0, "step": -1}
    chaos.attempts[1].events.insert(0, skipped)
    text = judge(REFERENCE, chaos).message()
    assert "left neither the old nor the new checkpoint loadable: attempt 1 found ckpt-5 damaged" in text


def test_a_counter_that_restarts_each_epoch_is_no_resume_point():
    """A script whose step counter restarts per epoch and reports no resume point: its restart's
    first step line (0) is no evidence that it started from scratch (issue 60: "resumed after step
    -1 ... work was lost silently" of a job that resumed right)."""
    per_epoch = record(attempt(0, [*(step(i % 4, lr=0.0) for i in range(8)), ckpt(3), final()]))
    chaos = record(
        attempt(
            0, [*(step(i, lr=0.0) for i in range(4)), ckpt(3)], code=-9, fault=FaultRecord("sigkill", 3, 3, 1.0, 1.0)
        ),
        attempt(1, [*(step(i, lr=0.0) for i in range(4)), final()]),
    )
    text = judge(per_epoch, chaos).message()
    assert "where attempt 1 resumed is unknown: its first step line said step 0" in text
    assert "work was lost silently" not in text


def test_rollback_past_an_intact_checkpoint_is_a_failure_and_a_rollback_to_it_is_not():
    """Two durable checkpoints; the restart skips the newest (said so) and must land on the older one."""

    def chaos(resume_after):
        first = [*(step(i, lr=0.1 * i) for i in range(7)), ckpt(2), ckpt(5)]
        skipped = {"event": "rollback", "skipped_uri": "file:///c5", "reason": "manifest missing"}
        second = [skipped]
        if resume_after is not None:
            second.append({"event": "resume", "from_step": resume_after, "uri": f"file:///c{resume_after}"})
        start = -1 if resume_after is None else resume_after
        second += [step(i, lr=0.1 * i) for i in range(start + 1, 10)]
        second.append(final())
        kill = FaultRecord("sigkill", 6, 6, 1.0, 1000.0)
        return record(attempt(0, first, code=-9, fault=kill), attempt(1, second))

    assert judge(REFERENCE, chaos(2)).passed
    verdict = judge(REFERENCE, chaos(None))  # skipped the bad one, then started over: lost the good one
    assert not verdict.passed
    assert any("rolled back past an intact checkpoint: it resumed after step -1" in f for f in verdict.failures)


def test_a_data_caveat_is_the_cause_only_where_the_batch_differs():
    """A framework restarts a plain loader's epoch (Lightning), but the job's sampler skipped the
    trained batches itself: with the batches equal, another cause is named, never the loader."""
    reference = record(attempt(0, [*(step(i, batch=f"b{i}") for i in range(10)), final()]))
    first = [*(step(i, batch=f"b{i}") for i in range(5)), ckpt(4)]

    def resumed_with(batch_of_step_5: str):
        resume = {
            "event": "resume",
            "from_step": 4,
            "uri": "u",
            "caveat": "no RNG state",
            "data_caveat": "plain loader",
        }
        second = [resume, step(5, loss=99.0, batch=batch_of_step_5), *(step(i, batch=f"b{i}") for i in range(6, 10))]
        return record(attempt(0, first, fault=notice(4)), attempt(1, [*second, final()]))

    same_batch = judge(reference, resumed_with("b5")).first_divergence
    assert same_batch.field == "loss" and same_batch.caveats == ["no RNG state"]
    other_batch = judge(reference, resumed_with("b0")).first_divergence
    assert other_batch.caveats == ["no RNG state", "plain loader"]


def test_a_rotation_that_deleted_the_last_complete_checkpoint_is_named_and_an_ordinary_one_is_not():
    kill = FaultRecord("sigkill", 6, 6, 1.0, 1000.0)
    removed = {"event": "removed", "uri": "file:///c2"}
    # c2 durable, deleted when the save of c5 was handed off, killed before c5 was written
    first = attempt(0, [*(step(i) for i in range(3)), ckpt(2), *(step(i) for i in range(3, 7)), removed], fault=kill)
    again = attempt(1, [*(step(i) for i in range(10)), final()])
    failures = judge(REFERENCE, record(first, again)).failures
    assert failures == [
        "attempt 1 resumed after step -1: the checkpoint after step 2 (c2) was durable, but the job deleted it in "
        "attempt 0 before a newer checkpoint was: its rotation removed the last complete checkpoint (delete an "
        "older checkpoint only once the newer one is written: with an asynchronous save, such as Lightning's "
        "AsyncCheckpointIO, once its write has finished)"
    ]
    # the ordinary rotation: c2 deleted once c5 was durable, the restart resumes from c5
    ordinary = attempt(0, [*(step(i) for i in range(6)), ckpt(2), ckpt(5), removed, step(6)], fault=kill)
    resumed_c5 = {"event": "resume", "from_step": 5, "uri": "file:///c5"}
    later = attempt(1, [resumed_c5, *(step(i) for i in range(6, 10)), final()])
    assert judge(REFERENCE, record(ordinary, later)).passed
