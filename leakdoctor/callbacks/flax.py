"""The older name of the JAX loop doctor's module: `leakdoctor.callbacks.flax` gives the same class as
`leakdoctor.callbacks.jax`, which serves every JAX loop (Flax TrainState and NNX, bare Optax, Equinox)."""

from __future__ import annotations

from leakdoctor.callbacks.jax import LeakDoctor

__all__ = ["LeakDoctor"]
