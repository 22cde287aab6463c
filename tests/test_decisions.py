"""The detector's and the clinic's decisions on synthetic series, at exact steps (as Lightning tests its
early stopping on a scripted metric): when a growth is first suspected and investigated, and what never
is. At the default settings: 20 steps of warm-up, windows of 6 steps, a suspicion once the last 6 window
minima grow (the shortest scale), an investigation of 8 steps, and a growth that no rule names watched
again after a cool-down that doubles each time (36, 72, 144 steps). The framework tests check only what
needs a framework: the cause, the line, the remedy."""

from __future__ import annotations

from typing import Callable

import pytest
from test_clinic import MIB, clinic_reading, feed

KIB = 2**10


def noise(step: int) -> float:
    """Up to 48 KiB of page-sized noise, the same on every run."""
    return (step * 7919 % 13) * 4096


def decisions(reading: Callable[[int], float], steps: int = 400) -> tuple[int | None, int]:
    """The step at which the first investigation opened (None: never), and how many opened, for a series
    read every step. The forensic budget is lifted so that the decisions depend on the readings alone,
    not on how long this machine took to make them."""
    clinic, now = clinic_reading(readings := lambda step: {"a": reading(step)})
    clinic.forensic_budget = 1.0
    opened: list[int] = []

    def note(step: int) -> None:
        if clinic.investigation is not None and not opened:
            opened.append(step)

    feed(clinic, now, readings, steps, each_step=note)
    return (opened[0] if opened else None), clinic.investigations


@pytest.mark.parametrize("reading", [
    lambda step: 300 * MIB + MIB * max(0, step - 20),
    lambda step: 300 * MIB + MIB * max(0, step - 20) + noise(step),
    lambda step: 300 * MIB + 64 * KIB * max(0, step - 20) + 8 * noise(step),  # slow, under 384 KiB of noise
], ids=["fast", "fast-noisy", "slow-noisy"])
def test_a_leak_from_the_end_of_warm_up_is_suspected_when_its_sixth_window_closes(reading):
    # windows of 6 steps from step 21; the sixth closes at the first reading past it, step 57; nothing
    # names the growth (no rules here), so it is looked at again after each cool-down: 4 times in 400 steps
    assert decisions(reading) == (57, 4)


def test_a_leak_that_starts_late_is_suspected_within_six_windows_of_its_start():
    # from step 151, in the window of steps 147-152: it and the five after it close at step 183
    first, _ = decisions(lambda step: 300 * MIB + MIB * max(0, step - 150))
    assert first == 183


def test_a_cache_that_fills_and_stops_is_investigated_once():
    assert decisions(lambda step: 300 * MIB + MIB * min(max(0, step - 20), 40)) == (57, 1)


@pytest.mark.parametrize("reading", [
    lambda step: 300 * MIB + noise(step),
    lambda step: 300 * MIB + 64 * MIB * (step % 50 == 25),  # a 64 MiB spike every 50 steps
    lambda step: 300 * MIB + MIB * min(step, 20),  # growth during warm-up only
], ids=["flat-noise", "spikes", "warm-up"])
def test_noise_spikes_and_warm_up_raise_no_suspicion(reading):
    assert decisions(reading) == (None, 0)
