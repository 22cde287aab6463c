"""pytest plugin (registered by entry point): a CI test that fails when a training step leaks.

    def test_step_does_not_leak(leak_check):
        model = make_model()
        leak_check(lambda: train_step(model), steps=300)

    @pytest.mark.leakcheck(steps=300)
    def test_step():               # the body is the step: it runs 300 times under the doctor
        train_step(MODEL)

Either fails with the leak summary when the step leaks: memory grows steadily by more than
`max_bytes_per_step` (default 4 KiB) a step, or another leak (hooks, compiles, a growing container) is
found. The threshold is in bytes per step, so the verdict is the same on a laptop and on a big runner: the
doctor's own materiality (a tenth of the headroom to the memory limit over `horizon` steps) depends on
the machine's memory, so the check sets a horizon over which any significant growth is material and
lets the threshold decide. The check samples every step (overhead=1.0): in a test, detection speed
matters and overhead does not. Other LeakDoctor arguments (warmup, window, remedies, ...) pass through.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from leakdoctor.summary import Summary, format_value

DEFAULT_STEPS = 300
#: A step may keep this many bytes on average (1.2 MB over 300 steps); a steady growth above it fails.
DEFAULT_MAX_BYTES_PER_STEP = 4096
#: The check's horizon: any significant growth is material over it (under a byte per step against a
#: tenth of a TiB), whatever the machine's memory, and `max_bytes_per_step` decides.
HORIZON = 2**40


def check_for_leaks(step: Callable[[], object], steps: int = DEFAULT_STEPS,
                    max_bytes_per_step: float = DEFAULT_MAX_BYTES_PER_STEP, fail_on: str = "major",
                    **doctor_args: Any) -> Summary:
    """Run `step` `steps` times under a LeakDoctor; fail the current test if it leaks: memory that grows
    by more than `max_bytes_per_step` a step, or another leak the doctor finds (not remedied).
    `fail_on="minor"` also fails on a proven cause too slow to matter (a minor finding)."""
    from leakdoctor import LeakDoctor

    if fail_on not in ("major", "minor"):
        raise ValueError(f"leak check: fail_on={fail_on!r}, expected 'major' or 'minor'")

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"leak check: steps={steps!r}, expected a positive int")
    if isinstance(max_bytes_per_step, bool) or not isinstance(max_bytes_per_step, (int, float)) \
            or not 0 <= max_bytes_per_step < math.inf:
        raise ValueError(f"leak check: max_bytes_per_step={max_bytes_per_step!r}, expected bytes >= 0, "
                         f"e.g. {DEFAULT_MAX_BYTES_PER_STEP}")
    doctor_args = {"verbose": False, "overhead": 1.0, "horizon": HORIZON, **doctor_args}
    with LeakDoctor(**doctor_args) as doctor:
        for _ in range(steps):
            step()
            doctor.step()
    summary = doctor.summary
    leaks = [f for f in summary.leaks if not (f.remedy and f.remedy.effective)
             and (f.unit != "bytes" or (f.rate_per_step or 0.0) > max_bytes_per_step)]
    if fail_on == "minor":
        leaks += [f for f in summary.minor if f.final_state == "minor"]
    if leaks:
        rates = ", ".join(f"{f.cause} on {f.metric} ({format_value(f.rate_per_step, f.unit)}/step)" for f in leaks)
        pytest.fail(f"the step leaks memory: {rates}; max_bytes_per_step={max_bytes_per_step:g}\n{summary.text()}",
                    pytrace=False)
    return summary


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leakcheck(steps=300, max_bytes_per_step=4096, fail_on='major', **doctor_args): run the test body `steps` "
        "times under leakdoctor and fail if it leaks (fail_on='minor': also on minor findings)",
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
