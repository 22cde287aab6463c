"""pytest plugin (registered by entry point): a CI test that fails when a training step leaks.

    def test_step_does_not_leak(leak_check):
        model = make_model()
        leak_check(lambda: train_step(model), steps=300)

    @pytest.mark.leakcheck(steps=300)
    def test_step():               # the body is the step: it runs 300 times under the doctor
        train_step(MODEL)

Either fails with the leak summary when the step leaks: what the step keeps alive grows steadily by more
than `max_bytes_per_step` (default 4 KiB) a step, or another leak (hooks, compiles, a growing container)
is found.

What the step keeps is measured, not what the process maps: resident memory cannot see a step that
fills heap an earlier test freed (the same leak passed or failed by test order). After every step the
check reads the bytes allocated and still alive: tracemalloc's traced memory (tracing is on for the
check, with 16 frames, and put back as it was after), malloc's bytes in use (glibc's mallinfo2), and the
allocator counters of a framework the test uses (torch CUDA/MPS allocated, MLX active memory, JAX live
arrays); what the doctor's own step() added is taken out. A measure fails the check when it rose, by at
least half the allowed rate, in each of the last three (or more) of six stretches after the warm-up, its
Theil–Sen slope over them exceeds `max_bytes_per_step`, and a gc.collect() at the end keeps the growth
(a one-off allocation, a cache that fills and stays, garbage not yet collected: no failure). A gc.collect()
before the first step frees what earlier tests left for the collector, so that its freeing during the
check is never credited against this step's growth (the verdict is the same in any order). The failure
names the line that allocates what is kept (a tracemalloc diff over a few more steps). The doctor still
watches the run (resident memory is the second opinion) and its own findings fail the check too, but
for growth of resident memory that nothing names (native_memory) where malloc's bytes in use are read:
those show whether the step keeps anything on the C heap.

The doctor is the one `leakdoctor run` attaches for the frameworks the test process imported (torch's,
MLX's, JAX's: leakdoctor._runner.in_process), on the model and optimizer the first step used, so a test
and a run name one bug alike: a list that keeps outputs with their autograd graphs is `retained_graph` at
the list's line, a hook added per step `hook_accumulation`. Where the doctor proves such a cause, the
check's own measures of the host's heap (tracemalloc, malloc) add no finding of their own.

The threshold is in bytes per step, so the verdict is the same on a laptop and on a big runner: the
doctor's own materiality (a tenth of the headroom to the memory limit over `horizon` steps) depends on
the machine's memory, so the check sets a horizon over which any significant growth is material and
lets the threshold decide. The check samples every step (overhead=1.0): in a test, detection speed
matters and overhead does not; so it starts no sampler thread (sampler="inline"), whose own stack and
malloc arena, some 32 KiB resident once, a check of bytes per step could see. The other options
(warmup, window, remedies, ...; the README's Options table) pass through to the doctor.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import math
import sys
import tracemalloc
import warnings
from typing import Any, Callable

import pytest

from leakdoctor._base import logs
from leakdoctor._base.findings import Finding
from leakdoctor._base.guard import LeakDoctorWarning
from leakdoctor._base.messages import msg
from leakdoctor._base.schema import MAJOR, MINOR, SEVERITIES
from leakdoctor._base.units import format_value
from leakdoctor.reporting.summary import Summary

DEFAULT_STEPS = 300
#: A step may keep this many bytes on average (1.2 MB over 300 steps); a steady growth above it fails.
DEFAULT_MAX_BYTES_PER_STEP = 4096
#: The check's horizon: any significant growth is material over it (under a byte per step against a
#: tenth of a TiB), whatever the machine's memory, and `max_bytes_per_step` decides.
HORIZON = 2**40
#: Frames tracemalloc keeps per allocation while the check traces (the failure names the user's line).
FRAMES = 16
#: Stretches of the steps after the warm-up; the growth must go on through the last RUN of them.
STRETCHES = 6
RUN = 3
#: Below this many bytes a step, a measure's growth is noise (interned names, caches of the interpreter).
NOISE_BYTES_PER_STEP = 16
#: Extra steps run after a failure, between two tracemalloc snapshots, to name the line that keeps memory.
LOCATE_STEPS = 30
#: The check's own defaults for options of the doctor (leakdoctor.settings.OPTIONS; the module's docstring
#: says why); any of them, and any other option, may be given to the check. Checked against the options'
#: definition by tests/test_options.py: a renamed option cannot leave a stale default here.
DOCTOR_DEFAULTS: dict[str, Any] = {"verbose": False, "overhead": 1.0, "horizon": HORIZON, "sampler": "inline"}


def check_for_leaks(step: Callable[[], object], steps: int = DEFAULT_STEPS,
                    max_bytes_per_step: float = DEFAULT_MAX_BYTES_PER_STEP, fail_on: str = MAJOR,
                    **doctor_args: Any) -> Summary:
    """Run `step` `steps` times under a LeakDoctor; fail the current test if it leaks: what the step keeps
    alive grows by more than `max_bytes_per_step` a step, or the doctor finds a leak (not remedied).
    `fail_on="minor"` also fails on a proven cause too slow to matter (a minor finding). `doctor_args`:
    any option of the README's Options table (leakdoctor.settings.OPTIONS); a misspelt name is an
    UnknownOptionError that suggests the nearest one (`steps` and the others of this check included)."""
    from leakdoctor._options import ENGINE_ONLY
    from leakdoctor.reporting._report import proven
    from leakdoctor._runner.in_process import FirstStep, make_doctor
    from leakdoctor.settings import NAMES, Settings, reject_unknown

    reject_unknown("leak check", doctor_args, {*NAMES, *ENGINE_ONLY, *OWN})
    if fail_on not in SEVERITIES:
        raise ValueError(f"leak check: fail_on={fail_on!r}, expected one of {SEVERITIES}")

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"leak check: steps={steps!r}, expected a positive int")
    if isinstance(max_bytes_per_step, bool) or not isinstance(max_bytes_per_step, (int, float)) \
            or not 0 <= max_bytes_per_step < math.inf:
        raise ValueError(f"leak check: max_bytes_per_step={max_bytes_per_step!r}, expected bytes >= 0, "
                         f"e.g. {DEFAULT_MAX_BYTES_PER_STEP}")
    doctor_args = {**DOCTOR_DEFAULTS, **doctor_args}
    Settings.create(**{k: v for k, v in doctor_args.items() if k not in ENGINE_ONLY})  # bad values fail before a step
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(FRAMES)
    try:
        with warnings.catch_warnings(record=True) as heard, logs.quiet():  # the check says what matters itself
            warnings.simplefilter("always", LeakDoctorWarning)  # held back: said below only if it matters
            kept = Kept()
            # What earlier tests (or a failure's traceback) left for the collector goes now, before the
            # first reading: freed during the steps or by the final gc.collect(), it would make the
            # measures fall and be credited against what this step keeps (the verdict would then
            # depend on the tests that ran before).
            gc.collect()
            first = FirstStep()  # the first step shows the model and optimizer of the frameworks' doctor
            first.run(step)
            kept.after_step()
            with make_doctor(first, **doctor_args) as doctor:
                del first
                gc.collect()  # what making the doctor left, before its first reading
                doctor.step()
                kept.after_doctor()
                for _ in range(steps - 1):
                    step()
                    kept.after_step()
                    doctor.step()
                    kept.after_doctor()
            summary = doctor.summary
            found = kept.findings(doctor.settings.warmup, max_bytes_per_step, step)
    finally:
        if started:
            tracemalloc.stop()
    leaks = [f for f in summary.leaks if not (f.remedy and f.remedy.effective) and not kept.explains_away(f)
             and (f.unit != "bytes" or (f.rate_per_step or 0.0) > max_bytes_per_step)]
    if any(proven(f) for f in leaks):  # the doctor named who keeps it: the host heap's growth adds no cause
        found = [f for f in found if f.metric not in HOST]
    if found:
        summary = dataclasses.replace(summary, findings=[*summary.findings, *found])
        leaks += found
        if doctor.settings.summary_path is not None:  # the doctor wrote its own; this one holds what was kept
            summary.write(doctor.settings.summary_path)
    if fail_on == MINOR:
        leaks += summary.unremedied_minor
    _say_again(heard, failing=bool(leaks))
    if leaks:
        rates = ", ".join(f"{f.cause} on {f.metric} ({format_value(f.rate_per_step, f.unit)}/step)" for f in leaks)
        pytest.fail(f"the step leaks memory: {rates}; max_bytes_per_step={max_bytes_per_step:g}\n{summary.text()}",
                    pytrace=False)
    return summary


#: The check's own keyword arguments (beside the doctor's options), from its signature.
OWN = tuple(name for name, p in inspect.signature(check_for_leaks).parameters.items()
            if p.kind is p.POSITIONAL_OR_KEYWORD and name != "step")


#: The start of a LeakDoctorWarning about the memory limit (leakdoctor._lifecycle.stopping): under the check's horizon
#: any growth projects to the limit in millions of steps, which says nothing about the test.
PROJECTION = " is projected to reach the memory limit "


def _say_again(heard: list[warnings.WarningMessage], failing: bool) -> None:
    """Pass on what was heard during the check: the step's own warnings always; of the doctor's, only a part
    switched off on a passing test (the check judged with less). A passing check is otherwise silent; a
    failing one says the rest in its summary (projection and switched-off parts included)."""
    from leakdoctor._base.guard import warn

    for heard_one in heard:
        if not issubclass(heard_one.category, LeakDoctorWarning):
            warnings.warn_explicit(heard_one.message, heard_one.category, heard_one.filename, heard_one.lineno,
                                   source=heard_one.source)
        elif not failing and PROJECTION not in str(heard_one.message):
            warn(str(heard_one.message))


class Kept:
    """What the step keeps alive, read after each step by every measure there is (see the module's
    docstring), less what the doctor's own step() added (its records of the run): each measure's rise
    across doctor.step() is booked to the doctor, its falls (a remedy, a collection of the step's garbage)
    are the step's."""

    def __init__(self) -> None:
        self.measures = dict(_measures())
        self.series: dict[str, list[float]] = {name: [] for name in self.measures}
        self._own = dict.fromkeys(self.measures, 0.0)
        self._mark: dict[str, float] = {}

    def explains_away(self, finding: Finding) -> bool:
        """Is the doctor's finding growth that these measures show the step does not keep? Resident memory
        that grows with nothing named (native_memory) where malloc's bytes in use are read: a native leak
        through malloc would show there, so what is left is the heap's own pages (freed memory it keeps,
        the doctor's records traced by tracemalloc, its investigation's snapshots), not the step's."""
        return finding.cause == "native_memory" and finding.metric == "rss_bytes" and "malloc_bytes" in self.measures

    def _read(self) -> dict[str, float]:
        values = {}
        for name, read in list(self.measures.items()):
            try:
                values[name] = float(read())
            except Exception:  # noqa: BLE001 - a measure that fails is left out; the others decide
                del self.measures[name]
        return values

    def after_step(self) -> None:
        self._mark = self._read()
        for name, value in self._mark.items():
            self.series[name].append(value - self._own[name])

    def after_doctor(self) -> None:
        for name, value in self._read().items():
            if name in self._mark:
                self._own[name] += max(0.0, value - self._mark[name])

    def findings(self, warmup: int, max_bytes_per_step: float, step: Callable[[], object]) -> list[Finding]:
        """A finding for each measure that grew steadily, faster than allowed, and kept its growth through
        a gc.collect(); the first (tracemalloc's) placed at the line that allocates what is kept."""
        gc.collect()
        now = self._read()
        found = []
        for name, values in self.series.items():
            values = values[warmup:]
            growth = steady_growth(values, max_bytes_per_step)
            if growth is None or name not in now:
                continue
            rate, start = growth
            collected = now[name] - self._own[name]
            if collected - min(values[start:start + max(1, (len(values) - start) // RUN)]) \
                    < 0.5 * rate * (len(values) - start):
                continue  # garbage that the collector had not freed yet, not kept
            found.append((name, rate, len(values) - start))
        host = [f for f in found if f[0] in HOST]
        if len(host) > 1:  # the same memory, seen by tracemalloc and by malloc: the faster one says it
            found = [max(host, key=lambda f: f[1])] + [f for f in found if f[0] not in HOST]
        if not found:
            return []
        location = locate(step) if tracemalloc.is_tracing() else None
        steps = len(next(iter(self.series.values()), []))
        return [Finding(
            cause=CAUSE_OF.get(name, "native_memory"), metric=name, first_step=steps - span + 1, detected_step=steps,
            rate_per_step=rate, unit="bytes", location=location, severity="major", state="leak",
            evidence=msg("test_step_kept", metric=name, meaning=MEANING[name], rate=rate, steps=span,
                         site=msg("allocated_at", site=location) if location else None),
            recommendation=msg("step_keeps"),
        ) for name, rate, span in found]


#: The measures of the process's own memory (the others are a device's).
HOST = ("traced_bytes", "malloc_bytes")
#: What each measure reads, and the cause its growth points to.
MEANING = {"traced_bytes": "tracemalloc's traced memory",
           "malloc_bytes": "malloc's bytes in use, tracemalloc's own left out",
           "cuda_allocated_bytes": "torch.cuda.memory_allocated()",
           "mps_allocated_bytes": "torch.mps.current_allocated_memory()",
           "mlx_active_bytes": "mx.get_active_memory()",
           "jax_live_bytes": "the bytes of jax.live_arrays()"}
CAUSE_OF = {"traced_bytes": "python_objects", "malloc_bytes": "native_memory", "cuda_allocated_bytes": "device_arrays",
            "mps_allocated_bytes": "device_arrays", "mlx_active_bytes": "device_arrays",
            "jax_live_bytes": "device_arrays"}


def _measures() -> list[tuple[str, Callable[[], float]]]:
    """(name, read) of every measure of bytes kept alive that this process has, each read once to try it."""
    from leakdoctor.integrations._process import malloc_in_use

    found: list[tuple[str, Callable[[], float]]] = [("traced_bytes", lambda: tracemalloc.get_traced_memory()[0])]
    in_use = malloc_in_use()
    if in_use is not None:
        found.append(("malloc_bytes", lambda: in_use() - tracemalloc.get_tracemalloc_memory()))
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            found.append(("cuda_allocated_bytes", torch.cuda.memory_allocated))
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            found.append(("mps_allocated_bytes", mps.current_allocated_memory))
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        metal = getattr(mx, "metal", None)
        active = getattr(mx, "get_active_memory", None) or getattr(metal, "get_active_memory", None)
        if active is not None:
            found.append(("mlx_active_bytes", active))
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "live_arrays"):
        found.append(("jax_live_bytes", lambda: sum(a.nbytes for a in jax.live_arrays())))
    working = []
    for name, read in found:
        try:
            float(read())
        except Exception:  # noqa: BLE001 - a measure this process cannot read is none
            continue
        working.append((name, read))
    return working


def steady_growth(values: list[float], max_bytes_per_step: float) -> tuple[float, int] | None:
    """(rate in bytes per step, index where the growth begins) when `values` (one a step) grow steadily to
    the end faster than `max_bytes_per_step`; else None. The values are cut into STRETCHES stretches; the
    minimum of each (a step's leftovers before a collection lift the others) must rise by half the allowed
    growth of a stretch at least, through the last RUN of them or more; the rate is the Theil–Sen slope
    over those stretches (per-window minima, at most 128 windows). A one-off allocation lifts one stretch;
    a cache that fills then stays is flat at the end."""
    import numpy as np

    from leakdoctor._base.trend import theil_sen, window_minima

    allowed = max(float(max_bytes_per_step), NOISE_BYTES_PER_STEP)
    n = len(values)
    size = n // STRETCHES
    if size < 4:
        return None
    tail = np.asarray(values[n - size * STRETCHES:], dtype=float)
    minima = tail.reshape(STRETCHES, size).min(axis=1)
    rises = np.diff(minima) > 0.5 * allowed * size
    run = 0
    while run < len(rises) and rises[len(rises) - 1 - run]:
        run += 1
    if run < RUN:
        return None
    begin = (STRETCHES - 1 - run) * size
    growing = tail[begin:]
    steps, lows = window_minima(range(len(growing)), growing, max(1, len(growing) // 128))
    rate = theil_sen(steps, lows)[0]
    return (rate, n - size * STRETCHES + begin) if rate > allowed else None


def locate(step: Callable[[], object]) -> str | None:
    """'test_train.py:42': the user's line that allocated most of what LOCATE_STEPS more steps kept (the
    innermost frame in the user's files of each allocation; tracemalloc traces)."""
    from leakdoctor._base.source import is_user_file, short_path

    try:
        before = tracemalloc.take_snapshot()
        for _ in range(LOCATE_STEPS):
            step()
        after = tracemalloc.take_snapshot()
    except Exception:  # noqa: BLE001 - the step failed when run again: no place, the verdict stands
        return None
    sites: dict[str, int] = {}
    for stat in after.compare_to(before, "traceback"):
        if stat.size_diff <= 0:
            continue
        frame = next((f for f in reversed(stat.traceback) if is_user_file(f.filename)), None)
        if frame is not None:
            where = f"{short_path(frame.filename)}:{frame.lineno}"
            sites[where] = sites.get(where, 0) + stat.size_diff
    return max(sites, key=sites.__getitem__) if sites else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"leakcheck(steps={DEFAULT_STEPS}, max_bytes_per_step={DEFAULT_MAX_BYTES_PER_STEP}, fail_on={MAJOR!r}, "
        f"**doctor_args): run the test body `steps` times under leakdoctor and fail if it leaks "
        f"(fail_on={MINOR!r}: also on minor findings; doctor_args: any option of leakdoctor.settings.OPTIONS, "
        f"defaults {DOCTOR_DEFAULTS} for the check)",
    )


@pytest.fixture
def leak_check() -> Callable[..., Summary]:
    """`leak_check(step, steps=300, max_bytes_per_step=4096, **doctor_args) -> Summary`; fails the test on
    a leak."""
    return check_for_leaks


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("leakcheck")
    if marker is None:
        return None
    if marker.args:
        raise pytest.UsageError("leakcheck takes keyword arguments only, e.g. @pytest.mark.leakcheck(steps=300)")
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    check_for_leaks(lambda: pyfuncitem.obj(**args), **marker.kwargs)
    return True
