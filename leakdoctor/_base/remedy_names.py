"""The remedies' names and the `remedies=` levels: what the settings check a `remedies=` value against, on the
ground floor so that the settings need not import the remedies (leakdoctor/remedies/ loads each by name)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["SAFE", "INVASIVE", "NAMES", "LEVELS", "resolve"]

#: Semantics-preserving: applied with remedies="safe". A finding gets the first applicable remedy in
#: registry order (cap_cache before clear_cache: capping a cache costs less than clearing it); if that
#: does not work it is undone where possible and the next one is tried.
SAFE = ("force_eval", "cap_cache", "clear_cache", "gc_collect", "malloc_trim")
#: Change what the program does (drop hooks, detach tensors, swap an optimizer's control flow, reset
#: Keras global state): applied only with remedies="all" or by name.
INVASIVE = ("remove_hooks", "detach_retained", "cond_to_where", "clear_session")
NAMES = SAFE + INVASIVE
LEVELS = ("off", "safe", "all")


def resolve(spec: str | Sequence[str]) -> tuple[str, ...]:
    """The remedy names a `remedies=` value allows, in registry order. A value that is neither a level nor
    a list of remedy names is a ValueError naming both, with the nearest level or name to a misspelt one."""
    if isinstance(spec, str):
        if spec == "off":
            return ()
        if spec == "safe":
            return SAFE
        if spec == "all":
            return NAMES
        raise ValueError(f"remedies={spec!r}: expected one of {LEVELS} or a list of remedy names from {NAMES}"
                         + _nearest([spec]))
    if not isinstance(spec, (list, tuple, set, frozenset)):
        raise ValueError(f"remedies={spec!r}: expected one of {LEVELS} or a list of remedy names from {NAMES}")
    unknown = [name for name in spec if name not in NAMES]
    if unknown:
        raise ValueError(f"remedies: unknown remedy name(s) {unknown}: valid names are {NAMES}, or one of the "
                         f"levels {LEVELS} alone" + _nearest(unknown))
    return tuple(name for name in NAMES if name in spec)


def _nearest(names: Sequence[object]) -> str:
    """"; 'safee': did you mean 'safe'?" for each misspelt name close to a level or a remedy name."""
    import difflib

    hints = []
    for name in names:
        close = difflib.get_close_matches(name, LEVELS + NAMES, n=1, cutoff=0.6) if isinstance(name, str) else []
        if close:
            hints.append(f"{name!r}: did you mean {close[0]!r}?")
    return "; " + "; ".join(hints) if hints else ""
