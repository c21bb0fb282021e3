"""Worker-group restarts inside one launch: torchrun's agent (and Ray Train's controller) restart
every rank when one dies, so one launch may hold several runs of the group; each is judged as an
attempt of its own."""

from __future__ import annotations

from dataclasses import replace

from ..trajectory import Attempt


def split_group_restarts(attempts: list[Attempt]) -> list[Attempt]:
    """One launch of a torchrun job may hold several runs of its worker group: the agent restarts
    every rank when one dies (or a lost node's replacement joins). Each run becomes an attempt of
    its own, as a restart by the harness would, so every verdict (resumed from the newest durable
    checkpoint, steps replayed bit-exact) applies to it. A rank's n-th start event opens its n-th
    group run; the fault stays with the run it hit, the exit and the damage with the last."""
    split: list[Attempt] = []
    for launch in attempts:
        runs: list[list] = [[]]
        starts: dict[int, int] = {}
        for event in launch.events:
            rank = event.get("rank", 0)
            if event["event"] == "start":
                starts[rank] = starts.get(rank, -1) + 1
            group_run = max(starts.get(rank, 0), 0)
            while len(runs) <= group_run:
                runs.append([])
            runs[group_run].append(event)
        for number, events in enumerate(runs):
            last = number == len(runs) - 1
            part = replace(
                launch,
                index=len(split),
                events=events,
                fault=launch.fault if number == 0 else None,
                damage=launch.damage if last else None,
                exit_code=launch.exit_code if last else None,
                failed_restart=launch.failed_restart if last else None,
                group_restart=number,
                launch=launch.index,
            )
            if number:
                first = events[0]["t"] if events else launch.started_wall
                part.started_wall, part.start_seconds = first, 0.0
            split.append(part)
    return split
