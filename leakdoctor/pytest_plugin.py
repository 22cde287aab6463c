"""pytest plugin (registered by entry point): a CI test that fails when a training step leaks.

    def test_step_does_not_leak(leak_check):
        model = make_model()
        leak_check(lambda: train_step(model), steps=300)

    @pytest.mark.leakcheck(steps=300)
    def test_step():               # the body is the step: it runs 300 times under the doctor
        train_step(MODEL)

Either fails with the leak summary when the verdict is "leak". The check samples every step
(overhead=1.0): in a test, detection speed matters and overhead does not. Other LeakDoctor arguments
(warmup, window, remedies, memory_limit, ...) pass through.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from leakdoctor.summary import Summary

DEFAULT_STEPS = 300


def check_for_leaks(step: Callable[[], object], steps: int = DEFAULT_STEPS, **doctor_args: Any) -> Summary:
    """Run `step` `steps` times under a LeakDoctor; fail the current test if it leaks."""
    from leakdoctor import LeakDoctor

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"leak check: steps={steps!r}, expected a positive int")
    doctor_args = {"verbose": False, "overhead": 1.0, **doctor_args}
    with LeakDoctor(**doctor_args) as doctor:
        for _ in range(steps):
            step()
            doctor.step()
    summary = doctor.summary
    if summary.verdict == "leak":
        pytest.fail(f"the step leaks memory:\n{summary.text()}", pytrace=False)
    return summary


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leakcheck(steps=300, **doctor_args): run the test body `steps` times under leakdoctor and fail "
        "if it leaks",
    )


@pytest.fixture
def leak_check() -> Callable[..., Summary]:
    """`leak_check(step, steps=300, **doctor_args) -> Summary`; fails the test on a leak."""
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
