"""The Prometheus exporter: a doctor's series, findings, remedies, projection and overhead on /metrics.

    doctor = LeakDoctor(prometheus_port=9464)       # http://127.0.0.1:9464/metrics

One HTTP server and one CollectorRegistry per doctor (never prometheus_client's global registry, so
several doctors in one process do not collide), bound to 127.0.0.1 unless the user names another host.
In a distributed run each rank serves base port + LOCAL_RANK, so one scrape config covers a node.

Cheap by construction: after a sample the engine calls `Publisher.publish` with what it already holds;
that keeps an immutable snapshot (a few small tuples), and the server's thread renders the latest
snapshot when Prometheus scrapes. Unsampled steps never reach this module.

To the end: at finish() the engine publishes the final values (last step, verdict, findings in their
final state), `conclude` pushes them to a Pushgateway when asked (`prometheus_pushgateway=`) and keeps
serving them for `prometheus_linger=` seconds (a daemon timer then stops the server). A process that
exits within the linger waits for its remainder at interpreter exit (an atexit handler, bounded by the
linger; Ctrl-C ends the wait at once), so the last scrape still sees the end of the run. A process ended
by a signal (SIGTERM, SIGKILL) or by os._exit does not wait.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    from leakdoctor._base.findings import Finding
    from leakdoctor._base.guard import Guard
    from leakdoctor.settings import Settings

PREFIX = "leakdoctor_"
#: The values of `leakdoctor_verdict{verdict}`: 1 for the current verdict, 0 for the others.
VERDICTS = ("clean", "leak", "remedied", "unwatched")
#: The Pushgateway job the final values are pushed under (grouped by rank).
JOB = "leakdoctor"
#: Seconds a push may take before it is given up (finish() waits for it).
PUSH_TIMEOUT = 5.0
#: Names of the exporter's own metrics; a series whose name would collide gets a numbered suffix.
OWN = ("step", "verdict", "findings", "remedies_applied", "projected_limit_step", "overhead_fraction", "probe_seconds",
       "forensic_seconds", "remedy_seconds", "investigations")


def require() -> Any:
    """The prometheus_client module, or an ImportError that says what to install."""
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 - the metric families the collector renders
    except ImportError as err:
        raise ImportError("prometheus_port= and prometheus_pushgateway= need prometheus_client: "
                          "pip install leakdoctor[prometheus]") from err
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
    verdict: str | None = None  # clean, leak, remedied or unwatched; final once the run finished


def finding_state(finding: "Finding") -> str:
    """leak, remedied (an effective remedy) or benign while the run goes on; the final states too
    (minor, withdrawn) once the summary judged them."""
    return finding.final_state


@dataclass
class Publisher:
    """One doctor's feed into an exporter, with its labels (rank, framework; the Keras callback adds
    `clock`). Only the owner's doctor concludes the exporter at finish() (`conclude`)."""

    exporter: "Exporter"
    labels: dict[str, str]
    owner: bool = False
    snapshot: Snapshot | None = None
    _applied: set[tuple[Any, ...]] = field(default_factory=set)

    def publish(self, step: int, readings: Mapping[str, float], findings: Sequence["Finding"],
                projected_limit_step: int | None, overhead: Mapping[str, float], verdict: str | None = None) -> None:
        """Replace the snapshot (called by the engine after a sample, and at finish() with the final
        values; microseconds)."""
        counts: dict[tuple[str, str], int] = {}
        for finding in findings:
            key = (finding.cause, finding_state(finding))
            counts[key] = counts.get(key, 0) + 1
            if finding.remedy is not None:
                self._applied.add((finding.key, finding.remedy.name, finding.remedy.applied_step))
        remedies: dict[str, int] = {}
        for _key, name, _step in self._applied:
            remedies[name] = remedies.get(name, 0) + 1
        self.snapshot = Snapshot(step, dict(readings), counts, remedies, projected_limit_step, dict(overhead), verdict)

    def sibling(self, **labels: str) -> "Publisher":
        """Another publisher on the same exporter (not its owner), e.g. for a second clock."""
        publisher = Publisher(self.exporter, {**self.labels, **labels})
        self.exporter.publishers.append(publisher)
        return publisher


class Exporter:
    """An HTTP server for /metrics on `host`:`port` (+ LOCAL_RANK) with a registry of its own. A bad
    port raises ValueError here; `start()` raises OSError when the port is taken (the engine guards it).
    Without a port (a Pushgateway only) it holds the registry and serves nothing."""

    def __init__(self, port: int | None, host: str = "127.0.0.1") -> None:
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
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._deadline: float | None = None  # set by linger(): when the final values stop being served
        self._pid = os.getpid()

    def start(self) -> None:
        try:
            self._server, self._thread = self._prometheus.start_http_server(self.port, self.host, self.registry)
        except OSError as err:
            raise OSError(err.errno, f"cannot serve /metrics on {self.host}:{self.port}: {err.strerror}") from None
        atexit.register(self._at_exit)

    def push(self, gateway: str, rank: str) -> None:
        """Push every publisher's latest values to a Pushgateway (job "leakdoctor", grouped by rank),
        replacing what this rank pushed before; raises what the push raised (the engine guards it)."""
        self._prometheus.push_to_gateway(gateway, job=JOB, registry=self.registry, grouping_key={"rank": rank},
                                         timeout=PUSH_TIMEOUT)

    def linger(self, seconds: float) -> None:
        """Keep serving for `seconds` more, then stop (a daemon timer; at interpreter exit, `_at_exit`
        waits out the rest); 0 or not serving: stop now."""
        if seconds <= 0 or self._server is None:
            self.close()
            return
        self._deadline = time.monotonic() + seconds
        timer = threading.Timer(seconds, self.close)
        timer.daemon = True
        timer.start()

    def _at_exit(self) -> None:
        """At interpreter exit: a finished run's exporter serves out its linger (at most that long; Ctrl-C
        ends the wait, also one that came before it, which ended the script), an unfinished one stops at
        once. A forked child leaves its parent's server alone."""
        if os.getpid() != self._pid:
            return
        interrupted = isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)  # the script's end
        try:
            if self._deadline is not None and not interrupted:
                self._closed.wait(max(0.0, self._deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

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
        with self._lock:
            server, self._server, thread, self._thread = self._server, None, self._thread, None
        self._closed.set()
        atexit.unregister(self._at_exit)
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def publisher_for(settings: "Settings", framework: str, guard: "Guard") -> Publisher | None:
    """The exporter a doctor's settings ask for, started (a port in use: a warning through `guard`, and
    the run goes on without it), and the doctor's publisher; None without `prometheus_port` or
    `prometheus_pushgateway` (a Pushgateway alone: an exporter that serves nothing)."""
    if settings.prometheus_port is None and settings.prometheus_pushgateway is None:
        return None
    exporter = Exporter(settings.prometheus_port, settings.prometheus_host)
    if settings.prometheus_port is not None:
        guard.call("prometheus", exporter.start)
    return exporter.publisher(owner=True, rank=str(settings.rank), framework=framework)


def conclude(publisher: Publisher, settings: "Settings", guard: "Guard") -> None:
    """At finish(), once the final values are published: push them to the Pushgateway when one is named
    (a failure is a warning and an entry in the summary's errors, once), then serve them for the linger.
    Only the publisher that owns the exporter concludes (the Keras callback's per-fit doctors do not)."""
    if not publisher.owner:
        return
    if settings.prometheus_pushgateway is not None:
        guard.call("prometheus pushgateway", publisher.exporter.push, settings.prometheus_pushgateway,
                   publisher.labels.get("rank", "0"))
    guard.call("prometheus server", publisher.exporter.linger, settings.prometheus_linger)


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
            if snap.verdict is not None:
                for verdict in VERDICTS:
                    add("gauge", PREFIX + "verdict", "The run's verdict so far (final after finish): 1 for the "
                        "current one", labels, float(verdict == snap.verdict), verdict=verdict)
            for series, name in _series_names(snap.readings).items():
                add("gauge", name, f"leakdoctor series {series!r}, latest sample", labels, snap.readings[series])
            for (cause, state), count in snap.findings.items():
                add("gauge", PREFIX + "findings", "Findings by cause and state (leak, remedied, benign; at the "
                    "end also minor, withdrawn)", labels,
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
