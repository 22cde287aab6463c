"""Validated doctor settings. Every bad value fails here, at construction, with a ValueError that names
the value and what would have been valid; nothing is validated later inside the user's loop."""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from leakdoctor import remedies as remedy_registry

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


@dataclass(frozen=True)
class Settings:
    """What a doctor was asked to do. Build with `Settings.create(...)`, which validates."""

    remedies: tuple[str, ...] = ()
    warmup: int = 20
    window: int = 6
    horizon: int = 100_000
    memory_limit: float | None = None
    alpha: float = 0.01
    investigate_steps: int = 10
    verify_windows: int = 8
    overhead: float = 0.005
    summary_path: Path | None = None
    plot_path: Path | None = None
    verbose: bool = True
    rank: int = 0
    on_limit: str | Callable[[Any], Any] = "warn"
    limit_margin: int | float = 0.1
    checkpoint: Callable[[], Any] | None = None
    oom_snapshot: Path | None = None
    prometheus_port: int | None = None
    prometheus_host: str = "127.0.0.1"

    @classmethod
    def create(
        cls,
        remedies: str | Sequence[str] = "off",
        warmup: int = 20,
        window: int = 6,
        horizon: int = 100_000,
        memory_limit: int | float | str | None = None,
        alpha: float = 0.01,
        investigate_steps: int | None = None,
        verify_windows: int = 8,
        overhead: float = 0.005,
        summary_path: str | os.PathLike[str] | None = None,
        plot_path: str | os.PathLike[str] | None = None,
        verbose: bool = True,
        rank: int = 0,
        on_limit: str | Callable[[Any], Any] = "warn",
        limit_margin: int | float = 0.1,
        checkpoint: Callable[[], Any] | None = None,
        oom_snapshot: str | os.PathLike[str] | None = None,
        prometheus_port: int | None = None,
        prometheus_host: str | None = None,
    ) -> "Settings":
        window = _int("window", window, minimum=1)
        return cls(
            remedies=remedy_registry.resolve(remedies),
            warmup=_int("warmup", warmup, minimum=0),
            window=window,
            horizon=_int("horizon", horizon, minimum=1),
            memory_limit=parse_bytes(memory_limit) if memory_limit is not None else None,
            alpha=_probability("alpha", alpha),
            investigate_steps=_int("investigate_steps", max(8, window) if investigate_steps is None else investigate_steps,
                                   minimum=2),
            verify_windows=_int("verify_windows", verify_windows, minimum=3),
            overhead=_fraction("overhead", overhead),
            summary_path=_writable("summary_path", summary_path),
            plot_path=_writable("plot_path", plot_path),
            verbose=_bool("verbose", verbose),
            rank=_int("rank", rank, minimum=0),
            on_limit=_on_limit(on_limit),
            limit_margin=_margin(limit_margin),
            checkpoint=_callable_or_none("checkpoint", checkpoint),
            oom_snapshot=_writable("oom_snapshot", oom_snapshot),
            prometheus_port=_port(prometheus_port, prometheus_host),
            prometheus_host=_host(prometheus_host),
        )


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")
    return value


def _port(port: Any, host: Any) -> int | None:
    """A TCP port for the Prometheus exporter (0: any free port), or None for no exporter."""
    if port is None:
        if host is not None:
            raise ValueError(f"prometheus_host={host!r} needs prometheus_port= (e.g. 9464)")
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"prometheus_port={port!r}: expected an int from 0 (any free port) to 65535, e.g. 9464")
    return port


def _host(host: Any) -> str:
    """The address the exporter binds: loopback unless the user names another one."""
    if host is None:
        return "127.0.0.1"
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
        raise ValueError(f"prometheus_host={host!r}: expected an address such as '127.0.0.1' or '0.0.0.0'")
    return host


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected True or False")
    return value


def _probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 0.5:
        raise ValueError(f"{name}={value!r}: expected a number between 0 and 0.5, e.g. 0.01")
    return float(value)


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name}={value!r}: expected a fraction of step time in (0, 1], e.g. 0.005")
    return float(value)


def _on_limit(value: Any) -> str | Callable[[Any], Any]:
    if value in ("warn", "stop") or (callable(value) and not isinstance(value, str)):
        return value
    raise ValueError(f"on_limit={value!r}: expected 'warn', 'stop', or a callable that receives the summary so far")


def _margin(value: Any) -> int | float:
    """Steps (an int >= 0) or a fraction of the steps run so far (a float in (0, 1))."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and 0 < value < 1:
        return value
    raise ValueError(f"limit_margin={value!r}: expected steps (an int >= 0, e.g. 200) or a fraction of the steps "
                     f"run so far (a float in (0, 1), e.g. 0.1)")


def _callable_or_none(name: str, value: Any) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    raise ValueError(f"{name}={value!r}: expected a callable (called with no arguments) or None")


def parse_bytes(value: int | float | str) -> float:
    """A memory size: bytes as a number, or a string such as '8GiB', '512 MB', '2g'."""
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
