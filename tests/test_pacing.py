"""The pacer on made-up costs (pure arithmetic, no clock): the budget holds over a whole run, also when a
sample costs more the further apart samples are (cold caches), and a rare accident does not widen the
interval for long."""

from __future__ import annotations

from leakdoctor._reading.pacing import Pacer

STEP = 1e-3
BUDGET = 0.005


def run(pacer: Pacer, runs: int, cost_of) -> tuple[float, float]:
    """`runs` runs, each costing cost_of(run, interval) and covering `interval` steps; the time spent and
    the steps covered."""
    spent = steps = 0.0
    for i in range(runs):
        every = pacer.every
        cost = cost_of(i, every)
        spent += cost
        steps += every
        pacer.update(cost, STEP)
    return spent, steps


def test_the_budget_holds_over_the_run_when_samples_cost_more_the_further_apart_they_are():
    pacer = Pacer(BUDGET)
    spent, steps = run(pacer, 600, lambda i, every: 20e-6 + min(every, 40) * 3e-6)
    assert spent / (steps * STEP) <= 1.02 * BUDGET  # what the first, cheap-looking runs overspent is paid back
    assert pacer.every <= 2 * (20e-6 + 40 * 3e-6) / (BUDGET * STEP)  # and not by much more than needed


def test_the_usual_dear_run_is_paid_for_and_a_rare_accident_is_not():
    pacer = Pacer(BUDGET)
    # every eighth run closes a window (4x dearer); run 300 is an accident (a context switch: 200x)
    spent, steps = run(pacer, 600, lambda i, every: 200 * 25e-6 if i == 300 else 25e-6 * (4 if i % 8 == 0 else 1))
    assert spent / (steps * STEP) <= 1.02 * BUDGET
    mean = 25e-6 * (7 + 4) / 8
    assert pacer.every <= 2 * mean / (BUDGET * STEP)  # the accident was paid back, and then forgotten


def test_a_cheap_run_is_sampled_every_step():
    pacer = Pacer(BUDGET)
    run(pacer, 100, lambda i, every: 1e-6)
    assert pacer.every == 1


def test_a_one_time_cost_is_paid_back_without_blinding_the_doctor():
    """A first read that registers a watched object costs 15 ms, 600 samples' worth: the interval
    stretches to at most twice what the cost needs while it is paid back, and the budget holds by the
    run's end."""
    pacer = Pacer(BUDGET)
    intervals = []

    def cost_of(i: int, every: int) -> float:
        intervals.append(every)
        return 15e-3 if i == 3 else 25e-6

    spent, steps = run(pacer, 2000, cost_of)
    assert max(intervals) <= 2 * 25e-6 / (BUDGET * STEP) + 1  # + 1: the interval is a whole number of steps
    assert spent / (steps * STEP) <= 1.02 * BUDGET
