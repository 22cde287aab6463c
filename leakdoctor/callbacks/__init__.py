"""Drop-in entry points, one module per framework; each imports its framework only when imported."""
