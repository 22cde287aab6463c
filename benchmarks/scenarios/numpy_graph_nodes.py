"""A computation graph that gains a node on every step and is walked on every step (burn#2487): the
user's gauge `len(graph.nodes)` grows by one per step, each node holds 40 KB, and the walk makes every
step a little slower than the last."""

from __future__ import annotations

import numpy as np
from _harness import Truth, marker

from leakdoctor import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="container_growth", framework="python/numpy", steps=170, start=START,
    what="graph.nodes.append(...) every step, the graph walked every step", source="burn#2487",
    location=(marker(__file__, "GAUGE"), marker(__file__, "GROW")),
)


class Graph:
    def __init__(self) -> None:
        self.nodes: list[np.ndarray] = []

    def walk(self) -> float:
        return float(sum(node[0] for node in self.nodes))


def run(h) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256))
    w = rng.standard_normal((256, 256)) * 0.05
    graph = Graph()
    with h.doctor(LeakDoctor) as doctor:
        doctor.watch("graph_nodes", lambda: len(graph.nodes))  # GAUGE
        for step in range(h.length):
            hidden = np.tanh(x @ w)
            w -= 1e-3 * (x.T @ (hidden * (1 - hidden ** 2))) / len(x)
            if step >= START:
                graph.nodes.append(np.ones(5000))  # GROW
            graph.walk()
            doctor.step()
            h.tick()
