"""The JAX loop doctor, for every JAX training loop: Flax (TrainState and NNX), bare Optax and Equinox.

    from leakdoctor.callbacks.jax import LeakDoctor

    with LeakDoctor(remedies="all", summary_path="leaks.json") as doctor:     # Flax TrainState
        for x, y in batches:
            state, loss = train_step(state, x, y)
            state = doctor.step(state)

Named after the framework it watches, as the integration is (leakdoctor/integrations/_jax.py).
`leakdoctor.callbacks.flax`, the older name, gives the same class: its code lives there until the
framework doctors are composed (the body moves here then, and flax.py becomes the alias).
"""

from __future__ import annotations

from leakdoctor.callbacks.flax import LeakDoctor

__all__ = ["LeakDoctor"]
