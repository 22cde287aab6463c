"""What every real-workload script shares: its command line, the synthetic stand-in for MNIST, and how
the doctor is attached.

    args = common.arguments(__doc__, steps=1200)     # --doctor {none,default,safe} --leak --steps N --summary PATH --on-limit
    with common.attach(LeakDoctor, args, model=model) as doctor:   # a loop doctor (a stand-in for --doctor none)
    callbacks = common.callbacks(LeakDoctorCallback, args)         # Lightning and Keras: [] for --doctor none
    common.done(steps, seconds)                      # the script's last line, which the benchmark reads

At `--doctor default` and `--doctor safe` the doctor gets leakdoctor's real defaults, as a user runs it:
no memory_limit, nothing tuned; only `remedies` ("off" or "safe") and the summary path are passed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scenarios"))
from _harness import Absent  # noqa: E402  (the corpus's do-nothing doctor: one copy, not two)

#: --doctor -> the doctor's `remedies`.
REMEDIES = {"default": "off", "safe": "safe"}
#: The line `done` prints; the benchmark looks for it.
RESULT = "realworld-result:"


def arguments(description: str | None, steps: int,
              extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The command line of a script: the doctor options every script takes, plus its own (`extra`).
    `steps` is the script's default number of training steps."""
    parser = argparse.ArgumentParser(description=(description or "").strip().splitlines()[0])
    parser.add_argument("--doctor", choices=("none", *REMEDIES), default="none",
                        help="none: the author's script as it is; default: leakdoctor at its defaults; "
                             "safe: remedies='safe'")
    parser.add_argument("--leak", action="store_true", help="plant the script's one realistic leak")
    parser.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    parser.add_argument("--summary", type=Path, default=None, help="where the doctor writes its JSON summary")
    parser.add_argument("--on-limit", choices=("warn", "stop"), default="warn",
                        help="the doctor's on_limit (warn, its default; stop: a clean run must never be stopped)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: expected a positive number of steps")
    return args


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The doctor's keyword arguments for this run: the remedies, on_limit and the summary path, nothing
    else."""
    return {"remedies": REMEDIES[args.doctor], "on_limit": args.on_limit, "summary_path": args.summary}


def attach(factory: Callable[..., Any], args: argparse.Namespace, **kwargs: Any) -> Any:
    """A loop doctor, `factory(**kwargs)` with the run's options; for --doctor none a stand-in whose
    `step` does nothing (and hands back the state it is given), so the loop is the same code."""
    if args.doctor == "none":
        return Absent(kwargs)
    return factory(**options(args), **kwargs)


def callbacks(factory: Callable[..., Any], args: argparse.Namespace, **kwargs: Any) -> list[Any]:
    """`[factory(**kwargs)]` with the run's options for a framework's `callbacks=`; [] for --doctor none."""
    return [] if args.doctor == "none" else [factory(**options(args), **kwargs)]


def mnist(train: int, test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A synthetic stand-in for MNIST (nothing can be downloaded here): `train` and `test` images of 28x28
    uint8 pixels and their labels 0-9, each image a noisy copy of its class's random template, so that a
    model learns and its loss falls as on the real data. Same shapes and dtypes as MNIST's."""
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 255, size=(10, 28, 28))
    labels = rng.integers(0, 10, size=train + test)
    images = templates[labels] * 0.3 + rng.uniform(0, 178, size=(train + test, 28, 28))
    images = images.astype(np.uint8)
    return images[:train], labels[:train].astype(np.int64), images[train:], labels[train:].astype(np.int64)


def done(steps: int, seconds: float) -> None:
    """The script's last line: the training steps it ran and the seconds its training loop took."""
    print(RESULT, json.dumps({"steps": steps, "seconds": round(seconds, 3)}), flush=True)
