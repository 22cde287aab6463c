"""The clinic's scheduling of investigations, on series fed by hand (no framework, no training loop):
a metric that becomes suspect while an investigation is open joins it, and once investigations have
used their budget, a suspect waits if it was investigated before or while a leak found so far still
grows, but not the first suspicion of another metric after a growth that stopped (a warm-up); and a
remedy is judged on what follows an investigation whose cleanup ladder emptied what it is judged on, and
is not undone for one jump among the few readings that judge it."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from helpers import says

from leakdoctor.integrations import Cleanup, MetricSpec
from leakdoctor._judging.clinic import Clinic, Practice, Treatment
from leakdoctor._base.trend import Trend
from leakdoctor._base.evidence import Rule
from leakdoctor._base.guard import Guard
from leakdoctor._reading.monitor import Monitor
from leakdoctor.remedies._base import Remedy, RemedyContext
from leakdoctor.reporting.summary import Finding, RemedyOutcome
from leakdoctor.settings import Settings

MIB = 2**20
SPECS = {name: MetricSpec(name, "bytes") for name in ("a", "b")}
GROWING = Trend("growing", slope=MIB)
Readings = Callable[[int], dict[str, float]]


def clinic_reading(readings: Readings, cleanups: Sequence[Cleanup] = ()) -> tuple[Clinic, list[int]]:
    """A clinic at the default settings (warm-up 20, windows of 6 steps) whose probes read
    `readings(step)` at the step held in the list returned beside it."""
    settings = Settings.create(verbose=False)
    now = [0]
    practice = Practice(forensics=[], cleanups=list(cleanups), rules=[], targets={}, read=lambda: readings(now[0]))
    return Clinic(settings, Monitor(settings), practice, Guard(), lambda message: None), now


def feed(clinic: Clinic, now: list[int], readings: Readings, steps: int, treat: bool = True,
         each_step: Callable[[int], None] = lambda step: None) -> Clinic:
    """Steps 1 to `steps`: `readings(step)` recorded, each sample handed on to the clinic as the doctor
    does (unless not `treat`), then `each_step(step)`."""
    for step in range(1, steps + 1):
        now[0] = step
        completed = clinic.monitor.record(step, readings(step), SPECS.__getitem__)
        if treat:
            clinic.after_sample(step, completed, {}, 0.001, 1.0)
        each_step(step)
    return clinic


def fed(readings: Readings, steps: int, treat: bool = True) -> Clinic:
    """A clinic whose series got `readings(step)` on steps 1 to `steps` (see feed)."""
    return feed(*clinic_reading(readings), readings, steps, treat)


def treating(remedy: Remedy, readings: Readings, cleanups: Sequence[Cleanup] = ()) -> tuple[Clinic, list[int]]:
    """A clinic (see clinic_reading) with one finding, a cache on a since step 21, that `remedy` treats
    from step 40: its verdict is the clinic's to give."""
    clinic, now = clinic_reading(readings, cleanups)
    finding = Finding("allocator_cache", "a", 21, 40, MIB, "bytes", None, "grew", "cap it", benign=True,
                      remedy=RemedyOutcome(remedy.name, 40))
    clinic.findings.append(finding)
    clinic.treatments.append(Treatment(remedy, finding, since=40))
    clinic.monitor.busy(["a"])
    return clinic, now


def over_budget(clinic: Clinic, investigated: str, suspect: str) -> bool:
    """Would `suspect` wait, after one investigation of `investigated` that took the whole budget?"""
    clinic.investigations, clinic.forensic_seconds = 1, 1.0
    clinic._investigated[investigated] = clinic.monitor.series[investigated].peak
    return clinic._over_budget({suspect: GROWING}, run_seconds=1.0)


def test_a_metric_suspect_a_sample_later_joins_the_open_investigation():
    """a and b grow together, but b is read every sixth step only (a dearer probe): its windows close
    a few samples after a's, when a's investigation is open already."""
    def readings(step: int) -> dict[str, float]:
        return {"a": 100 * MIB + step * MIB, **({"b": 50 * MIB + step * MIB} if step % 6 == 0 else {})}

    clinic = fed(readings, steps=62)  # a is suspect at step 57, b at step 60; the window ends at 65
    assert clinic.investigations == 1
    assert clinic.investigation is not None and set(clinic.investigation.suspects) == {"a", "b"}


def test_the_budget_holds_back_a_metric_investigated_before():
    clinic = fed(lambda step: {"a": 100 * MIB}, steps=60, treat=False)
    assert over_budget(clinic, "a", "a")
    assert not clinic._over_budget({"a": GROWING}, run_seconds=100.0)  # 5% of a longer run pays for it


def test_the_budget_lets_a_metric_through_again_once_it_grows_past_what_its_investigation_saw():
    """a jumps 40 MiB at step 50 (an allocator's cache, say, that its investigation sees malloc_trim take
    back) and then grows 256 KiB a step: with investigations over their budget from the first one on,
    a is investigated again once it has grown past its peak at the first investigation, and not while it
    stays at that peak (a Keras fit that kept the weights of every batch
    went unnamed for 600 batches: its first investigation took 2 s of an 8 s run)."""
    def investigations(leak_until: int) -> int:
        clinic, now = clinic_reading(readings := lambda step: {
            "a": 100 * MIB + 40 * MIB * (step >= 50) + min(step, leak_until) * MIB / 4})
        clinic.forensic_budget = 0.0  # every investigation is over the budget
        return feed(clinic, now, readings, steps=600).investigations

    assert investigations(leak_until=60) == 1
    assert investigations(leak_until=600) >= 2


def test_the_budget_lets_through_again_a_steady_growth_that_its_investigation_missed_below_its_peak():
    """a holds a 60 MiB cache that its investigation's cleanup takes back; 10 MiB of it refill within a
    window, and a leak of 64 KiB a step goes on in steps (1.5 MiB every 24), which would pass the old peak
    only after 800 steps: with investigations over their budget, a is looked at again once its minima
    since the look grow steadily, though a flat stretch between two steps ends each run of suspicions (a
    Keras fit's weights kept after every batch went unnamed in 1 run of 8 when the cooling after each
    dismissed triage broke such runs). A refill alone gets no second look."""
    def investigations(leak: bool) -> int:
        trimmed_at: list[int] = []

        def readings(step: int) -> dict[str, float]:
            cache = 60 * MIB if not trimmed_at else min(step - trimmed_at[0], 6) * 10 * MIB / 6
            grown = step if leak or not trimmed_at else trimmed_at[0]  # without the leak, it stops at the look
            return {"a": 100 * MIB + cache + grown // 24 * 3 * MIB / 2}  # in steps: 1.5 MiB every 24

        clinic, now = clinic_reading(readings, [Cleanup("trim", lambda: trimmed_at[:1] or trimmed_at.append(now[0]))])
        clinic.forensic_budget = 0.0  # every investigation is over the budget
        return feed(clinic, now, readings, steps=400).investigations

    assert investigations(leak=False) == 1
    assert investigations(leak=True) >= 2


def test_the_budget_lets_a_new_metric_through_after_a_growth_that_stopped():
    """a grew through the first windows and stopped (its finding is no leak any more): b's first
    suspicion is investigated at once, as it would have been had a not come first."""
    clinic = fed(lambda step: {"a": 100 * MIB + min(step, 60) * MIB, "b": 100 * MIB}, steps=300, treat=False)
    clinic.findings.append(Finding("native_memory", "a", 30, 60, MIB, "bytes", None, "grew", "look"))
    assert not over_budget(clinic, "a", "b")


def test_the_budget_holds_back_a_new_metric_while_a_leak_found_still_grows():
    """a still grows: what b sees is most likely the same leak, and b waits for the budget; a benign
    finding (an allocator's cache) holds nothing back."""
    clinic = fed(lambda step: {"a": 100 * MIB + step * MIB, "b": 100 * MIB}, steps=300, treat=False)
    clinic.findings.append(Finding("native_memory", "a", 30, 60, MIB, "bytes", None, "grew", "look"))
    assert over_budget(clinic, "a", "b")
    clinic.findings[0].benign = True
    assert not over_budget(clinic, "a", "b")


class LooseCap(Remedy):
    """A remedy that changes nothing: the growth it treats goes on."""

    name = "loose_cap"
    treats = frozenset({"allocator_cache"})
    safe = True

    def apply(self, ctx: RemedyContext) -> str:
        return ""


def test_a_remedy_is_judged_on_what_follows_an_investigation_whose_ladder_emptied_its_metric():
    """a is a cache that grows a MiB a step until a cleanup empties it; a remedy that does not stop it is
    applied at step 40. b then grows and is investigated, and the investigation's ladder empties a's cache
    three times: read from step 40, a's level falls, and the remedy would look as if it worked. Judged on
    what follows the investigation, it did not, and is noted so; then a is investigated itself."""
    emptied = [0]

    def readings(step: int) -> dict[str, float]:
        return {"a": 100 * MIB + (step - emptied[0]) * MIB, "b": 100 * MIB + max(0, step - 40) * 2 * MIB}

    empty = Cleanup("clear_cache", run=lambda: emptied.__setitem__(0, now[0]))
    clinic, now = treating(LooseCap(), readings, [empty])
    finding = feed(clinic, now, readings, 300).findings[0]
    assert clinic.investigations >= 1 and emptied[0] > 40  # b was investigated, and the ladder emptied a
    assert finding.remedy.effective is False, finding.remedy
    assert says(clinic.notes, "did_not_stop", remedy="loose_cap", cause="allocator_cache", metric="a"), clinic.notes
    # No remedy is left, and what goes on growing may not be the cache it was taken for: a is looked at
    # again (after a cool-down), not left unwatched for the rest of the run.
    assert "a" in clinic._investigated, clinic.notes


class TightCap(LooseCap):
    """A remedy that stops the growth it treats."""

    name = "tight_cap"


def test_a_remedy_is_not_undone_for_one_jump_among_the_readings_that_judge_it():
    """a grows a MiB a step until a remedy stops it at step 40; 24 steps later one allocation that stays
    lifts a by 24 MiB. On the 8 windows that judge the remedy, half before the jump and half after, the
    slope's estimate is over a quarter of the rate before, its interval reaching down to zero: the
    verdict waits for more windows, and the flat ones that follow say the remedy worked."""
    def readings(step: int) -> dict[str, float]:
        return {"a": 100 * MIB + min(step, 40) * MIB + (24 * MIB if step > 64 else 0), "b": 100 * MIB}

    clinic, now = treating(TightCap(), readings)
    finding, judged = clinic.findings[0], {}
    feed(clinic, now, readings, 160, each_step=lambda step: judged.setdefault(finding.remedy.effective, step))
    assert finding.remedy.effective is True and judged[True] > 40 + 8 * 6, (finding.remedy, judged)
    assert not says(clinic.notes, "did_not_stop"), clinic.notes
    assert finding.remedy.rate_after <= 0.25 * MIB, finding.remedy
    # What the first 8 windows alone say: an estimate over the line, an interval reaching under it.
    trend = fed(readings, 40 + 8 * 6, treat=False).monitor.trend_since("a", 40)
    assert trend.slope > 0.25 * MIB >= trend.slope_low, trend


def test_a_finding_found_again_while_its_remedy_is_judged_waits_for_that_verdict():
    """test_mlx's capped buffer cache, 1 run in 40 under two hogs: cap_cache was applied to MLX's cache at
    step 63, and an investigation of resident memory, opened while cap_cache was being judged, found the
    same cache again, now explaining resident memory too. The clinic treated it anew: clear_cache took
    the finding's remedy, and cap_cache's outcome was lost while it still acted. Found again, the finding
    waits for its remedy's verdict, and explains what the new investigation saw."""
    def readings(step: int) -> dict[str, float]:
        return {"a": 100 * MIB + min(step, 40) * MIB, "b": 100 * MIB + min(step, 50) * MIB}

    empty = Cleanup("clear_cache", run=lambda: None)
    clinic, now = treating(TightCap(), readings, [empty])
    clinic.findings[0].reclaimed_by = "clear_cache"
    again = Finding("allocator_cache", "a", 21, 60, MIB, "bytes", None, "grew", "cap it", benign=True,
                    reclaimed_by="clear_cache", explains=("a", "b"))
    clinic.practice.rules = [Rule(10, lambda evidence, accepted: [dataclasses.replace(again)])]
    clinic.settings = dataclasses.replace(clinic.settings, remedies=("clear_cache",))
    feed(clinic, now, readings, 60, treat=False)  # the series; tight_cap not judged yet
    clinic._step = now[0] = 52
    clinic._investigate({"b": GROWING})
    clinic._step = now[0] = 60
    clinic._conclude()
    (finding,) = clinic.findings
    assert finding.remedy.name == "tight_cap" and [t.remedy.name for t in clinic.treatments] == ["tight_cap"]
    assert set(finding.explains) == {"a", "b"}
