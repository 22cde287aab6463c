"""The Prometheus exporter: a doctor's series, findings, remedies, projection and overhead on /metrics.

    doctor = LeakDoctor(prometheus_port=9464)       # http://127.0.0.1:9464/metrics

One HTTP server and one CollectorRegistry per doctor (never prometheus_client's global registry, so
several doctors in one process do not collide), bound to 127.0.0.1 unless the user names another host.
In a distributed run each rank serves base port + LOCAL_RANK, so one scrape config covers a node.

Cheap by construction: after a sample the engine calls `Publisher.publish` with what it already holds;
that keeps an immutable snapshot (a few small tuples), and the server's thread renders the latest
snapshot when Prometheus scrapes. Unsampled steps never reach this module.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    from leakdoctor.guard import Guard
    from leakdoctor.settings import Settings
    from leakdoctor.summary import Finding

PREFIX = "leakdoctor_"
#: Names of the exporter's own metrics; a series whose name would collide gets a numbered suffix.
OWN = ("step", "findings", "remedies_applied", "projected_limit_step", "overhead_fraction", "probe_seconds",
       "forensic_seconds", "remedy_seconds", "investigations")


def require() -> Any:
    """The prometheus_client module, or an ImportError that says what to install."""
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 - the metric families the collector renders
    except ImportError as err:
        raise ImportError("prometheus_port= needs prometheus_client: pip install leakdoctor[prometheus]") from err
    return prometheus_client


def metric_name(series: str) -> str:
    """`leakdoctor_` + the series name made a valid Prometheus metric name ([a-zA-Z0-9_:], no
    leading digit): `len(Model.outputs)` becomes `leakdoctor_len_Model_outputs`."""
    name = re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9_:]", "_", series)).strip("_")
    return PREFIX + (name or "series")


def local_rank() -> int:
    """This process's rank on its node (torchrun, Lightning and SLURM launchers set LOCAL_RANK)."""
    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Snapshot:
    """What one doctor held after its latest sample, in the form a scrape renders."""

    step: int
    readings: Mapping[str, float]
    findings: Mapping[tuple[str, str], int]  # (cause, state) -> count; state: leak, remedied or benign
    remedies: Mapping[str, int]  # remedy name -> times applied (monotonic)
    projected_limit_step: int | None
    overhead: Mapping[str, float]


def finding_state(finding: "Finding") -> str:
    """leak, remedied (an effective remedy) or benign while the run goes on; the final states too
    (minor, withdrawn) once the summary judged them."""
    return finding.final_state


@dataclass
class Publisher:
    """One doctor's feed into an exporter, with its labels (rank, framework; the Keras callback adds
    `clock`). The owner's `close()` stops the exporter; a borrowed publisher's does nothing."""

    exporter: "Exporter"
    labels: dict[str, str]
    owner: bool = False
    snapshot: Snapshot | None = None
    _applied: set[tuple[Any, ...]] = field(default_factory=set)

    def publish(self, step: int, readings: Mapping[str, float], findings: Sequence["Finding"],
                projected_limit_step: int | None, overhead: Mapping[str, float]) -> None:
        """Replace the snapshot (called by the engine after a sample; microseconds)."""
        counts: dict[tuple[str, str], int] = {}
        for finding in findings:
            key = (finding.cause, finding_state(finding))
            counts[key] = counts.get(key, 0) + 1
            if finding.remedy is not None:
                self._applied.add((finding.key, finding.remedy.name, finding.remedy.applied_step))
        remedies: dict[str, int] = {}
        for _key, name, _step in self._applied:
            remedies[name] = remedies.get(name, 0) + 1
        self.snapshot = Snapshot(step, dict(readings), counts, remedies, projected_limit_step, dict(overhead))

    def sibling(self, **labels: str) -> "Publisher":
        """Another publisher on the same exporter (not its owner), e.g. for a second clock."""
        publisher = Publisher(self.exporter, {**self.labels, **labels})
        self.exporter.publishers.append(publisher)
        return publisher

    def close(self) -> None:
        if self.owner:
            self.exporter.close()


class Exporter:
    """An HTTP server for /metrics on `host`:`port` (+ LOCAL_RANK) with a registry of its own. A bad
    port raises ValueError here; `start()` raises OSError when the port is taken (the engine guards it)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._prometheus = require()
        self.host = host
        self.port = port + local_rank() if port else 0
        if self.port > 65535:
            raise ValueError(f"prometheus_port={port}: with LOCAL_RANK={local_rank()} this rank would serve port "
                             f"{self.port}, above 65535; choose a lower base port")
        self.publishers: list[Publisher] = []
        self.registry = self._prometheus.CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self._server, self._thread = self._prometheus.start_http_server(self.port, self.host, self.registry)
        except OSError as err:
            raise OSError(err.errno, f"cannot serve /metrics on {self.host}:{self.port}: {err.strerror}") from None

    @property
    def address(self) -> tuple[str, int] | None:
        """The (host, port) the server is bound to, or None when it is not serving."""
        return tuple(self._server.server_address[:2]) if self._server is not None else None  # type: ignore[return-value]

    def publisher(self, owner: bool = False, **labels: str) -> Publisher:
        publisher = Publisher(self, dict(labels), owner)
        self.publishers.append(publisher)
        return publisher

    def close(self) -> None:
        """Stop serving and free the port (waits for the server's loop, at most half a second)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def publisher_for(settings: "Settings", framework: str, guard: "Guard") -> Publisher | None:
    """The exporter a doctor's settings ask for, started (a port in use: a warning through `guard`, and
    the run goes on without it), and the doctor's publisher; None without `prometheus_port`."""
    if settings.prometheus_port is None:
        return None
    exporter = Exporter(settings.prometheus_port, settings.prometheus_host)
    guard.call("prometheus", exporter.start)
    return exporter.publisher(owner=True, rank=str(settings.rank), framework=framework)


class _Collector:
    """Renders the publishers' latest snapshots at scrape time (in the server's thread)."""

    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Any]:
        core = self._exporter._prometheus.core
        fed = [(p.labels, p.snapshot) for p in list(self._exporter.publishers) if p.snapshot is not None]
        names = sorted({k for labels, _ in fed for k in labels})
        families: dict[str, Any] = {}

        def add(kind: str, name: str, doc: str, labels: Mapping[str, str], value: float, **extra: str) -> None:
            family = families.get(name)
            if family is None:
                make = core.CounterMetricFamily if kind == "counter" else core.GaugeMetricFamily
                family = families[name] = make(name, doc, labels=names + sorted(extra))
            family.add_metric([labels.get(k, "") for k in names] + [extra[k] for k in sorted(extra)], value)

        for labels, snap in fed:
            add("gauge", PREFIX + "step", "Training steps the doctor has counted", labels, snap.step)
            for series, name in _series_names(snap.readings).items():
                add("gauge", name, f"leakdoctor series {series!r}, latest sample", labels, snap.readings[series])
            for (cause, state), count in snap.findings.items():
                add("gauge", PREFIX + "findings", "Findings by cause and state (leak, remedied, benign)", labels,
                    count, cause=cause, state=state)
            for remedy, count in snap.remedies.items():
                add("counter", PREFIX + "remedies_applied", "Remedies applied", labels, count, remedy=remedy)
            if snap.projected_limit_step is not None:
                add("gauge", PREFIX + "projected_limit_step", "Step at which an unremedied leak reaches the "
                    "memory limit", labels, snap.projected_limit_step)
            add("gauge", PREFIX + "overhead_fraction", "The doctor's probe time over step time", labels,
                snap.overhead.get("fraction_of_step_time", 0.0))
            for part in ("probe", "forensic", "remedy"):
                add("counter", f"{PREFIX}{part}_seconds", f"Seconds the doctor spent on {part} work", labels,
                    snap.overhead.get(f"{part}_seconds", 0.0))
            add("counter", PREFIX + "investigations", "Investigations run", labels,
                snap.overhead.get("investigations", 0))
        yield from families.values()


def _series_names(readings: Mapping[str, float]) -> dict[str, str]:
    """Each series' metric name; a name taken (by the exporter's own metrics or an earlier series)
    gets a numbered suffix, so no two series share a metric."""
    taken = {PREFIX + name + suffix for name in OWN for suffix in ("", "_total")}
    names = {}
    for series in readings:
        name = base = metric_name(series)
        number = 2
        while name in taken:
            name, number = f"{base}_{number}", number + 1
        taken.add(name)
        names[series] = name
    return names
