"""The options' types, generated from leakdoctor.settings.OPTIONS by `python -m leakdoctor.settings`: do
not edit (tests/test_options.py checks that this file is what OPTIONS makes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict

__all__ = ["DoctorOptions", "SettingsFields"]


class DoctorOptions(TypedDict, total=False):
    """The options as keyword arguments (`**options: Unpack[DoctorOptions]`), for IDEs and type checkers."""

    remedies: str | Sequence[str]
    summary_path: str | os.PathLike[str] | None
    plot_path: str | os.PathLike[str] | None
    html_path: str | os.PathLike[str] | None
    warmup: int
    window: int
    horizon: int
    memory_limit: int | float | str | None
    alpha: float
    investigate_steps: int | None
    verify_windows: int
    overhead: float
    sampler: str
    verbose: bool
    rank: int
    on_limit: str | Callable[[Any], Any]
    limit_margin: int | float
    checkpoint: Callable[[], Any] | None
    oom_snapshot: str | os.PathLike[str] | None
    heartbeat: float | None
    oom_watermark: float | None
    prometheus_port: int | None
    prometheus_host: str | None
    prometheus_linger: float
    prometheus_pushgateway: str | None
    trackers: str | Any | Sequence[Any] | None


@dataclass(frozen=True)
class SettingsFields:
    """The fields of `leakdoctor.settings.Settings`: each option's value once checked."""

    remedies: tuple[str, ...]
    summary_path: Path | None
    plot_path: Path | None
    html_path: Path | None
    warmup: int
    window: int
    horizon: int
    memory_limit: float | None
    alpha: float
    investigate_steps: int
    verify_windows: int
    overhead: float
    sampler: str
    verbose: bool
    rank: int
    on_limit: str | Callable[[Any], Any]
    limit_margin: int | float
    checkpoint: Callable[[], Any] | None
    oom_snapshot: Path | None
    heartbeat: float | None
    oom_watermark: float | None
    prometheus_port: int | None
    prometheus_host: str
    prometheus_linger: float
    prometheus_pushgateway: str | None
    trackers: tuple[Any, ...]
