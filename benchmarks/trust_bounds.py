"""The trust boundary's bounds, measured in one run (never asserted in a test).

- the secret scan and the redaction of a large log, streamed from a file: MB/s with 50 secrets
  (every 8-character window and its encodings, one RE2 automaton) and detect-secrets' shapes,
  against the Python window loop the scan used before (on a slice, extrapolated);
- the time to the job's timeout with a log pattern that backtracks on one line of its output:
  Python's ``re`` on that line (its growth with the line's length: the timeout can never win)
  against RE2, and the wall time of a real attempt under it with 5 s timeouts;
- the harness's peak RSS while its load reads a stream that never ends, 2 workers for a few
  seconds, against the bytes the stream carried meanwhile;
- the subreaper sweep at the end of an attempt (every process's stat read) against a bare
  Python start.

    .venv/bin/python benchmarks/trust_bounds.py --megabytes 256
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from spotchaos.config.jobs import JobSpec
from spotchaos.config.logspec import LogSpec
from spotchaos.errors import JobError
from spotchaos.faults.plan import Plan
from spotchaos.host.processes import become_subreaper, end_adopted
from spotchaos.safety.redact import SecretMatcher, leak_forms, leaking_files, redact_files
from spotchaos.training.engine.run import EngineOptions, run_job

ROOT = Path(__file__).resolve().parent.parent


def _old_python_scan(text: str, windows: dict[int, set[str]]) -> bool:
    """The scan before RE2: every position, every window size, a set lookup."""
    return any(text[i : i + n] in ws for n, ws in windows.items() for i in range(len(text) - n + 1))


def scan_figures(megabytes: int) -> None:
    keys = [secrets.token_urlsafe(30) for _ in range(50)]
    line = b"step 12 loss 0.123456 lr 3.0e-04 tokens/s 123456 grad_norm 0.98765 mem 12.3GB\n"
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        with open(root / "stdout.log", "wb") as f:
            block = line * ((8 << 20) // len(line))
            for _ in range(max(1, (megabytes << 20) // len(block))):
                f.write(block)
            f.write(f"late {keys[7]}\n".encode())  # one leak, at the very end
        size = (root / "stdout.log").stat().st_size / 1e6
        matcher = SecretMatcher(keys)
        start = time.perf_counter()
        found = leaking_files(root, matcher)
        scan = time.perf_counter() - start
        start = time.perf_counter()
        changed = redact_files(root, matcher)
        redaction = time.perf_counter() - start
    windows: dict[int, set[str]] = {}
    for key in keys:
        for form, n in leak_forms(key):
            windows.setdefault(n, set()).update(form[i : i + n] for i in range(len(form) - n + 1))
    sample = (line * ((1 << 20) // len(line))).decode()
    start = time.perf_counter()
    _old_python_scan(sample, windows)
    old = len(sample) / 1e6 / (time.perf_counter() - start)
    print(
        f"secret scan of a {size:.0f} MB log, 50 secrets ({sum(map(len, matcher.windows.values()))} windows): "
        f"{size / scan:.0f} MB/s (found {found}); redaction with shapes, copy renamed into place: "
        f"{size / redaction:.0f} MB/s ({changed}); the Python loop before: {old:.1f} MB/s = "
        f"{size / scan / old:.0f} x slower"
    )


def backtracking_figures() -> None:
    pattern = r"step (?P<step>\d+) (?:x+x+)+y loss (?P<loss>[0-9.]+)"
    slow = re.compile(pattern)
    times = []
    for n in (16, 18, 20, 22):
        start = time.perf_counter()
        slow.search("step 1 " + "x" * n + " loss 1.0")
        times.append((n, time.perf_counter() - start))
    growth = times[-1][1] / times[-2][1]
    at_40 = times[-1][1] * growth ** ((40 - times[-1][0]) / 2)
    fast = LogSpec(pattern=pattern).regex
    start = time.perf_counter()
    fast.search("step 1 " + "x" * 100_000 + " loss 1.0")
    re2_seconds = time.perf_counter() - start
    shown = ", ".join(f"{n} x's {t * 1e3:.0f} ms" for n, t in times)
    print(
        f"a backtracking log pattern, Python re: {shown} (x{growth:.1f} per 2 more; 40 x's ~ {at_40:.2g} s); "
        f"RE2 on 100,000 x's: {re2_seconds * 1e3:.2f} ms"
    )
    with tempfile.TemporaryDirectory() as folder:
        job_file = Path(folder) / "job.py"
        job_file.write_text('import time\nprint("step 1 " + "x" * 40 + " loss 1.0", flush=True)\ntime.sleep(300)\n')
        job = JobSpec(
            name="backtracks",
            command=(sys.executable, str(job_file)),
            log=LogSpec(pattern=pattern),
            start_timeout_seconds=5,
            event_timeout_seconds=5,
        )
        start = time.perf_counter()
        try:
            run_job(job, Plan(), Path(folder) / "run", EngineOptions(root=ROOT))
        except JobError as exc:
            said = str(exc).splitlines()[0][:90]
        wall = time.perf_counter() - start
    print(f"  an attempt under it with 5 s timeouts ended after {wall:.1f} s: {said}")


ENDLESS = textwrap.dedent(
    """
    import socket, sys, threading
    server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    def answer(conn):
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n")
        chunk = b"x" * 65536
        try:
            while True:
                conn.sendall(b"10000\\r\\n" + chunk + b"\\r\\n")
        except OSError:
            conn.close()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()
    """
)


def endless_stream_figures(seconds: float) -> None:
    from spotchaos.config.services import RequestRecipe
    from spotchaos.serving.load import Load

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", ENDLESS, str(port)])
    try:
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        load = Load(f"http://127.0.0.1:{port}", RequestRecipe(method="GET", path="/"), 2, 1.0).start()
        time.sleep(seconds)
        load.stop()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        server.kill()
        server.wait()
    timeouts = sum(r.outcome == "timeout" for r in load.records)
    print(
        f"an endless stream read by 2 workers for {seconds:g} s (1 s deadline): {timeouts} of {len(load.records)} "
        f"requests timed out; peak RSS {peak:.0f} MB, {peak - before:+.0f} MB over the harness before it"
    )


def sweep_figures(repeats: int) -> None:
    become_subreaper()
    samples, starts = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        starts.append(time.perf_counter() - t)
        t = time.perf_counter()
        end_adopted(0)
        samples.append(time.perf_counter() - t)
    sweep, start = sorted(samples)[len(samples) // 2], sorted(starts)[len(starts) // 2]
    print(
        f"subreaper sweep per attempt ({len(os.listdir('/proc'))} /proc entries): {sweep * 1e3:.2f} ms "
        f"= {sweep / start:.3f} x a bare Python start"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256, help="size of the scanned log")
    parser.add_argument("--stream-seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    threading.current_thread().name = "benchmark"
    scan_figures(args.megabytes)
    backtracking_figures()
    endless_stream_figures(args.stream_seconds)
    sweep_figures(args.repeats)


if __name__ == "__main__":
    main()
