"""The container rule on evidence built by hand around a real watched object: a list of arrays that made
resident memory suspect before its own length was is named by its attribute, once, as when its length
is suspect first; a loss history next to a resident growth is not blamed for it."""

from __future__ import annotations

import numpy as np
from helpers import has, says

from leakdoctor.integrations import MetricSpec
from leakdoctor.integrations._python import Watchlist, container_rule
from leakdoctor._base.trend import Trend
from leakdoctor._base.evidence import Evidence, Ladder
from leakdoctor._base.guard import Guard

MIB = 2**20
STEPS = 8


class Trainer:
    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []
        self.losses: list[float] = []


def rss_first(trainer: Trainer, kept: int, losses: int) -> tuple[Watchlist, Evidence]:
    """A window of 8 steps opened on resident memory alone (+1 MiB a step); the trainer's lists gained
    `kept` arrays of 1 MiB and `losses` floats between the ladders."""
    watchlist = Watchlist(Guard())
    watchlist.add_object(trainer, "trainer", include_private=False)
    start = dict(watchlist.read())
    trainer.kept += [np.ones(MIB // 8) for _ in range(kept)]
    trainer.losses += [0.5] * losses
    end = dict(watchlist.read())
    specs = {"rss_bytes": MetricSpec("rss_bytes", "bytes", source="process"),
             **{m: watchlist.spec(m) for m in start}}
    rss = Trend("growing", slope=MIB)
    begin = Ladder([("before", {"rss_bytes": 500.0 * MIB, **start})], step=40)
    finish = Ladder([("before", {"rss_bytes": 508.0 * MIB, **end})], step=40 + STEPS)
    evidence = Evidence(start_step=40, end_step=40 + STEPS, suspects={"rss_bytes": rss}, trends={"rss_bytes": rss},
                        specs=specs, begin=begin, end=finish, reports={})
    return watchlist, evidence


def test_a_list_of_arrays_that_made_resident_memory_suspect_is_named_by_its_attribute():
    trainer = Trainer()  # the watchlist holds it weakly
    watchlist, evidence = rss_first(trainer, kept=STEPS, losses=STEPS)
    (found,) = container_rule(watchlist).fn(evidence, [])
    assert (found.cause, found.metric) == ("container_growth", "len(trainer.kept)")
    assert found.where.startswith("Trainer.kept (")
    assert set(found.explains) == {"len(trainer.kept)", "rss_bytes"}
    assert has(found.evidence["params"]["growth"], "grew", metric="len(trainer.kept)", growth=8, steps=8, rate=1), \
        found.evidence  # what it says first: the growth
    assert says(found.evidence, "new_items", size="8.0 MiB"), found.evidence
    assert found.rate_per_step == 1.0


def test_a_loss_history_does_not_take_a_resident_growth_it_cannot_hold():
    trainer = Trainer()
    watchlist, evidence = rss_first(trainer, kept=0, losses=STEPS)
    assert container_rule(watchlist).fn(evidence, []) == []


def slower_steps(items: list, low: float = 0.4) -> list:
    """The container rule's findings for a watched list that gained `items` in a window of 8 steps and
    was the suspect, while the step's CPU time rose from 5 ms by half over 200 steps, by `low` of itself
    at the low end of the slope's confidence interval."""
    trainer = Trainer()
    watchlist = Watchlist(Guard())
    watchlist.add_object(trainer, "trainer", include_private=False)
    start = dict(watchlist.read())
    trainer.losses += items
    end = dict(watchlist.read())
    metric = "len(trainer.losses)"
    specs = {"rss_bytes": MetricSpec("rss_bytes", "bytes", source="process"),
             "step_cpu_seconds": MetricSpec("step_cpu_seconds", "seconds", source="process"),
             **{m: watchlist.spec(m) for m in start}}
    count = Trend("growing", slope=1.0)
    cpu = Trend("growing", slope=2.5e-3 / 200, slope_low=low * 5e-3 / 200, first=5e-3, span=200)
    begin = Ladder([("before", {"rss_bytes": 500.0 * MIB, **start})], step=40)
    finish = Ladder([("before", {"rss_bytes": 500.0 * MIB, **end})], step=40 + STEPS)
    evidence = Evidence(start_step=40, end_step=40 + STEPS, suspects={metric: count},
                        trends={metric: count, "step_cpu_seconds": cpu}, specs=specs, begin=begin, end=finish,
                        reports={})
    return container_rule(watchlist).fn(evidence, [])


def test_a_history_of_floats_is_no_leak_however_the_step_slowed_but_a_walked_list_is():
    """A step that got slower while a loss history grew was slowed by something else (a busy machine):
    walking one float more a step cannot cost that. A list of lists that grows as the step slows is the
    Burn case, found by the step time although its items hold little."""
    assert slower_steps([0.5] * STEPS) == []
    (found,) = slower_steps([[0.5] for _ in range(STEPS)])
    assert found.cause == "container_growth" and says(found.evidence, "cpu_rising"), found.evidence


def test_a_step_whose_slowing_is_a_fifth_only_at_the_slope_estimate_does_not_make_a_list_a_leak():
    """A neighbour's load that changed once: the slope's estimate says the step got half slower, its
    confidence interval reaches down to a twentieth; the list's items hold nothing, so no finding."""
    assert slower_steps([[0.5] for _ in range(STEPS)], low=0.05) == []
