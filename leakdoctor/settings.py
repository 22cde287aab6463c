"""The options of every doctor and callback, defined once (`OPTIONS`, at the end), and the validated
`Settings` they make. Every bad value fails here, at construction, with a ValueError that names the value
and what would have been valid, and a misspelt name with an UnknownOptionError that suggests the nearest
one; nothing is validated later inside the user's loop. Everything else about the options is derived from
`OPTIONS`: the README's "Options" table (`options_table()`), the types of `Settings` and of the keyword
arguments (`types_source()`, leakdoctor/_option_types.py), the doctors' docstrings (`documented`), the
flags of `leakdoctor run` (_runner/command.py) and what the pytest plugin accepts."""

from __future__ import annotations

import difflib
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from leakdoctor._option_types import DoctorOptions, SettingsFields
from leakdoctor._base import remedy_names as remedy_registry
from leakdoctor._base import tracker_names

__all__ = ["Settings", "Option", "OPTIONS", "NAMES", "DoctorOptions", "UnknownOptionError", "options_table",
           "parse_bytes"]

#: The most steps an option counts (warm-up, window, horizon, ...): far beyond any run, and within what a
#: float holds exactly, so that no step count overflows the arithmetic inside the user's loop.
MAX_STEPS = 2**50
#: The shortest heartbeat: a summary written more often would cost a run more than it saves.
MIN_HEARTBEAT = 0.01
#: The longest heartbeat or linger (a year), in seconds: beyond it, None (or 0) says what is meant.
MAX_SECONDS = 365 * 86400
#: The smallest memory limit: a process of the interpreter alone takes more.
MIN_MEMORY_LIMIT = 2**20

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


#: The share of `overhead` that the samples may take (the rest: the sampler thread and the investigations).
SAMPLING_SHARE = 0.25


@dataclass(frozen=True)
class Settings(SettingsFields):
    """What a doctor was asked to do, validated: one field per option of `OPTIONS` (the definition; the
    fields come from it, leakdoctor/_option_types.py), each holding the checked value (`remedies` resolved
    to names, paths made absolute, `investigate_steps` resolved from `window` when None). Build with
    `Settings.create(**options)`."""

    @property
    def sampling_budget(self) -> float:
        """The share of step time the samples (and the agreement of ranks, and the workers' reads) may
        take: a quarter of `overhead`, the whole doctor's share, which leaves the rest to the sampler thread
        and the investigations; all of it at 1.0 (every step sampled, no budget held)."""
        return 1.0 if self.overhead >= 1.0 else self.overhead * SAMPLING_SHARE

    @classmethod
    def create(cls, **options: Any) -> "Settings":
        """Validate `options` (any of `OPTIONS`; the others take their defaults) and resolve the ones that
        depend on another.

        Raises:
            UnknownOptionError: a name that is not an option (with the nearest valid one).
            ValueError: a bad value, named with the valid ones.
        """
        reject_unknown("Settings", options, NAMES)
        values = {o.name: o.check(o.name, options.get(o.name, o.default)) for o in OPTIONS}
        if values["investigate_steps"] is None:
            values["investigate_steps"] = max(8, values["window"])
        if values["prometheus_host"] is not None and values["prometheus_port"] is None:
            raise ValueError(f"prometheus_host={values['prometheus_host']!r} needs prometheus_port= (e.g. 9464)")
        values["prometheus_host"] = values["prometheus_host"] or "127.0.0.1"
        return cls(**values)


def _int(name: str, value: Any, minimum: int, maximum: int = MAX_STEPS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}={_short(value)}: expected an int >= {minimum} "
                         f"(at most 2**{maximum.bit_length() - 1})")
    return value


def _at_least(minimum: int, none: bool = False) -> Callable[[str, Any], int | None]:
    """The check of an int option >= `minimum` (None allowed when `none`)."""
    def check(name: str, value: Any) -> int | None:
        return None if none and value is None else _int(name, value, minimum)

    return check


def _port(name: str, port: Any) -> int | None:
    """A TCP port for the Prometheus exporter (0: any free port), or None for no exporter."""
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ValueError(f"{name}={_short(port)}: expected an int from 0 (any free port) to 65535, e.g. 9464")
    return port


def _host(name: str, host: Any) -> str | None:
    """The address the exporter binds, when the user names one (None: loopback)."""
    if host is not None and (not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host)):
        raise ValueError(f"{name}={host!r}: expected an address such as '127.0.0.1' or '0.0.0.0'")
    return host


def _linger(name: str, seconds: Any) -> float:
    """How long the exporter keeps serving the final values after finish() (0: stop at once)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"{name}={_short(seconds)}: expected seconds from 0 (stop serving at finish()) to "
                         f"{MAX_SECONDS} (a year), e.g. 20")
    return float(seconds)


def _heartbeat(name: str, seconds: Any) -> float | None:
    """Seconds between the summary's writes while the run goes (None: written only when it ends)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not MIN_HEARTBEAT <= seconds <= MAX_SECONDS:
        raise ValueError(f"{name}={_short(seconds)}: expected seconds between writes of the summary while the run "
                         f"goes, from {MIN_HEARTBEAT} to {MAX_SECONDS} (a year), e.g. 60, or None (written only "
                         f"when the run ends)")
    return float(seconds)


def _watermark(name: str, fraction: Any) -> float | None:
    """The share of the memory limit above which the post-mortem is written at once (None: never)."""
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"{name}={fraction!r}: expected a fraction of the memory limit in (0, 1], e.g. 0.95, "
                         f"or None (no post-mortem before the end)")
    return float(fraction)


def _pushgateway(name: str, url: Any) -> str | None:
    """A Pushgateway to push the final values to at finish(): 'http://host:9091' or 'host:9091'."""
    if url is None:
        return None
    if not isinstance(url, str) or not re.fullmatch(r"(https?://)?[^\s/:]+(:\d+)?(/\S*)?", url):
        raise ValueError(f"{name}={url!r}: expected a Pushgateway URL such as "
                         f"'http://127.0.0.1:9091', or None")
    return url


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected True or False")
    return value


def _probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 0.5:
        raise ValueError(f"{name}={_short(value)}: expected a number between 0 and 0.5, e.g. 0.01")
    return float(value)


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name}={_short(value)}: expected a fraction of step time in (0, 1], e.g. 0.005")
    return float(value)


def _sampler(name: str, value: Any) -> str:
    if value not in ("auto", "thread", "inline"):
        raise ValueError(f"{name}={value!r}: expected \"auto\", \"thread\" or \"inline\""
                         + did_you_mean(value, ("auto", "thread", "inline")))
    return value


def _on_limit(value: Any) -> str | Callable[[Any], Any]:
    if value in ("warn", "stop") or (callable(value) and not isinstance(value, str)):
        return value
    raise ValueError(f"on_limit={value!r}: expected 'warn', 'stop', or a callable that receives the summary so far"
                     + did_you_mean(value, ("warn", "stop")))


def _margin(value: Any) -> int | float:
    """Steps (an int >= 0) or a fraction of the steps run so far (a float in (0, 1))."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEPS:
        return value
    if isinstance(value, float) and 0 < value < 1:
        return value
    raise ValueError(f"limit_margin={_short(value)}: expected steps (an int >= 0, at most 2**50, e.g. 200) or a "
                     f"fraction of the steps run so far (a float in (0, 1), e.g. 0.1)")


def _callable_or_none(name: str, value: Any) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    raise ValueError(f"{name}={value!r}: expected a callable (called with no arguments) or None")


def parse_bytes(value: int | float | str) -> float:
    """A memory size: bytes as a number, or a string such as '8GiB', '512 MB', '2g'; at least 1 MiB
    (MIN_MEMORY_LIMIT: a smaller one is a typo, e.g. bytes given for MiB)."""
    size = _size(value)
    if size < MIN_MEMORY_LIMIT:
        raise ValueError(f"memory_limit={_short(value)}: {size:g} bytes is below the smallest limit, 1 MiB "
                         f"(a Python process alone takes more); expected a size such as '8GiB'")
    return size


def _size(value: int | float | str) -> float:
    """The bytes `value` says, positive and finite; a ValueError naming memory_limit otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"memory_limit={value!r}: expected bytes (int) or a size such as '8GiB'")
    if isinstance(value, (int, float)):
        size = float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.inf
        if not math.isfinite(size) or size <= 0:
            raise ValueError(f"memory_limit={_short(value)}: expected a positive, finite size in bytes or a size "
                             f"such as '8GiB'")
        return size
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    size = float(match.group(1)) * _UNITS[unit] if match and unit in _UNITS else math.nan
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"memory_limit={_short(value)}: expected bytes (int) or a size such as '8GiB', '512MB'; "
                         f"units: {sorted(k for k in _UNITS if k)}")
    return size


def _short(value: object) -> str:
    """repr(value), cut to 40 characters (an integer of 400 digits names itself by its start)."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"{str(value)[:12]}...({len(str(value))} digits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _writable(name: str, value: str | os.PathLike[str] | None) -> Path | None:
    """A file path whose folder exists (created if missing) and is writable, made absolute now, so that
    a later os.chdir() in the training script does not move it."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name}={value!r}: expected a file path (str or os.PathLike) or None")
    path = Path(os.path.abspath(Path(value).expanduser()))
    if path.is_dir():
        raise ValueError(f"{name}={str(path)!r} is a folder: expected a file path such as {str(path / 'leaks.json')!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{name}={str(path)!r}: cannot create folder {str(path.parent)!r}: {err.strerror}") from None
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise ValueError(f"{name}={str(path)!r}: folder {str(path.parent)!r} is not writable: {err.strerror}") from None
    return path


def _plot_path(name: str, value: str | os.PathLike[str] | None) -> Path | None:
    """A plot's path (as `_writable`), refused now when matplotlib is missing: the plot is drawn when the
    run ends, and a run of hours should not find out then, with exit 0, that no plot could be drawn."""
    path = _writable(name, value)
    if path is not None and not _installed("matplotlib"):
        raise ValueError(f"{name}={str(path)!r}: drawing the plot needs matplotlib, which is not installed: "
                         f"pip install 'leakdoctor[plot]' (or leave {name} out)")
    return path


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (matplotlib takes a second to import)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --- the definition: every option of every doctor and callback, once ----------------------------------

@dataclass(frozen=True)
class Option:
    """One option that every doctor and callback takes (and `leakdoctor run`, and the pytest plugin),
    defined once: its name, default, one-line meaning, valid values (as the options table says them), the
    check that turns a given value into the one `Settings` holds (a ValueError naming the value if it is
    bad), and its types as Python source: `accepts`, what a caller may pass (the `DoctorOptions` keyword
    argument, for editors), and `holds`, what `Settings` keeps once checked (default: `accepts`). Everything
    else is derived from it: the `Settings` fields and `DoctorOptions` (generated source,
    leakdoctor/_option_types.py, kept equal by tests/test_options.py), the options table, the docstrings,
    and the flags of `leakdoctor run` (`--NAME-WITH-DASHES` and the `flags` besides, whose text becomes a
    value by `parse`; `command_line=False` for a value no command line can give, a callable; `repeatable`
    for a list that a flag given again adds to, `--tracker tensorboard --tracker mlflow`)."""

    name: str
    default: Any
    meaning: str
    valid: str
    check: Callable[[str, Any], Any]
    accepts: str
    holds: str = ""
    flags: tuple[str, ...] = ()
    metavar: str = "VALUE"
    parse: Callable[[str], Any] | None = None
    command_line: bool = True
    repeatable: bool = False

    @property
    def held(self) -> str:
        """The type `Settings` holds, as source."""
        return self.holds or self.accepts

    @property
    def flag(self) -> str:
        """The option's own flag on the command line: `--summary-path` for summary_path."""
        return "--" + self.name.replace("_", "-")

    def from_text(self, text: str | list[str]) -> Any:
        """The value a command line's `text` gives this option (checked later, by `check`); a repeatable
        option's texts, each parsed, make one list."""
        read = self.parse or literal
        if isinstance(text, list):
            return [item for each in text for item in read(each)]
        return read(text)


def _names(text: str) -> list[str]:
    """Names separated by commas (`tensorboard,mlflow`), as a list."""
    return [name.strip() for name in text.split(",") if name.strip()]


def literal(text: str) -> Any:
    """A number, bool or None as Python writes it (`8`, `0.5`, `True`, `None`); anything else stays the
    string it is (`8GiB`, `thread`)."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _remedies_text(text: str) -> str | list[str]:
    """`--remedies`: a level (off, safe, all) as it is, else remedy names separated by commas."""
    if text in remedy_registry.LEVELS:
        return text
    return [name.strip() for name in text.split(",") if name.strip()]


def _given(check: Callable[[Any], Any]) -> Callable[[str, Any], Any]:
    """A check that names its option itself, taking (name, value) like the others."""
    return lambda _name, value: check(value)


OPTIONS: tuple[Option, ...] = (
    Option("remedies", "off", "what the doctor may do about a leak: `off` detects and recommends, `safe` applies "
           "semantics-preserving remedies, `all` the others too (README \"Remedies\")",
           '`"off"`, `"safe"`, `"all"`, or a list of remedy names', _given(remedy_registry.resolve),
           accepts="str | Sequence[str]", holds="tuple[str, ...]", parse=_remedies_text, metavar="LEVEL|NAME,..."),
    Option("summary_path", None, "write the summary JSON here when the run ends (stderr if it cannot)",
           "a file path (str or os.PathLike; its folder is created) or None", _writable,
           flags=("--summary",), accepts="str | os.PathLike[str] | None", holds="Path | None", parse=str, metavar="PATH"),
    Option("plot_path", None, "write a PNG of every series, with detections and remedies marked, when the run ends "
           "(needs matplotlib)", "a file path or None", _plot_path, flags=("--plot",), accepts="str | os.PathLike[str] | None", holds="Path | None", parse=str, metavar="PATH"),
    Option("html_path", None, "write the run as one self-contained HTML page (verdict, findings, series drawn, "
           "timeline) when the run ends", "a file path or None", _writable, flags=("--html",),
           accepts="str | os.PathLike[str] | None", holds="Path | None", parse=str, metavar="PATH"),
    Option("warmup", 20, "steps ignored at the start (imports, compiles, caches filling up)",
           "an int >= 0 (at most 2**50)", _at_least(0), accepts="int", metavar="STEPS"),
    Option("window", 6, "steps per detection window; a leak is suspected after several windows of growth",
           "an int >= 1 (at most 2**50)", _at_least(1), accepts="int", metavar="STEPS"),
    Option("horizon", 100_000, "steps over which a growth must matter (reach a material share of the headroom "
           "to the memory limit) to be a leak", "an int >= 1 (at most 2**50)", _at_least(1), accepts="int",
           metavar="STEPS"),
    Option("memory_limit", None, "the limit growth is judged and projected against; None: the tightest of RAM, "
           "the cgroup limit and RLIMIT_AS/DATA", 'bytes (at least 1 MiB), a size such as `"8GiB"`, or None',
           _given(lambda value: None if value is None else parse_bytes(value)),
           accepts="int | float | str | None", holds="float | None", metavar="SIZE"),
    Option("alpha", 0.01, "significance level of the trend test (lower: fewer, surer findings)",
           "a number in (0, 0.5)", _probability, accepts="float", metavar="P"),
    Option("investigate_steps", None, "steps an investigation (the forensics) runs once a growth is suspected; "
           "None: max(8, window)", "an int >= 2 (at most 2**50), or None", _at_least(2, none=True),
           accepts="int | None", holds="int", metavar="STEPS"),
    Option("verify_windows", 8, "windows after a remedy over which its effect is judged",
           "an int >= 3 (at most 2**50)", _at_least(3), accepts="int", metavar="N"),
    Option("overhead", 0.02, "the share of the run's time the whole doctor may cost (its samples, the sampler "
           "thread, the investigations): samples take a quarter of it and come less often to stay under that; an "
           "investigation waits while the total would pass it, unless a leak would reach the memory limit first "
           "(1.0: every step sampled, no budget)", "a number in (0, 1]", _fraction, accepts="float", metavar="SHARE"),
    Option("sampler", "auto", "where resident memory's rise is watched: `thread`, also on a daemon thread between the "
           "sampled steps (a rise wakes the next step, whatever the stride; near the memory limit it writes the "
           "post-mortem at once, even in a long step); `inline`, on the sampled steps only; `auto`, the thread "
           "while its CPU budget (0.4% of a core) buys a reading a window, else it watches the memory limit only "
           "(short steps where a thread's wake-up is dear; no thread when there is no limit to watch, i.e. no "
           "`summary_path`), and no thread under RLIMIT_AS",
           '`"auto"`, `"thread"` or `"inline"`', _sampler, accepts="str", parse=str, metavar="auto|thread|inline"),
    Option("verbose", True, "print alerts and the summary on stderr (rank 0 only)", "True or False", _bool,
           accepts="bool", metavar="True|False"),
    Option("rank", 0, "this process's rank: only rank 0 prints and writes `summary_path` (torch, Lightning and "
           "multi-process JAX set it; other ranks write their own beside it, leaks.rankN.json)",
           "an int >= 0 (at most 2**50)", _at_least(0), accepts="int", metavar="N"),
    Option("on_limit", "warn", "what to do when an unremedied leak is projected to reach the memory limit within "
           "`limit_margin`: warn, stop the run (loops: `doctor.should_stop`), or call yours with the summary so far",
           '`"warn"`, `"stop"`, or a callable', _given(_on_limit), accepts="str | Callable[[Any], Any]",
           parse=str, metavar="warn|stop"),
    Option("limit_margin", 0.1, "how early `on_limit` acts: steps before the limit (int), or a fraction of the "
           "steps run so far (float)", "an int >= 0 (at most 2**50) or a float in (0, 1)", _given(_margin),
           accepts="int | float", metavar="STEPS|FRACTION"),
    Option("checkpoint", None, "called before `on_limit=\"stop\"` ends the run (Lightning and Keras also save "
           "their own)", "a callable taking no arguments, or None", _callable_or_none,
           accepts="Callable[[], Any] | None", command_line=False),
    Option("oom_snapshot", None, "where to dump the CUDA allocator snapshot if the run dies out of memory",
           "a file path or None", _writable, accepts="str | os.PathLike[str] | None", holds="Path | None", parse=str, metavar="PATH"),
    Option("heartbeat", 60, "while the run goes, write the summary (marked `\"complete\": false`) to `summary_path` "
           "at least this often, in seconds, and as soon as a finding is made or changes state, so that a run the "
           "kernel kills (SIGKILL) leaves it on disk; None: only at the end", "seconds from 0.01 to a year, or None",
           _heartbeat, accepts="float | None", metavar="SECONDS"),
    Option("oom_watermark", 0.95, "when the limit's figure (resident memory; a cgroup's charge) passes this share "
           "of the memory limit, write the "
           "post-mortem summary (`\"oom\": {\"imminent\": true, ...}`) to `summary_path` at once, before the "
           "out-of-memory killer can strike", "a number in (0, 1], or None (off)", _watermark,
           accepts="float | None", metavar="SHARE"),
    Option("prometheus_port", None, "serve the series and findings on http://HOST:PORT/metrics (+ LOCAL_RANK)",
           "an int from 0 (any free port) to 65535, or None (no exporter)", _port, accepts="int | None",
           metavar="PORT"),
    Option("prometheus_host", None, "the address the exporter binds; None: 127.0.0.1",
           "an address such as `\"0.0.0.0\"` (needs `prometheus_port`), or None", _host, accepts="str | None",
           holds="str", parse=str, metavar="HOST"),
    Option("prometheus_linger", 20.0, "seconds the final values stay served after `finish()` (20: one more scrape at a "
           "15 s interval; 0: stop at once)", "seconds from 0 to a year", _linger,
           accepts="float", metavar="SECONDS"),
    Option("prometheus_pushgateway", None, "push the final values to this Prometheus Pushgateway at `finish()`",
           'a URL such as `"http://127.0.0.1:9091"`, or None', _pushgateway, accepts="str | None", parse=str,
           metavar="URL"),
    Option("trackers", (), "send the series, the findings as they change state and the verdict to experiment "
           "trackers: the run the script has open, else a new one (docs/trackers.md)",
           '`"tensorboard"`, `"mlflow"`, `"wandb"`, a SummaryWriter or run object, or a list of them',
           _given(tracker_names.resolve), flags=("--tracker",), accepts="str | Any | Sequence[Any] | None",
           holds="tuple[Any, ...]", parse=_names, metavar="NAME", repeatable=True),
)
NAMES: frozenset[str] = frozenset(o.name for o in OPTIONS)


class UnknownOptionError(ValueError, TypeError):
    """An option name that the doctor or callback does not take. A ValueError, as documented for every bad
    option, and a TypeError, as Python's own "unexpected keyword argument" is, so that either catches it.
    The message names each unknown name and the nearest valid one (difflib), then every valid name."""

    def __init__(self, where: str, unknown: Sequence[str], valid: Iterable[str]) -> None:
        self.where, self.unknown, self.valid = where, list(unknown), sorted(valid)
        names = "; ".join(_suggestion(name, self.valid) for name in self.unknown)
        super().__init__(f"{where}: unknown option {names} (valid options: {', '.join(self.valid)})")


def _suggestion(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f"{name!r}: did you mean {close[0]!r}?" if close else f"{name!r}"


def did_you_mean(value: object, valid: Iterable[str]) -> str:
    """" (did you mean 'thread'?)" when a string `value` is close to one of `valid` (difflib), else ""."""
    close = difflib.get_close_matches(value, list(valid), n=1, cutoff=0.6) if isinstance(value, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def reject_unknown(where: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Raise UnknownOptionError, labelled `where`, if any name in `given` is not in `valid`."""
    valid = set(valid)
    unknown = [name for name in given if name not in valid]
    if unknown:
        raise UnknownOptionError(where, unknown, valid)


def options_table() -> str:
    """The README's "Options" table (markdown), generated from `OPTIONS`; tests/test_options.py checks that
    the README holds this very table."""
    rows = ["| option | default | meaning | valid values |", "| --- | --- | --- | --- |"]
    rows += [f"| `{o.name}` | `{_shown(o.default)}` | {o.meaning} | {o.valid} |".replace("\n", " ") for o in OPTIONS]
    return "\n".join(rows)


def options_doc(indent: str = "        ") -> str:
    """The options as Google-style argument lines (`name: meaning. Default: x; valid values.`), appended to
    the docstring of every doctor and callback by `documented`."""
    return "\n".join(f"{indent}{o.name}: {o.meaning}. Default: {_shown(o.default)}; {o.valid}.".replace("`", "")
                     for o in OPTIONS)


#: The generated module of the options' types (types_source()), checked in for editors and type checkers.
TYPES_MODULE = Path(__file__).with_name("_option_types.py")


def types_source() -> str:
    """The source of leakdoctor/_option_types.py, derived from `OPTIONS`: the `DoctorOptions` TypedDict
    (what a caller may pass, `**options: Unpack[DoctorOptions]`) and the `SettingsFields` that `Settings`
    holds. Type checkers read no class built at run time, so the module is source, checked in;
    tests/test_options.py keeps it equal to this (`python -m leakdoctor.settings` writes it)."""
    typed = "".join(f"    {o.name}: {o.accepts}\n" for o in OPTIONS)
    held = "".join(f"    {o.name}: {o.held}\n" for o in OPTIONS)
    return f'''"""The options' types, generated from leakdoctor.settings.OPTIONS by `python -m leakdoctor.settings`: do
not edit (tests/test_options.py checks that this file is what OPTIONS makes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict

__all__ = ["DoctorOptions", "SettingsFields"]


class DoctorOptions(TypedDict, total=False):
    """The options as keyword arguments (`**options: Unpack[DoctorOptions]`), for IDEs and type checkers."""

{typed}

@dataclass(frozen=True)
class SettingsFields:
    """The fields of `leakdoctor.settings.Settings`: each option's value once checked."""

{held}'''


def documented(cls: type) -> type:
    """Append the options to `cls`'s docstring, so that help() lists every one of them from `OPTIONS`."""
    cls.__doc__ = f"{cls.__doc__.rstrip()}\n\n    Options (`**options`; README \"Options\"):\n{options_doc()}\n"
    return cls


def _shown(default: Any) -> str:
    return f'"{default}"' if isinstance(default, str) else repr(default)


if __name__ == "__main__":  # python -m leakdoctor.settings: write the options' types from OPTIONS
    TYPES_MODULE.write_text(types_source())
    print(f"wrote {TYPES_MODULE}")
