"""low_precision_init against the usual stacked init (equinox#673): peak resident memory of building a
stack of Equinox layers with filter_vmap in float32 then casting to float16, against building it layer
by layer into a preallocated float16 buffer; and the preflight estimate (estimate_init_bytes) against
both peaks. Each way runs in its own fresh process, several times.

The peak is the resident high-water mark (VmHWM, reset through /proc/self/clear_refs right before the
init) minus the resident size just before it. "First run" is the init in a process that never ran it
(it includes compiling the init's pieces); "second run" repeats it in the same process after freeing
the first stack, so only the arrays count: that is what the preflight estimates.

Run: .venv/bin/python benchmarks/run.py low_precision_init
"""

from __future__ import annotations

import ctypes
import gc
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, table, write_section  # noqa: E402

LAYERS = 24
WIDTHS = (1024,)
PROCESSES = 3
WAYS = ("naive", "layerwise")


def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field))


def _peak_of(build) -> int:
    """Peak resident bytes above the current resident size while `build()` runs."""
    import jax

    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # the high-water mark restarts at the current resident size
    jax.block_until_ready(build())
    return _status("VmHWM") - base


def measure(way: str, width: int) -> dict:
    """In this (fresh) process: the estimate, the first run's peak and the second run's peak."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from leakdoctor.remedies.low_precision_init import estimate_init_bytes, low_precision_init

    keys = jax.random.split(jax.random.PRNGKey(0), LAYERS)

    def make(key):
        return eqx.nn.Linear(width, width, key=key)

    def naive():
        stack = eqx.filter_vmap(make)(keys)
        return jax.tree_util.tree_map(lambda x: x.astype(jnp.float16) if eqx.is_inexact_array(x) else x, stack)

    build = naive if way == "naive" else lambda: low_precision_init(make, keys, dtype=jnp.float16)
    first = _peak_of(build)
    second = _peak_of(build)
    estimate = estimate_init_bytes(make, keys, dtype=jnp.float16)
    return {"first": first, "second": second, "estimate": estimate.naive_peak_bytes if way == "naive"
            else estimate.layerwise_peak_bytes, "text": str(estimate)}


def run_fresh(way: str, width: int) -> dict:
    out = subprocess.run([sys.executable, __file__, way, str(width)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def size_section(width: int) -> str:
    """The table and ratios for a stack of LAYERS layers of `width`."""
    runs = {way: [run_fresh(way, width) for _ in range(PROCESSES)] for way in WAYS}
    med = {way: {k: statistics.median(r[k] for r in runs[way]) for k in ("first", "second", "estimate")}
           for way in WAYS}
    rows = []
    for way in WAYS:
        m = med[way]
        rows.append([way, mib(m["first"]), mib(m["second"]), mib(m["estimate"]),
                     f"{m['estimate'] / m['second'] - 1:+.0%}", f"{m['estimate'] / m['first'] - 1:+.0%}"])
    ratio_first = med["layerwise"]["first"] / med["naive"]["first"]
    ratio_second = med["layerwise"]["second"] / med["naive"]["second"]
    per_process = "; ".join(f"{way} " + ", ".join(f"{mib(r['first'])}/{mib(r['second'])}" for r in runs[way])
                            for way in WAYS)
    return f"""
### {LAYERS} layers of `eqx.nn.Linear({width}, {width})`: {mib(LAYERS * (width * width + width) * 4)} in float32

Preflight: {runs['naive'][0]['text']}.

{table(["way", "peak, first run", "peak, second run", "preflight estimate", "estimate vs second run",
        "estimate vs first run"], rows)}

Layerwise / naive peak: **{ratio_first:.2f}x** on the first run, **{ratio_second:.2f}x** on the second (target:
at most 0.4x). Per-process peaks (first/second run): {per_process}.
"""


def main() -> None:
    import equinox
    import jax

    sections = "".join(size_section(width) for width in WIDTHS)
    write_section("low_precision_init", f"""
## JAX: low_precision_init against filter_vmap then cast (equinox#673)

`.venv/bin/python benchmarks/run.py low_precision_init` on {machine()}, jax {jax.__version__},
equinox {equinox.__version__}. "naive" builds the stack with `eqx.filter_vmap(make)(keys)` in float32,
then casts every floating array to float16, eagerly; "layerwise" is `low_precision_init(make, keys,
dtype=jnp.float16)`. Peak = resident high-water mark (VmHWM, reset right before the init) minus the
resident size right before it, median of {PROCESSES} fresh processes per way and size. The first run
includes compiling the init's pieces and the allocator arenas of XLA's threads, a few tens of MiB whatever
the model's size; the second run repeats the init in the same process after freeing the first stack, so
only the arrays count: that is what `estimate_init_bytes(make, keys, dtype=jnp.float16)` estimates,
without allocating or running anything.
{sections}""")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(measure(sys.argv[1], int(sys.argv[2]))))
    else:
        main()
