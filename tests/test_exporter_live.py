"""longhaul-exporter against real transfers on loopback.

* iperf3 transfers: their flows show up in longhaul_tcp_* (sock_diag sees any
  process's sockets on the watched ports) under stable labels (peer, port
  range, flow slot), the same for a second run, and the counters only grow;
* a longhaul transfer (`longhaul serve` + `longhaul send`, CLI of DESIGN.md):
  the engine collector's per-stream counters longhaul_stream_bytes_total grow
  between two scrapes, the engine port's admission counters count the
  session, and the tcp collector, although it watches the engine's
  port, reports none of longhaul's sockets (the engine collector does).

Binaries come from $LONGHAUL_DIST (default <repo>/dist; `make build` fills
it). Everything listens on 127.0.0.1 with free ports and is killed at the end.
"""

import calendar
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import helpers

REPO = Path(__file__).resolve().parent.parent
DIST = Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))
EXPORTER = DIST / "longhaul-exporter"
LONGHAUL = DIST / "longhaul"



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class Procs:
    """Processes started by a test; all killed at teardown."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen([str(a) for a in args], **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.stop()


def need(path):
    assert path.is_file() and os.access(
        path, os.X_OK
    ), f"{path} missing: run `make build` or point LONGHAUL_DIST at target/release"


def start_exporter(procs, *args):
    need(EXPORTER)
    p = procs.start(
        [EXPORTER, "--web.listen-address=127.0.0.1:0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found = {}
    ready = threading.Event()
    log = []

    def reader():
        for line in p.stderr:
            log.append(line)
            m = re.search(r"listening on (\S+)", line)
            if m and not ready.is_set():
                found["addr"] = m.group(1)
                ready.set()

    threading.Thread(target=reader, daemon=True).start()
    assert ready.wait(15), f"exporter did not start: {''.join(log)}"
    return found["addr"], log


def scrape(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return helpers.parse_exposition(text)


def series(samples, name, **match):
    return {
        tuple(sorted(l.items())): v
        for n, l, v in samples
        if n == name and all(l.get(k) == v for k, v in match.items())
    }


def success(samples, collector):
    return series(samples, "longhaul_exporter_collector_success", collector=collector)[
        (("collector", collector),)
    ]


def run_iperf3(procs, iperf3, port, seconds):
    # Rate-limited so the counters grow steadily on a busy 2-core box.
    return procs.start(
        [iperf3, "-c", "127.0.0.1", "-p", port, "-t", str(seconds), "-b", "2G"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_every_log_line_starts_with_an_rfc3339_utc_timestamp(procs):
    # As the engine's log: lines of several hosts' exporters sort and
    # correlate without journald (containers, plain shells).
    before = time.time()
    addr, log = start_exporter(procs)
    scrape(addr)
    exporter = procs.procs[-1]
    exporter.terminate()
    exporter.wait(timeout=10)
    deadline = time.monotonic() + 5
    while not any("shutting down" in line for line in log) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line.rstrip("\n") for line in log]
    assert any("listening on" in line for line in lines), lines
    assert any("signal received, shutting down" in line for line in lines), lines
    for line in lines:
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z longhaul-exporter: ", line)
        assert m, f"no RFC 3339 UTC timestamp first: {line!r}"
        stamp = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f"))
        assert before - 2 <= stamp <= time.time() + 2, f"{line!r} is not the time it was written"


def test_iperf3_flows_appear_in_tcp_metrics_under_stable_labels(procs):
    iperf3 = shutil.which("iperf3")
    assert iperf3, "iperf3 (Debian package iperf3) must be installed"
    port = free_port()
    procs.start(
        [iperf3, "-s", "-B", "127.0.0.1", "-p", port],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    addr, _ = start_exporter(
        procs, f"--collector.tcp.ports={port}", "--no-collector.engine", "--no-collector.raid"
    )
    group = (("ports", str(port)), ("remote", "127.0.0.1"))
    client = run_iperf3(procs, iperf3, port, 5)
    time.sleep(1.5)
    first = scrape(addr)
    time.sleep(2.0)
    second = scrape(addr)
    client.wait(timeout=30)

    assert success(second, "tcp") == 1.0
    # One group per peer and port range: ephemeral ports are no label.
    sent1 = series(first, "longhaul_tcp_bytes_acked_total")
    sent2 = series(second, "longhaul_tcp_bytes_acked_total")
    assert list(sent1) == [group], sent1
    assert sent2[group] > sent1[group] > 1_000_000, (sent1, sent2)
    recv1 = series(first, "longhaul_tcp_bytes_received_total")
    recv2 = series(second, "longhaul_tcp_bytes_received_total")
    assert recv2[group] > recv1[group]
    assert series(second, "longhaul_tcp_connections")[group] >= 2  # iperf3 control + data
    flows = {dict(k)["flow"] for k in series(second, "longhaul_tcp_rtt_seconds")}
    assert flows and flows <= {"0", "1", "2", "3"}, flows
    for name in ("longhaul_tcp_cwnd_bytes", "longhaul_tcp_retransmits_total"):
        assert series(second, name), name

    # A second run: new connections on new ephemeral ports, the same series;
    # the counters of the ended run are kept (they never go down).
    time.sleep(1.0)
    ended = scrape(addr)
    assert series(ended, "longhaul_tcp_bytes_acked_total")[group] >= sent2[group]
    client = run_iperf3(procs, iperf3, port, 4)
    time.sleep(1.5)
    during = scrape(addr)
    client.wait(timeout=30)
    assert tcp_series(during) == tcp_series(second), "new connections made new series"
    assert (
        series(during, "longhaul_tcp_bytes_acked_total")[group]
        > series(ended, "longhaul_tcp_bytes_acked_total")[group]
    )


def tcp_series(samples):
    return {(n, tuple(sorted(l.items()))) for n, l, _ in samples if n.startswith("longhaul_tcp_")}


def test_longhaul_stream_counters_grow(procs):
    need(LONGHAUL)
    port, stats = free_port(), free_port()
    launched = time.time()
    procs.start(
        [
            LONGHAUL,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--stats-listen",
            f"127.0.0.1:{stats}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    wait_port(stats)
    addr, log = start_exporter(
        procs,
        f"--engine.url=http://127.0.0.1:{stats}",
        f"--collector.tcp.ports={port}",
        "--no-collector.raid",
    )
    sender = procs.start(
        [LONGHAUL, "send", "--to", f"127.0.0.1:{port}", "--streams", "4", "--time", "6"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    first = scrape(addr)
    time.sleep(2.0)
    second = scrape(addr)
    _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, f"longhaul send failed: {err}"

    assert success(second, "engine") == 1.0, "".join(log)
    s1 = series(first, "longhaul_stream_bytes_total")
    s2 = series(second, "longhaul_stream_bytes_total")
    streams = {dict(k)["stream"] for k in s2}
    assert len(streams) >= 4, f"want 4 streams, got {sorted(streams)}"
    for key, v2 in s2.items():
        assert key in s1, f"stream {dict(key)} missing from the first scrape"
        assert v2 > s1[key], f"stream {dict(key)} did not grow: {s1[key]} -> {v2}"
    sessions = series(second, "longhaul_session_info")
    assert sessions, "no longhaul_session_info"
    protocols = {dict(k).get("protocol") for k in sessions}
    assert protocols == {"longhaul"}, f"a longhaul send is not protocol=longhaul: {sessions}"
    # The engine's port: the session's control connection admitted, its 4
    # streams and wait_port's probes accepted, nothing dropped.
    admission = {
        name: series(second, name, listener="longhaul")
        for name in ("longhaul_admission_accepted_total", "longhaul_admission_admitted_total")
    }
    assert list(admission["longhaul_admission_admitted_total"].values()) == [1.0], admission
    assert list(admission["longhaul_admission_accepted_total"].values())[0] >= 5.0, admission
    dropped = series(second, "longhaul_admission_dropped_total", listener="longhaul")
    assert sorted(dict(k)["reason"] for k in dropped) == ["evicted", "expired", "garbage"], dropped
    assert set(dropped.values()) == {0.0}, dropped
    # The engine's own counters: one session begun, none failed, and the
    # start time of the serve process this test launched.
    engine = {
        name: series(second, name)[()]
        for name in ("longhaul_sessions_total", "longhaul_sessions_failed_total", "longhaul_engine_start_time_seconds")
    }
    assert engine["longhaul_sessions_total"] == 1.0 and engine["longhaul_sessions_failed_total"] == 0.0, engine
    assert launched - 1 <= engine["longhaul_engine_start_time_seconds"] <= launched + 10, (launched, engine)
    # The engine collector reports longhaul's sockets; the tcp collector,
    # watching the engine's port, leaves both loopback ends of every stream
    # (and the control connection) to it: no series twice.
    assert success(second, "tcp") == 1.0
    tcp = [(n, l) for n, l, _ in first + second if n.startswith("longhaul_tcp_")]
    assert not tcp, f"longhaul's sockets reported by the tcp collector too: {tcp}"
    # A client killed mid-transfer: the server ends that session as failed,
    # and the counter says so.
    killed = procs.start(
        [LONGHAUL, "send", "--to", f"127.0.0.1:{port}", "--streams", "2", "--time", "30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    killed.kill()
    killed.wait(timeout=10)
    deadline = time.time() + 30
    while True:
        third = scrape(addr)
        failed = series(third, "longhaul_sessions_failed_total").get(())
        if failed == 1.0 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert (series(third, "longhaul_sessions_total")[()], failed) == (2.0, 1.0), "".join(log)


def start_engine(procs):
    """`longhaul serve` on free loopback ports: (data port, stats port)."""
    need(LONGHAUL)
    port, stats = free_port(), free_port()
    procs.start(
        [LONGHAUL, "serve", "--listen", f"127.0.0.1:{port}", "--stats-listen", f"127.0.0.1:{stats}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    wait_port(stats)
    return port, stats


def start_transfer(procs, port, streams, seconds):
    # Rate-limited: the point is many streams, not a busy CPU.
    return procs.start(
        [LONGHAUL, "send", "--to", f"127.0.0.1:{port}", "--streams", str(streams),
         "--rate", "400M", "--time", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_streams(addr, want, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(addr)
        bytes_ = series(samples, "longhaul_stream_bytes_total")
        if len({dict(k)["stream"] for k in bytes_}) >= want:
            return samples
        assert time.monotonic() < deadline, f"fewer than {want} streams listed: {sorted(bytes_)[:5]}"
        time.sleep(0.3)


def test_a_100_stream_session_exports_at_most_6_series_per_stream_and_3_per_session(procs):
    # Issue 45's series budget: a stream exports the bytes it delivered (at
    # its receiving end) and its sending end's TCP state, once; a session
    # its info and its bytes each way. Before, 14 per stream.
    port, stats = start_engine(procs)
    addr, log = start_exporter(procs, f"--engine.url=http://127.0.0.1:{stats}", "--no-collector.raid")
    sender = start_transfer(procs, port, 100, 6)
    samples = wait_for_streams(addr, 100)
    # Counters of the sending ends are reported once a second: wait for them.
    deadline = time.monotonic() + 15
    while len(series(samples, "longhaul_stream_rtt_seconds")) < 100:
        assert time.monotonic() < deadline, "".join(log)
        time.sleep(0.3)
        samples = scrape(addr)
    _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err
    [session] = {dict(k)["session"] for k in series(samples, "longhaul_session_info")}
    per_stream, per_session = {}, []
    for name, labels, _ in samples:
        if labels.get("session") != session or name == "longhaul_device_io_bytes_total":
            continue
        if "stream" in labels:
            per_stream.setdefault(labels["stream"], []).append((name, labels.get("direction")))
        else:
            per_session.append(name)
    assert len(per_stream) == 100, sorted(per_stream)
    worst = max(per_stream.values(), key=len)
    assert len(worst) <= 6, worst
    assert len(per_session) <= 3, per_session
    # What each stream carries: delivered bytes at the receiving end, TCP
    # state at the sending end, nothing twice.
    assert sorted(worst) == sorted(
        [("longhaul_stream_bytes_total", "receive")]
        + [(n, "send") for n in (
            "longhaul_stream_rtt_seconds",
            "longhaul_stream_cwnd_bytes",
            "longhaul_stream_retransmits_total",
            "longhaul_stream_segments_sent_total",
            "longhaul_stream_pacing_rate_bytes_per_second",
        )]
    ), worst


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def get_from(source, addr, headers, timeout=15.0):
    """GET /metrics from a chosen source address: (status, body)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout, source_address=(source, 0)) as s:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{head}Connection: close\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.1",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}
# Seconds per phase of the flood test (issue 40 asks for 60; CI runs
# shorter phases, which show the same as long as the distinguished scraper
# gets several scrapes in each).
FLOOD_PHASE = float(os.environ.get("LONGHAUL_FLOOD_PHASE", "6"))
RSS_BUDGET_KIB = 30 * 1024


def test_a_flood_of_scrapers_from_one_source_leaves_prometheus_answered_within_30_mib(procs):
    # Issue 40: with 4, 8 and 32 clients scraping in a loop from one
    # address during a 100-stream transfer, a scraper at another address
    # (127.0.0.2, as Prometheus would be) gets every scrape, and the
    # exporter stays within its 30 MiB. Before, 12 of 15 Prometheus scrapes
    # got 503 with 4 such clients, 14-15 with 8 or 32.
    port, stats = start_engine(procs)
    addr, log = start_exporter(procs, f"--engine.url=http://127.0.0.1:{stats}", "--no-collector.raid")
    exporter = procs.procs[-1]
    sender = start_transfer(procs, port, 100, int(3 * FLOOD_PHASE + 30))
    wait_for_streams(addr, 100)

    stop = threading.Event()
    flood_answers = {}
    lock = threading.Lock()

    def flood():
        while not stop.is_set():
            try:
                status, _ = get_from("127.0.0.1", addr, {})
            except OSError as e:
                status = type(e).__name__
            with lock:
                flood_answers[status] = flood_answers.get(status, 0) + 1

    peak = [0]

    def watch_rss():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(exporter.pid)[0])
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_rss, daemon=True)
    watcher.start()
    threads = []
    failures, answered = [], 0
    try:
        for clients in (4, 8, 32):
            while len(threads) < clients:
                t = threading.Thread(target=flood, daemon=True)
                t.start()
                threads.append(t)
            end = time.monotonic() + FLOOD_PHASE
            while time.monotonic() < end:
                started = time.monotonic()
                try:
                    status, body = get_from("127.0.0.2", addr, PROMETHEUS_HEADERS)
                except OSError as e:
                    status, body = type(e).__name__, b""
                text = body.decode(errors="replace")
                took = time.monotonic() - started
                ok = (
                    took < 10.0  # Prometheus' default scrape timeout
                    and status == 200
                    and text.endswith("# EOF\n")
                    and 'longhaul_exporter_collector_success{collector="engine"} 1' in text
                    and text.count("longhaul_stream_bytes_total{") >= 100
                )
                if ok:
                    answered += 1
                else:
                    failures.append((clients, status, round(took, 2), text[:200]))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=20)
        watcher.join(timeout=5)
    hwm = rss_kib(exporter.pid)[1]
    sender.kill()
    assert not failures, f"{len(failures)} of {len(failures) + answered} distinguished scrapes failed: {failures[:5]}"
    assert answered >= 3 * int(FLOOD_PHASE) - 3, answered
    # The flood was real: its clients were answered, and turned away.
    assert flood_answers.get(200, 0) > 10 and flood_answers.get(503, 0) > 10, flood_answers
    assert peak[0] < RSS_BUDGET_KIB and hwm < RSS_BUDGET_KIB, (peak[0], hwm, "".join(log[-5:]))
