"""Test helpers. `isolated` runs a scenario in a fresh interpreter: memory readings then start from a
clean heap, so memory freed by an earlier test cannot hide (or fake) the growth a test reproduces.
`run_ranks` runs the ranks of a distributed run as spawned processes (tests/test_distributed_stop.py,
tests/test_jax_distributed.py, benchmarks/bench_distributed.py); each process hands its result back
through a pipe with `report_to`, as `isolated`'s does."""

from __future__ import annotations

import functools
import multiprocessing
import re
import socket
import string
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from leakdoctor._base.messages import MESSAGES, _Formatter, location_text, records

SCENARIOS = Path(__file__).parent.parent / "benchmarks" / "scenarios"


def report_to(conn: Any, fn: Callable[..., Any], *args: Any, label: str = "") -> None:
    """In a child process: fn(*args), and through `conn` ("ok", its result), or ("error", the traceback) for
    any failure, headed by `label` and the exception ("rank 1: MemoryError: ..."); then `conn` is closed."""
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as err:  # noqa: BLE001 - hand every failure back to the test
        head = f"{label}: {type(err).__name__}: {err}\n" if label else ""
        conn.send(("error", head + traceback.format_exc()))
    finally:
        conn.close()


def _child(conn: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    # as pyproject's filterwarnings: a deprecation raised on a call the library makes is an error (the
    # library's guard then records it in the summary's errors, which the tests read)
    warnings.filterwarnings("error", category=DeprecationWarning, module="leakdoctor")
    report_to(conn, functools.partial(fn, *args, **kwargs))


def isolated(fn: Callable[..., Any], *args: Any, timeout: float = 600, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a spawned, non-daemon process (it may start workers of its own); returns
    its (picklable) result or raises with the child's traceback. `fn` must be importable by name."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, fn, args, kwargs))
    process.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"{fn.__name__} did not finish within {timeout} s")
        status, value = parent.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    if status == "error":
        raise AssertionError(f"{fn.__name__} failed in its own process:\n{value}")
    return value


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(target: Callable[..., None], folder: str, world: int = 2, timeout: float = 240) -> list[Any]:
    """target(rank, port, folder, conn) in `world` spawned processes (`port`: a free port for their
    rendezvous; `conn`: where the process sends its result, as `report_to` does); their results in rank
    order. Every process still alive at the deadline, `timeout` seconds for the whole job (or after a
    failure), is killed."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    pipes, processes = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        process = ctx.Process(target=target, args=(rank, port, folder, child))
        process.start()
        child.close()
        pipes.append(parent)
        processes.append(process)
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * world
    try:
        for rank, pipe in enumerate(pipes):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"rank {rank} did not finish within {timeout} s")
            status, value = pipe.recv()
            if status == "error":
                raise AssertionError(value)
            results[rank] = value
    finally:
        for process in processes:
            process.join(max(1.0, min(10.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join(10)
    return results


def corpus_run(scenario: str) -> dict:
    """A corpus scenario's summary in its detect run, as `make bench` runs it (to call in `isolated`)."""
    sys.path.insert(0, str(SCENARIOS))
    import _harness

    return _harness.run_one(scenario, "detect")["summary"]


def counts(finding: dict) -> bool:
    """Does a finding of a summary JSON make the verdict: a major leak, remedied or not (minor, benign and
    withdrawn findings are listed only)?"""
    return finding["state"] in ("leak", "remedied") and finding["severity"] == "major"


def kept(summary: dict) -> list[dict]:
    """The findings of a summary JSON that the end of the run bore out (all but the withdrawn live alerts)."""
    return [f for f in summary["findings"] if f["state"] != "withdrawn"]


#: The printed text that tests read, each phrase named once: the printed summary's layout (render_text), the
#: lines printed while the run goes on, and a remedy's detail. `{part}`: a dynamic part the test passes to
#: `says`/`phrase` (a step, a name); one left out matches any text within the line. What a finding's evidence
#: and recommendation and a summary's notes say is asserted on their records (RECORDS), never on their words.
PHRASES: dict[str, str] = {
    # the printed summary (summary.render_text) and the lines printed while the run goes on
    "headline": "leakdoctor: {framework}, {steps} steps, verdict {verdict}",
    "verdict": "verdict {verdict}",
    "finding_line": "[{state}] {cause} on {metric}: {rate}/step since step {first}",
    "where": "where: {location}",
    "remedy_line": "{remedy} at step {step}, {outcome}",
    "time_rose": "{label} rose from {start} to {end}",
    "stopped_line": "STOPPED at step {step} before the memory limit: {reason}",
    "oom_line": "OUT OF MEMORY at step {step}: {error}",
    "imminent_line": "OUT OF MEMORY IMMINENT at step {step}: resident memory {rss} of the memory limit {limit}",
    "incomplete_line": "INCOMPLETE: the run did not finish: this summary was last written at {written_at}",
    "oom_growing": "  growing: {metric} {rate}/step since step {since}",
    "oom_allocated": "  allocated: {location}: {what}, +{size} ({seen_by}, step {step})",
    "live_line": "leakdoctor: step {step}:",
    "applied": "applied {remedy} for {cause}",
    "no_step": "took no step",
    "fit_line": "leakdoctor: fit() call {call}",
    "fit_call": "fit() call {call}",
    "fit_result": "{batches} training batches, {verdict}: {found}",
    # a remedy's detail: what it did
    "registered_evaluated": "doctor.step({name}=...)",
    "cache_limit_set": "mx.set_cache_limit({size})",
}


def mentions(record: Any, text: str) -> bool:
    """Does a record (or one nested in it) name `text` in one of its params (a function, a holder, a
    place)? Its data, not its words: the catalogue's templates are not searched."""
    def values(value: Any) -> Iterable[str]:
        if isinstance(value, dict):
            for item in value.values():
                yield from values(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from values(item)
        elif value is not None and not isinstance(value, bool):
            yield str(value)
    return any(text in value for r in records(record) for value in values(r.get("params")))


def _field(params: dict, name: str, code: str) -> str:
    """One param as its message renders it (a number in its unit: '8.0 MiB')."""
    for _, field, spec, conversion in string.Formatter().parse(MESSAGES[code]):
        if field == name:
            value = params.get(name)
            value = repr(value) if conversion == "r" else value
            return _Formatter(params).format_field(value, spec or "")
    return str(params.get(name))


def _same(params: dict, name: str, code: str, part: Any) -> bool:
    """Is the param `name` the part a test gives: equal, one of a list, or as it renders?"""
    value = params.get(name)
    if value == part or str(value) == str(part):
        return True
    if isinstance(value, list):
        return any(v == part or str(v) == str(part) or isinstance(v, dict) and part in v.values() for v in value)
    return _field(params, name, code) == str(part)


def _params(**renamed: str) -> Callable[[dict, str, dict], bool]:
    """A check of the parts a test gives against the params of the same name (or `renamed`: part=param),
    those the record has (a part the message does not hold is another message's, as a phrase's was)."""
    def check(params: dict, code: str, parts: dict) -> bool:
        return all(_same(params, renamed.get(part, part), code, value) for part, value in parts.items()
                   if renamed.get(part, part) in params)
    return check


def _anything(params: dict, code: str, parts: dict) -> bool:
    return True


def _named(params: dict, code: str, parts: dict) -> bool:
    return all(mentions({"code": code, "params": params}, str(v)) for v in parts.values())


#: What a finding's evidence and recommendation and a summary's notes say, by the name a test gives it:
#: the catalogue's codes that say it (leakdoctor/_base/messages.py), and how the test's parts are checked
#: against a record's params (by default: params of the same name).
RECORDS: dict[str, tuple[tuple[str, ...], Callable[[dict, str, dict], bool]]] = {
    # notes
    "ended": (("ended",), _params()),
    "ended_unmerged": (("ended_with",), _params()),
    "watermark_passed": (("watermark_passed",), _params()),
    "never_finished": (("never_finished", "collected"), _params()),
    "collected": (("collected", "when_collected"), _params()),
    "not_gathered": (("not_gathered",), _params()),
    "rank_alone": (("not_gathered",), _params()),
    "not_seen_on_rank": (("not_seen_on_rank",), _params()),
    "not_a_leak": (("not_a_leak", "small_history", "collector_on", "scalar_history", "refilled", "shared_pages"),
                   _params()),
    "collector_on": (("collector_on",), _params()),
    "nothing_allocated": (("refilled",), _params()),
    "slow_unproven_note": (("unproven_and_slow",), _params()),
    "registered_evaluated": (("remedy_force_eval",), lambda p, c, parts: f"doctor.step({parts['name']}=...)" in p["parts"]),
    "cache_limit_set": (("remedy_cap_cache",), lambda p, c, parts: f"{p['cap'] / 2**20:.1f} MiB" == parts["size"]),
    "clears": (("remedy_clear_cache",), lambda p, c, parts: parts["name"] in p["clears"]),
    "no_cuda_snapshot": (("no_cuda_snapshot",), lambda p, c, parts: all(
        repr(p["path"]) == v if k == "path" else _same(p, k, c, v) for k, v in parts.items())),
    "did_not_stop": (("did_not_stop",), _params()),
    "nan_readings": (("nan_readings",), _params()),
    "forked_children": (("forked_children",), _params()),
    "earlier_fits": (("earlier_fits",), _params()),
    "keras_clock": (("steps_are_batches", "steps_are_calls"), _params()),
    "call_did_not_return": (("call_did_not_return",), _params()),
    "stop_warns_across_calls": (("stop_warns_across_calls",), _params()),
    "stop_warns_in_fits": (("stop_warns_in_fits",), _params()),
    # evidence
    "grew": (("grew",), _params(rate="pace")),
    "new_items": (("new_items",), _params()),
    "cpu_rising": (("cpu_rising",), _params()),
    "cycle_census": (("cycle_census",), _params()),
    "held_by": (("held_by", "held_by_counted", "sampled_held_by", "tensors_kept"), lambda p, c, parts: all(
        any(str(h.get("holder") if isinstance(h, dict) else h).startswith(str(v)) for h in p["holders"])
        for v in parts.values())),
    "array_kind": (("accumulating", "arrays_gained"), lambda p, c, parts: any(
        row["arrays"] == "{dtype}[{shape}] on {platform}".format(**parts) for row in p["arrays"])),
    "grad_fn": (("graphs_kept", "items_keep_graphs", "graphs_in", "graph_tensors", "stores_graphs"), _params()),
    "graph_grew": (("graph_grew",), _params()),
    "hooks_held": (("hooks_held",), _params()),
    "retries_rose": (("retries_rose",), _params()),
    "new_models": (("new_models",), _params()),
    "per_new_model": (("per_new_model",), _params()),
    "gc_took_back": (("gc_took_back",), _params()),
    "collected_then_trimmed": (("collected_then_trimmed",), _params()),
    "not_given_back": (("not_given_back",), _params()),
    "models_settle": (("models_settle",), _params()),
    "keras_compiled": (("keras_compiled",), lambda p, c, parts: parts.get("function") in p["functions"]),
    "within_fit": (("within_fit",), lambda p, c, parts: "call" not in parts or re.fullmatch(
        rf"fit\(\) call {parts['call']}( .*)?", p["label"]) is not None),  # 'fit() call 1 at train.py:9'
    "fit_batches": (("within_fit",), lambda p, c, parts: "batches" not in parts or p["batches"] == parts["batches"]),
    "list_grew": (("grew", "growing_by", "gaining_graph_bytes", "no_growth_of_its_own"),
                  lambda p, c, parts: p["metric"] == f"len({parts['list']})"),
    "traced_again": (("traced_again",), _params()),
    "traced": (("traced",), _params()),
    "jax_compiled": (("compiled_in_window", "compiled_from", "traced_again"), lambda p, c, parts: mentions(
        {"code": c, "params": p}, f"jit({parts['function']})")),
    "lax_cond": (("lax_cond",), _params()),
    "active_flat": (("active_flat",), _params()),
    "never_evaluated": (("never_evaluated",), _anything),
    "named": (("never_evaluated",), lambda p, c, parts: parts["name"] in p["names"] or parts["name"] == p["name"]),
    "shapes_changing": (("arguments_changing",), lambda p, c, parts: p["arguments"].startswith(
        f"{parts['argument']} (")),
    "python_list": (("python_container",), lambda p, c, parts: p["kind"] == "list" and (
        "count" not in parts or p["count"] == parts["count"]) and ("kind" not in parts or p["item"] == parts["kind"])),
    "pytorch_issue": (("workers_copied", "workers_read_container", "workers_keep"), _anything),
    # recommendations
    "clear_session": (("drop_old_models", "clear_session_or_del", "clear_session_caches"), _params()),
    "fixed_shapes": (("fixed_shapes",), _params()),
    "jit_the_update": (("jit_the_update",), _params()),
    "as_arrays": (("trace_once",), _params()),
    "store_floats": (("store_floats",), _params()),
    "detach": (("keep_scalar", "keep_either"), lambda p, c, parts: p["value"] == parts.get("value", "loss")),
    "detach_or_summary": (("keep_detached",), _params()),
    "models_referenced": (("models_referenced",), _params()),
    "models_held_by": (("models_held_by",), lambda p, c, parts: str(p["holder"]).startswith(parts.get("holder", ""))),
    "allow_remedy": (("allow_detach",), _params()),
    "list_stores": (("stores",), lambda p, c, parts: p["kind"] == "list" and p["holder"] == parts["list"] and
                    mentions(p["what"], parts["type"])),
    "mx_eval_state": (("eval_state_after_call", "eval_state_after_update", "eval_chain"), lambda p, c, parts: (
        parts.get("extra", "") == (f", {p['expr']}" if c == "eval_chain" else ""))),
    "register_with_doctor": (("eval_chain",), _params()),
    "shapeless": (("shapeless",), _params()),
    "bucket": (("shapeless",), _params()),
    "as_numpy_array": (("loader_advice",), _params()),
    "persistent_workers": (("loader_advice",), _params()),
}


def has(record: Any, *keys: str, **parts: Any) -> bool:
    """Does the record (a finding's evidence or recommendation, a note), or one nested in it, say every
    fact that `keys` name (RECORDS), its params agreeing with `parts`? For a list of records (a summary's
    notes): does one of them say them all?"""
    if isinstance(record, list):
        return any(has(item, *keys, **parts) for item in record)
    return all(any(code in RECORDS[key][0] and RECORDS[key][1](params, code, parts)
                   for code, params in _walk(record, {})) for key in keys)


def _walk(record: Any, around: dict) -> Iterable[tuple[str, dict]]:
    """(code, params) of the record and those nested in it; a note said at a step (`at_step`) gives its
    step to what it says."""
    if isinstance(record, list):
        for item in record:
            yield from _walk(item, around)
    elif isinstance(record, dict) and "code" in record:
        params = record.get("params") or {}
        yield record["code"], {**around, **params}
        inner = {**around, "step": params.get("step")} if record["code"] == "at_step" else around
        for value in params.values():
            yield from _walk(value, inner)


def phrase(key: str, **parts: Any) -> re.Pattern[str]:
    """PHRASES[key] as a pattern: a part given is matched as written, one left out as any text within the line."""
    pattern = ""
    for literal, name, _, _ in string.Formatter().parse(PHRASES[key]):
        pattern += re.escape(literal)
        if name is not None:
            pattern += re.escape(str(parts[name])) if name in parts else r"[^\n]+?"
    return re.compile(pattern)


def says(text: str | Iterable[str], *keys: str, **parts: Any) -> bool:
    """Does `text` hold every phrase `keys` names, its parts filled from `parts`? For a list of texts (a
    summary's notes): does one of them hold them all?"""
    if isinstance(text, dict) or isinstance(text, list) and any(isinstance(item, dict) for item in text):
        return has(text, *keys, **parts)  # records: their codes and params
    if not isinstance(text, str):
        return any(says(item, *keys, **parts) for item in text)
    return all(phrase(key, **parts).search(text) for key in keys)


def place(finding: dict) -> str | None:
    """A finding's location, as the summary's text says it ('val_losses in train() (train.py:42)'), from the
    summary JSON's {file, line, function, holder}."""
    return location_text(finding.get("location"))
