"""The units a metric is read in, and how a value of each reads to a person (1.5 MiB, 12 ms)."""

from __future__ import annotations

__all__ = ["UNITS", "format_value"]

UNITS = ("bytes", "count", "seconds")


def format_value(value: float | None, unit: str) -> str:
    """Human units: 1.5 MiB, 12 ms, 0.35 µs, 3.0."""
    if value is None:
        return "-"
    if unit == "bytes":
        magnitude = abs(value)
        for suffix, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if magnitude >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "seconds":  # a slope of microseconds a step reads in µs, not as "0.00 ms"
        return f"{value * 1e6:.2f} µs" if 0 < abs(value) < 5e-6 else f"{value * 1e3:.2f} ms"
    return f"{value:g}" if abs(value) >= 0.01 or value == 0 else f"{value:.2e}"
