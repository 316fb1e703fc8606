"""longhaul-exporter against real transfers on loopback.

* an iperf3 transfer: its flows show up in longhaul_tcp_* (sock_diag sees any
  process's sockets on the watched ports) and their counters grow;
* a longhaul transfer (`longhaul serve` + `longhaul send`, CLI of DESIGN.md):
  the engine collector's per-stream counters longhaul_stream_bytes_total grow
  between two scrapes.

Binaries come from $LONGHAUL_DIST (default <repo>/dist; `make build` fills
it). Everything listens on 127.0.0.1 with free ports and is killed at the end.
"""

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

REPO = Path(__file__).resolve().parent.parent
DIST = Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))
EXPORTER = DIST / "longhaul-exporter"
LONGHAUL = DIST / "longhaul"

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


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
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"unparsable sample line {line!r}"
        labels = dict(LABEL_RE.findall(m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
    return samples


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


def test_iperf3_flows_appear_in_tcp_metrics(procs):
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
    # Rate-limited so the counters grow steadily on a busy 2-core box.
    client = procs.start(
        [iperf3, "-c", "127.0.0.1", "-p", port, "-t", "5", "-b", "2G"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    first = scrape(addr)
    time.sleep(2.0)
    second = scrape(addr)
    client.wait(timeout=30)

    assert success(second, "tcp") == 1.0
    # Client side: sockets whose remote port is the iperf3 server's.
    sent1 = {
        k: v
        for k, v in series(first, "longhaul_tcp_bytes_acked_total").items()
        if dict(k)["remote"].endswith(f":{port}")
    }
    sent2 = {
        k: v
        for k, v in series(second, "longhaul_tcp_bytes_acked_total").items()
        if dict(k)["remote"].endswith(f":{port}")
    }
    assert sent1, f"no iperf3 client flows in the first scrape: {first}"
    data_flow = max(sent2, key=sent2.get)
    assert data_flow in sent1, "the data flow kept its labels"
    assert sent2[data_flow] > sent1[data_flow] > 1_000_000, (sent1, sent2)
    # Server side: bytes received on the listening port grow too.
    recv1 = series(first, "longhaul_tcp_bytes_received_total")
    recv2 = series(second, "longhaul_tcp_bytes_received_total")
    server_flows = [k for k in recv2 if dict(k)["local"] == f"127.0.0.1:{port}"]
    assert server_flows
    assert max(recv2[k] for k in server_flows) > max(recv1.get(k, 0) for k in server_flows)
    for name in (
        "longhaul_tcp_rtt_seconds",
        "longhaul_tcp_cwnd_bytes",
        "longhaul_tcp_retransmits_total",
    ):
        assert data_flow in series(second, name), name


def test_longhaul_stream_counters_grow(procs):
    need(LONGHAUL)
    port, stats = free_port(), free_port()
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
    # The same transfer is visible to the tcp collector too.
    assert series(second, "longhaul_tcp_bytes_received_total"), "no tcp flows on the data port"
