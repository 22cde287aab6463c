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


#: The library's wording that tests read, each phrase named once: where the words are the feature (the
#: printed summary's layout, advice a user must follow, a holder named in the evidence, a note that has no
#: field), a rewording is one edit here. Facts the summary's fields carry are asserted on the fields.
#: `{part}`: a dynamic part the test passes to `says`/`phrase` (a step, a name); one left out matches any
#: text within the line.
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
    # notes (summary["notes"]: no field says these)
    "ended": "the run ended with {error} at step {step}",
    "watermark_passed": "step {step}: resident memory reached {rss}, {share} of the memory limit",
    "ended_unmerged": "the run ended with {error}: ",
    "never_finished": "finish() was never called",
    "collected": "when it was garbage-collected",
    "not_gathered": "the summaries of the other {others} rank(s) were not gathered (they may never reach the "
                    "collective)",
    "rank_alone": "so this summary is rank {rank}'s alone",
    "not_seen_on_rank": "rank {rank}: {cause} on {metric} (not seen on rank {first})",
    "not_a_leak": "not a leak",
    "collector_on": "garbage collector, which is on",
    "nothing_allocated": "nothing new was allocated",
    "no_cuda_snapshot": "oom_snapshot={path}: CUDA is not available",
    "did_not_stop": "{remedy} did not stop {cause} on {metric}",
    "nan_readings": "{metric} read NaN or inf {count} time(s), first at step {step}",
    "forked_children": "forked child process(es) were watched too",
    "earlier_fits": "steps 1-{steps} were earlier fits with this callback",
    "keras_clock": "({calls} calls, {batches} training batches)",
    "call_did_not_return": "call {call}, {kind}() at {site}, did not return",
    "stop_warns_across_calls": "on_limit='stop' stops a fit (model.stop_training) but acts as 'warn' across calls",
    "stop_warns_in_fits": "on_limit='stop' acts as 'warn', within fits as across calls: {variable} says",
    # evidence: what the library saw, named for the user
    "grew": "{metric} grew {growth} in {steps} steps ({rate}/step)",
    "new_items": ", about {size} of new items",
    "cpu_rising": "CPU time per step rising",
    "cycle_census": "garbage in cycles:",
    "held_by": "held by {holders}",
    "array_kind": "{dtype}[{shape}] on {platform}",
    "grad_fn": "grad_fn",
    "graph_grew": "autograd graph grew",
    "hooks_held": "holds {count} {kind}s running",
    "retries_rose": "retries rose by {count}",
    "new_models": "new models in",
    "per_new_model": "per new model",
    "gc_took_back": "gc.collect() took it back",
    "collected_then_trimmed": "full collection freed the old models just before the ladder, and malloc_trim took it back",
    "not_given_back": "not given back",
    "models_settle": "do not pile up",
    "keras_compiled": "Keras compiled {function}",
    "within_fit": "within fit() call {call}",
    "fit_batches": "({batches} batches;",
    "list_grew": "len({list}) grew",
    "traced_again": "{function} was traced again",
    "traced": "{function} was traced",
    "jax_compiled": "jit({function})",
    "lax_cond": "lax.cond",
    "active_flat": "active memory stayed flat",
    "never_evaluated": "never evaluated",
    "named": "`{name}`",
    "shapes_changing": "its arguments changing: {argument} (",
    "python_list": "a Python list of {count} objects ({kind}",
    "pytorch_issue": "pytorch#13246",
    # recommendations: the advice a user must read
    "clear_session": "keras.backend.clear_session()",
    "fixed_shapes": "fixed shapes",
    "jit_the_update": "jax.jit",
    "as_arrays": "jnp.asarray",
    "store_floats": "store Python floats in {holder}",
    "detach": "loss.detach() or loss.item()",
    "allow_remedy": "remedies='all' (or ['{remedy}'])",
    "list_stores": "the list {list} stores {type}",
    "mx_eval_state": "mx.eval(model.parameters(), optimizer.state{extra})",
    "shapeless": "shapeless=True",
    "bucket": "bucket",
    "as_numpy_array": "{holder} as a numpy array",
    "persistent_workers": "persistent_workers=True",
    # a remedy's detail: what it did
    "registered_evaluated": "doctor.step({name}=...)",
    "cache_limit_set": "mx.set_cache_limit({size})",
}


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
    if not isinstance(text, str):
        return any(says(item, *keys, **parts) for item in text)
    return all(phrase(key, **parts).search(text) for key in keys)
