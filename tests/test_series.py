"""Series storage: windows are spans of steps, the pyramid and the history stay bounded."""

from leakdoctor.integrations import MetricSpec
from leakdoctor._reading.series import Series


def test_windows_are_step_spans_whatever_the_sampling():
    every_step, every_third = Series(MetricSpec("m"), window=6, warmup=0), Series(MetricSpec("m"), window=6, warmup=0)
    for step in range(1, 121):
        every_step.add(step, float(step))
        if step % 3 == 0:
            every_third.add(step, float(step))
    assert len(every_step.levels[0]) == len(every_third.levels[0]) == 19  # 20 spans, the last still open
    assert [v for _, v in every_step.levels[0]][:3] == [1.0, 7.0, 13.0]
    assert [v for _, v in every_third.levels[0]][:3] == [3.0, 9.0, 15.0]


def test_a_window_whose_last_sample_is_in_closes_at_once():
    """Sampled every 16 steps (windows of 6), each sample's window closes on that sample, not a stride
    later; when the pace quickens inside a window closed early, its later samples stay out of it."""
    waiting, told = Series(MetricSpec("m"), window=6, warmup=0), Series(MetricSpec("m"), window=6, warmup=0)
    for step in range(1, 97, 16):
        assert (0 in waiting.add(step, float(step))) == (step > 1)
        assert 0 in told.add(step, float(step), next_step=step + 16)
        assert told.levels[0][-1] == (step, float(step))
    assert list(waiting.levels[0]) == list(told.levels[0])[:-1]  # the same minima, each a stride later
    assert 0 in told.add(97, 97.0, next_step=113)  # steps 97-102
    assert told.add(99, 0.0, next_step=101) == [] and told.levels[0][-1] == (97, 97.0)  # the pace quickened
    assert told.add(103, 5.0, next_step=105) == [] and told.add(105, 4.0, next_step=107) == []
    assert 0 in told.add(109, 9.0) and told.levels[0][-1] == (105, 4.0)  # whole windows again


def test_warmup_is_kept_out_of_detection_but_not_of_history():
    series = Series(MetricSpec("m"), window=4, warmup=10)
    for step in range(1, 31):
        series.add(step, float(step))
    assert series.start == 11.0 and series.end == 30.0 and series.peak == 30.0
    assert series.levels[0][0] == (11, 11.0)
    assert series.points[0] == (1, 1.0)


def test_memory_is_bounded_on_long_runs():
    series = Series(MetricSpec("m"), window=2, warmup=0, depth=48, history=256)
    for step in range(1, 200_001):
        series.add(step, float(step % 1000))
    assert all(len(level) <= 48 for level in series.levels)
    assert len(series.points) <= 256 and series.peak == 999.0
    assert series.minima(len(series.levels) - 2)[0].size > 0  # a slow trend can be tested far back
