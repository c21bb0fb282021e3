"""When a service stopped saying it is ready, after its reclaim notice.

A graceful drain starts by taking the instance out of the traffic: the platform's balancer sends
requests to every instance whose readiness check answers 200, so one that keeps answering 200
after its notice keeps being sent requests it can only refuse (or, worse, drop), while a ready
replacement waits. The drain verdict alone cannot see it: each of those requests may be refused
correctly. So from the notice on, the harness asks the instance itself (not through the balancer)
every ``every`` seconds, each check bounded in time, until a check does not answer 200 (503, a
refused connection, no answer within its deadline) or the instance is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .answers import request_once

CHECK_SECONDS = 0.05  # between two checks
CHECK_DEADLINE_SECONDS = 0.5  # one check, in all: a service that cannot answer that fast is not ready


class ReadinessWatch:
    """``watch = ReadinessWatch(url, is_gone).start()`` at the notice; ``watch.stop()`` once the
    instance is gone; ``watch.unready_at`` (``time.monotonic()``) is when it stopped being ready."""

    def __init__(self, url: str, is_gone: Callable[[], bool], every: float = CHECK_SECONDS) -> None:
        self.url = url
        self.is_gone = is_gone
        self.every = every
        self.unready_at: float | None = None
        self.checks = 0
        self.last_ready_at: float | None = None  # the last check that answered 200
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotchaos-readiness", daemon=True)

    def start(self) -> ReadinessWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(CHECK_DEADLINE_SECONDS + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            if self.is_gone():
                self.unready_at = asked
                return
            try:
                ready = request_once("GET", self.url, CHECK_DEADLINE_SECONDS, read_body=False).status == 200
            except Exception:  # refused, reset, no answer in time: not ready
                ready = False
            self.checks += 1
            if not ready:
                self.unready_at = asked
                return
            self.last_ready_at = asked
            self._stop.wait(self.every)
