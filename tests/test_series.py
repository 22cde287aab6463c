"""Series storage: windows are spans of steps, the pyramid and the history stay bounded."""

from leakdoctor.integrations import MetricSpec
from leakdoctor.series import Series


def test_windows_are_step_spans_whatever_the_sampling():
    every_step, every_third = Series(MetricSpec("m"), window=6, warmup=0), Series(MetricSpec("m"), window=6, warmup=0)
    for step in range(1, 121):
        every_step.add(step, float(step))
        if step % 3 == 0:
            every_third.add(step, float(step))
    assert len(every_step.levels[0]) == len(every_third.levels[0]) == 19  # 20 spans, the last still open
    assert [v for _, v in every_step.levels[0]][:3] == [1.0, 7.0, 13.0]
    assert [v for _, v in every_third.levels[0]][:3] == [3.0, 9.0, 15.0]


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
