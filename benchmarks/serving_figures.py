"""Service figures, measured in one run: for each built-in service (and each notice channel on
the plain one), the drain time, failed requests, the replacement's type, cold and warm time to
first request and their ratio; on the subprocess backend, and in Docker with --docker.

    .venv/bin/python benchmarks/serving_figures.py [--docker] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotchaos import Session  # noqa: E402
from spotchaos.backends.testimage import IMAGE  # noqa: E402
from spotchaos.config.jobs import load_settings  # noqa: E402
from spotchaos.errors import ScenarioFailure  # noqa: E402

CASES = [
    ("model", "sigterm"),
    ("model", "aws"),
    ("model", "gcp"),
    ("model", "azure"),
    ("model", "alibaba"),
    ("model-stream", "sigterm"),
    ("model-fallback", "sigterm"),
    ("model-republished", "sigterm"),
    ("model-pai-eas", "alibaba"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docker", action="store_true", help="run every service in the test image")
    parser.add_argument("--repeat", type=int, default=1, help="runs of model-fallback for the warm/cold ratio")
    args = parser.parse_args()
    settings = load_settings(ROOT / "pyproject.toml")
    with tempfile.TemporaryDirectory() as work, Session(ROOT, workdir=Path(work)) as session:
        header = (
            "service | channel | backend | drain s | requests | failed | TTFR cold s | replacement | TTFR s | warm/cold"
        )
        print(f"| {header} |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        ratios = []
        for name, channel in CASES + [("model-fallback", "sigterm")] * (args.repeat - 1):
            spec = replace(settings.service(name), channel=channel)
            if args.docker:
                spec = spec.in_image(IMAGE)
            try:
                f = session.check_drain(spec)
            except ScenarioFailure as failure:
                print(f"| {name} | {channel} | FAILED: {str(failure).splitlines()[1]} |")
                continue
            r = f.get("replacement") or {}
            if f.get("served_by"):
                gap = f["longest_gap_seconds"]
                print(f"  behind the balancer: {f['served_by']}, longest stretch with no answer {gap} s")
            if f.get("warm_cold_ttfr_ratio") is not None:
                ratios.append(f["warm_cold_ttfr_ratio"])
            print(
                f"| {name} | {channel} | {f['backend']} | {f['drain_seconds']:.2f} | {f['requests']} | {f['failed']} | "
                f"{f['ttfr_seconds']:.2f} | {r.get('instance_type', '-')} ({r.get('cache') or '-'}) | "
                f"{r.get('ttfr_seconds') or '-'} | {f.get('warm_cold_ttfr_ratio') or '-'} |"
            )
        if ratios:
            print(
                f"warm/cold TTFR ratio over {len(ratios)} run(s): median {statistics.median(ratios):.2f}, "
                f"range {min(ratios):.2f}-{max(ratios):.2f}"
            )


if __name__ == "__main__":
    main()
