"""``spotchaos``: re-render, list and compare saved reports without running anything.

Exit status: 0 fine, 1 a regression under ``--fail-on``, 2 a usage or report error (one line
on stderr naming the file and the problem).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .errors import SpotchaosError
from .report import load_report, write_text
from .report.compare import METRICS, FailRule, compare
from .report.history import HISTORY_DIR, SAVED, resolve_run, saved_runs
from .report.markdown import render_markdown
from .safety.sanitize import visible


def _render_html(document):
    from .report.html import render_html  # matplotlib only when a page is drawn

    return render_html(document)


RENDERERS = {"md": render_markdown, "html": _render_html}
WORSE = [FailRule("verdict"), *(FailRule(metric, 0.0) for metric in METRICS)]  # any change for the worse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotchaos", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"spotchaos {__version__}")
    where = f"where saved runs live (default: {HISTORY_DIR}, as pytest saves them)"
    parser.add_argument("--dir", default=HISTORY_DIR, help=where)
    # --dir also after the subcommand (spotchaos compare --dir runs/ 3 latest), where people type it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help=where)
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser(
        "report", parents=[common], help="render a report.json (or a saved run) as Markdown or HTML"
    )
    report.add_argument("path", help="report file, saved run number, 'latest' or 'previous'")
    report.add_argument("--format", choices=sorted(RENDERERS), default="html")
    report.add_argument("-o", "--output", help="file to write (default: stdout for md, beside PATH for html)")

    compare_cmd = commands.add_parser("compare", parents=[common], help="what changed from run A to run B")
    compare_cmd.add_argument("before", help="report file, saved run number, 'latest' or 'previous'")
    compare_cmd.add_argument("after", help="report file, saved run number, 'latest' or 'previous'")
    compare_cmd.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="RULE",
        help="exit 1 on this regression: 'verdict' (a pass became a failure) or METRIC:PCT%% "
        f"(grew by more than PCT %%), METRIC one of {', '.join(METRICS)}; repeatable",
    )

    commands.add_parser("list", parents=[common], help="the saved runs")
    commands.add_parser(
        "test-image",
        help="build the local test images (spotchaos-test:latest, :shell-entrypoint) from this machine's Python",
    )
    return parser


def _report(args: argparse.Namespace) -> int:
    path = resolve_run(args.path, Path(args.dir))
    text = RENDERERS[args.format](load_report(path))
    output = args.output
    if output is None and args.format == "html":
        output = str(path.with_suffix(".html"))
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        write_text(text, Path(output))
        print(output)
    return 0


def _compare(args: argparse.Namespace) -> int:
    rules = [FailRule.parse(r) for r in args.fail_on]
    directory = Path(args.dir)
    before_path, after_path = resolve_run(args.before, directory), resolve_run(args.after, directory)
    before, after = load_report(before_path), load_report(after_path)
    result = compare(before, after, rules or WORSE)  # without rules: every change for the worse, shown, not gating
    print(f"before: {before_path}\nafter:  {after_path}")
    if not result.changes:
        print("no change")
    for change in result.changes:
        print(f"  {change.describe(gating=bool(rules))}")
    if not rules:
        print(
            f"{len(result.regressions)} change(s) for the worse; no --fail-on rule given, so nothing gates "
            "(exit 0): add e.g. --fail-on verdict --fail-on overhead:20%"
        )
        return 0
    print(f"decision: {result.decision()} ({len(result.regressions)} regression(s))")
    return 1 if result.regressions else 0


def _list(args: argparse.Namespace) -> int:
    runs = saved_runs(Path(args.dir))
    if not runs:
        print(f"no saved runs in {args.dir} (pytest --spotchaos saves one per session)")
    for run in runs:
        counter, commit, stamp = SAVED.match(run.name).groups()
        print(f"{int(counter):4d}  {commit:8}  {stamp}  {run}")
    return 0


def _test_image(args: argparse.Namespace) -> int:
    from .backends.docker import DockerSession
    from .backends.testimage import build

    for name in build(DockerSession().client):
        print(name)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"report": _report, "compare": _compare, "list": _list, "test-image": _test_image}[args.command]
    try:
        return handler(args)
    except SpotchaosError as exc:
        print(f"spotchaos {args.command}: {visible(str(exc))}", file=sys.stderr)
        return 2
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        # a report of the right kind whose inner fields are of the wrong shape: a usage error (2),
        # never a traceback, and never the 1 that --fail-on reads as a regression
        named = " or ".join(str(getattr(args, k)) for k in ("path", "before", "after") if hasattr(args, k))
        print(
            f"spotchaos {args.command}: {named}: not of the shape of a spotchaos report "
            f"({type(exc).__name__}: {visible(str(exc))[:160]})",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
