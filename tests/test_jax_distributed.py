"""A multi-process JAX run (jax.distributed.initialize, two processes on CPU): on_limit="stop" stops every
process together, at the same step. Only process 1 leaks (2 MiB a step, kept), with a real limit a few
hundred MiB above its resident memory: process 1 asks to stop, the processes agree (one
multihost_utils.process_allgather at agreement steps), and both leave the loop at the same step, before the
limit, each having called `checkpoint=` (JAX's checkpointing is itself a collective). Nothing is gathered:
process 0 writes leaks.json (which says which process asked), process 1 its own leaks.rank1.json beside it.

The two processes are spawned from this test, with a deadline after which both are killed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import report_to
from test_distributed_stop import CHUNK, HEADROOM, rss, run_ranks

pytest.importorskip("jax")
pytest.importorskip("optax")

STEPS = 2000


def jax_process(rank: int, port: int, folder: str, conn: Any) -> None:
    """One of two JAX processes; process 1 keeps 2 MiB a step. Sends back its last step, should_stop, its
    limit and its checkpoint calls."""
    report_to(conn, _jax_process, rank, port, folder, label=f"process {rank}")


def _jax_process(rank: int, port: int, folder: str) -> dict:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from leakdoctor.callbacks.jax import LeakDoctor

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank)

    class Hoarder:
        def __init__(self) -> None:
            self.hoard: list = []  # a list attribute the doctor counts (watch_object)

    keeper = Hoarder()
    calls: list[int] = []
    limit = rss() + HEADROOM
    step = 0
    try:
        doctor = LeakDoctor(tx=optax.sgd(0.01), on_limit="stop", memory_limit=limit, overhead=1.0, verbose=False,
                            checkpoint=lambda: calls.append(rank), summary_path=os.path.join(folder, "leaks.json"))
        tx = doctor.tx
        key = jax.random.PRNGKey(0)
        params = {"w": jnp.zeros((32, 1)), "b": jnp.zeros((1,))}
        opt_state = tx.init(params)

        @jax.jit
        def train_step(params, opt_state, x, y):
            def loss_fn(p):
                return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        doctor.watch_object(keeper)
        with doctor:
            for step in range(1, STEPS + 1):
                key, kx, ky = jax.random.split(key, 3)
                params, opt_state, loss = train_step(params, opt_state, jax.random.normal(kx, (16, 32)),
                                                     jax.random.normal(ky, (16, 1)))
                loss.block_until_ready()
                if rank == 1:
                    keeper.hoard.append(np.ones(CHUNK))  # the leak, on process 1 only
                doctor.step(opt_state=opt_state, params=params)
                if doctor.should_stop:
                    break
    finally:
        jax.distributed.shutdown()
    return {"rank": rank, "last_step": step, "should_stop": doctor.should_stop, "limit": limit,
            "checkpoint_calls": len(calls), "agreements": doctor.summary.overhead.get("stop_agreements")}


def test_two_jax_processes_stop_together_when_one_leaks(tmp_path):
    results = run_ranks(jax_process, str(tmp_path))
    steps = [r["last_step"] for r in results]
    assert steps[0] == steps[1] < STEPS and all(r["should_stop"] for r in results), results
    assert [r["checkpoint_calls"] for r in results] == [1, 1]  # every process saves (a collective save)
    assert all(r["agreements"] and r["agreements"] > 0 for r in results), results
    # process 0's own summary: the stop, and which process asked
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["rank"] == 0 and summary["framework"] == "jax"
    assert summary["stopped"]["step"] == steps[0] == summary["steps"]
    assert summary["stopped_by"]["rank"] == 1
    # process 1's own summary beside it: its leak, found and stopped before its limit
    own = json.loads((tmp_path / "leaks.rank1.json").read_text())
    assert own["rank"] == 1 and own["verdict"] == "leak" and own["steps"] == steps[1]
    assert own["stopped_by"]["rank"] == 1 and own["stopped_by"]["step"] <= steps[1]
    assert any(f["state"] == "leak" for f in own["findings"]), own["findings"]
    assert own["series"]["rss_bytes"]["peak"] < results[1]["limit"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaks.json", "leaks.rank1.json"]
