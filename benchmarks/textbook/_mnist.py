"""The textbook scripts' stand-in for MNIST (nothing can be downloaded here): `mnist(train, test)` gives
`train` and `test` images of 28x28 uint8 pixels and their int64 labels 0-9, as the MNIST loaders do. Each
image is a noisy copy of its class's random template, so that a model learns and its loss falls as on the
real data. No leakdoctor code: the scripts of this folder are plain training scripts."""

from __future__ import annotations

import numpy as np


def mnist(train: int, test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels), shapes (n, 28, 28) uint8 and (n,) int64."""
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 255, size=(10, 28, 28))
    labels = rng.integers(0, 10, size=train + test)
    images = (templates[labels] * 0.3 + rng.uniform(0, 178, size=(train + test, 28, 28))).astype(np.uint8)
    return images[:train], labels[:train].astype(np.int64), images[train:], labels[train:].astype(np.int64)
