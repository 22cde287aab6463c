"""The `leakdoctor run` command line: its flags, and their way to `runner.run`.

    leakdoctor run [--remedies safe] [--summary leaks.json] [--plot leaks.png] [--html leaks.html]
                   [--on-limit stop] [--tracker NAME] [--OPTION VALUE ...] [--fail-on-leak[=minor]] [--step-on module:function] [-o NAME=VALUE]
                   script.py [args...]

Every option of the doctor (leakdoctor.settings.OPTIONS) is a flag, derived from its definition:
`--window 12` for window=12 (`--summary` and `--plot` are summary_path's and plot_path's short names);
`-o NAME=VALUE` takes any of them too. The flags below (OWN) are the run's own.

Everything after the script is the script's, untouched (`--` included), so the split is made here
rather than by argparse. An option whose value is optional (`--fail-on-leak`) takes it only after "=":
the word after it is never its value (`--fail-on-leak train.py` runs train.py). A flag that is none of
these is refused before the script runs, with the nearest one (`--remedy`: did you mean `--remedies`?).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any, Sequence

from leakdoctor._base.schema import MAJOR, SEVERITIES

#: `leakdoctor run`'s own flags, beside the doctor's options: (flags, argparse keywords).
OWN: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--fail-on-leak",), dict(nargs="?", const=MAJOR, choices=SEVERITIES, metavar="=minor",
                               help="exit 1 when the script succeeds and the verdict is leak; --fail-on-leak=minor: "
                                    "also on a minor finding (an unwatched run is not a failure; `leakdoctor "
                                    "report` exits 3 for it)")),
    (("--step-on",), dict(metavar="MODULE:FUNCTION", help="a step is a return from this function (the script's "
                                                           "own without MODULE:); replaces the automatic steps "
                                                           "(framework updates, compiled and jitted functions)")),
    (("-o", "--option"), dict(action="append", default=[], metavar="NAME=VALUE",
                              help="any option of the README's Options table by its name, e.g. -o overhead=1.0 "
                                   "-o memory_limit=8GiB")),
]


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the run's flags to `parser` (the `run` subcommand's): one per option of the doctor, from its
    definition, then the run's own, the script and its arguments."""
    from leakdoctor.settings import OPTIONS

    doctor = parser.add_argument_group("the doctor's options (leakdoctor.settings.OPTIONS; README \"Options\")")
    for option in OPTIONS:
        if option.command_line:
            doctor.add_argument(*option.flags, option.flag, dest=option.name, metavar=option.metavar,
                                default=argparse.SUPPRESS, help=_help(option),
                                action="append" if option.repeatable else "store")
    own = parser.add_argument_group("the run's own")
    for flags, keywords in OWN:
        own.add_argument(*flags, **keywords)
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def _help(option: Any) -> str:
    """An option's help line: its meaning, valid values and default, as the options table says them."""
    from leakdoctor.settings import _shown

    text = f"{option.meaning}; {option.valid}; default {_shown(option.default)}".replace("`", "")
    return text.replace("%", "%%")


def flags() -> dict[str, bool]:
    """Every flag `leakdoctor run` takes, and whether the next word is its value (an optional value comes
    only as --flag=value)."""
    from leakdoctor.settings import OPTIONS

    known = {"-h": False, "--help": False}
    known.update({flag: True for o in OPTIONS if o.command_line for flag in (*o.flags, o.flag)})
    known.update({flag: kw.get("action") != "store_true" and kw.get("nargs") != "?" for fl, kw in OWN for flag in fl})
    return known


def split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(`run`, leakdoctor's options and the script; the script's arguments) of a `run` command line."""
    takes_value = {flag for flag, valued in flags().items() if valued}
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return list(argv[:i + 2]), list(argv[i + 2:])
        if not token.startswith("-") or token == "-":
            return list(argv[:i + 1]), list(argv[i + 1:])
        i += 2 if token in takes_value else 1
    return list(argv), []


def unknown_flag(argv: Sequence[str]) -> str | None:
    """What to say about the first word of leakdoctor's part of a `run` command line (`split`'s first
    part) that is no flag of the run, with the nearest one; None when every one is known."""
    known = flags()
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            return None
        name = token.split("=", 1)[0] if token.startswith("--") else token
        if name not in known and token[:2] not in known:  # -oNAME=VALUE is -o's
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = f": did you mean {close[0]}?" if close else ""
            return f"unknown option {name}{hint} (leakdoctor run -h lists them; `-o NAME=VALUE` takes any option)"
        i += 2 if known.get(token) else 1
    return None


def has_script(argv: Sequence[str]) -> bool:
    """Whether a `run` command line (`split`'s first part) names a script, or asks for help instead."""
    if "-h" in argv or "--help" in argv:
        return True
    last = argv[-1] if len(argv) > 1 else "-"
    return not last.startswith("-") and not (len(argv) > 2 and flags().get(argv[-2], False))


#: Options whose value is optional: the value comes only after "=" (`--fail-on-leak=minor`), never as the
#: next word, which is the script (`--fail-on-leak train.py`) or another option.
OPTIONAL_VALUE = {"--fail-on-leak": MAJOR}


def valued(argv: Sequence[str]) -> list[str]:
    """`argv` (leakdoctor's own options, never the script's arguments) with each bare option whose value is
    optional given its default after "=", so that argparse cannot take the next word as its value."""
    return [f"{token}={OPTIONAL_VALUE[token]}" if token in OPTIONAL_VALUE else token for token in argv]


def level_as_script(argv: Sequence[str]) -> str | None:
    """What to say when the word taken for the script is a level given without "=" (`--fail-on-leak minor
    train.py`) and no file of that name exists; else None."""
    import os

    for i, token in enumerate(argv[:-1]):
        if token in OPTIONAL_VALUE and i + 2 == len(argv) and argv[-1] in SEVERITIES \
                and not os.path.isfile(argv[-1]):
            return f"{token} takes its level after '=': {token}={argv[-1]} (the word after {token} is the script)"
    return None


def main(args: argparse.Namespace, script_args: list[str], relaunch: list[str]) -> Any:
    """Validate, run, and give the exit status (a KeyboardInterrupt ends the process as Python's does)."""
    from leakdoctor import _runner as runner
    from leakdoctor._runner.step_on import Target

    try:
        options = doctor_options(args)
        if args.step_on:
            Target.parse(args.step_on)
    except ValueError as err:
        print(f"leakdoctor run: {err}", file=sys.stderr)
        return 2
    outcome = runner.run(args.script, script_args, options, step=args.step_on,
                         fail_on_leak=args.fail_on_leak, relaunch=relaunch)
    if isinstance(outcome.exception, KeyboardInterrupt):
        sys.excepthook = _printed  # the traceback is out; Python ends the process by SIGINT, as for a script
        raise KeyboardInterrupt
    return outcome.code


def doctor_options(args: argparse.Namespace) -> dict[str, Any]:
    """The doctor's keyword arguments, validated now rather than at the first step: a bad value is a
    ValueError, a name that is no option (leakdoctor.settings.OPTIONS) an UnknownOptionError (a
    ValueError too) that suggests the nearest one. Each flag given becomes its option (its text read by
    the option's own `parse`); `-o` takes any option, those with a flag too, and comes last."""
    from leakdoctor.settings import NAMES, OPTIONS, Settings, literal, reject_unknown

    given = vars(args)
    options: dict[str, Any] = {o.name: o.from_text(given[o.name]) for o in OPTIONS if o.name in given}
    for item in args.option:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"-o {item!r}: expected NAME=VALUE, e.g. -o memory_limit=8GiB")
        reject_unknown(f"-o {item!r}", [name], NAMES)
        options[name] = literal(text)  # as Python writes it: -o summary_path=None is None
    Settings.create(**options)
    return options


def _printed(*_: Any) -> None:
    """sys.excepthook once the traceback has been printed."""
