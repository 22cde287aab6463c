"""Live alerts and the final verdict also go through `logging.getLogger("leakdoctor")` (issue #40): levels
(suspected INFO, leak WARNING, an error inside the doctor ERROR) and the finding's fields on each record,
for real leaks (a torch loop that keeps its outputs with their autograd graphs; a plain Python list), read
back from the logger's records (caplog). Nothing is printed by logging where no logging is configured."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from procs import env

EVERY_STEP = {"warmup": 5, "window": 4, "overhead": 1.0, "memory_limit": "4GiB", "verbose": False}


def records(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "leakdoctor" and r.event == event]


def torch_outputs_kept(steps: int):
    """A torch loop that appends each step's output, with its graph, to a list; its summary."""
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 64)
    outputs = []
    with LeakDoctor(model=model, optimizer=optimizer, **EVERY_STEP) as doctor:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            outputs.append(model(x))  # the leak: each output keeps its graph
            doctor.step()
    return doctor.summary


KEPT: list[bytearray] = []


def python_list_grows(steps: int):
    """A plain loop that appends 200 kB a step to a module-level list; its summary."""
    from leakdoctor import LeakDoctor

    KEPT.clear()
    with LeakDoctor(**EVERY_STEP) as doctor:
        for _ in range(steps):
            KEPT.append(bytearray(200_000))  # the leak
            doctor.step()
    KEPT.clear()
    return doctor.summary


@pytest.mark.parametrize(("loop", "cause"), [(torch_outputs_kept, "retained_graph"),
                                              (python_list_grows, "python_objects")])
def test_a_leak_is_logged_live_at_info_and_in_the_verdict_at_warning_with_its_fields(caplog, loop, cause):
    caplog.set_level(logging.INFO, logger="leakdoctor")
    summary = loop(200)
    assert summary.verdict == "leak"
    (leak,) = [f for f in summary.findings if f.final_state == "leak" and f.counts]
    assert leak.cause == cause and leak.location is not None

    suspected = [r for r in records(caplog, "suspected") if r.cause == leak.cause and r.metric == leak.metric]
    assert suspected, [(r.event, r.cause, r.metric) for r in caplog.records]
    live = suspected[0]
    assert live.levelno == logging.INFO and live.state == "suspected" and live.severity is None
    assert live.location == leak.location and live.location is not None
    assert isinstance(live.step, int) and 0 < live.step <= summary.steps and live.rank == 0

    (final,) = [r for r in records(caplog, "finding") if r.cause == leak.cause and r.metric == leak.metric]
    assert final.levelno == logging.WARNING
    assert (final.state, final.severity, final.location, final.step) == \
        ("leak", "major", leak.location, leak.detected_step)

    (verdict,) = records(caplog, "verdict")
    assert verdict.levelno == logging.WARNING and verdict.verdict == "leak" and verdict.steps == summary.steps
    order = [r.event for r in caplog.records if r.name == "leakdoctor"]
    assert order.index("suspected") < order.index("finding") < order.index("verdict")  # live first, verdict last


def test_a_clean_run_logs_its_verdict_at_info(caplog):
    from leakdoctor import LeakDoctor

    caplog.set_level(logging.INFO, logger="leakdoctor")
    with LeakDoctor(**EVERY_STEP) as doctor:
        for _ in range(60):
            doctor.step()
    (verdict,) = records(caplog, "verdict")
    assert doctor.summary.verdict == "clean"
    assert verdict.levelno == logging.INFO and verdict.verdict == "clean" and verdict.steps == 60
    assert not [r for r in caplog.records if r.name == "leakdoctor" and r.levelno >= logging.WARNING]


def test_an_error_inside_the_doctor_is_logged_at_error_with_the_part(caplog):
    from leakdoctor import LeakDoctor, LeakDoctorWarning

    def broken() -> float:
        raise RuntimeError("gauge broke")

    caplog.set_level(logging.INFO, logger="leakdoctor")
    with pytest.warns(LeakDoctorWarning):  # the warning stays as it was
        with LeakDoctor(**EVERY_STEP) as doctor:
            doctor.watch("broken", broken)
            for _ in range(20):
                doctor.step()
    (error,) = records(caplog, "error")
    assert error.levelno == logging.ERROR
    assert (error.part, error.error) == (doctor.summary.errors[0]["part"], doctor.summary.errors[0]["error"])
    assert "RuntimeError" in error.error


def test_logging_prints_nothing_where_no_logging_is_configured(tmp_path):
    """A library's records go nowhere until the application configures logging (a NullHandler): a run with
    verbose=False that leaks prints nothing on stderr (Python's last-resort handler would print each
    WARNING record)."""
    script = tmp_path / "leaky.py"
    script.write_text(textwrap.dedent("""
        from leakdoctor import LeakDoctor
        kept = []
        with LeakDoctor(warmup=5, window=4, overhead=1.0, memory_limit="4GiB", verbose=False) as doctor:
            for _ in range(200):
                kept.append(bytearray(200_000))
                doctor.step()
        print(doctor.summary.verdict)
    """))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["leak"], result.stderr
    assert result.stderr == "", result.stderr


def stopped_at_the_limit() -> dict:
    """A plain loop keeping 2 MiB a step, with a real limit 300 MiB above its resident memory and
    on_limit="stop" (run in a fresh process: what it keeps is its own); the records of the leakdoctor
    logger (their fields) and the summary."""
    import warnings

    import numpy as np
    import psutil

    from leakdoctor import LeakDoctor

    seen: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append({name: getattr(record, name) for name in
                         ("levelno", "event", "cause", "metric", "severity", "state", "step", "location")})

    logger = logging.getLogger("leakdoctor")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    warnings.simplefilter("ignore")  # the LeakDoctorWarnings stay as they are; the records are read here
    kept = []
    limit = psutil.Process().memory_info().rss + 300 * 2**20
    with LeakDoctor(memory_limit=limit, on_limit="stop", overhead=1.0, verbose=False) as doctor:
        for _ in range(2000):
            kept.append(np.ones(2**18))  # the leak: 2 MiB a step
            doctor.step()
            if doctor.should_stop:
                break
    summary = doctor.summary
    return {"records": seen, "stopped": summary.stopped, "findings": [f.to_dict() for f in summary.findings]}


def test_a_stop_before_the_memory_limit_is_logged_at_warning_with_the_leak():
    from helpers import isolated

    result = isolated(stopped_at_the_limit)
    assert result["stopped"] is not None
    limit = [r for r in result["records"] if r["event"] == "limit"]
    assert limit and all(r["levelno"] == logging.WARNING and r["state"] == "leak" for r in limit), result["records"]
    stop = limit[-1]
    assert stop["step"] == result["stopped"]["step"]
    (leak,) = [f for f in result["findings"] if f["state"] == "leak"]
    assert (stop["cause"], stop["metric"], stop["location"]) == (leak["cause"], leak["metric"], leak["location"])
