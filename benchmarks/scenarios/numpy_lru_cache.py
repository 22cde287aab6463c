"""Benign: featurisation memoised with `functools.lru_cache(maxsize=96)` over a dataset of 400 samples
drawn at random: the cache fills over the first hundred or so steps (each entry 200 KB) and then stays
at its bound, evicting as it adds."""

from __future__ import annotations

import functools

import numpy as np
from _harness import Truth

from leakdoctor import LeakDoctor

TRUTH = Truth(
    leak=False, cause=None, framework="python/numpy", steps=300, start=0,
    what="an lru_cache(maxsize=96) of 200 KB features, filling then bounded", source="memoised featurisation",
)


@functools.lru_cache(maxsize=96)
def features(index: int) -> np.ndarray:
    return np.random.default_rng(index).standard_normal(25_000)


def run(h) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256))
    w = rng.standard_normal((256, 256)) * 0.05
    with h.doctor(LeakDoctor) as doctor:
        for _ in range(h.length):
            hidden = np.tanh(x @ w)
            w -= 1e-3 * (x.T @ (hidden * (1 - hidden ** 2))) / len(x)
            features(int(rng.integers(0, 400)))
            doctor.step()
            h.tick()
    info = features.cache_info()
    return {"cache": f"{info.currsize} entries, {info.hits} hits, {info.misses} misses"}
