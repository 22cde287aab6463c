"""The Prometheus exporter (prometheus_port=): a real leaking torch loop read over HTTP from 127.0.0.1, a
real Prometheus server scraping it, and the rules around it (loopback only, a registry per doctor, bad
ports refused at construction, a port in use a warning, LOCAL_RANK offsets, nothing on unsampled steps);
the end of the run: the final values served for the linger (also by a process that exits at once) and
pushed to a real Pushgateway."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import json

import psutil
import pytest
from helpers import isolated

from leakdoctor import LeakDoctor, LeakDoctorWarning
from leakdoctor.reporting._exporter import _series_names, metric_name

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def scrape(address: tuple[str, int]) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one GET /metrics."""
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(matches) == 1, (name, labels, sorted(k for k in samples if k[0] == name))
    return matches[0]


def listening(port: int) -> list[tuple[str, int]]:
    """This process's listening sockets on `port`."""
    return [tuple(c.laddr) for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- a leaking torch loop, read over HTTP --------------------------------------------------------------

def test_a_leaking_torch_loop_serves_its_series_finding_and_remedy_on_loopback_only():
    torch = pytest.importorskip("torch")
    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    doctor = TorchDoctor(model=model, optimizer=optimizer, remedies="all", prometheus_port=0, prometheus_linger=0,
                         overhead=1.0, verbose=False)
    address = doctor._publisher.exporter.address
    assert address[0] == "127.0.0.1" and listening(address[1]) == [address]  # nothing on any other address
    labels = {"framework": "torch", "rank": "0"}
    fresh = []  # (scrape, hooks) right after a sampled step, from step 90 on: the gauges are that step's
    for step in range(1, 201):
        model[1].register_forward_hook(lambda module, args, out: None)  # the leak: one more hook every step
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        doctor.step()
        if step >= 90 and value(samples := scrape(address), "leakdoctor_step", **labels) == step:
            fresh.append((samples, sum(len(m._forward_hooks) for m in model.modules())))
    (during, hooks), (after, _) = fresh[0], fresh[-1]  # sampled steps are paced: which ones depends on the load
    assert value(during, "leakdoctor_step", **labels) < value(after, "leakdoctor_step", **labels)
    assert value(during, "leakdoctor_torch_hooks", **labels) == hooks  # the series, as sampled this step
    assert value(during, "leakdoctor_rss_bytes", **labels) > 10 * 2**20
    assert value(during, "leakdoctor_findings", cause="hook_accumulation", state="leak", **labels) == 1
    assert value(during, "leakdoctor_remedies_applied_total", remedy="remove_hooks", **labels) == 1
    assert value(during, "leakdoctor_probe_seconds_total", **labels) > 0
    assert 0 < value(during, "leakdoctor_overhead_fraction", **labels)
    assert value(after, "leakdoctor_findings", cause="hook_accumulation", state="remedied", **labels) == 1
    assert value(after, "leakdoctor_torch_hooks", **labels) < 10  # remove_hooks dropped the repeats
    assert value(after, "leakdoctor_remedies_applied_total", remedy="remove_hooks", **labels) == 1
    summary = doctor.finish()
    assert summary.steps == 200
    hooks_finding = next(f for f in summary.findings if f.cause == "hook_accumulation")
    assert hooks_finding.remedy.effective and not summary.errors, summary.text()
    assert listening(address[1]) == []  # finish() stopped the server
    with pytest.raises(urllib.error.URLError):
        scrape(address)


@pytest.mark.filterwarnings("ignore::leakdoctor.LeakDoctorWarning")  # on_limit="warn" says the same
def test_a_growing_memory_leak_is_projected_to_the_memory_limit():
    doctor = LeakDoctor(prometheus_port=0, prometheus_linger=0, overhead=1.0, memory_limit="2GiB", verbose=False)
    kept = []
    for _ in range(120):
        kept.append(bytearray(400_000))  # 400 kB a step, kept
        doctor.step()
    samples = scrape(doctor._publisher.exporter.address)
    doctor.finish()
    assert value(samples, "leakdoctor_findings", cause="python_objects", state="leak") == 1
    projected = value(samples, "leakdoctor_projected_limit_step")
    assert 120 < projected < 120 + 2 * 2**30 / 300_000  # the limit is reached within (2 GiB / the rate) steps


def test_each_doctor_has_its_own_registry_and_server():
    first, second = (LeakDoctor(prometheus_port=0, prometheus_linger=0, overhead=1.0, verbose=False) for _ in range(2))
    first.watch("len(graph.nodes)", lambda: 7)
    for _ in range(5):
        first.step()
    for _ in range(9):
        second.step()
    a, b = scrape(first._publisher.exporter.address), scrape(second._publisher.exporter.address)
    assert value(a, "leakdoctor_step") == 5 and value(b, "leakdoctor_step") == 9
    assert value(a, "leakdoctor_len_graph_nodes") == 7 and not any(n == "leakdoctor_len_graph_nodes" for n, _ in b)
    assert not any(m.name.startswith("leakdoctor") for m in prometheus_client.REGISTRY.collect())
    first.finish(), second.finish()


def test_unsampled_steps_publish_nothing():
    doctor = LeakDoctor(prometheus_port=0, prometheus_linger=0, verbose=False)  # the default budget: sampled rarely
    calls = []
    publish = doctor._publisher.publish
    doctor._publisher.publish = lambda *args: (calls.append(args[0]), publish(*args))
    for _ in range(5000):
        doctor.step()
    doctor.finish()
    assert 0 < len(calls) < 5000 / 8, len(calls)  # one publish per sample, none in between
    assert calls == sorted(set(calls))


def test_series_names_follow_prometheus_rules_and_never_collide():
    assert metric_name("len(Model.outputs)") == "leakdoctor_len_Model_outputs"
    assert metric_name("mlx_cache_bytes") == "leakdoctor_mlx_cache_bytes"
    assert metric_name("9 lives") == "leakdoctor_9_lives" and metric_name("()") == "leakdoctor_series"
    names = _series_names({"step": 1, "a.b": 2, "a:b": 3, "a b": 4, "findings": 5})
    assert names == {"step": "leakdoctor_step_2", "a.b": "leakdoctor_a_b", "a:b": "leakdoctor_a:b",
                     "a b": "leakdoctor_a_b_2", "findings": "leakdoctor_findings_2"}


# --- the rules around the port -------------------------------------------------------------------------

def test_bad_ports_and_hosts_fail_at_construction():
    for port in (-1, 65536, "9464", True, 9464.0):
        with pytest.raises(ValueError, match="prometheus_port"):
            LeakDoctor(prometheus_port=port)
    for host in ("", "local host", 127):
        with pytest.raises(ValueError, match="prometheus_host"):
            LeakDoctor(prometheus_port=0, prometheus_host=host)
    with pytest.raises(ValueError, match="needs prometheus_port"):
        LeakDoctor(prometheus_host="0.0.0.0")


def test_a_port_in_use_is_a_warning_and_training_goes_on():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.warns(LeakDoctorWarning, match=f"cannot serve /metrics on 127.0.0.1:{port}"):
            doctor = LeakDoctor(prometheus_port=port, overhead=1.0, verbose=False)
        for _ in range(30):
            doctor.step()
        summary = doctor.finish()
    assert summary.steps == 30 and [e["part"] for e in summary.errors] == ["prometheus"]


def test_each_local_rank_serves_base_port_plus_its_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    port = free_port()
    doctor = LeakDoctor(prometheus_port=port - 1, prometheus_linger=0, verbose=False)
    try:
        assert doctor._publisher.exporter.address == ("127.0.0.1", port)
    finally:
        doctor.finish()
    with pytest.raises(ValueError, match="LOCAL_RANK=1"):
        LeakDoctor(prometheus_port=65535)


# --- Keras: one server for the callback's life, both clocks ----------------------------------------------

def keras_fit_metrics() -> dict:
    """A Keras fit (torch backend) with the callback's exporter: what a scrape shows after the fit."""
    import os

    os.environ["KERAS_BACKEND"] = "torch"
    import warnings

    warnings.filterwarnings("ignore")
    import keras
    import numpy as np

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = LeakDoctorCallback(prometheus_port=0, prometheus_linger=0, overhead=1.0, verbose=False)
    model.fit(x, x[:, :1], epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    address = callback.doctor._publisher.exporter.address
    samples = {f"{name}{dict(sorted(labels))}": v for (name, labels), v in scrape(address).items()}
    callback.finish()
    return {"samples": samples, "closed": listening(address[1]) == []}


def test_the_keras_callback_serves_both_clocks_until_it_finishes():
    result = isolated(keras_fit_metrics, timeout=300)
    samples = result["samples"]
    assert samples["leakdoctor_step{'clock': 'call', 'framework': 'keras', 'rank': '0'}"] == 1  # one fit call
    assert samples["leakdoctor_step{'clock': 'batch', 'framework': 'keras', 'rank': '0'}"] == 8  # 2 epochs x 4
    assert samples["leakdoctor_rss_bytes{'clock': 'batch', 'framework': 'keras', 'rank': '0'}"] > 0
    assert result["closed"]


# --- a real Prometheus server --------------------------------------------------------------------------

def test_a_real_prometheus_scrapes_the_exporter(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    doctor = LeakDoctor(prometheus_port=0, prometheus_linger=0, overhead=1.0, verbose=False)
    for _ in range(30):
        doctor.step()
    target = "%s:%d" % doctor._publisher.exporter.address
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: leakdoctor\n    static_configs:\n      - targets: ['{target}']\n")
    server = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    query = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": "leakdoctor_rss_bytes"})
    result: list = []
    try:
        deadline = time.monotonic() + 60
        while not result and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(query, timeout=5) as response:
                    result = json.loads(response.read())["data"]["result"]
            except (urllib.error.URLError, ConnectionError):
                continue  # not listening yet
    finally:
        server.terminate()
        try:
            _, errors = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            _, errors = server.communicate()
        doctor.finish()
    assert result, f"no leakdoctor_rss_bytes in Prometheus after 60 s; prometheus said:\n{errors.decode()[-2000:]}"
    series = result[0]
    assert series["metric"]["__name__"] == "leakdoctor_rss_bytes" and series["metric"]["job"] == "leakdoctor"
    assert series["metric"]["framework"] == "python" and series["metric"]["rank"] == "0"
    assert float(series["value"][1]) > 10 * 2**20


# --- to the end: the final values, served for the linger, pushed to a Pushgateway -------------------------

def verdicts(samples: dict) -> dict[str, float]:
    """{verdict: value} of leakdoctor_verdict."""
    return {dict(labels)["verdict"]: v for (name, labels), v in samples.items() if name == "leakdoctor_verdict"}


def test_the_final_values_are_served_for_the_linger_then_the_port_closes():
    doctor = LeakDoctor(prometheus_port=0, prometheus_linger=1.5, verbose=False)  # a µs step: sampled rarely
    address = doctor._publisher.exporter.address
    for _ in range(3000):
        doctor.step()
    assert value(scrape(address), "leakdoctor_step") < 3000  # the last sample was some steps ago
    finished = time.monotonic()
    summary = doctor.finish()
    after = scrape(address)  # after finish(): still served, with the end of the run
    assert value(after, "leakdoctor_step", framework="python", rank="0") == summary.steps == 3000
    assert verdicts(after) == {"clean": 1, "leak": 0, "remedied": 0, "unwatched": 0}
    assert listening(address[1]) == [address]
    while listening(address[1]) and time.monotonic() - finished < 10:
        time.sleep(0.1)
    assert 1.4 < time.monotonic() - finished < 5  # closed once the linger was over, not before
    with pytest.raises(urllib.error.URLError):
        scrape(address)


LINGERING_SCRIPT = """
import sys, time
from leakdoctor import LeakDoctor
doctor = LeakDoctor(prometheus_port=0, prometheus_linger=float(sys.argv[1]), verbose=False)
for _ in range(2):
    doctor.step()
doctor.finish()
print("%s:%d" % doctor._publisher.exporter.address, time.monotonic(), flush=True)
"""


def default_sigint() -> None:
    """In the child before exec: SIGINT as a shell leaves it, whatever this pytest worker inherited or a
    library in it set (ignored SIGINT is inherited, and Python then installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_lingering(linger: float) -> tuple[subprocess.Popen, tuple[str, int]]:
    """A script that finishes its doctor and exits at once; its exporter's address, once finished."""
    process = subprocess.Popen([sys.executable, "-c", LINGERING_SCRIPT, str(linger)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    host, port = process.stdout.readline().split()[0].split(":")
    return process, (host, int(port))


def test_a_process_that_exits_after_finish_serves_the_linger_and_no_longer():
    process, address = run_lingering(2.0)
    started = time.monotonic()
    try:
        samples = scrape(address)  # the script is past its last line: the exit waits for the linger
        assert value(samples, "leakdoctor_step") == 2
        assert verdicts(samples)["unwatched"] == 1  # 2 steps are not enough to judge
        assert process.wait(timeout=10) == 0
        assert 1.0 < time.monotonic() - started < 6  # it waited out the linger, and not much more
    finally:
        process.kill()
    process, address = run_lingering(600.0)  # a long linger: Ctrl-C ends the wait at once
    try:
        scrape(address)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=10)
        # In the wait, Ctrl-C ends it quietly; on a loaded machine it may come before the wait, as the
        # script ends: Python reports that KeyboardInterrupt, as for any script, and there is no wait.
        errors = process.stderr.read()
        assert errors == "" and process.returncode == 0 or \
            errors.rstrip().endswith("KeyboardInterrupt") and process.returncode == -signal.SIGINT, errors
    finally:
        process.kill()
    with pytest.raises(urllib.error.URLError):
        scrape(address)


def test_a_script_ended_by_ctrl_c_after_finish_does_not_wait_out_the_linger():
    """Ctrl-C that comes as the script ends, before the exit's wait (its KeyboardInterrupt ends the
    script): the exit does not then wait out a linger of 600 s."""
    script = LINGERING_SCRIPT + "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
    process = subprocess.Popen([sys.executable, "-c", script, "600.0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        assert process.wait(timeout=60) == -signal.SIGINT
        assert process.stderr.read().rstrip().endswith("KeyboardInterrupt")
    finally:
        process.kill()


@pytest.fixture
def pushgateway(tmp_path):
    """A real Pushgateway (Debian's prometheus-pushgateway) on a free port: its URL."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        pytest.skip("the Pushgateway binary is not installed (Debian: apt-get install prometheus-pushgateway)")
    port = free_port()
    server = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the Pushgateway did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def pushed_leak(pushgateway: str) -> dict:
    """A leak of 400 kB a step for 123 steps, its final state pushed to `pushgateway` (no port served)."""
    import warnings

    warnings.simplefilter("ignore", LeakDoctorWarning)  # on_limit="warn" says the leak too
    doctor = LeakDoctor(prometheus_pushgateway=pushgateway, overhead=1.0, memory_limit="2GiB", verbose=False)
    kept = []
    for _ in range(123):
        kept.append(bytearray(400_000))  # kept: a leak
        doctor.step()
    summary = doctor.finish()
    return {"summary": summary.to_dict(), "text": summary.text(), "served": doctor._publisher.exporter.address}


def test_the_final_state_is_pushed_to_a_real_pushgateway(pushgateway):
    # in a fresh process: in this one, the leak may fill heap that earlier tests freed, unseen
    run = isolated(pushed_leak, pushgateway)
    summary = run["summary"]
    assert run["served"] is None  # a Pushgateway alone: no port is served
    assert summary["verdict"] == "leak" and not summary["errors"], run["text"]
    url = urllib.parse.urlsplit(pushgateway)
    pushed = scrape((url.hostname, url.port))  # the Pushgateway's own /metrics
    labels = {"job": "leakdoctor", "rank": "0", "framework": "python"}
    assert value(pushed, "leakdoctor_step", **labels) == 123
    assert verdicts(pushed) == {"clean": 0, "leak": 1, "remedied": 0, "unwatched": 0}
    assert value(pushed, "leakdoctor_findings", cause="python_objects", state="leak", **labels) == 1


def test_an_unreachable_pushgateway_is_reported_once_and_the_run_goes_on():
    port = free_port()  # nothing listens there
    doctor = LeakDoctor(prometheus_pushgateway=f"http://127.0.0.1:{port}", verbose=False)
    for _ in range(30):
        doctor.step()
    with pytest.warns(LeakDoctorWarning, match="prometheus pushgateway failed"):
        summary = doctor.finish()
    assert summary.steps == 30 and [e["part"] for e in summary.errors] == ["prometheus pushgateway"]
    with pytest.raises(ValueError, match="prometheus_pushgateway"):
        LeakDoctor(prometheus_pushgateway="not a url")
    for linger in (-1, float("inf"), "20", None):
        with pytest.raises(ValueError, match="prometheus_linger"):
            LeakDoctor(prometheus_port=0, prometheus_linger=linger)
