"""The ranks' stop agreement (stopping.SharedLimitWatch) between two watches in two threads, agreeing through
an in-process collective (the element-wise maximum, as all_reduce MAX gives it): the schedule every rank
computes alike, and that a rank's projected leak shortens it whatever the other ranks propose. The real
collectives run in test_distributed_stop.py, test_jax_distributed.py and test_ray.py."""

from __future__ import annotations

import threading

import pytest

from leakdoctor._base.guard import Guard, LeakDoctorWarning
from leakdoctor._lifecycle.stopping import FARTHEST, SharedLimitWatch
from leakdoctor.settings import Settings

EVERY = 6


class TwoRanks:
    """An all_reduce MAX between two threads: each rank's values in, their element-wise maximum out."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2)
        self.values: list[list[int]] = [[], []]

    def agree_for(self, rank: int):
        def agree(values: list[int]) -> list[int]:
            self.values[rank] = values
            self.barrier.wait()
            out = [max(a, b) for a, b in zip(*self.values)]
            self.barrier.wait()
            return out

        return agree


def watches() -> list[SharedLimitWatch]:
    collective = TwoRanks()
    settings = Settings.create(on_limit="stop", window=EVERY)
    return [SharedLimitWatch(settings, Guard(), lambda metric: None, lambda text: None,
                             agree=collective.agree_for(rank), every=EVERY, rank=rank, checkpoint_here=rank == 0)
            for rank in (0, 1)]


def settle_both(ranks: list[SharedLimitWatch], step: int, step_seconds: float) -> None:
    threads = [threading.Thread(target=w.settle, args=(step, step_seconds)) for w in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)


def test_a_threatened_rank_brings_the_next_agreement_close_whatever_the_others_propose():
    ranks = watches()
    settle_both(ranks, EVERY, 1e-9)  # no cost known yet: the shortest
    assert [w.every for w in ranks] == [EVERY, EVERY]
    settle_both(ranks, 2 * EVERY, 1e-9)  # dear against nanosecond steps: the farthest
    assert [w.every for w in ranks] == [FARTHEST * EVERY] * 2
    ranks[1].threatened = True  # rank 1's leak is projected to reach its limit
    settle_both(ranks, 3 * EVERY, 1e-9)
    assert [w.every for w in ranks] == [EVERY, EVERY] and not any(w.should_stop for w in ranks)


def test_every_rank_stops_at_the_agreement_after_one_asked_and_knows_which():
    ranks = watches()
    settle_both(ranks, EVERY, 1e-3)
    ranks[1].asked = {"rank": 1, "step": EVERY + 2, "reason": "rss_bytes is projected to reach the limit"}
    with pytest.warns(LeakDoctorWarning):  # each rank says it stops, and why
        settle_both(ranks, 2 * EVERY, 1e-3)
    assert all(w.should_stop for w in ranks)
    assert [w.stopped["step"] for w in ranks] == [2 * EVERY] * 2
    assert [w.stopped_by["rank"] for w in ranks] == [1, 1]
    assert ranks[1].stopped_by == ranks[1].asked and ranks[0].stopped_by["step"] is None
