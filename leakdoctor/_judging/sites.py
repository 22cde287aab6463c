"""The allocation sites the investigations saw grow, kept for the post-mortem of a run that runs out of memory
(_lifecycle/oom.py): the clinic merges each investigation's into those seen before."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SITES", "allocation_sites"]

#: Sites a post-mortem keeps.
SITES = 8


def allocation_sites(reports: Mapping[str, Any], seen: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The sites an investigation's forensics saw grow (tracemalloc's allocation lines, the tensor census's
    kept tensors), merged into those seen before: the latest look at a place wins; the user's lines
    first, then the largest."""
    new = []
    growth = reports.get("tracemalloc")
    for site in getattr(growth, "sites", [])[:SITES]:
        new.append({"location": site.location, "bytes": float(site.size), "count": site.count,
                    "user": bool(site.user), "seen_by": "tracemalloc", "step": step})
    census = reports.get("tensor_census")
    held = ", ".join(h.name for h in getattr(census, "holders", [])[:3]) or None
    for description, count, size, graph in getattr(census, "groups", [])[:SITES]:
        new.append({"location": held, "tensors": description, "bytes": float(size), "count": count,
                    "user": graph, "seen_by": "tensor_census", "step": step})
    merged = {(s["seen_by"], s["location"], s.get("tensors")): s for s in seen + new}
    return sorted(merged.values(), key=lambda s: (s["user"], s["bytes"]), reverse=True)[:SITES]
