"""Drop-in entry points, one module per framework; each imports its framework only when imported.

torch.py (plain PyTorch loops), lightning.py (Lightning), keras.py (Keras 3), jax.py (JAX loops: Flax, Optax,
Equinox; flax.py is its older name), mlx.py (MLX), ray.py (Ray Train). Each is public, its names in __all__.
"""
