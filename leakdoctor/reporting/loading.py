"""Reading a summary file that anyone may have written or damaged (`leakdoctor report`, Summary.load):
bounded in size, checked in shape before anything renders it, its strings made safe to print.

Every problem is one SummaryFileError (a ValueError) with a one-line message that says where in the file
it is, so that a CI gate can tell a corrupt file (`leakdoctor report` exits 2) from a leak (exit 1).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

from leakdoctor._base.schema import CAUSES, OLD_SCHEMAS, SCHEMA, SEVERITIES, STATES
from leakdoctor._base.units import UNITS

__all__ = ["SummaryFileError", "read", "check", "clean"]

#: A summary is a few hundred kB (histories are bounded at 1024 points a series); a larger file is not one.
MAX_BYTES = 64 * 2**20

# Terminal control: CSI and OSC sequences, other ESC sequences, C0/C1 control characters, and the
# bidirectional overrides that can make printed text read differently from what it is.
_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?|\x9b[0-?]*[ -/]*[@-~]?")
_BLANKS = re.compile(r"[\t\n\r\v\f]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class SummaryFileError(ValueError):
    """The file is not a readable leakdoctor summary."""


def clean(text: str) -> str:
    """`text` without terminal escape sequences and control characters (whitespace becomes a space)."""
    return _CONTROLS.sub("", _BLANKS.sub(" ", _SEQUENCES.sub("", text)))


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary in `path` as JSON data, checked and with clean strings (Summary.load makes it a
    Summary); SummaryFileError if it is none."""
    with open(path, "rb") as fh:
        # a file's size is known before reading; a pipe or a device gives at most one byte too many
        raw = None if os.fstat(fh.fileno()).st_size > MAX_BYTES else fh.read(MAX_BYTES + 1)
    if raw is None or len(raw) > MAX_BYTES:
        raise SummaryFileError(f"larger than {MAX_BYTES // 2**20} MiB, which no leakdoctor summary is")
    try:
        data = json.loads(raw.decode("utf-8"))
        data = _cleaned(data)
    except UnicodeDecodeError as err:
        raise SummaryFileError(f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise SummaryFileError(f"not JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise SummaryFileError("nested too deeply to be a leakdoctor summary") from None
    check(data)
    return data


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value


# --- the shape ---------------------------------------------------------------------------------------

def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _string(v: Any) -> bool:
    return isinstance(v, str)


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
               bool: "true/false", type(None): "null"}


def _need(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        got = _JSON_NAMES.get(type(value), type(value).__name__)
        raise SummaryFileError(f"{where}: expected {what}, got {got}")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(obj: dict, key: str, where: str, test: Callable[[Any], bool], what: str, required: bool = True) -> None:
    if key not in obj:
        if required:
            raise SummaryFileError(f"{where}: missing {key!r}")
        return
    _need(test(obj[key]), f"{where}.{key}", what, obj[key])


def check(data: Any) -> None:
    """Raise SummaryFileError unless `data` has the shape that Summary.from_dict, the text table and the
    plot read. Keys they do not read are left alone (newer summaries add some)."""
    _need(isinstance(data, dict), "the file", "a JSON object (a leakdoctor summary)", data)
    if data.get("schema") not in (SCHEMA, *OLD_SCHEMAS):
        raise SummaryFileError(f"not a leakdoctor summary: schema {_short(repr(data.get('schema')))}, "
                               f"expected {SCHEMA!r}")
    _field(data, "framework", "summary", _string, "a string")
    _field(data, "steps", "summary", lambda v: _integer(v) and v >= 0, "a whole number of steps")
    _field(data, "rank", "summary", _integer, "an integer", required=False)
    _field(data, "version", "summary", _string, "a string", required=False)
    _field(data, "projected_limit_step", "summary", _optional(_integer), "a step or null", required=False)
    _field(data, "series", "summary", lambda v: isinstance(v, dict), "an object of series")
    for name, series in data["series"].items():
        _check_series(series, f"series[{_short(repr(name))}]")
    _field(data, "findings", "summary", lambda v: isinstance(v, list), "a list of findings")
    for i, finding in enumerate(data["findings"]):
        _check_finding(finding, f"findings[{i}]")
    _field(data, "notes", "summary", lambda v: isinstance(v, list) and all(_string(n) or _record(n) for n in v),
           "a list of records (or strings)", required=False)
    _field(data, "errors", "summary", lambda v: isinstance(v, list) and all(
        isinstance(e, dict) and _string(e.get("part")) and _string(e.get("error")) for e in v),
        "a list of {part, error} objects", required=False)
    _field(data, "ranks", "summary", lambda v: isinstance(v, list) and all(
        isinstance(r, dict) and isinstance(r.get("findings", []), list) for r in v),
        "a list of rank objects", required=False)
    _field(data, "unwatched", "summary", _optional(lambda v: isinstance(v, dict) and all(
        _string(v.get(k)) for k in ("reason", "fix"))), "an object with reason and fix, or null", required=False)
    _field(data, "stopped_by", "summary", _optional(lambda v: isinstance(v, dict) and all(
        _optional(_integer)(v.get(k)) for k in ("rank", "step"))), "an object with the rank and step, or null",
        required=False)
    _field(data, "complete", "summary", lambda v: isinstance(v, bool), "true or false", required=False)
    _field(data, "written_at", "summary", _optional(_string), "a time (ISO 8601) or null", required=False)
    for key in ("overhead", "settings"):
        _field(data, key, "summary", lambda v: isinstance(v, dict), "an object", required=False)
    for key, value in data.get("overhead", {}).items():
        check, expected = _OVERHEAD_RECORDS.get(key, (_plain, "a number"))
        _need(check(value), f"overhead[{_short(repr(key))}]", expected, value)


def _record(value: Any) -> bool:
    """A record of the message catalogue: a code, and params whose records are records too."""
    return isinstance(value, dict) and _string(value.get("code")) and isinstance(value.get("params", {}), dict)


def _location(value: Any) -> bool:
    """{file, line, function, holder}: strings or null, the line a whole number or null."""
    return isinstance(value, dict) and all(_optional(_string)(value.get(k)) for k in ("file", "function", "holder")) \
        and _optional(_integer)(value.get("line"))


def _plain(value: Any) -> bool:
    return value is None or _number(value) or _string(value)


#: The overhead entries that are records, not numbers: what waited for the budget, and the suspicions the
#: triage did not confirm, by metric.
_OVERHEAD_RECORDS = {
    "deferred": (lambda v: isinstance(v, list) and all(isinstance(d, dict) and _integer(d.get("step")) for d in v),
                 "a list of objects with their step"),
    "suspicions_dismissed": (lambda v: isinstance(v, dict) and all(_integer(n) for n in v.values()),
                             "an object of counts by metric"),
}


def _check_series(series: Any, where: str) -> None:
    _need(isinstance(series, dict), where, "an object", series)
    _field(series, "unit", where, lambda v: v in UNITS, f"one of {UNITS}")
    for key in ("start", "end", "peak", "slope_per_step"):
        _field(series, key, where, _optional(_number), "a number or null")
    _field(series, "trend", where, _string, "a string")
    _field(series, "points", where, lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and _number(p[0]) and _optional(_number)(p[1]) for p in v),
        "a list of [step, value] pairs", required=False)


def _check_finding(finding: Any, where: str) -> None:
    _need(isinstance(finding, dict), where, "an object", finding)
    _field(finding, "cause", where, lambda v: v in CAUSES, f"a cause, one of {sorted(CAUSES)}")
    for key in ("metric", "unit"):
        _field(finding, key, where, _string, "a string")
    for key in ("evidence", "recommendation"):  # a record; text in a file of schema 1
        _field(finding, key, where, lambda v: _string(v) or _record(v), "a record (or a string)")
    for key in ("first_step", "detected_step"):
        _field(finding, key, where, _integer, "a step")
    _field(finding, "rate_per_step", where, _optional(_number), "a number or null")
    _field(finding, "location", where, _optional(lambda v: _string(v) or _location(v)),
           "a {file, line, function, holder} object (or a string) or null", required=False)
    _field(finding, "reclaimed_by", where, _optional(_string), "a string or null", required=False)
    _field(finding, "benign", where, lambda v: isinstance(v, bool), "true or false", required=False)
    _field(finding, "state", where, _optional(lambda v: v in STATES), f"one of {STATES} or null", required=False)
    _field(finding, "severity", where, _optional(lambda v: v in SEVERITIES), f"one of {SEVERITIES} or null",
           required=False)
    _field(finding, "reason", where, _optional(lambda v: _string(v) or _record(v)), "a record, a string or null",
           required=False)
    _field(finding, "rate_interval", where, _optional(lambda v: isinstance(v, list) and len(v) == 2),
           "a [low, high] pair or null", required=False)
    _field(finding, "remedy", where, _optional(lambda v: isinstance(v, dict)), "an object or null", required=False)
    _field(finding, "supporting", where, lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
           "a list of objects", required=False)
    remedy = finding.get("remedy")
    if remedy is not None:
        where = f"{where}.remedy"
        _field(remedy, "name", where, _string, "a string")
        _field(remedy, "applied_step", where, _integer, "a step")
        _field(remedy, "effective", where, _optional(lambda v: isinstance(v, bool)), "true, false or null",
               required=False)
        _field(remedy, "rate_after", where, _optional(_number), "a number or null", required=False)
        _field(remedy, "detail", where, _optional(lambda v: _string(v) or _record(v) or isinstance(v, list)
                                                  and all(_record(r) for r in v)), "a record, records or a string",
               required=False)
        _field(remedy, "error", where, _optional(_string), "a string or null", required=False)
