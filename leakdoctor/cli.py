"""Command line: `leakdoctor demo`, `leakdoctor report leaks.json [--plot out.png] [--html out.html]` and
`leakdoctor run [options] script.py [args...]` (also `python -m leakdoctor ...`); `leakdoctor --version`.
Each command's `--help` says its exit statuses (REPORT_STATUS, RUN_STATUS); the top-level help shows
examples (EXAMPLES). A misspelt command or flag is refused with the nearest valid one, as the Python API
refuses a misspelt option."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn, Sequence

from leakdoctor._base.version import __version__
from leakdoctor._base.schema import MAJOR, SEVERITIES
from leakdoctor._runner import command as run_command

DESCRIPTION = ("Find memory leaks in training runs: tell a real leak from warm-up, caches and spikes, name its "
               "cause and place, and remedy it when allowed.")
EXAMPLES = """examples:
  leakdoctor demo                                  a training loop with a planted leak, found and fixed
  leakdoctor run train.py --epochs 3               run a script unedited with a doctor at its training step
  leakdoctor run --remedies safe --summary leaks.json --plot leaks.png train.py
  leakdoctor run --window 12 --memory-limit 8GiB train.py    any option of the doctor is a flag
  leakdoctor run --fail-on-leak train.py           exit 1 when the run leaks (a CI gate)
  leakdoctor report leaks.json --plot leaks.png    print (and plot) a saved summary
  leakdoctor run -h                                every flag of run, with its default

docs: docs/cli.md (this command line), docs/logging.md (alerts through Python logging)"""
REPORT_STATUS = """exit status: 0 when the verdict is clean or remedied, 1 when it is leak (with --fail-on-leak=minor,
also on a minor finding), 2 when the file is not a readable summary, 3 when the run was unwatched (too few
steps seen to judge: not a pass). A summary its run left unfinished ("complete": false, what a SIGKILL leaves)
is printed with a first line saying so, and exits by its verdict so far."""
RUN_STATUS = """exit status: the script's own; 1 for a leak with --fail-on-leak (for a minor finding too with
--fail-on-leak=minor) when the script succeeded; 2 for a bad option, before the script runs."""


class Parser(argparse.ArgumentParser):
    """argparse, with the nearest valid word in its errors: `leakdoctor reprot` (did you mean 'report'?),
    `leakdoctor report --plto x.png` (did you mean --plot?)."""

    def error(self, message: str) -> NoReturn:
        return super().error(message + _nearest(self, message))


def _nearest(parser: argparse.ArgumentParser, message: str) -> str:
    """'; did you mean ...?' for the word argparse refused in `message`, when one is close."""
    choice = re.match(r"argument \S+: invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        word, valid = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
    else:
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if not unknown:
            return ""
        word, valid = unknown.group(1).split("=", 1)[0], _flags(parser)
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag of `parser` and of its subcommands."""
    found = []
    for action in parser._actions:
        found += [flag for flag in action.option_strings if flag.startswith("--")]
        for sub in (getattr(action, "choices", None) or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
            found += _flags(sub)
    return found


def make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, and its `run` subcommand's."""
    parser = Parser(prog="leakdoctor", description=DESCRIPTION, epilog=EXAMPLES,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"leakdoctor {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,report,run}")
    demo = commands.add_parser("demo", help="run a training loop with a planted leak and fix it")
    demo.add_argument("--case", help="which demo (default: the first whose framework is installed)")
    demo.add_argument("--steps", type=int, help="training steps (default: the case's own)")
    demo.add_argument("--out", default=".", help="folder for leakdoctor-demo.json and .png")
    demo.add_argument("--list", action="store_true", help="list the demo cases and exit")
    report = commands.add_parser("report", help="print a saved summary (and plot it)", epilog=REPORT_STATUS,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("summary", help="a summary JSON written by leakdoctor")
    report.add_argument("--plot", help="write a PNG of the series here")
    report.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML page here")
    report.add_argument("--fail-on-leak", nargs="?", const=MAJOR, default=MAJOR, choices=SEVERITIES,
                        metavar="=minor", help="--fail-on-leak=minor: exit 1 on a minor finding too")
    run = run_command.configure(commands.add_parser(
        "run", help="run a script unedited with a doctor at its training step", epilog=RUN_STATUS,
        usage="leakdoctor run [options] script.py [args...]", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser, run


def main(argv: Sequence[str] | None = None) -> Any:
    parser, run = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if argv[:1] == ["run"]:  # everything after the script is the script's own
        argv, script_args = run_command.split(argv)
        hint = run_command.unknown_flag(argv) or run_command.level_as_script(argv)
        if hint is not None:
            print(f"leakdoctor run: {hint}", file=sys.stderr)
            return 2
        if not run_command.has_script(argv):
            run.print_usage(sys.stderr)
            print("leakdoctor run: a script to run is needed: leakdoctor run [options] script.py [args...] "
                  "(leakdoctor run -h lists the options)", file=sys.stderr)
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
