"""The plain PyTorch loop doctor on real leaks, each reproduced in a fresh process (tests/helpers.isolated):
hooks registered every step, validation losses kept with their graphs (a list, and a running total),
DataLoader workers copying a Python list, and a clean loop that must stay clean and unchanged. Then the
parts on their own: argument checks, remove_hooks and detach_retained on real modules and tensors, the
CUDA allocator rule on hand-built evidence (no GPU here), and the merge of ranks' summaries."""

from __future__ import annotations

import gc
import inspect
import json
import weakref
from collections import deque

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import counts, has, isolated, kept, mentions, place, says
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor
from leakdoctor.integrations import MetricSpec
from leakdoctor.integrations._holders import Holder
from leakdoctor.integrations._python import code_location
from leakdoctor.integrations._torch import device_rule
from leakdoctor.integrations._torch_graphs import TensorCensus, retained_rule
from leakdoctor._base.trend import Trend
from leakdoctor._base.evidence import Evidence, Ladder
from leakdoctor.remedies._base import RemedyContext
from leakdoctor.remedies.detach_retained import DetachRetained, Packer, detached
from leakdoctor.remedies.remove_hooks import drop_repeats
from leakdoctor.reporting._ranks import merge
from leakdoctor.reporting._report import proven
from leakdoctor.reporting.summary import Finding, Summary


#: The leak tests sample every step: they test what is found and remedied, not the pacing, and at the
#: default 0.5% budget how often a few-ms step is sampled depends on the machine's speed.
EVERY_STEP = dict(overhead=1.0, verbose=False)


def setup(width: int = 256, batch: int = 128, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """A small regression MLP (a step takes a few ms), its optimizer and a fixed set of batches."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(batch, 64), torch.randn(batch, 1)) for _ in range(8)]
    return model, optimizer, batches


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def named(summary: dict, cause: str) -> list[dict]:
    return [f for f in summary["findings"] if f["cause"] == cause]


def finding(summary: dict, cause: str) -> dict:
    found = named(summary, cause)
    assert found, f"no {cause}: {[(f['cause'], f['metric']) for f in summary['findings']]}; notes {summary['notes']}"
    return found[0]


# --- hooks registered every step -------------------------------------------------------------------

def record_activation(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
    module.activation_norm = output.detach().norm()


def hooks_every_step(steps: int) -> dict:
    model, optimizer, batches = setup()
    counts = []
    with LeakDoctor(model=model, optimizer=optimizer, remedies="all", **EVERY_STEP) as doctor:
        for step in range(steps):
            model[0].register_forward_hook(record_activation)  # the leak: a new hook every step
            train_step(model, optimizer, *batches[step % len(batches)])
            doctor.step()
            counts.append(len(model[0]._forward_hooks))
    return {"summary": doctor.summary.to_dict(), "counts": counts}


def test_hook_registered_every_step_is_found_and_removed():
    result = isolated(hooks_every_step, 400)
    found = finding(result["summary"], "hook_accumulation")
    assert found["metric"] == "torch_hooks"
    assert place(found) == code_location(record_activation)
    assert says(found["evidence"], "hooks_held", kind="forward hook") and mentions(found["evidence"], "record_activation")
    remedy = found["remedy"]
    assert remedy["name"] == "remove_hooks" and remedy["effective"] is True
    assert remedy["rate_after"] <= 0.05 * found["rate_per_step"]
    counts = result["counts"]
    applied = remedy["applied_step"]
    assert counts[applied - 2] >= 20  # hooks piled up until the remedy...
    assert max(counts[applied:]) == 1  # ...then only the first one is left after every step
    assert result["summary"]["verdict"] == "remedied"


# --- validation losses kept with their autograd graphs ---------------------------------------------

def validation_losses_kept(steps: int, remedies: str) -> dict:
    model, optimizer, batches = setup()
    x_val, y_val = torch.randn(128, 64), torch.randn(128, 1)
    val_losses, values = [], []
    with LeakDoctor(model=model, optimizer=optimizer, remedies=remedies, **EVERY_STEP) as doctor:
        for step in range(steps):
            train_step(model, optimizer, *batches[step % len(batches)])
            val_losses.append(F.mse_loss(model(x_val), y_val))  # the leak: grad enabled, graph kept
            values.append(val_losses[-1].item())
            doctor.step()
    held = sum(t.grad_fn is not None for t in val_losses)
    return {"summary": doctor.summary.to_dict(), "with_graph": held, "kept": len(val_losses),
            "unchanged": [t.item() for t in val_losses] == values}


APPEND_LINE = validation_losses_kept.__code__.co_firstlineno + 7


def test_validation_losses_with_graph_are_found_and_detached():
    result = isolated(validation_losses_kept, 400, "all")
    found = finding(result["summary"], "retained_graph")
    assert found["metric"] == "rss_bytes"
    assert place(found) == f"val_losses in validation_losses_kept() (tests/test_torch.py:{APPEND_LINE})"
    assert says(found["evidence"], "grad_fn") and mentions(found["evidence"], "val_losses")
    remedy = found["remedy"]
    # the kept scalars are packed into shared buffers, so the C heap does not fragment around them and
    # resident memory stops growing, not just slows down
    assert remedy["name"] == "detach_retained" and remedy["effective"] is True, remedy
    assert remedy["rate_after"] <= 0.1 * found["rate_per_step"], remedy
    assert result["with_graph"] == 0 and result["kept"] == 400  # the list is intact, its graphs are gone
    assert result["unchanged"]  # and so are its values
    assert [f["cause"] for f in result["summary"]["findings"] if counts(f)] == ["retained_graph"]
    assert result["summary"]["verdict"] == "remedied"



class Recorder:
    """A user's callback that keeps every output it is shown (with its graph: the leak)."""

    def __init__(self) -> None:
        self.outputs: list[torch.Tensor] = []

    def on_step(self, output: torch.Tensor) -> None:
        self.outputs.append(output)  # the leak: a recorder keeps outputs with their graphs


def notify(callbacks: list[Recorder], output: torch.Tensor) -> None:
    for callback in callbacks:
        callback.on_step(output)


def outputs_kept_by_a_callback(steps: int) -> dict:
    """The outputs are kept by an object inside a list of callbacks, two levels below the loop's variable."""
    model, optimizer, batches = setup()
    x_val = torch.randn(128, 64)
    callbacks = [Recorder()]
    with LeakDoctor(model=model, optimizer=optimizer, remedies="all", **EVERY_STEP) as doctor:
        for step in range(steps):
            train_step(model, optimizer, *batches[step % len(batches)])
            notify(callbacks, model(x_val))
            doctor.step()
    held = sum(t.grad_fn is not None for t in callbacks[0].outputs)
    return {"summary": doctor.summary.to_dict(), "with_graph": held, "kept": len(callbacks[0].outputs)}


RECORDER_LINE = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                     if text.rstrip().endswith("# the leak: a recorder keeps outputs with their graphs"))


def test_outputs_kept_inside_a_list_of_callbacks_are_named_by_the_attribute_that_keeps_them():
    result = isolated(outputs_kept_by_a_callback, 300)
    found = finding(result["summary"], "retained_graph")
    assert place(found) == f"Recorder.outputs (tests/test_torch.py:{RECORDER_LINE})"
    remedy = found["remedy"]
    assert remedy["name"] == "detach_retained" and remedy["effective"] is True, remedy
    assert result["with_graph"] == 0 and result["kept"] == 300  # the recorder's list is intact, without graphs


def running_total_kept(steps: int) -> dict:
    model, optimizer, batches = setup()
    x_val, y_val = torch.randn(128, 64), torch.randn(128, 1)
    total = torch.zeros(())
    with LeakDoctor(model=model, optimizer=optimizer, remedies="all", **EVERY_STEP) as doctor:
        for step in range(steps):
            train_step(model, optimizer, *batches[step % len(batches)])
            total += F.mse_loss(model(x_val), y_val)  # the leak: each step's graph chained to the last
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "graph_freed": total.grad_fn is None}


TOTAL_LINE = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                  if text.rstrip().endswith("# the leak: each step's graph chained to the last"))


def test_running_total_with_graph_is_found_and_detached_in_place():
    result = isolated(running_total_kept, 400)
    found = finding(result["summary"], "retained_graph")
    assert found["metric"] == "rss_bytes"
    assert place(found) == f"total in running_total_kept() (tests/test_torch.py:{TOTAL_LINE})"
    assert says(found["evidence"], "graph_grew")
    remedy = found["remedy"]
    assert remedy["name"] == "detach_retained" and remedy["effective"] is True
    assert remedy["rate_after"] <= 0.1 * found["rate_per_step"]
    assert result["graph_freed"]

def one_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, doctor: LeakDoctor) -> torch.Tensor:
    """An epoch of the textbook loop's shape: a function called again each epoch, whose running total
    starts anew (a new frame, a new tensor) and chains every step's graph to the last."""
    x_val, y_val = torch.randn(128, 64), torch.randn(128, 1)
    epoch_total = 0.0
    for x, y in batches:
        train_step(model, optimizer, x, y)
        epoch_total += F.mse_loss(model(x_val), y_val)  # each epoch's total, chained
        doctor.step()
    return epoch_total


def running_totals_per_epoch(epochs: int, steps: int) -> dict:
    model, optimizer, batches = setup()
    with LeakDoctor(model=model, optimizer=optimizer, remedies="all", **EVERY_STEP) as doctor:
        totals = [one_epoch(model, optimizer, [batches[i % len(batches)] for i in range(steps)], doctor)
                  for _ in range(epochs)]
    return {"summary": doctor.summary.to_dict(), "graphs": [t.grad_fn is not None for t in totals]}


def test_a_running_total_started_anew_each_epoch_is_detached_in_every_epoch():
    result = isolated(running_totals_per_epoch, 4, 100)
    summary = result["summary"]
    (found,) = named(summary, "retained_graph")
    assert place(found).startswith("epoch_total in one_epoch() (tests/test_torch.py:")
    assert found["remedy"]["name"] == "detach_retained" and found["remedy"]["effective"] is True, found
    assert found["state"] == "remedied" and summary["verdict"] == "remedied"
    assert result["graphs"][-1] is False  # the last epoch's total, a new tensor in a new call, detached too


def test_a_running_total_chaining_graphs_is_proven_in_a_window_where_malloc_trim_took_memory_back():
    """torch_total_loss (textbook benchmark, 1 run in 3 clean): `epoch_loss += loss` chains each step's
    graph nodes to the last (a few KiB a step), and the investigations that looked were opened by the
    epoch-end test pass's heap, which malloc_trim took back. The chain, held by a named variable, is proof
    of retained_graph whatever resident memory did in that window: a real census of a real chain, the
    ladders' readings by hand."""
    model, optimizer, batches = setup(width=32)
    census = TensorCensus(torch.Tensor, lambda: [model])
    epoch_loss = torch.zeros(())
    census.begin()
    for x, y in batches[:8]:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # frees the activations the graph saved; its nodes stay
        optimizer.step()
        epoch_loss += loss  # chained
    del loss
    report = census.end(8)
    mib = 2**20

    def ladder(step: int, before: float, after: float) -> Ladder:
        return Ladder([("before", {"rss_bytes": before * mib}), ("malloc_trim", {"rss_bytes": after * mib})],
                      frozenset({"malloc_trim"}), step)

    rss = Trend("growing", slope=2 * mib)  # the test pass's heap: grew 8 MiB in 4 steps, trimmed back
    ev = Evidence(start_step=224, end_step=232, suspects={"rss_bytes": rss}, trends={"rss_bytes": rss},
                  specs={"rss_bytes": MetricSpec("rss_bytes", "bytes", source="process")},
                  begin=ladder(224, 500, 480), middle=ladder(228, 484, 480), end=ladder(232, 488, 480),
                  reports={"tensor_census": report})
    assert not ev.survives("rss_bytes") and ev.reclaimed_by("rss_bytes") == "malloc_trim"
    (found,) = retained_rule().fn(ev, [])
    assert (found.cause, found.metric) == ("retained_graph", "rss_bytes")
    line = inspect.getsourcelines(test_a_running_total_chaining_graphs_is_proven_in_a_window_where_malloc_trim_took_memory_back)
    chained = line[1] + next(i for i, text in enumerate(line[0]) if text.rstrip().endswith("# chained"))
    assert found.where == ("epoch_loss in test_a_running_total_chaining_graphs_is_proven_in_a_window_where_"
                              f"malloc_trim_took_memory_back() (tests/test_torch.py:{chained})")
    assert proven(found) and found.rate_per_step == 0  # what the ladders saw it keep: the trim took it all


def test_the_running_total_that_grew_is_named_not_an_older_total_holding_last_epochs_chain():
    """torch_total_loss (textbook benchmark, 1 run in 5 named `total_loss in main()`): main() adds each
    epoch's total to its own, so in the second epoch two tensors hold chains longer than the window's growth:
    last epoch's (the older total, left alone) and this epoch's (chained every step). The census names the
    one that grew, whichever the heap walk meets first (the older total is made last here, so it is met
    first: the youngest generation is walked first)."""
    model, optimizer, batches = setup(width=32)
    census = TensorCensus(torch.Tensor, lambda: [model])
    epoch_loss = torch.zeros(())
    for x, y in batches * 3:  # the first epoch: a chain three times the window's
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        epoch_loss += loss
    first_epoch, epoch_loss = epoch_loss, torch.zeros(())
    gc.collect()  # this epoch's total into the oldest generation
    total_loss = 0.0 + first_epoch  # main()'s total: a new tensor, in the youngest
    del first_epoch
    census.begin()
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        epoch_loss += loss  # chained
    del loss
    report = census.end(len(batches))
    assert [holder.path for holder in report.holders] == ["epoch_loss"], report.holders
    assert total_loss.grad_fn is not None  # held through the window


# --- a module-level dict keeping every step's input batch (CPU tensors, no graph) --------------------

#: Every step's input batch, keyed by step: the leak of the textbook torch_step_cache scenario (issue #28).
#: A CPU tensor's storage is malloc'd outside Python's allocator, so resident memory grows while Python
#: allocations grow by a dict entry a step.
STEP_CACHE: dict[int, torch.Tensor] = {}


def inputs_kept_in_a_global_dict(steps: int) -> dict:
    """Each step trains on a fresh batch (as a DataLoader makes one) and the loop keeps it in STEP_CACHE."""
    model, optimizer, _ = setup()
    generator = torch.Generator().manual_seed(0)
    with LeakDoctor(model=model, optimizer=optimizer, **EVERY_STEP) as doctor:
        for step in range(steps):
            x, y = torch.randn(256, 64, generator=generator), torch.randn(256, 1, generator=generator)
            train_step(model, optimizer, x, y)
            STEP_CACHE[step] = x  # the leak: every input batch kept, keyed by step
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "kept": len(STEP_CACHE)}


CACHE_LINE = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                  if text.rstrip().endswith("# the leak: every input batch kept, keyed by step"))


def test_input_batches_kept_in_a_global_dict_are_named_at_the_line_that_stores_them():
    result = isolated(inputs_kept_in_a_global_dict, 400)
    summary = result["summary"]
    found = finding(summary, "container_growth")
    assert found["metric"] == "rss_bytes"
    assert place(found) == f"global STEP_CACHE (tests/test_torch.py:{CACHE_LINE})"
    assert found["state"] == "leak" and found["severity"] == "major"
    assert summary["verdict"] == "leak"
    assert not named(summary, "native_memory"), summary["findings"]
    assert result["kept"] == 400


# --- DataLoader workers reading a Python list ------------------------------------------------------

class RecordsDataset(torch.utils.data.Dataset):
    """Samples kept as Python objects, one page apart: every read writes the object's reference count,
    so a forked worker copies the page that holds it (pytorch#13246). `as_array` keeps the same bytes in
    one numpy array instead (the fix): the workers read its buffer and write nothing."""

    def __init__(self, count: int, as_array: bool = False) -> None:
        self.records = np.zeros((count, 4000), np.uint8) if as_array else [bytes(4000) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        record = self.records[index]
        x = torch.full((64,), float(len(record) % 7))
        return x, x[:1]


def workers_read_dataset(as_array: bool, steps: int = 625) -> dict:
    """Up to one epoch (625 steps) with 2 forked workers, the doctor at its defaults (the pacing is the
    point: the workers' pages are read within its 0.5% budget); it stops once the doctor names the cause."""
    model, optimizer, _ = setup()
    # forked workers, as in a script on Linux (this scenario's own process was spawned, so say it)
    loader = torch.utils.data.DataLoader(RecordsDataset(20_000, as_array), batch_size=32, shuffle=True, num_workers=2,
                                         multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    with LeakDoctor(model=model, optimizer=optimizer, verbose=False) as doctor:
        for step, (x, y) in enumerate(loader):
            train_step(model, optimizer, x, y)
            doctor.step()
            if step + 1 == steps or step % 50 == 0 and named(doctor.summary.to_dict(), "dataloader_workers"):
                break
    return {"summary": doctor.summary.to_dict(), "epoch": len(loader)}


def test_dataloader_workers_copying_a_python_list_are_named_within_the_first_epoch():
    result = isolated(workers_read_dataset, False)
    found = finding(result["summary"], "dataloader_workers")
    assert found["detected_step"] < result["epoch"]
    assert found["metric"] == "workers_copied_bytes"
    assert place(found) == f"RecordsDataset.records ({code_location(RecordsDataset)})"
    assert says(found["evidence"], "python_list", "pytorch_issue", count=20000, kind="bytes")
    advice = found["recommendation"]
    assert says(advice, "as_numpy_array", "persistent_workers", holder="RecordsDataset.records")


def test_dataloader_workers_reading_a_numpy_array_are_clean():
    summary = isolated(workers_read_dataset, True, 300)["summary"]
    assert not named(summary, "dataloader_workers"), summary["findings"]


class KeepingDataset(torch.utils.data.Dataset):
    """Numbers in a tensor, read cleanly, but each sample made is also kept on the dataset: in a worker
    process that is the worker's own copy of `seen`, which grows all epoch (4 KiB a sample) while this
    process's stays empty."""

    def __init__(self, count: int) -> None:
        self.values = torch.arange(count, dtype=torch.float32)
        self.seen: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.values[index].expand(1024).clone()
        self.seen.append(x)  # the leak: every sample kept, in the worker's copy of the dataset
        return x[:64], x[:1]


SEEN_LINE = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                 if text.rstrip().endswith("# the leak: every sample kept, in the worker's copy of the dataset"))


def workers_keep_samples(steps: int = 1200) -> dict:
    """Up to `steps` steps of one epoch with a forked worker whose dataset keeps every sample (128 KiB a
    step), the doctor at its defaults (the workers' reads paced within its budget); it stops once the
    doctor names the cause."""
    model, optimizer, _ = setup()
    loader = torch.utils.data.DataLoader(KeepingDataset(32 * steps), batch_size=32, num_workers=1,
                                         multiprocessing_context="fork")
    with LeakDoctor(model=model, optimizer=optimizer, verbose=False) as doctor:
        for step, (x, y) in enumerate(loader):
            train_step(model, optimizer, x, y)
            doctor.step()
            if step % 50 == 0 and named(doctor.summary.to_dict(), "dataloader_workers"):
                break
    return {"summary": doctor.summary.to_dict(), "epoch": len(loader), "kept_here": len(loader.dataset.seen)}


def test_dataloader_workers_keeping_every_sample_on_the_dataset_are_named_at_the_line_that_stores_them():
    """The worker's memory grows in pages it shared with this process at first (the samples land in the
    heap the fork handed it) and in new ones; the dataset's __getitem__ names the container it grows, whose
    copy here stays empty."""
    result = isolated(workers_keep_samples)
    summary = result["summary"]
    found = finding(summary, "dataloader_workers")
    assert found["metric"] == "workers_grown_bytes"
    assert place(found) == f"KeepingDataset.seen (tests/test_torch.py:{SEEN_LINE})"
    assert found["state"] == "leak" and found["severity"] == "major"
    assert found["detected_step"] < result["epoch"]
    assert summary["verdict"] == "leak"
    assert result["kept_here"] == 0


# --- a clean loop: no finding, and the doctor changes nothing -----------------------------------------

def clean_loop(steps: int) -> dict:
    """The same training twice, with the doctor (remedies off) and without; validation done right."""
    runs = {}
    for watched in (True, False):
        model, optimizer, batches = setup(seed=1)
        x_val, y_val = torch.randn(128, 64), torch.randn(128, 1)
        doctor = LeakDoctor(model=model, optimizer=optimizer, verbose=False) if watched else None
        losses, val_losses = [], []
        for step in range(steps):
            losses.append(train_step(model, optimizer, *batches[step % len(batches)]))
            with torch.no_grad():
                val_losses.append(F.mse_loss(model(x_val), y_val).item())
            if doctor is not None:
                doctor.step()
        runs["with" if watched else "without"] = losses
        if doctor is not None:
            runs["summary"] = doctor.finish().to_dict()
    return runs


def test_clean_loop_has_no_finding_and_identical_losses():
    result = isolated(clean_loop, 400)
    summary = result["summary"]
    assert summary["steps"] == 400 and summary["verdict"] == "clean"
    assert kept(summary) == [], summary["findings"]
    assert result["with"] == result["without"]


# --- the parts on their own (real torch objects, no training run) -----------------------------------

def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="model=.*torch.nn.Module"):
        LeakDoctor(model="net")
    with pytest.raises(ValueError, match="optimizer=.*torch.optim.Optimizer"):
        LeakDoctor(optimizer=[1, 2])
    with pytest.raises(ValueError, match="watch_model"):
        LeakDoctor(watch_model="yes")
    with pytest.raises(ValueError, match="remedies"):
        LeakDoctor(model=nn.Linear(2, 2), remedies="some")


def test_remove_hooks_keeps_the_first_of_each_repeated_hook():
    layer = nn.Linear(2, 2)
    first = layer.register_forward_hook(record_activation, with_kwargs=False, always_call=True)
    for _ in range(3):
        layer.register_forward_hook(record_activation, always_call=True)
    for scale in (1.0, 2.0):  # a fresh closure each time: same code, so a repeat
        layer.register_forward_pre_hook(lambda module, args, s=scale: None)
    other = layer.register_forward_hook(lambda module, args, output: None)  # different code: kept
    assert drop_repeats(layer, "_forward_hooks") == 3
    assert drop_repeats(layer, "_forward_pre_hooks") == 1
    assert list(layer._forward_hooks) == [first.id, other.id]
    assert list(layer._forward_hooks_always_called) == [first.id]
    assert len(layer._forward_pre_hooks) == 1
    layer(torch.ones(1, 2))  # the module still runs, with the kept hooks
    assert hasattr(layer, "activation_norm")


def test_detached_replaces_graph_holding_tensors_in_place():
    weight = torch.ones(3, requires_grad=True)
    outputs = [weight * 2, {"loss": (weight ** 2).sum(), "n": 1}, (weight.sum(), "tag")]
    same_list, same_dict = outputs, outputs[1]
    assert detached(outputs) is same_list and outputs[1] is same_dict
    assert outputs[0].grad_fn is None and outputs[1]["loss"].grad_fn is None and outputs[2][0].grad_fn is None
    assert outputs[1]["n"] == 1 and outputs[2][1] == "tag"
    assert torch.equal(outputs[0], torch.full((3,), 2.0))


def test_detach_retained_packs_small_tensors_and_follows_a_deque():
    """The remedy on real tensors: a deque on a module, detached as it grows (new items on the right);
    small CPU tensors come back as views of one shared buffer with their values, large ones as they are."""
    weight = torch.ones(4, requires_grad=True)
    holder = nn.Module()
    holder.recent = deque([(weight * i).sum() for i in range(3)], maxlen=4)
    remedy = DetachRetained()
    ref = weakref.ref(holder)
    place = Holder("Module.recent", "", 3, (("train.py", 1, 9),), 1, lambda: ref().recent,
                   lambda v: setattr(ref(), "recent", v))
    context = RemedyContext(Finding("retained_graph", "rss_bytes", 1, 2, 1.0, "bytes", None, "", "", subject=[place]), {})
    assert remedy.applicable(context)
    remedy.apply(context)
    for i in range(3, 6):  # the deque is full: old items fall off the left
        holder.recent.append((weight * i).sum())
        remedy.on_step(context)
    items = list(holder.recent)
    assert [t.item() for t in items] == [8.0, 12.0, 16.0, 20.0] and all(t.grad_fn is None for t in items)
    assert len({t.untyped_storage().data_ptr() for t in items}) == 1  # packed: one buffer for all of them
    big = (weight.repeat(2048) * 2).reshape(64, 128)
    packed = Packer()(big)
    assert packed.grad_fn is None and packed.untyped_storage().nbytes() == big.nbytes and torch.equal(packed, big)


def cuda_evidence(reserved_end: float, allocated_end: float, retries_end: float) -> Evidence:
    """An investigation of 10 steps in which cuda_reserved_bytes was suspected of growing 1 MiB/step;
    the clear_cache rung gives back what reserved holds beyond allocated (as empty_cache does)."""
    mib = 2**20
    specs = {"cuda_allocated_bytes": MetricSpec("cuda_allocated_bytes", "bytes", source="cuda"),
             "cuda_reserved_bytes": MetricSpec("cuda_reserved_bytes", "bytes", source="cuda"),
             "cuda_alloc_retries": MetricSpec("cuda_alloc_retries", "count", role="supporting", source="cuda")}

    def ladder(step: int, allocated: float, reserved: float, retries: float) -> Ladder:
        before = {"cuda_allocated_bytes": allocated, "cuda_reserved_bytes": reserved, "cuda_alloc_retries": retries}
        return Ladder([("before", before), ("clear_cache", {**before, "cuda_reserved_bytes": allocated})], step=step)

    suspects = {"cuda_reserved_bytes": Trend("growing", slope=mib)}
    if allocated_end > 100 * mib:
        suspects["cuda_allocated_bytes"] = Trend("growing", slope=mib)
    return Evidence(start_step=100, end_step=110, suspects=suspects, trends=dict(suspects), specs=specs,
                    begin=ladder(100, 100 * mib, 200 * mib, 3),
                    end=ladder(110, allocated_end, reserved_end, retries_end),
                    reports={})


def test_cuda_rule_tells_the_caching_allocator_from_a_device_leak():
    """The CUDA allocator rule on evidence an investigation would gather (no GPU on this machine)."""
    mib = 2**20
    rule = device_rule("cuda").fn
    plateau = rule(cuda_evidence(reserved_end=210 * mib, allocated_end=100 * mib, retries_end=3), [])
    assert [(f.cause, f.metric, f.benign, f.reclaimed_by) for f in plateau] == \
        [("allocator_cache", "cuda_reserved_bytes", True, None)]  # not a leak, and nothing to clear
    retrying = rule(cuda_evidence(reserved_end=210 * mib, allocated_end=100 * mib, retries_end=9), [])
    assert [(f.cause, f.reclaimed_by) for f in retrying] == [("allocator_cache", "clear_cache")]
    assert says(retrying[0].evidence, "retries_rose", count=6)
    leak = rule(cuda_evidence(reserved_end=210 * mib, allocated_end=110 * mib, retries_end=3), [])
    assert [(f.cause, f.metric, f.benign) for f in leak] == [("device_arrays", "cuda_allocated_bytes", False)]
    assert set(leak[0].explains) == {"cuda_allocated_bytes", "cuda_reserved_bytes"}


def test_merge_keeps_every_rank_and_each_finding_once():
    def summary(rank: int, causes: list[str]) -> Summary:
        findings = [Finding(c, "rss_bytes", 30, 40, 1024.0, "bytes", f"train.py:{10 + i}", "grew", "fix it")
                    for i, c in enumerate(causes)]
        return Summary("torch", 100, {}, findings, projected_limit_step=5000 - rank, rank=rank)

    merged = merge([summary(1, ["retained_graph", "container_growth"]), summary(0, ["retained_graph"])])
    assert merged.rank == 0 and [r["rank"] for r in merged.ranks] == [0, 1]
    assert [(f.cause, f.where) for f in merged.findings] == \
        [("retained_graph", "train.py:10"), ("container_growth", "train.py:11")]
    assert merged.notes == [{"code": "not_seen_on_rank", "params": {
        "rank": 1, "cause": "container_growth", "metric": "rss_bytes", "first": 0}}], merged.notes
    assert merged.projected_limit_step == 4999 and merged.verdict == "leak"
    assert [len(r["findings"]) for r in merged.ranks] == [1, 2]
    assert Summary.from_dict(json.loads(merged.to_json())).ranks == merged.ranks


# --- fix texts that fit the value ----------------------------------------------------------------------

def outputs_kept(steps: int) -> dict:
    """A (16, 10) output tensor kept with its graph every step."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 10))  # its graph keeps 256 kB
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    outputs = []
    with LeakDoctor(model=model, optimizer=optimizer, **EVERY_STEP) as doctor:
        for _ in range(steps):
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            outputs.append(out)  # the leak: a (16, 10) output with its graph
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "shape": list(outputs[-1].shape)}


def test_the_fix_for_a_kept_output_tensor_does_not_suggest_item():
    # `out.item()` raises on a (16, 10) tensor: the fix suggests out.detach() (or a summary statistic)
    result = isolated(outputs_kept, 300)
    assert result["shape"] == [16, 10]
    found = finding(result["summary"], "retained_graph")
    assert place(found).startswith("outputs in outputs_kept()")
    assert has(found["recommendation"], "detach_or_summary", value="out")  # not out.item(): it has many elements
    assert not has(found["recommendation"], "detach", value="out") and not mentions(found["recommendation"], "out.item()")


# --- a short or slow run: the last look at finish() ------------------------------------------------------

def slow_running_total(steps: int, keep_graph: bool) -> dict:
    """A small model whose loop adds every step's loss to a running total: with its graph (`total += loss`,
    a few KiB a step: too slow to raise a suspicion in 1200 steps) or as a number (`loss.item()`)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    total_loss = 0
    with LeakDoctor(model=model, optimizer=optimizer, verbose=False) as doctor:
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss if keep_graph else loss.item()  # the slow total
            doctor.step()
    return doctor.summary.to_dict()


def test_a_slow_running_total_with_its_graph_is_reported_at_its_line_at_least_minor():
    summary = isolated(slow_running_total, 1200, True)
    found = finding(summary, "retained_graph")
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.rstrip().endswith("# the slow total"))
    assert place(found) == f"total_loss in slow_running_total() (tests/test_torch.py:{line})", found
    assert found["state"] in ("minor", "leak") and found["severity"] in ("minor", "major"), found
    clean = isolated(slow_running_total, 1200, False)
    assert clean["verdict"] == "clean" and kept(clean) == [], clean["findings"]
