"""The plot's structure, read from the matplotlib figure rather than from the PNG: a panel per growing
series (or series a finding is on), every drawn line and band named in its panel's legend, a title with
the verdict and the steps (unwatched where the summary says so), and axes in human units without
offset notation."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import place

from leakdoctor import Finding, LeakDoctor, Summary
from leakdoctor.reporting.summary import RemedyOutcome, SeriesSummary

pytest.importorskip("matplotlib")
from leakdoctor.reporting._plot import figure, shown  # noqa: E402

MIB = 2**20


def series(unit: str, trend: str, values: list[float]) -> SeriesSummary:
    points = [(step * 10, value) for step, value in enumerate(values)]
    return SeriesSummary(unit, values[0], values[-1], max(values), 0.0, trend, points)


def remedied_summary() -> Summary:
    """A remedied leak on rss_bytes, a growing count, and two flat series."""
    remedy = RemedyOutcome("gc_collect", applied_step=64, effective=True, rate_after=0.0)
    finding = Finding("python_objects", "rss_bytes", first_step=22, detected_step=64, rate_per_step=1e6,
                      unit="bytes", location="train.py:42", evidence="grew", recommendation="fix", remedy=remedy)
    return Summary("python", 400, {
        "rss_bytes": series("bytes", "flat", [300 * MIB, 340 * MIB, 301 * MIB, 301 * MIB]),
        "graph_nodes": series("count", "growing", [1, 2, 3, 4, 5]),
        "mlx_active_bytes": series("bytes", "flat", [210.1765 * MIB + i * 1e-5 for i in range(20)]),
        "step_seconds": series("seconds", "flat", [0.005, 0.0051, 0.0049]),
    }, [finding], settings={"warmup": 20})


def legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    return [text.get_text() for text in legend.get_texts()] if legend else []


def drawn(ax) -> list:
    """The artists drawn in a panel: lines and bands (the grid lines are ticks, not artists)."""
    return list(ax.lines) + list(ax.patches)


def tick_labels(fig, ax) -> list[str]:
    fig.canvas.draw()
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text()]


def test_one_panel_per_growing_series_or_series_with_a_finding():
    summary = remedied_summary()
    fig = figure(summary)
    assert shown(summary) == ["rss_bytes", "graph_nodes"]
    assert [ax.get_title(loc="left").split(":")[0] for ax in fig.axes] == ["rss_bytes", "graph_nodes"]
    clean = Summary("python", 400, {"rss_bytes": series("bytes", "flat", [MIB, MIB]),
                                     "step_seconds": series("seconds", "flat", [0.1, 0.1])}, [],
                    settings={"warmup": 20})
    assert len(figure(clean).axes) == 1 and shown(clean) == ["rss_bytes"]  # nothing grows: resident memory
    clean.series["step_seconds"] = series("seconds", "growing", [0.1, 0.2])
    assert shown(clean) == ["rss_bytes", "step_seconds"]  # resident memory first, whatever else grows


def test_every_line_and_band_is_in_the_legend_and_nothing_hides_the_detection():
    fig = figure(remedied_summary())
    for ax in fig.axes:
        artists = drawn(ax)
        labels = legend_labels(ax)
        assert len(labels) == len(artists) and all(a.get_label() in labels for a in artists), (labels, artists)
    rss = fig.axes[0]
    labels = legend_labels(rss)
    assert any("warm-up" in label for label in labels)
    assert any("growth began (step 22)" in label for label in labels)
    detected = next(line for line in rss.lines if "detected (step 64)" in line.get_label())
    remedy = next(patch for patch in rss.patches if "gc_collect" in patch.get_label())
    assert detected.get_zorder() > remedy.get_zorder()  # the remedy starts at the same step: drawn under it


def test_the_title_has_the_verdict_and_the_steps_and_a_two_step_run_is_unwatched():
    assert "REMEDIED" in figure(remedied_summary()).get_suptitle()
    assert "400 steps" in figure(remedied_summary()).get_suptitle()
    doctor = LeakDoctor(verbose=False, overhead=1.0)
    doctor.step(), doctor.step()
    summary = doctor.finish()
    assert summary.verdict == "unwatched"
    text = figure(summary).get_suptitle()
    assert "UNWATCHED" in text and "2 steps" in text and "CLEAN" not in text


def test_axes_read_in_steps_and_human_units_without_offset():
    summary = remedied_summary()
    summary.findings.append(dataclasses.replace(summary.findings[0], metric="mlx_active_bytes"))
    summary.findings.append(dataclasses.replace(summary.findings[0], metric="step_seconds"))
    fig = figure(summary)
    panels = {ax.get_title(loc="left").split(":")[0]: ax for ax in fig.axes}
    rss, nodes, mlx, step = (panels[name] for name in ("rss_bytes", "graph_nodes", "mlx_active_bytes", "step_seconds"))
    assert all(label.endswith(" MiB") for label in tick_labels(fig, rss))
    assert all(label.endswith(" MiB") for label in tick_labels(fig, mlx))  # 210.1765 MiB, flat to 1e-5
    assert all(label.endswith(" ms") for label in tick_labels(fig, step))
    assert all(label.replace(",", "").isdigit() for label in tick_labels(fig, nodes))
    for ax in fig.axes:
        assert ax.yaxis.get_offset_text().get_text() == ""  # no "1e-5+2.101765e2"
    assert fig.axes[-1].get_xlabel() == "step"
    big = Summary("python", 10, {"rss_bytes": series("bytes", "growing", [3 * 2**30, 3.5 * 2**30])}, [])
    fig = figure(big)
    assert all(label.endswith(" GiB") for label in tick_labels(fig, fig.axes[0]))


def test_plot_summary_writes_a_png(tmp_path):
    path = tmp_path / "leaks.png"
    remedied_summary().plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- pictures that prove the verdict: each finding's proving series, from a real run -------------------

def hooks_and_outputs_kept(steps: int = 300) -> dict:
    """A torch loop that registers a forward hook every step and keeps each step's output, with its graph,
    in a list on the model."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
            self.history = []

        def forward(self, x):
            return self.body(x)

    def note(module, inputs, output) -> None:
        module.last = output.detach().norm()

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    with TorchDoctor(model=model, optimizer=optimizer, overhead=1.0, verbose=False) as doctor:
        for _ in range(steps):
            model.body[0].register_forward_hook(note)  # a hook per step
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.history.append(model(x))  # an output with its graph kept per step
            doctor.step()
    return doctor.summary.to_dict()


def test_each_finding_is_drawn_on_every_series_that_proved_it():
    from helpers import counts, isolated

    data = isolated(hooks_and_outputs_kept)
    summary = Summary.from_dict(data)
    found = {f["cause"]: f for f in data["findings"] if counts(f)}
    assert {"hook_accumulation", "retained_graph"} <= set(found), data["findings"]
    assert "torch_hooks" in found["hook_accumulation"]["series"]
    assert any(name.startswith("len(") for name in found["retained_graph"]["series"])
    fig = figure(summary)
    panels = {ax.get_title(loc="left").split(": ")[0]: ax for ax in fig.axes}
    for f in found.values():
        for name in f["series"]:
            assert name in panels, (name, list(panels))  # its own axis
            assert f"{f['cause']}: detected (step {f['detected_step']})" in legend_labels(panels[name]), \
                (name, legend_labels(panels[name]))
    assert any(len(f["series"]) > 1 for f in found.values())  # a finding proven on more than its metric


def test_the_stop_and_a_keras_runs_calls_are_marked_on_every_panel():
    summary = remedied_summary()
    summary = dataclasses.replace(summary, stopped={"step": 300, "reason": "projected", "checkpoint": None},
                                  calls=[{"call": 1, "kind": "fit", "first_step": 1, "last_step": 200},
                                         {"call": 2, "kind": "fit", "first_step": 201, "last_step": 400}])
    for ax in figure(summary).axes:
        labels = legend_labels(ax)
        assert "stopped before the memory limit (step 300)" in labels, labels
        assert "end of each fit/evaluate/predict call" in labels, labels


KEEP_LINE = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1) if text.rstrip().endswith("# KEEP"))


def outputs_kept_in_a_local_list(steps: int = 300) -> dict:
    """A torch loop keeping each step's (16, 10) output, with its graph, in a list of the loop: nothing
    watches the list, so no series holds what proves the retained graph but the census's nodes."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    outputs = []
    with TorchDoctor(model=model, optimizer=optimizer, overhead=1.0, verbose=False) as doctor:
        for _ in range(steps):
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            outputs.append(out)  # KEEP
            doctor.step()
    return doctor.summary.to_dict()


def test_outputs_kept_in_a_local_list_are_a_retained_graph_at_their_line():
    """Kept outputs whose activations backward() freed grow resident memory by a few hundred bytes a step:
    too slow to raise a suspicion, the graphs are still proven, at the line that keeps them (an
    investigation's census, or the last look at finish()), at least as a minor finding."""
    from helpers import isolated, kept

    data = isolated(outputs_kept_in_a_local_list)
    found = [f for f in kept(data) if f["cause"] == "retained_graph"]
    assert found and f"tests/test_plot.py:{KEEP_LINE})" in place(found[0]), data["findings"]
    assert data["verdict"] in ("clean", "leak") and found[0]["severity"] in ("major", "minor")


def test_a_retained_graph_proven_by_autograd_nodes_gets_a_panel_of_those_nodes():
    """A finding whose proof no series holds (the autograd nodes an investigation's census counted at its
    two ends) gets its own panel, with the finding's marks; resident memory's panel shows nothing more."""
    proof = [{"name": "autograd nodes", "unit": "count", "points": [(40, 1200), (48, 1296)]}]
    found = Finding("retained_graph", "rss_bytes", first_step=21, detected_step=48, rate_per_step=600.0,
                    unit="bytes", location="train.py:12", evidence="", recommendation="", proof=proof)
    summary = Summary("torch", 300, {"rss_bytes": series("bytes", "flat", [300 * MIB] * 30)}, [found],
                      settings={"warmup": 20})
    data = Summary.from_dict(summary.to_dict())
    fig = figure(data)
    panels = {ax.get_title(loc="left"): ax for ax in fig.axes}
    ax = panels["autograd nodes: proves retained_graph"]
    assert "retained_graph: detected (step 48)" in legend_labels(ax), legend_labels(ax)
    assert list(ax.lines[0].get_xdata()) == [40, 48]
    assert list(ax.lines[0].get_ydata()) == [1200, 1296]
