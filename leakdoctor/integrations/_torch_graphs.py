"""Tensors kept across steps: a census of the live tensors at the start and end of an investigation, which
names who holds the ones kept (integrations/_holders.py: a model attribute, a local list, a global) with the
line that stores them; the retained_graph rule (tensors that keep their autograd graph) and the
kept_tensors rule (CPU tensors without a graph, whose storage Python's allocator never sees). Part of the
PyTorch integration (integrations/_torch.py), apart because it is the one piece that walks the heap."""

from __future__ import annotations

import sys
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from leakdoctor._base.evidence import RSS, Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._holders import CONTAINERS, Holder, find_holders, keep_instead, live_instances
from leakdoctor.integrations._python import new_items

#: Most autograd nodes a census walks; a graph this large is reported as at least this large.
GRAPH_LIMIT = 200_000
#: New tensors without a graph whose holders are looked for (as many as LiveArrayDiff samples of JAX's).
SAMPLE = 64
#: Share of resident memory's growth in the window that the CPU tensors kept must account for (as JAX's
#: arrays on CPU must, integrations/_jax.py live_arrays).
ACCOUNTS = 0.3


@dataclass
class Retained:
    """What the tensor census saw over an investigation of `steps` steps: tensor groups (shape, dtype,
    device, graph) whose live count grew, autograd nodes gained, and who holds the retained tensors."""

    steps: int
    groups: list[tuple[str, int, int, bool]]  # (description, tensors gained, bytes gained, holds a graph)
    graph_growth: int
    holders: list[Holder]
    #: who holds the tensors without a graph gained in the window (a dict of input batches), most first
    data_holders: list[Holder] = field(default_factory=list)
    #: autograd nodes alive at the window's start (its end: graph_start + graph_growth)
    graph_start: int = 0

    @property
    def retained(self) -> bool:
        return any(graph for *_, graph in self.groups) or self.graph_growth >= self.steps

    @property
    def graph_bytes(self) -> int:
        """Bytes of the tensors gained in the window that hold a graph (activations saved by the graphs)."""
        return sum(b for *_, b, graph in self.groups if graph)

    @property
    def saved_bytes(self) -> int:
        """The part of `graph_bytes` in tensors of more than a number: activations the graphs saved for a
        backward() that never comes (a loss kept after its backward() keeps only its graph's nodes)."""
        return sum(b for desc, _, b, graph in self.groups if graph and not desc.startswith("()"))

    def data_bytes(self, device: str) -> int:
        """Bytes of the tensors without a graph gained in the window on `device` ('cpu'): their storage."""
        return sum(b for desc, _, b, graph in self.groups if not graph and device_of(desc) == device)

    @property
    def devices(self) -> set[str]:
        return {device_of(desc) for desc, *_, graph in self.groups if graph}

    def describe(self) -> list[Record]:
        """What the census saw, each part a record (the evidence joins them with '; ')."""
        kept = [{"count": n, "tensors": desc, "size": b} for desc, n, b, graph in self.groups if graph]
        parts = [msg("graphs_kept", steps=self.steps, groups=kept[:3])] if kept else []
        if self.graph_growth >= self.steps:
            parts.append(msg("graph_grew", nodes=self.graph_growth))
        if self.holders:
            parts.append(msg("held_by_counted", holders=[{"holder": h.name, "count": h.count}
                                                         for h in self.holders[:3]]))
        return parts

    def kept_on(self, device: str) -> Record | None:
        kept = [{"count": n, "tensors": desc} for desc, n, _, _ in self.groups if desc.split()[-1].startswith(device)]
        return msg("gained_on", device=device, groups=kept[:3]) if kept else None


def group_of(t: Any) -> tuple[str, bool]:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} {t.device}", t.grad_fn is not None


def graph_nodes(tensors: Sequence[Any], limit: int = GRAPH_LIMIT) -> int:
    """Distinct autograd nodes reachable from the tensors' grad_fn (the node wrappers are kept alive
    while walking, so their ids stay unique)."""
    seen: dict[int, Any] = {}
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen)


def _growing_chain(grad: Sequence[Any], growth: int) -> Any:
    """The tensor whose graph took the window's growth: of those whose graph holds as many nodes, the one
    whose root autograd made last. A running total gets a new root every step; an older total that holds
    last epoch's chain (main()'s sum of the epochs') ties with it on size, and its root is older."""
    return max(grad, key=lambda t: (graph_nodes([t], limit=growth + 1), _made_at(t.grad_fn)))


def _made_at(node: Any) -> int:
    """When autograd made the node (its sequence number, which rises as nodes are made); -1 unknown."""
    try:
        return int(node._sequence_nr())
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return -1


class TensorCensus:
    """Live tensors by (shape, dtype, device, holds a graph) and autograd nodes, at the start and end of an
    investigation. Groups that gained at least half a tensor per step are kept across steps; if those hold
    a graph (or the graph grew by a node per step), the census names who holds them."""

    name = "tensor_census"

    def __init__(self, tensor_type: type, roots: Callable[[], list[Any]]) -> None:
        self._tensor = tensor_type
        self._roots = roots
        self._before: Counter[tuple[str, bool]] = Counter()
        self._graph = 0
        self._old: dict[int, Any] = {}

    def begin(self) -> None:
        tensors = live_instances(self._tensor)
        self._before = Counter(map(group_of, tensors))
        self._graph = graph_nodes(tensors)
        self._old = {id(t): weakref.ref(t) for t in tensors}

    def end(self, steps: int) -> Retained:
        tensors = live_instances(self._tensor)
        keyed = [(group_of(t), t) for t in tensors]
        after = Counter(group for group, _ in keyed)
        gained = {g: n - self._before[g] for g, n in after.items() if n - self._before[g] >= max(2, steps // 2)}
        size = {group: t.element_size() * t.nelement() for group, t in keyed if group in gained}
        groups = sorted(((desc, n, n * size[(desc, graph)], graph) for (desc, graph), n in gained.items()),
                        key=lambda g: g[2], reverse=True)
        grad = [t for (_, graph), t in keyed if graph]
        growth = graph_nodes(grad) - self._graph
        kept = [t for group, t in keyed if group[1] and group in gained and not self._is_old(t)]
        frame = sys._getframe(1)
        holders = find_holders(kept, self._roots(), frame) if kept else []
        if not holders and growth >= steps and grad:  # a running total chains each step's graph to the last
            holders = find_holders([_growing_chain(grad, growth)], self._roots(), frame)
        stored = [t for group, t in keyed if not group[1] and group in gained and not self._is_old(t)][-SAMPLE:]
        data_holders = find_holders(stored, self._roots(), frame) if stored else []
        start, self._before, self._old = self._graph, Counter(), {}
        return Retained(steps, groups, growth, holders, data_holders, start)

    def _is_old(self, t: Any) -> bool:
        ref = self._old.get(id(t))
        return ref is not None and ref() is t


def retained_rule() -> Rule:
    """Tensors that hold their autograd graph kept across steps: name the holder and the line that stores
    them. The finding is on memory (device memory first), what leaks, what detach_retained frees and is
    judged on, when it survived the cleanup ladder, when the graphs' tensors account for its growth, or
    when they keep activations (more than numbers): memory grows then by at least their bytes a step,
    whether or not its series shows it yet. A watched container that holds them (a list on the module)
    grows too: the finding explains its length, and is on that length whenever the kept graphs hold only
    numbers and their nodes (a loss kept after backward()): the list is the problem, which only the user
    can bound, and its length is exact where resident memory's growth at that pace is noise. Graphs that
    grew by a node a step or more, held by a named place, are proof too (a running total that chains each
    step's graph to the last, `total += loss`; a list of tensors kept with their graphs while another
    finding explains the memory): on resident memory, whatever it did in this window (its rate is judged
    over the run)."""

    def retained_graph(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        census = ev.reports.get("tensor_census")
        if census is None or not census.retained:
            return []
        unexplained = ev.unexplained(accepted)
        explained = {m for f in accepted for m in f.explains}
        holder = census.holders[0] if census.holders else None
        containers = [m for m, spec in ev.specs.items() if holder and spec.source == "container"
                      and (spec.where or "").split(" (")[0] == holder.name and _grows(ev, m)]
        candidates = [f"{d}_allocated_bytes" for d in ("cuda", "mps") if d in census.devices] + ["rss_bytes"]
        memory = next((m for m in candidates if m in ev.specs and m not in explained and (
            census.saved_bytes or _graphs_account(ev, m, census) or m in unexplained and ev.survives(m))), None)
        on_memory = memory is not None and (not containers or census.saved_bytes > 0)
        metric = memory if on_memory else next(iter(containers), None)
        chained = metric is None and holder is not None and census.graph_growth >= census.steps and RSS in ev.specs
        metric = RSS if chained else metric  # graphs a named place holds are proof, whatever memory did
        if metric is None:
            return []
        twin = [memory.replace("allocated", "reserved")] if memory and memory.endswith("_allocated_bytes") else []
        allocations = ev.reports.get("tracemalloc")
        top = allocations.top if allocations else None
        location = holder.location(allocations) if holder else top.location if top else None
        name = holder.path if holder else "the kept tensors"
        kept = holder.get() if holder else None
        value = (holder.stored() if holder else None) or "loss"
        instead = keep_instead(value, _newest_with_graph(kept))
        code = "store_detached" if holder is None or isinstance(kept, CONTAINERS) else "add_detached"
        advice = msg(code, stores=_what_is_kept(holder, kept), instead=instead, holder=name,
                     remedy=_remedy_note(ev, census.holders))
        growth = [_describe(ev, m, census) for m in dict.fromkeys([metric, *containers])]
        found = ev.finding(
            "retained_graph", metric, location=location,
            explains=tuple(dict.fromkeys([metric, *containers, *([memory] if memory else []), *twin])),
            subject=census.holders, evidence=msg("graphs_census", growth=growth, census=census.describe()),
            recommendation=advice)
        if census.graph_growth > 0:  # the nodes it counted: the proof no series of the run holds
            found.proof = [{"name": "autograd nodes", "unit": "count", "points": [
                [ev.start_step, census.graph_start], [ev.end_step, census.graph_start + census.graph_growth]]}]
        if metric == memory and not ev.growing(memory):  # its series shows no growth yet: the graphs' bytes
            found.rate_per_step = census.graph_bytes / census.steps
        if chained and not ev.survives(RSS):  # what the ladders saw it keep, not a growth a rung took back
            found.rate_per_step, found.rate_interval = max(0.0, ev.residual(RSS)) / ev.steps, None
        return [found]

    return Rule(30, retained_graph)


def device_of(description: str) -> str:
    """'cpu' of a group's description '(16, 1, 28, 28) float32 cpu', 'cuda' of '... cuda:0'."""
    return description.split()[-1].split(":")[0]


def kept_tensors_rule() -> Rule:
    """CPU tensors without an autograd graph kept across steps (a dict of input batches, a list of detached
    outputs): torch allocates their storage with malloc, outside Python's allocator, so tracemalloc does not
    see it and Python's objects grow by an entry a step while resident memory grows by the tensors' bytes;
    no rule would name more than native_memory. Named when resident memory's growth survived the cleanup
    ladder (and was no refill of pages malloc held), the tensors the census saw gained in the window account
    for ACCOUNTS of it, and a place in the user's program holds them: container_growth at the line that
    stores into the container (a list, a dict), else device_arrays at the holder. A watched container is
    named first by the container rule, whose count is exact (it runs before this one)."""

    def kept_tensors(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        census = ev.reports.get("tensor_census")
        if census is None or not census.data_holders or not _rss_kept(ev, accepted):
            return []
        held = census.data_bytes("cpu")
        if held < ACCOUNTS * ev.growth(RSS):
            return []
        holder = census.data_holders[0]
        kept = holder.get()  # no remedy acts on it: the finding keeps no reference to the user's data
        return [ev.finding(
            "container_growth" if isinstance(kept, CONTAINERS) else "device_arrays", RSS,
            location=holder.location(ev.reports.get("tracemalloc")), evidence=_kept_evidence(ev, census),
            accounts={RSS: float(held)},
            recommendation=msg("bound_tensors", stores=_what_is_stored(holder, kept),
                               holder=holder.path.removeprefix("global ")),
        )]

    return Rule(52, kept_tensors)


def _kept_evidence(ev: Evidence, census: Retained) -> Record:
    """How resident memory grew, which tensors without a graph were kept, and who holds them (the main
    holder, and others that hold as many as half of what it holds)."""
    holder = census.data_holders[0]
    kinds = [{"count": n, "tensors": desc, "size": b} for desc, n, b, graph in census.groups if not graph]
    others = [h for h in census.data_holders[1:] if 2 * h.count >= holder.count][:2]
    return msg("tensors_kept", growth=ev.describe(RSS), steps=census.steps, groups=kinds[:3],
               holders=[h.name for h in [holder, *others]])


def _rss_kept(ev: Evidence, accepted: list[Finding]) -> bool:
    """Did resident memory grow through the window, not accounted for so far (a finding before may explain
    it without having measured it: a second leak), and not by refilling pages that malloc already held
    (what the native_memory fallback asks too)?"""
    return RSS in ev.unaccounted(accepted) and ev.survives(RSS) and not ev.refilled(RSS)


def _what_is_stored(holder: Holder, kept: Any) -> Record | None:
    """'the dict global CACHE stores tensors (16, 1, 28, 28) float32 cpu: ': what the code keeps, where known."""
    newest = [t for t in new_items(kept, 8) if hasattr(t, "shape") and hasattr(t, "dtype")]
    if not isinstance(kept, CONTAINERS) or not newest:
        return None
    return msg("stores_tensors", kind=type(kept).__name__, holder=holder.path, tensors=group_of(newest[-1])[0])


def _newest_with_graph(kept: Any) -> Any:
    """The newest tensor with an autograd graph that `kept` holds (a container's item, or the held tensor
    itself: a running total); None if none can be read."""
    if isinstance(kept, CONTAINERS):
        return next((t for t in reversed(new_items(kept, 8)) if getattr(t, "grad_fn", None) is not None), None)
    return kept if getattr(kept, "grad_fn", None) is not None else None


def _what_is_kept(holder: Holder | None, kept: Any) -> Record | None:
    """'the list Model.step_losses stores tensors with grad_fn (...): ': what the code keeps, where known."""
    if holder is None:
        return None
    newest = [t for t in new_items(kept, 8) if getattr(t, "grad_fn", None) is not None and hasattr(t, "shape")]
    tensors = group_of(newest[-1])[0] if newest else None
    if isinstance(kept, CONTAINERS):
        return msg("stores_graphs", kind=type(kept).__name__, holder=holder.path,
                   tensors=msg("tensors_in_parens", tensors=tensors) if tensors else None)
    return msg("holds_chain", holder=holder.path)


def _remedy_note(ev: Evidence, holders: Sequence[Holder]) -> Record | None:
    """What detach_retained can do here, or why it cannot act."""
    if not holders:
        return msg("detach_no_holder")
    if "detach_retained" in ev.remedies:
        return None
    return msg("allow_detach", remedy="detach_retained")


def _graphs_account(ev: Evidence, metric: str, census: Retained) -> bool:
    """Do the kept graphs account for the growth of `metric`: it grew (a suspect that survived the ladder,
    or that a rung partly took back, since the C heap fragments around kept tensors and malloc_trim
    returns that; or a metric that is no suspect but trends up), and the tensors the graphs gained in
    the window make at least a quarter of that growth?"""
    trend = ev.suspects.get(metric) or ev.trends.get(metric)
    grew = ev.growing(metric) if metric in ev.suspects else bool(trend and trend.growing)
    return grew and trend is not None and census.graph_bytes >= 0.25 * trend.slope * ev.steps


def _describe(ev: Evidence, metric: str, census: Retained) -> Record:
    """How the metric grew: over the window (a suspect that grew, or a count that kept an item a step);
    or (no suspect of this investigation) by the kept graphs' bytes for memory, by its trend for a count."""
    unit = ev.specs[metric].unit if metric in ev.specs else "count"
    if ev.growing(metric) or unit != "bytes" and ev.growth(metric) >= ev.steps:
        return ev.describe(metric)
    if unit == "bytes" and not census.graph_bytes:  # a chain: each step's graph nodes, and no tensor gained
        return msg("no_growth_of_its_own", metric=metric)
    if unit == "bytes":
        return msg("gaining_graph_bytes", metric=metric, rate=census.graph_bytes / census.steps)
    return msg("growing_by", metric=metric, rate=ev.rate(metric), unit=unit)


def _grows(ev: Evidence, metric: str) -> bool:
    """Growing now, or known to grow (a metric an earlier finding explains is no longer investigated), or
    kept an item a step over the window at least (the holder's list, whose series, read at the stride,
    may hold too few windows for a trend when a fast leak is investigated early)."""
    trend = ev.trends.get(metric)
    return metric in ev.confirmed or bool(trend and trend.growing) or ev.growth(metric) >= ev.steps


# --- the last look at finish() ------------------------------------------------------------------------

#: A running total's chain proves itself when it has at least this many nodes of its kind in a row, and one
#: for every other step of the run: a model's own graph has a few nodes of a kind in a row, a total kept
#: with its graph (`total_loss += loss`) one a step.
MIN_CHAIN = 32


def chain_length(node: Any, limit: int) -> int:
    """Nodes of the root's kind that follow one another from it (AddBackward0 after AddBackward0: a total
    that adds each step's loss to the last total), at most `limit`."""
    name, count = node.name(), 0
    while node is not None and count < limit:
        count += 1
        node = next((fn for fn, _ in node.next_functions if fn is not None and fn.name() == name), None)
    return count


def last_look(tensor_type: type, roots: Callable[[], list[Any]]) -> Callable[[int], list[Finding]]:
    """The census's proof in one snapshot, for finish() (_judging/last_look.py): a tensor whose graph chains
    a node of one kind for every other step of the run, or a container holding a tensor with its graph for
    every other step, held by a named place of the user's program: retained_graph at the line that stores
    into it. A clean loop holds the last step's loss and outputs: neither."""

    def look(steps: int) -> list[Finding]:
        needed = max(MIN_CHAIN, steps // 2)
        grad = [t for t in live_instances(tensor_type) if getattr(t, "grad_fn", None) is not None]
        if len(grad) >= needed:  # enough tensors with graphs alive for one container to keep one a step
            listed = [h for h in find_holders(grad, roots(), sys._getframe(1))
                      if isinstance(h.get(), CONTAINERS) and h.count >= needed]
        else:
            listed = []
        chained = [t for t in grad if chain_length(t.grad_fn, needed) >= needed]
        holders = listed or (find_holders(chained, roots(), sys._getframe(1)) if chained else [])
        if not holders:
            return []
        holder = holders[0]
        kept = holder.get()
        sample = _newest_with_graph(kept)
        nodes = graph_nodes([sample]) if sample is not None else 0
        instead = keep_instead(holder.stored() or "loss", sample)
        what = (msg("graphs_in", count=holder.count, holder=holder.name) if isinstance(kept, CONTAINERS) else
                msg("chains_nodes", holder=holder.name, nodes=nodes))
        return [Finding(
            "retained_graph", RSS, first_step=0, detected_step=0, rate_per_step=0.0, unit="bytes",
            location=holder.location(), subject=holders,
            evidence=msg("last_look", what=what),
            recommendation=msg("store_detached_last", stores=_what_is_kept(holder, kept), instead=instead,
                               holder=holder.path))]

    return look
