"""The `leakdoctor run` command line: its options, and their way to `runner.run`.

    leakdoctor run [--remedies safe] [--summary leaks.json] [--plot leaks.png] [--html leaks.html] [--on-limit stop]
                   [--prometheus-port N] [--tracker NAME] [--fail-on-leak[=minor]] [--step-on module:function]
                   [-o NAME=VALUE] script.py [args...]

Everything after the script is the script's, untouched (`--` included), so the split is made here
rather than by argparse. An option whose value is optional (`--fail-on-leak`) takes it only after "=":
the word after it is never its value (`--fail-on-leak train.py` runs train.py).
"""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any, Sequence

#: leakdoctor's own options: (flags, argparse keywords).
OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--remedies",), dict(default="off", metavar="LEVEL", help="off (default: detect and recommend), safe, all, "
                                                                 "or remedy names separated by commas")),
    (("--summary",), dict(metavar="PATH", help="write the summary JSON here")),
    (("--plot",), dict(metavar="PATH", help="write a PNG of the series here (needs matplotlib)")),
    (("--html",), dict(metavar="PATH", help="write the report as one self-contained HTML page here")),
    (("--on-limit",), dict(choices=("warn", "stop"), help="act before an unremedied leak reaches the memory limit")),
    (("--prometheus-port",), dict(type=int, metavar="N", help="serve /metrics on 127.0.0.1:N (+ LOCAL_RANK)")),
    (("--prometheus-host",), dict(metavar="HOST", help="bind another address than 127.0.0.1")),
    (("--tracker",), dict(action="append", metavar="NAME", help="send the series, findings and verdict to "
                                                               "tensorboard, mlflow or wandb (repeatable)")),
    (("--fail-on-leak",), dict(nargs="?", const="major", choices=("major", "minor"), metavar="=minor",
                               help="exit 1 when the script succeeds and the verdict is leak; --fail-on-leak=minor: "
                                    "also on a minor finding (an unwatched run is not a failure; `leakdoctor "
                                    "report` exits 3 for it)")),
    (("--step-on",), dict(metavar="MODULE:FUNCTION", help="a step is a return from this function (the script's "
                                                           "own without MODULE:); replaces the automatic steps "
                                                           "(framework updates, compiled and jitted functions)")),
    (("-o", "--option"), dict(action="append", default=[], metavar="NAME=VALUE",
                              help="any option of the README's Options table, e.g. -o overhead=1.0 -o "
                                   "memory_limit=8GiB")),
]


def configure(parser: argparse.ArgumentParser) -> None:
    for flags, keywords in OPTIONS:
        parser.add_argument(*flags, **keywords)
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


def split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(`run`, leakdoctor's options and the script; the script's arguments) of a `run` command line."""
    takes_value = {flag for flags, kw in OPTIONS if kw.get("action") != "store_true" and kw.get("nargs") != "?"
                   for flag in flags}  # an optional value comes only as --flag=value
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return list(argv[:i + 2]), list(argv[i + 2:])
        if not token.startswith("-") or token == "-":
            return list(argv[:i + 1]), list(argv[i + 1:])
        i += 2 if token in takes_value else 1
    return list(argv), []


#: Options whose value is optional: the value comes only after "=" (`--fail-on-leak=minor`), never as the
#: next word, which is the script (`--fail-on-leak train.py`) or another option.
OPTIONAL_VALUE = {"--fail-on-leak": "major"}


def valued(argv: Sequence[str]) -> list[str]:
    """`argv` (leakdoctor's own options, never the script's arguments) with each bare option whose value is
    optional given its default after "=", so that argparse cannot take the next word as its value."""
    return [f"{token}={OPTIONAL_VALUE[token]}" if token in OPTIONAL_VALUE else token for token in argv]


def level_as_script(argv: Sequence[str]) -> str | None:
    """What to say when the word taken for the script is a level given without "=" (`--fail-on-leak minor
    train.py`) and no file of that name exists; else None."""
    import os

    for i, token in enumerate(argv[:-1]):
        if token in OPTIONAL_VALUE and i + 2 == len(argv) and argv[-1] in ("major", "minor") \
                and not os.path.isfile(argv[-1]):
            return f"{token} takes its level after '=': {token}={argv[-1]} (the word after {token} is the script)"
    return None


def main(args: argparse.Namespace, script_args: list[str], relaunch: list[str]) -> Any:
    """Validate, run, and give the exit status (a KeyboardInterrupt ends the process as Python's does)."""
    from leakdoctor import runner
    from leakdoctor.runner.step_on import Target

    try:
        options = doctor_options(args)
        if args.step_on:
            Target.parse(args.step_on)
    except ValueError as err:
        print(f"leakdoctor run: {err}", file=sys.stderr)
        return 2
    outcome = runner.run(args.script, script_args, options, on_limit=args.on_limit, step=args.step_on,
                         fail_on_leak=args.fail_on_leak, relaunch=relaunch)
    if isinstance(outcome.exception, KeyboardInterrupt):
        sys.excepthook = _printed  # the traceback is out; Python ends the process by SIGINT, as for a script
        raise KeyboardInterrupt
    return outcome.code


def doctor_options(args: argparse.Namespace) -> dict[str, Any]:
    """The doctor's keyword arguments, validated now rather than at the first step: a bad value is a
    ValueError, a name that is no option (leakdoctor.settings.OPTIONS) an UnknownOptionError (a
    ValueError too) that suggests the nearest one. `-o` takes any option, those with a flag too."""
    from leakdoctor.settings import NAMES, Settings, reject_unknown

    remedies = args.remedies if args.remedies in ("off", "safe", "all") else \
        [name.strip() for name in args.remedies.split(",") if name.strip()]
    options: dict[str, Any] = {"remedies": remedies}
    for name, value in (("summary_path", args.summary), ("plot_path", args.plot), ("html_path", args.html),
                        ("prometheus_port", args.prometheus_port), ("prometheus_host", args.prometheus_host)):
        if value is not None:
            options[name] = value
    if args.tracker:
        options["trackers"] = list(args.tracker)
    for item in args.option:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"-o {item!r}: expected NAME=VALUE, e.g. -o memory_limit=8GiB")
        reject_unknown(f"-o {item!r}", [name], NAMES)
        options[name] = _value(text)
    Settings.create(**options)
    return options


def _value(text: str) -> Any:
    """A number, bool or None as Python writes it; anything else stays a string ('8GiB')."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _printed(*_: Any) -> None:
    """sys.excepthook once the traceback has been printed."""
