"""Command line: `leakdoctor demo [--case NAME]`, `leakdoctor report leaks.json [--plot out.png] [--html
out.html]` and `leakdoctor run [options] script.py [args...]` (also `python -m leakdoctor ...`).
`report` exits 0 when the summary's verdict is "clean" or "remedied", 1 when it is "leak", so a CI job can
gate on it, 2 when the file is not a readable summary (a one-line error), so a corrupt file is not taken
for a leak, and 3 when it is "unwatched" (too few steps seen to judge: not a pass); with
--fail-on-leak=minor, a minor finding exits 1 too. A summary written while its run went on (`"complete":
false`, what a run killed by SIGKILL leaves) is printed with a first line saying that the run did not
finish and when the summary was last written; it exits by its verdict so far. `run` exits with the
script's status (or 1 for a leak with --fail-on-leak, and for a minor finding too with
--fail-on-leak=minor)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from leakdoctor.runner import command as run_command


def main(argv: Sequence[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(prog="leakdoctor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a training loop with a planted leak and fix it")
    demo.add_argument("--case", help="which demo (default: the first whose framework is installed)")
    demo.add_argument("--steps", type=int, help="training steps (default: the case's own)")
    demo.add_argument("--out", default=".", help="folder for leakdoctor-demo.json and .png")
    demo.add_argument("--list", action="store_true", help="list the demo cases and exit")
    report = commands.add_parser("report", help="print a saved summary (and plot it)")
    report.add_argument("summary", help="a summary JSON written by leakdoctor")
    report.add_argument("--plot", help="write a PNG of the series here")
    report.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML page here")
    report.add_argument("--fail-on-leak", nargs="?", const="major", default="major", choices=("major", "minor"),
                        metavar="=minor", help="--fail-on-leak=minor: exit 1 on a minor finding too")
    run_command.configure(commands.add_parser("run", help="run a script unedited with a doctor at its training step"))
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if argv[:1] == ["run"]:  # everything after the script is the script's own
        argv, script_args = run_command.split(argv)
        hint = run_command.level_as_script(argv)
        if hint is not None:
            print(f"leakdoctor run: {hint}", file=sys.stderr)
            return 2
    argv = run_command.valued(argv)  # `--fail-on-leak x`: x is the script (or the summary), never the level
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_command.main(args, script_args, relaunch=argv[:-1])
    return _demo(args) if args.command == "demo" else _report(args)


def _demo(args: argparse.Namespace) -> int:
    from leakdoctor import demo

    if args.list:
        available = demo.available()
        for name, (description, module) in demo.CASES.items():
            print(f"{name:16s} {'ready' if name in available else 'needs ' + module:14s} {description}")
        return 0
    try:
        summary = demo.run(args.case, args.steps, args.out)
    except (ValueError, RuntimeError) as err:
        print(f"leakdoctor demo: {err}", file=sys.stderr)
        return 2
    return 0 if summary.verdict != "leak" else 1


def _report(args: argparse.Namespace) -> int:
    from leakdoctor.reporting.loading import clean
    from leakdoctor.reporting.summary import Summary

    try:
        summary = Summary.load(args.summary)
        text = summary.text()
    except Exception as err:  # noqa: BLE001 - whatever the file holds, the answer is one line and exit 2
        print(clean(f"leakdoctor report: cannot read {args.summary}: {err}"), file=sys.stderr)
        return 2
    if not _print(text):
        return _status(summary, args)
    if args.plot:
        try:
            summary.plot(args.plot)
        except (ImportError, OSError, ValueError, TypeError) as err:
            print(clean(f"leakdoctor report: cannot plot to {args.plot}: {err}"), file=sys.stderr)
            return 2
        _print(f"plot written to {args.plot}")
    if args.html:
        try:
            summary.write_html(args.html)
        except (OSError, ValueError, TypeError) as err:
            print(clean(f"leakdoctor report: cannot write {args.html}: {err}"), file=sys.stderr)
            return 2
        _print(f"HTML report written to {args.html}")
    return _status(summary, args)


def _status(summary: Any, args: argparse.Namespace) -> int:
    """report's exit status: 1 for a leak, 3 for an unwatched run, else 0."""
    return 1 if summary.fails(args.fail_on_leak) else 3 if summary.verdict == "unwatched" else 0


def _print(text: str) -> bool:
    """Print to stdout; False if the reader went away (`leakdoctor report f.json | head`): then stdout
    is pointed at /dev/null, so that neither this print nor the flush at exit ends in a traceback."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False


if __name__ == "__main__":
    sys.exit(main())
