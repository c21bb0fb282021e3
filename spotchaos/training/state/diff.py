"""Name the state a resume did not restore, and catch what no loss shows yet.

The uninterrupted run's checkpoints are kept as they appear (a trainer rotates them away), and
so are those a chaos run writes after a resume. Each of the latter is compared with the
reference's of the same step, file by file and key by key through nested dicts, lists and
tensors: ``trainer.pt:scheduler.last_epoch: 12 vs 13``, ``optimizer.pt:state.3.exp_avg:
differs``. When the run diverged, that names the cause; when it did not, a difference is a
*latent* failure: a scheduler counter restored wrong where it happens not to matter yet, an RNG
nothing has drawn from yet.

Each file is read in its own format through link-refusing fds (``state_formats``: safetensors,
numpy, JSON, torch with ``weights_only=True``); identical bytes are equal state, a file no format
reads is compared as bytes, and a torch file that needs a full unpickle is compared inside the
job's confinement (``confined/state_diff.py``). Paths of each run's own directory compare as
``{run}``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...safety.safefs import regular_files
from .checkpoint_reader import ConfinedLoader
from .confined.state_diff import diff
from .formats import AsBytes, NeedsConfinement, load_state, same_bytes

SHOWN = 8  # differences shown per checkpoint
ENTRIES_KEPT = 256  # differing entries a difference keeps by name (the report's, and the noise check's)


@dataclass
class StateDifference:
    """The first checkpoint after a resume whose state differs from the reference's."""

    attempt: int
    label: str  # "s<step>" (a probe's checkpoint) or "k<stored step key>" (a log-adapter one)
    differences: list[str] = field(default_factory=list)
    more: int = 0
    entries: list[str] = field(default_factory=list)  # every differing entry ("rng.python", "trainer.pt:step")

    def describe(self, latent: bool) -> str:
        shown = "; ".join(self.differences) + (f"; and {self.more} more" if self.more else "")
        which = f"after step {self.label[1:]}" if self.label.startswith("s") else f"storing step {self.label[1:]}"
        where = f"the checkpoint {which} (attempt {self.attempt}, after a resume)"
        if latent:
            return (
                f"latent: the losses matched, but {where} holds state the uninterrupted run's does not: {shown} "
                "— restored wrong where it happens not to matter yet (list entries that may differ in "
                "state_diff_ignore)"
            )
        return f"state not restored: {where} differs from the uninterrupted run's: {shown}"

    def unrepeatable(self, noise: StateDifference) -> str | None:
        """Said instead of :meth:`describe` when a second uninterrupted run's checkpoint (``noise``)
        already differs from the first's in an entry this one differs in: that state was never
        repeatable, so no resume restored it wrong (an RNG the job never seeded, say)."""
        noisy = set(noise.entries)
        shared = [entry for entry in self.entries if entry in noisy]
        if not shared:
            return None
        which = f"after step {noise.label[1:]}" if noise.label.startswith("s") else f"storing step {noise.label[1:]}"
        shown = ", ".join(shared[:SHOWN]) + (f" and {len(shared) - SHOWN} more" if len(shared) > SHOWN else "")
        return (
            f"not deterministic without any preemption: two uninterrupted runs already differ in {shown} "
            f"(their checkpoints {which}), the state the resumed run's checkpoint differs in too, so this is no "
            "restore gone wrong: seed what draws it (random.seed, numpy.random.seed, torch.manual_seed at start), "
            "or list the entries in state_diff_ignore if they are no state"
        )


@dataclass(frozen=True)
class DiffRules:
    """What two checkpoints may differ in and still hold the same state."""

    ignore: tuple[str, ...] = ()  # entry patterns: the framework's tables and the job's state_diff_ignore
    exact_floats: bool = True  # False (envelope jobs): floating entries are the envelope's to judge
    runs: tuple[str, str] = ("", "")  # the two runs' folders: a path under one names ``{run}``, as under the other
    # the options a restart's command adds or changes (``restart_flags``): a job that stores its own
    # arguments in its checkpoints (nanoGPT's ``config``, a Trainer's args) stores those as the
    # restart got them, which is no state the resume failed to restore
    restart_flags: frozenset[str] = frozenset()
    # values each run reported as its own identity (its logger's run id, ``probe.logger``), as the
    # diff shows them: two runs store their own, which is no state a resume failed to restore
    identities: frozenset[str] = frozenset()
    # attempts that trained in another run's folder (a tail another plan ran: training/reference/tails.py),
    # each with that folder: their checkpoints name it, as the run's own name ``runs[1]``
    trained_elsewhere: tuple[tuple[int, str], ...] = ()


def compare(
    reference_kept: Path,
    chaos_kept: Path,
    *,
    confined: ConfinedLoader | None,
    rules: DiffRules = DiffRules(),
    first_attempt: int = 1,
) -> StateDifference | None:
    """The first kept checkpoint of a resumed attempt that differs from the reference's of its step.
    ``first_attempt``: 0 compares a second uninterrupted run's own checkpoints too."""
    kept = sorted(
        (int(a), int(label[1:]), label, p)
        for p in (chaos_kept.iterdir() if chaos_kept.is_dir() else [])
        if p.name.startswith("a") and "-" in p.name
        for a, label in [p.name[1:].split("-", 1)]
        if a.isdigit() and int(a) >= first_attempt and label[:1] in ("s", "k") and label[1:].lstrip("-").isdigit()
    )
    elsewhere = dict(rules.trained_elsewhere)
    for attempt, _, label, path in kept:
        reference = reference_kept / f"a0-{label}"
        if not reference.is_dir():
            continue
        written = replace(rules, runs=(rules.runs[0], elsewhere[attempt])) if attempt in elsewhere else rules
        found, more = _compare_folders(reference, path, confined, written)
        if found:
            texts = [text for _, text in found]
            entries = [entry for entry, _ in found][:ENTRIES_KEPT]
            return StateDifference(attempt, label, texts[:SHOWN], more + max(0, len(texts) - SHOWN), entries)
    return None


def _compare_folders(
    reference: Path, chaos: Path, confined: ConfinedLoader | None, rules: DiffRules
) -> tuple[list[tuple[str, str]], int]:
    """Every file of two kept checkpoints, compared: (entry, what differs) ranked causes first
    (counters and RNG states before the tensors a divergence drags along), across files."""
    names = sorted({str(p.relative_to(reference)) for p in regular_files(reference)})
    names = sorted(set(names) | {str(p.relative_to(chaos)) for p in regular_files(chaos)})
    single = len(names) == 1
    found: list[tuple[int, str, str]] = []
    more = 0
    pairs = [(name, reference / name, chaos / name) for name in names]
    renamed = _renamed(pairs)
    if renamed is not None:  # one file only on each side, of one kind: the same checkpoint named otherwise
        pairs = [p for p in pairs if p[1].exists() and p[2].exists()] + [renamed]
        single = len(pairs) == 1
    for name, a, b in pairs:
        if not a.exists() or not b.exists():
            found.append((0, name, f"{name}: {_presence(a)} vs {_presence(b)}"))
            continue
        result = _diff_files(a, b, confined, rules.exact_floats, rules.runs)
        more += result.get("more", 0)
        for d in result["differences"]:
            entry = d["entry"] if single else f"{name}:{d['entry']}"
            if any(fnmatch.fnmatchcase(entry, pattern) for pattern in rules.ignore):
                continue
            if _leaf(d["entry"]) in rules.restart_flags:  # the job's own argument, stored as the restart was given it
                continue
            if d["reference"] in rules.identities and d["chaos"] in rules.identities:  # each run's own logger run
                continue
            same = d["reference"] == d["chaos"]
            rank = d["rank"] if isinstance(d.get("rank"), int) else 3
            text = f"{entry}: differs" if same else f"{entry}: {d['reference']} vs {d['chaos']}"
            if d.get("suggest"):  # what a heuristic would have skipped: shown, with the line that skips it
                rank, text = 4, f"{text} ({d['suggest']}: if it is no state, list {entry!r} in state_diff_ignore)"
            found.append((rank, entry, text))
    return [(entry, text) for _, entry, text in sorted(found)], more


def _renamed(pairs: list[tuple[str, Path, Path]]) -> tuple[str, Path, Path] | None:
    """The one file only the reference's checkpoint has and the one only the resumed run's has,
    paired, where they are of one kind (suffix): a checkpoint its job names by why it was written
    (``sigterm-step=12.ckpt`` for a notice's save where the uninterrupted run wrote the periodic
    ``epoch=1-step=12.ckpt``) holds the same state under another name, and is compared as such."""
    only_reference = [a for _, a, b in pairs if a.exists() and not b.exists()]
    only_chaos = [b for _, a, b in pairs if b.exists() and not a.exists()]
    if len(only_reference) != 1 or len(only_chaos) != 1 or only_reference[0].suffix != only_chaos[0].suffix:
        return None
    a, b = only_reference[0], only_chaos[0]
    return f"{b.name} (the reference's {a.name})", a, b


def restart_flags(
    command: tuple[str, ...], resume_args: tuple[str, ...], resume_command: tuple[str, ...] | None
) -> frozenset[str]:
    """The options a restart's command adds to the first attempt's or changes in it, as a script
    names them once parsed (``--init_from=resume``, ``--resume-from-checkpoint PATH``: ``init_from``,
    ``resume_from_checkpoint``): the keys under which a job storing its own arguments keeps them."""
    restart = (*(resume_command or command), *resume_args)
    first = set(command)
    return frozenset(
        token.lstrip("-").split("=", 1)[0].replace("-", "_")
        for token in restart
        if token.startswith("-") and len(token) > 1 and token not in first and token.lstrip("-")
    )


def _leaf(entry: str) -> str:
    """An entry's own name: ``config.init_from`` -> ``init_from``."""
    return entry.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def _presence(path: Path) -> str:
    return "present" if path.exists() else "absent"


def _diff_files(
    a: Path, b: Path, confined: ConfinedLoader | None, exact_floats: bool, runs: tuple[str, str]
) -> dict[str, Any]:
    """Two kept files compared in the terms of their format (see ``state_formats``): identical
    bytes are equal state; a file no format reads, or one that does not parse, differs as bytes;
    a torch file only a full unpickle reads is compared in the job's confinement."""
    if same_bytes(a, b):
        return {"differences": [], "more": 0}
    try:
        (_, x), (_, y) = load_state(a), load_state(b)
    except AsBytes as exc:
        return {"differences": [{"entry": "(bytes)", "reference": "differs", "chaos": "differs", "why": str(exc)}]}
    except NeedsConfinement:
        if confined is None:
            return {"differences": [{"entry": "(bytes)", "reference": "differs", "chaos": "differs"}]}
        answer = confined.diff(a, b, SHOWN * 4, runs)
        if "error" in answer:  # the job's own loader could not read it either: what differs is its bytes
            return {"differences": [{"entry": "(bytes)", "reference": "differs", "chaos": "differs"}]}
        return answer
    return diff(x, y, SHOWN * 4, exact_floats=exact_floats, runs=runs, within=a.name)
