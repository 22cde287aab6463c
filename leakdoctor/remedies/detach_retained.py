"""detach_retained: replace the tensors that a holder keeps across steps (a list or deque on the model such
as Lightning's `self.training_step_outputs`, a dict, a local list, a global, a running total) with detached
ones, so their autograd graphs, and the activations those graphs saved, are freed while the user's code
keeps its objects. The loop keeps adding, so new items are detached after every step while the finding is
open. Not safe: a program that meant to call backward() through the kept tensors later can no longer do
it. Applies to a retained_graph finding whose holders were found (its subject): on memory (bytes), the
metric it frees and is judged on by its slope; or on the length of a watched container (a count: a
LightningModule's `self.step_losses`, any `watch_object`'s list or dict), which keeps growing by an item
a step after the remedy, as the user's code appends; what the remedy frees there are the items' graphs,
so it is judged on them: it worked when the holders keep no tensor with a graph any more and what they
keep of a step is small (the list that still grows is then a history of detached numbers, which the
container rule judges by the bytes it holds; large detached tensors would go on leaking memory). A local
variable is read in the newest call of its function on the stack (integrations/_holders.py), so the running
total that each epoch's call of `train()` starts anew is detached too.

Small CPU tensors kept this way (a scalar loss per step) are also packed into shared buffers: each has a
storage of a few bytes, allocated while the step's large temporaries came and went, and glibc carves those
from the freed holes, so the C heap fragments and resident memory keeps creeping (at a quarter of the
leak's rate here, with `loss.detach()` as much as with this remedy; `loss.item()` does not). As views of
one buffer they add no allocation of their own."""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Callable

from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._holders import Holder
from leakdoctor.remedies._base import Remedy, RemedyContext

#: Largest tensor (bytes) packed into a shared buffer, and the size of one buffer.
PACK_BYTES = 4096
CHUNK_BYTES = 65536


def has_graph(value: Any) -> bool:
    return getattr(value, "grad_fn", None) is not None and callable(getattr(value, "detach", None))


def plain_detach(tensor: Any) -> Any:
    return tensor.detach()


def detached(value: Any, depth: int = 2, detach: Callable[[Any], Any] = plain_detach) -> Any:
    """`value` with the tensors holding an autograd graph replaced by `detach(tensor)`: lists, deques and
    dicts are changed in place, tuples rebuilt; `depth` containers deep."""
    if has_graph(value):
        return detach(value)
    if depth == 0:
        return value
    if isinstance(value, (list, deque)):
        for i, item in enumerate(value):
            value[i] = detached(item, depth - 1, detach)
    elif isinstance(value, dict):
        for key, item in value.items():
            value[key] = detached(item, depth - 1, detach)
    elif isinstance(value, tuple):
        items = [detached(item, depth - 1, detach) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


class Packer:
    """Detaches tensors; small CPU ones come back as views of a shared buffer (one per dtype, a new one
    when it is full), with the same values, shape and dtype. A buffer is freed with its last view."""

    def __init__(self) -> None:
        self._buffers: dict[Any, tuple[Any, int]] = {}  # dtype -> (buffer, elements used)

    def __call__(self, tensor: Any) -> Any:
        tensor = tensor.detach()
        size = tensor.numel()
        if not self._packable(tensor) or size * tensor.element_size() > PACK_BYTES:
            return tensor
        buffer, used = self._buffers.get(tensor.dtype, (None, 0))
        if buffer is None or used + size > buffer.numel():
            buffer, used = tensor.new_empty(CHUNK_BYTES // tensor.element_size()), 0
        view = buffer[used:used + size].view(tensor.shape)
        view.copy_(tensor)
        self._buffers[tensor.dtype] = (buffer, used + size)
        return view

    @staticmethod
    def _packable(tensor: Any) -> bool:
        """A plain dense CPU tensor (no subclass, no quantized or sparse layout)."""
        return (type(tensor).__name__ == "Tensor" and tensor.device.type == "cpu"
                and str(tensor.layout) == "torch.strided" and not tensor.is_quantized)


def holds_graph(value: Any, depth: int = 1) -> bool:
    """Is `value` a tensor with a graph, or a container holding one, `depth` containers deep?"""
    if has_graph(value):
        return True
    if depth == 0 or not isinstance(value, (list, deque, dict, tuple)):
        return False
    return any(holds_graph(item, depth - 1) for item in (value.values() if isinstance(value, dict) else value))


class DetachRetained(Remedy):
    name = "detach_retained"
    treats = frozenset({"retained_graph"})
    safe = False
    stops_count = False  # the user's list goes on growing; its items no longer hold graphs

    def __init__(self) -> None:
        self._holders: list[Holder] = []
        self._pack = Packer()
        self._done: dict[int, tuple[int, int]] = {}  # holder index -> (id of its list/dict, items detached)
        self._on_count = False

    def applicable(self, ctx: RemedyContext) -> bool:
        finding = ctx.finding
        if not super().applicable(ctx) or not finding.subject or finding.unit not in ("bytes", "count"):
            return False
        return finding.unit == "bytes" or any(_reachable(holder) for holder in finding.subject)

    def apply(self, ctx: RemedyContext) -> Record:
        self._holders = list(ctx.finding.subject)
        self._on_count = ctx.finding.unit == "count"
        self._detach_all()
        names = [h.name for h in self._holders if _reachable(h)] or [h.name for h in self._holders]
        appends = msg("still_appends", metric=ctx.finding.metric) if self._on_count else None
        return msg("remedy_detach", holders=names, appends=appends)

    def worked(self, rate_before: float, after: Any) -> bool:
        """On memory: its slope fell (Remedy.worked). On a container's length, which goes on growing as the
        user's code appends: the holders keep no tensor with an autograd graph any more, and what they keep
        of a step is small (a number, a few: the items packed into shared buffers). Detached tensors that
        are large still leak: the container's growth then matters in bytes, which detaching cannot stop.
        A running total (holders that keep one tensor each) is judged on its graph too: the chain is cut
        when the total holds no graph after the step, and its nodes, a few KiB a step, are more than memory
        shows within a verification's windows."""
        values = [value for holder in self._holders if (value := holder.get()) is not None]
        totals = values and not any(isinstance(value, (list, dict, deque, tuple)) for value in values)
        if not self._on_count and not totals:
            return super().worked(rate_before, after)
        if not values or any(holds_graph(value, depth=2) for value in values):
            return False
        newest = [item for value in values if isinstance(value, (list, dict, deque))
                  for item in islice(reversed(value.values() if isinstance(value, dict) else value), 8)]
        return all(_tensor_bytes(item) <= PACK_BYTES for item in newest)

    def on_step(self, ctx: RemedyContext) -> None:
        self._detach_all()

    def _detach_all(self) -> None:
        for index, holder in enumerate(self._holders):
            self._detach(index, holder)

    def _detach(self, index: int, holder: Holder) -> None:
        value = holder.get()
        if value is None:
            return
        if has_graph(value):
            if holder.rebind is not None:
                holder.rebind(value.detach())
            else:
                value.detach_()  # a local variable: its tensor is changed in place
        elif isinstance(value, (list, dict)):
            self._detach_new(index, value)
        elif isinstance(value, deque):
            _detach_newest(value, self._pack)
        else:
            detached(value, detach=self._pack)

    def _detach_new(self, index: int, container: list | dict) -> None:
        """Detach the items added since the last call: all of them if the container is a new one (the user
        replaced it) or shrank (cleared, then refilled)."""
        ident, start = self._done.get(index, (id(container), 0))
        start = start if ident == id(container) and start <= len(container) else 0
        if isinstance(container, list):
            for i in range(start, len(container)):
                container[i] = detached(container[i], 1, self._pack)
        else:
            for key in list(islice(container, start, None)):
                container[key] = detached(container[key], 1, self._pack)
        self._done[index] = (id(container), len(container))


def _tensor_bytes(value: Any, depth: int = 1) -> int:
    """Bytes of the tensors in `value` (a tensor, or a tuple, list or dict of them, `depth` deep)."""
    if callable(getattr(value, "element_size", None)) and callable(getattr(value, "numel", None)):
        return value.element_size() * value.numel()
    if depth == 0 or not isinstance(value, (list, deque, dict, tuple)):
        return 0
    return sum(_tensor_bytes(item, depth - 1) for item in (value.values() if isinstance(value, dict) else value))


def _reachable(holder: Holder) -> bool:
    """Can the remedy reach what the holder keeps (a container, or a tensor with a graph)?"""
    try:
        value = holder.get()
    except Exception:  # noqa: BLE001 - an owner gone, an attribute deleted: nothing to act on
        return False
    return isinstance(value, (list, dict, deque, tuple)) or has_graph(value)


def _detach_newest(items: deque, detach: Callable[[Any], Any]) -> None:
    """Detach the newest items of a deque, from the right until one holds no graph: items are appended on
    the right and older ones were detached already (a bounded deque drops them on the left, so an index
    cannot tell the new ones)."""
    for i in range(len(items) - 1, -1, -1):
        if not holds_graph(items[i]):
            return
        items[i] = detached(items[i], 1, detach)


REMEDY = DetachRetained
