"""`longhaul serve --iperf3-listen` against Debian's iperf3 client (issue 22),
on loopback with the release binaries ($LONGHAUL_DIST, `make build`).

* every test shape of the issue (`-P 1/8/128`, `-R`, `--bidir`, `-n 1G`,
  `-w 2M`, `-C cubic`, `-u -b 1G`), each with `-J`: exit 0, and the sender
  and receiver sums present and consistent (equal bytes where longhaul
  receives; where the iperf3 client receives it stops reading at TEST_END,
  as against iperf3's own server, so it may count a little less);
* 16 clients at once: all exit 0, and the stats API lists 16 running iperf3
  sessions with their streams meanwhile;
* hostile input on the iperf3 port: random bytes, a wrong cookie on a data
  connection, a 1 GiB parameter length, truncated JSON, a client vanishing
  in every protocol state, 300 silent connections held past the admission
  deadline; after each a real client succeeds and the server's memory stays
  bounded; one source stalling 16, then 200, tests after their parameters
  (reopened when cut) while real clients from 127.0.0.2 succeed throughout,
  the refusals counted in the stats API and the exporter;
* iperf3 authentication: the right user and key succeed, a wrong password
  and an unknown user are refused with iperf3's own error text.
"""

import json
import os
import socket
import struct
import subprocess
import time
import uuid
from types import SimpleNamespace

import pytest

import helpers
import hostile

LONGHAUL = helpers.dist_dir() / "longhaul"
IPERF3 = "/usr/bin/iperf3"

# iperf3's state bytes (signed chars on the wire).
TEST_START, TEST_RUNNING, TEST_END = 1, 2, 4
PARAM_EXCHANGE, CREATE_STREAMS = 9, 10
EXCHANGE_RESULTS, DISPLAY_RESULTS, IPERF_DONE = 13, 14, 16
SERVER_ERROR = 0xFE  # -2

# Longer than the engine's 10 s admission deadline.
HOLD_S = 12.0
# The server's resident memory after any hostile input.
MAX_RSS_MIB = 256


def need_binaries():
    assert LONGHAUL.is_file(), f"{LONGHAUL} missing: run `make build` or set LONGHAUL_DIST"
    if not os.access(IPERF3, os.X_OK):
        helpers.cannot_run(f"{IPERF3} is missing (Debian package iperf3)")


def start_server(processes, name, *extra):
    need_binaries()
    iperf3 = helpers.free_port()
    proc, _, stats = helpers.start_engine(
        processes, "--iperf3-listen", f"127.0.0.1:{iperf3}", *extra, name=name
    )
    processes.wait_port(proc, iperf3)
    return SimpleNamespace(proc=proc, port=iperf3, stats=stats, name=name, processes=processes)


@pytest.fixture(scope="module")
def server(module_processes):
    # Every client here comes from 127.0.0.1: it may take every slot.
    return start_server(
        module_processes,
        "serve-iperf3",
        "--iperf3-max-tests",
        "32",
        "--iperf3-max-tests-per-source",
        "32",
    )


def run_iperf3(port, *args, timeout=120, env=None):
    """Runs Debian's client with -J; returns (exit code, parsed JSON, stderr)."""
    result = subprocess.run(
        [IPERF3, "-c", "127.0.0.1", "-p", str(port), "-J", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    try:
        data = json.loads(result.stdout)
    except ValueError:
        data = None
    return result.returncode, data, result.stderr


def iperf3_ok(server, *args, timeout=120):
    rc, data, stderr = run_iperf3(server.port, *args, timeout=timeout)
    assert rc == 0 and data is not None and "error" not in data, (
        f"iperf3 {args}: exit {rc}, error {data and data.get('error')}, stderr {stderr}\n"
        f"server log:\n{server.processes.log(server.name)[-4000:]}"
    )
    return data


def log_count(server, text):
    return server.processes.log(server.name).count(text)


def logs_anew(server, text, before):
    """Waits for the server's log to hold `text` more than `before` times.
    The server writes why it ended a test after it told the client, so the
    client can exit before the line is written."""
    try:
        helpers.wait_until(
            lambda: log_count(server, text) > before, 10, f"the server to log {text!r}", 0.1
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\nserver log:\n{server.processes.log(server.name)[-4000:]}")


def check_tcp_sums(end, sent_key, received_key, longhaul_receives, streams):
    sent = end[sent_key]["bytes"]
    received = end[received_key]["bytes"]
    assert sent > 0 and received > 0, (sent_key, sent, received_key, received)
    if longhaul_receives:
        assert received == sent, f"{received_key} {received} != {sent_key} {sent}"
    else:
        # What was in flight when the client stopped reading at TEST_END.
        slack = max(sent // 10, streams * (8 << 20))
        assert sent - slack <= received <= sent, f"{received_key} {received} vs {sent_key} {sent}"


def listening(port):
    """Whether a socket listens on TCP `port` (IPv4 or IPv6), from /proc."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in lines.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def rss_mib(proc):
    with open(f"/proc/{proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def sessions(server):
    return helpers.get_json(f"http://127.0.0.1:{server.stats}/v1/sessions")["sessions"]


def still_serves(server):
    """A real client succeeds, and the server's memory is bounded."""
    server.processes.check_running(server.proc)
    data = iperf3_ok(server, "-t", 1, "-P", 2)
    check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 2)
    assert rss_mib(server.proc) < MAX_RSS_MIB


# ------------------------------------------------------------ test shapes

TCP_SHAPES = [
    pytest.param(["-P", 1], id="P1"),
    pytest.param(["-P", 8], id="P8"),
    pytest.param(["-P", 128], id="P128"),
    pytest.param(["-R"], id="reverse"),
    pytest.param(["--bidir"], id="bidir"),
    pytest.param(["-w", "2M"], id="window-2M"),
    pytest.param(["-C", "cubic"], id="cc-cubic"),
    pytest.param(["-Z"], id="zerocopy"),
    pytest.param(["-M", "1400"], id="mss-1400"),
    pytest.param(["--get-server-output"], id="server-output"),
]


@pytest.mark.parametrize("args", TCP_SHAPES)
def test_iperf3_client_tcp_shapes(server, args):
    data = iperf3_ok(server, "-t", 2, *args)
    end = data["end"]
    streams = int(args[1]) if args[0] == "-P" else 1
    reverse = "-R" in args
    assert len(end["streams"]) == streams * (2 if "--bidir" in args else 1)
    check_tcp_sums(end, "sum_sent", "sum_received", not reverse, streams)
    if "--bidir" in args:
        check_tcp_sums(end, "sum_sent_bidir_reverse", "sum_received_bidir_reverse", False, 1)
    if "--get-server-output" in args:
        assert "longhaul" in data["server_output_text"], data.get("server_output_text")
    if "-C" in args:
        assert end["sender_tcp_congestion"] == "cubic"
        assert end["receiver_tcp_congestion"] == "cubic"


def test_iperf3_client_bytes_limit(server):
    data = iperf3_ok(server, "-n", "1G")
    end = data["end"]
    assert end["sum_sent"]["bytes"] == 1 << 30
    assert end["sum_received"]["bytes"] == 1 << 30


def test_iperf3_client_blocks_limit(server):
    data = iperf3_ok(server, "-k", 2000)
    end = data["end"]
    assert end["sum_sent"]["bytes"] == end["sum_received"]["bytes"] == 2000 * 131072


# -O: a paced test, so the counted bytes tell the counted seconds.
OMIT_RATE_BPS = 200_000_000
OMIT_S, OMIT_TIME_S = 1, 2


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_iperf3_client_omits_the_first_seconds(server, reverse):
    args = ["-t", OMIT_TIME_S, "-O", OMIT_S, "-b", OMIT_RATE_BPS] + (["-R"] if reverse else [])
    data = iperf3_ok(server, *args)
    omitted = [i["sum"]["omitted"] for i in data["intervals"]]
    assert omitted[:OMIT_S] == [True] * OMIT_S and not any(omitted[OMIT_S:]), omitted
    end = data["end"]
    want = OMIT_RATE_BPS / 8 * OMIT_TIME_S
    for key in ("sum_sent", "sum_received"):
        # Both ends count -t's seconds only: with the omitted second the
        # sums would be 1.5x this.
        assert abs(end[key]["seconds"] - OMIT_TIME_S) < 0.2, (key, end[key])
        assert 0.9 * want <= end[key]["bytes"] <= 1.1 * want, (key, end[key]["bytes"], want)
    # The two ends stop counting the omitted seconds at their own instants,
    # each on its own timer, and the receiver also counts what sat in its
    # socket buffer then. Idle, they agree within a block (0.26 %); with the
    # CPUs busy they differed by up to 0.56 % here and by 1.05 % (4 blocks,
    # 21 ms at this rate) once in CI. 3 % is 60 ms; an end that counted the
    # omitted second would be off by 50 %.
    sent, received = end["sum_sent"]["bytes"], end["sum_received"]["bytes"]
    assert abs(sent - received) <= 0.03 * sent, (sent, received)


def test_unsupported_option_is_refused_with_iperf3s_error(server):
    _, data, _ = run_iperf3(server.port, "-t", 1, "-L", 5)
    assert data["error"] == "an option you are trying to set is not implemented yet"
    still_serves(server)


def test_iperf3_client_udp(server):
    data = iperf3_ok(server, "-t", 2, "-u", "-b", "1G")
    sent, received = data["end"]["sum_sent"], data["end"]["sum_received"]
    assert sent["packets"] > 1000 and sent["bytes"] > 0
    # The receiver counts up to the highest sequence number it saw: what it
    # missed below it is its loss figure; the last few datagrams may arrive
    # after TEST_END (not counted, as in iperf3) on a loaded machine.
    assert sent["packets"] - 64 <= received["packets"] <= sent["packets"]
    assert 0 <= received["lost_packets"] <= received["packets"]
    assert 0 < received["bytes"] <= sent["bytes"]
    assert received["jitter_ms"] >= 0


# ------------------------------------------------------------ many at once


def start_exporter(server):
    exporter = helpers.dist_dir() / "longhaul-exporter"
    assert exporter.is_file(), f"{exporter} missing: run `make build`"
    port = helpers.free_port()
    proc = server.processes.start(
        "exporter",
        [
            exporter,
            f"--web.listen-address=127.0.0.1:{port}",
            f"--engine.url=http://127.0.0.1:{server.stats}",
            "--no-collector.tcp",
            "--no-collector.raid",
        ],
    )
    server.processes.wait_port(proc, port)
    return port


def exported_streams(port):
    """{session: set of streams} of longhaul_stream_bytes_total, and
    {session: protocol label} of longhaul_session_info, from one scrape."""
    text = helpers.http_get(f"http://127.0.0.1:{port}/metrics")
    streams, info = {}, {}
    for line in text.splitlines():
        if line.startswith(("longhaul_stream_bytes_total{", "longhaul_session_info{")):
            labels = dict(
                pair.split("=", 1) for pair in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            session = labels["session"].strip('"')
            if line.startswith("longhaul_session_info"):
                info[session] = labels.get("protocol", "").strip('"')
            else:
                streams.setdefault(session, set()).add(labels["stream"].strip('"'))
    return streams, info


# Each client's test outlasts the time the sixteen take to start on a busy
# machine, at a rate that leaves the machine's CPU to the control exchanges:
# CI run P (8 s tests at full speed beside the lab and Molecule) never saw the
# sixteen running at once, the first ones ending before the last had started.
# Long enough that sixteen clients started one after the other on a machine
# busy with the lab beside us still overlap (CI R: at 20 s, 30 s of waiting
# never saw all sixteen running at once, beside the lab's two-pair transfers).
ALL_AT_ONCE_SECONDS = "30"
ALL_AT_ONCE_RATE = "20M"  # per stream: 16 x 2 x 20 Mb/s in all


def ended_client(client):
    """An ended client's exit status, iperf3's error and its stderr."""
    out, err = client.communicate()
    try:
        error = json.loads(out).get("error")
    except ValueError:
        error = out[-300:]
    return {"exit": client.returncode, "error": error, "stderr": err[-300:]}


def test_16_iperf3_clients_at_once(server):
    exporter = start_exporter(server)
    clients = [
        subprocess.Popen(
            [IPERF3, "-c", "127.0.0.1", "-p", str(server.port), "-J", "-t", ALL_AT_ONCE_SECONDS,
             "-b", ALL_AT_ONCE_RATE, "-P", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    try:

        last = {}

        def sixteen_running():
            ended = [i for i, c in enumerate(clients) if c.poll() is not None]
            # A client that ended before all sixteen ran can never make
            # sixteen: say why at once, with what it printed.
            assert not ended, [ended_client(clients[i]) for i in ended]
            iperf3 = [s for s in sessions(server) if s["protocol"] == "iperf3"]
            last["states"] = sorted((s["state"], len(s["streams"])) for s in iperf3)
            running = [s for s in iperf3 if s["state"] == "running"]
            with_streams = [s for s in running if len(s["streams"]) == 2]
            return len(with_streams) == 16 and running

        try:
            seen = helpers.wait_until(sixteen_running, 45, "16 running iperf3 sessions", 0.2)
        except AssertionError as error:
            raise AssertionError(f"{error}; the server's iperf3 sessions last seen (state, streams): {last}") from None
        assert all(st["bytes"] >= 0 and st["local"] for s in seen for st in s["streams"])
        # The exporter shows the same 16 sessions as iperf3 tests, each with
        # its 2 streams.
        streams, info = exported_streams(exporter)
        for s in seen:
            assert info.get(s["id"]) == "iperf3", (s["id"], info)
            assert len(streams.get(s["id"], ())) == 2, (s["id"], streams.get(s["id"]))
        outputs = [c.communicate(timeout=90) for c in clients]
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait()
    for c, (out, err) in zip(clients, outputs):
        data = json.loads(out)
        assert c.returncode == 0 and "error" not in data, (c.returncode, data.get("error"), err)
        check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 2)


def test_a_source_allowed_16_tests_may_exchange_16_parameter_blocks_at_once(server):
    """The server allows 32 tests per source and says nothing of pending
    connections: 16 clients of one host in their parameter exchange at once
    (a loaded machine's 16 clients started together) all stay. Before, the
    pending limit stayed 8 whatever the tests per source, the ninth pushed
    the first out, and CI's 16-client test saw "control socket has closed
    unexpectedly"."""
    clients = [HandClient(server) for _ in range(16)]
    try:
        for c in clients:
            c.run_until("cookie")
        time.sleep(0.5)
        cut = [i for i, c in enumerate(clients) if closed_by_server(c.control, 0.05)]
        assert not cut, f"clients {cut} of 16 were pushed out of their parameter exchange"
        # Each goes on to its test.
        for c in clients:
            c._params()
    finally:
        for c in clients:
            c.vanish()
    still_serves(server)


# ------------------------------------------------------------ hostile input


def connect(server, timeout=15.0):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    s.settimeout(timeout)
    return s


def new_cookie():
    return uuid.uuid4().hex[:36].ljust(36, "x").encode() + b"\0"


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def closed_by_server(s, within):
    """True when the server closes `s` (EOF or reset) within `within` s;
    whatever it says first is read and dropped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
    return False


def send_block(s, obj):
    body = json.dumps(obj).encode()
    s.sendall(struct.pack(">I", len(body)) + body)


def read_block(s):
    (n,) = struct.unpack(">I", recv_exact(s, 4))
    return json.loads(recv_exact(s, n))


def params(seconds=2, parallel=1):
    return {
        "tcp": True,
        "omit": 0,
        "time": seconds,
        "num": 0,
        "blockcount": 0,
        "parallel": parallel,
        "len": 131072,
        "pacing_timer": 1000,
        "client_version": "3.12",
    }


def test_random_bytes(server):
    for first in (b"\x00", b"A"):  # not a cookie at once, and later
        s = connect(server)
        s.sendall(first + os.urandom(64 << 10))
        assert closed_by_server(s, HOLD_S + 5), "random bytes: the server kept the connection"
        s.close()
    still_serves(server)


def test_wrong_cookie_on_a_data_connection(server):
    cookie = new_cookie()
    control = connect(server)
    control.sendall(cookie)
    assert recv_exact(control, 1)[0] == PARAM_EXCHANGE
    send_block(control, params())
    assert recv_exact(control, 1)[0] == CREATE_STREAMS
    # A data connection with a cookie of no test is not one of this test's
    # streams: the server takes it for a new test's control connection.
    wrong = connect(server)
    wrong.sendall(new_cookie())
    assert recv_exact(wrong, 1)[0] == PARAM_EXCHANGE
    # The test still waits for its one stream: the right cookie starts it.
    data = connect(server)
    data.sendall(cookie)
    assert recv_exact(control, 1)[0] == TEST_START
    assert recv_exact(control, 1)[0] == TEST_RUNNING
    # A second stream with the right cookie is one too many.
    extra = connect(server)
    extra.sendall(cookie)
    assert closed_by_server(extra, 15), "a stream beyond the test's count was kept"
    for s in (wrong, data, extra, control):
        s.close()
    still_serves(server)


def test_parameter_block_of_1_gib(server):
    before = rss_mib(server.proc)
    s = connect(server)
    s.sendall(new_cookie())
    assert recv_exact(s, 1)[0] == PARAM_EXCHANGE
    s.sendall(struct.pack(">I", 1 << 30) + b'{"tcp":true' + b" " * 65536)
    # iperf3's SERVER_ERROR state, then the error code and errno.
    answer = b""
    try:
        while len(answer) < 9:
            chunk = s.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    except ConnectionResetError:
        pass
    s.close()
    assert answer[:1] == bytes([SERVER_ERROR]), answer
    assert rss_mib(server.proc) < before + 32
    still_serves(server)


def test_truncated_json(server):
    # The length promises more than comes, and the client stops sending.
    s = connect(server)
    s.sendall(new_cookie())
    assert recv_exact(s, 1)[0] == PARAM_EXCHANGE
    body = json.dumps(params()).encode()
    s.sendall(struct.pack(">I", len(body)) + body[: len(body) // 2])
    s.shutdown(socket.SHUT_WR)
    assert closed_by_server(s, 5), "truncated parameters: the connection stayed open"
    s.close()
    # The length matches, the JSON inside is cut short.
    s = connect(server)
    s.sendall(new_cookie())
    assert recv_exact(s, 1)[0] == PARAM_EXCHANGE
    cut = body[: len(body) // 2]
    s.sendall(struct.pack(">I", len(cut)) + cut)
    assert recv_exact(s, 1)[0] == SERVER_ERROR
    assert closed_by_server(s, 5)
    s.close()
    # The length is right and then nothing more: cut at the deadline.
    s = connect(server)
    s.sendall(new_cookie())
    assert recv_exact(s, 1)[0] == PARAM_EXCHANGE
    s.sendall(struct.pack(">I", len(body)) + body[:10])
    assert closed_by_server(s, HOLD_S + 5), "stalled parameters outlived the deadline"
    s.close()
    still_serves(server)


class HandClient:
    """iperf3's client side of a 1-stream TCP test, step by step, so a test
    can vanish after any of them."""

    STEPS = [
        "connected",
        "cookie",
        "params",
        "streams",
        "running",
        "test_end",
        "results",
    ]

    def __init__(self, server):
        self.server = server
        self.cookie = new_cookie()
        self.sockets = []

    def run_until(self, step):
        for done in self.STEPS:
            getattr(self, "_" + done)()
            if done == step:
                return

    def _connected(self):
        self.control = connect(self.server)
        self.sockets.append(self.control)

    def _cookie(self):
        self.control.sendall(self.cookie)
        assert recv_exact(self.control, 1)[0] == PARAM_EXCHANGE

    def _params(self):
        send_block(self.control, params(seconds=30))
        assert recv_exact(self.control, 1)[0] == CREATE_STREAMS

    def _streams(self):
        self.data = connect(self.server)
        self.sockets.append(self.data)
        self.data.sendall(self.cookie)
        assert recv_exact(self.control, 1)[0] == TEST_START
        assert recv_exact(self.control, 1)[0] == TEST_RUNNING

    def _running(self):
        self.sent = 0
        chunk = b"\x5a" * (128 << 10)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            self.data.sendall(chunk)
            self.sent += len(chunk)

    def _test_end(self):
        self.control.sendall(bytes([TEST_END]))
        assert recv_exact(self.control, 1)[0] == EXCHANGE_RESULTS

    def _results(self):
        send_block(
            self.control,
            {
                "cpu_util_total": 1.0,
                "cpu_util_user": 0.5,
                "cpu_util_system": 0.5,
                "sender_has_retransmits": 1,
                "streams": [
                    {
                        "id": 1,
                        "bytes": self.sent,
                        "retransmits": 0,
                        "jitter": 0,
                        "errors": 0,
                        "packets": 0,
                        "start_time": 0,
                        "end_time": 1.0,
                    }
                ],
            },
        )
        theirs = read_block(self.control)
        assert theirs["streams"][0]["bytes"] == self.sent
        assert recv_exact(self.control, 1)[0] == DISPLAY_RESULTS

    def vanish(self):
        for s in self.sockets:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()


@pytest.mark.parametrize("step", HandClient.STEPS)
def test_client_vanishes(server, step):
    client = HandClient(server)
    client.run_until(step)
    local = client.control.getsockname()
    client.vanish()
    peer = f"{local[0]}:{local[1]}"

    def ended():
        mine = [s for s in sessions(server) if s["peer"] == peer]
        return all(s["state"] in ("finished", "failed") for s in mine)

    # The session (if it got that far) ends: no test is left running.
    helpers.wait_until(ended, 30, f"the test of a client gone after {step} to end", 0.2)
    still_serves(server)


def test_300_silent_connections(server):
    with hostile.Crowd(server.port, silent=300) as crowd:
        time.sleep(1.0)
        started = time.monotonic()
        # While they wait, and after they outlived the deadline, real tests run.
        still_serves(server)
        time.sleep(max(0.0, started + HOLD_S - time.monotonic()))
        still_serves(server)
        # On a loaded machine the crowd notices late: one more deadline.
        cut_by = time.monotonic() + 10.0
        while crowd.reopened < 300 and time.monotonic() < cut_by:
            time.sleep(0.2)
        assert crowd.reopened >= 300, f"the silent connections were never cut ({crowd.reopened})"
    still_serves(server)


def admission(server, listener="iperf3"):
    engine = helpers.get_json(f"http://127.0.0.1:{server.stats}/v1/sessions")["engine"]
    return next(a for a in engine["admission"] if a["listener"] == listener)


def exported(port, name, **labels):
    """The value of one sample of the exporter's scrape (0 if absent)."""
    text = helpers.http_get(f"http://127.0.0.1:{port}/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[line.index("{") + 1 : line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


# Each crowd is held past every deadline a stalled test meets: the 5 s
# attach timeout and the 10 s admission deadline. Issue 40 asks for 60 s
# (LONGHAUL_FLOOD_HOLD=60); CI holds each crowd 12 s, which already spans
# every deadline and several cycles of cut and reopened tests.
FLOOD_HOLD_S = float(os.environ.get("LONGHAUL_FLOOD_HOLD", "12"))


def test_one_source_stalling_its_tests_cannot_lock_out_the_others(processes):
    """One source opens 16, then 200, iperf3 tests that stop after their
    parameters, reopening each as soon as it is cut. Before, 16 took every
    slot of the default 16 for 30 s each and no other client was served;
    now the source gets its share (a quarter), a stalled test gives its slot
    back after 5 s, and real iperf3 clients from 127.0.0.2 succeed throughout."""
    srv = start_server(processes, "serve-iperf3-flood")
    exporter = start_exporter(srv)
    for count in (16, 200):
        with hostile.StalledIperf3Tests(srv.port, count, params(seconds=10)) as flood:
            time.sleep(1.0)
            ends = time.monotonic() + FLOOD_HOLD_S
            served = 0
            while time.monotonic() < ends:
                rc, data, stderr = run_iperf3(srv.port, "-t", 1, "-B", "127.0.0.2")
                assert rc == 0 and data and "error" not in data, (
                    f"{count} stalled tests: a real client failed after {served} served: "
                    f"{data and data.get('error')} {stderr}\n"
                    f"{processes.log(srv.name)[-3000:]}"
                )
                check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 1)
                served += 1
            assert served >= 3, served
            # The source held at most its share, and got its slots back.
            assert flood.slots >= 4 and flood.denied > 0, vars(flood)
            assert flood.cut >= count, vars(flood)
        processes.check_running(srv.proc)
    counts = admission(srv)
    refused = counts["refused"]
    assert refused["source_busy"] > 0 and refused["attach_timeout"] > 0, counts
    assert refused["busy"] == 0, counts
    # The exporter says the same.
    for reason in ("source_busy", "attach_timeout"):
        value = exported(
            exporter, "longhaul_admission_refused_total", listener="iperf3", reason=reason
        )
        assert value > 0, reason
    assert rss_mib(srv.proc) < MAX_RSS_MIB


# ------------------------------------------------------------ authentication


@pytest.fixture(scope="module")
def auth_server(module_processes, tmp_path_factory):
    keys = tmp_path_factory.mktemp("iperf3-keys")
    private, public = keys / "private.pem", keys / "public.pem"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(private), "2048"], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "rsa", "-in", str(private), "-pubout", "-out", str(public)],
        check=True,
        capture_output=True,
    )
    import hashlib

    users = keys / "users.csv"
    digest = hashlib.sha256(b"{alice}s3cret").hexdigest()
    users.write_text(f"# user,sha256 of {{user}}password\nalice,{digest}\n")
    srv = start_server(
        module_processes,
        "serve-iperf3-auth",
        "--iperf3-rsa-private-key-path",
        private,
        "--iperf3-authorized-users-path",
        users,
    )
    srv.public_key = public
    return srv


def authenticated(server, user, password):
    return run_iperf3(
        server.port,
        "-t",
        1,
        "--username",
        user,
        "--rsa-public-key-path",
        server.public_key,
        env={"IPERF3_PASSWORD": password},
    )


def test_iperf3_authentication(auth_server):
    rc, data, stderr = authenticated(auth_server, "alice", "s3cret")
    assert rc == 0 and "error" not in data, (rc, data and data.get("error"), stderr)
    check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 1)
    for user, password in (("alice", "wrong"), ("mallory", "s3cret")):
        # iperf3 3.12 exits 0 with -J even when the server refuses (so it
        # does against its own server): the JSON's error says it.
        _, data, _ = authenticated(auth_server, user, password)
        assert data["error"] == "test authorization failed", data.get("error")
        plain = subprocess.run(
            [
                IPERF3,
                "-c",
                "127.0.0.1",
                "-p",
                str(auth_server.port),
                "-t",
                "1",
                "--username",
                user,
                "--rsa-public-key-path",
                str(auth_server.public_key),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "IPERF3_PASSWORD": password},
        )
        assert plain.returncode != 0
        assert "error - test authorization failed" in plain.stdout + plain.stderr
    # Without credentials at all.
    _, data, _ = run_iperf3(auth_server.port, "-t", 1)
    assert data["error"] == "test authorization failed", data.get("error")
    logs_anew(auth_server, "user alice: unknown, or the password does not match", 0)
    # Still open to the right user after the refusals.
    rc, data, stderr = authenticated(auth_server, "alice", "s3cret")
    assert rc == 0 and "error" not in data, (rc, data and data.get("error"), stderr)


# ------------------------------------------------------------ server-side limits

# --iperf3-max-duration of `duration_limited`, --iperf3-server-bitrate-limit
# of `rate_limited` (a test must outlast the 5 s rate window, so not both).
LIMIT_MAX_S = 3
LIMIT_RATE = "200M"


@pytest.fixture(scope="module")
def duration_limited(module_processes):
    return start_server(
        module_processes, "serve-iperf3-max-duration", "--iperf3-max-duration", str(LIMIT_MAX_S)
    )


@pytest.fixture(scope="module")
def rate_limited(module_processes):
    return start_server(
        module_processes, "serve-iperf3-rate-limit", "--iperf3-server-bitrate-limit", LIMIT_RATE
    )


def test_test_longer_than_max_duration_is_refused(duration_limited):
    # iperf3's error text; "maximum" is the client's own compiled-in limit.
    why = f"this server allows {LIMIT_MAX_S} s"
    before = log_count(duration_limited, why)
    _, data, _ = run_iperf3(duration_limited.port, "-t", LIMIT_MAX_S + 7, "-b", "10M")
    assert data["error"].startswith("test duration too long"), data.get("error")
    # -t plus -O counts.
    _, data, _ = run_iperf3(duration_limited.port, "-t", LIMIT_MAX_S, "-O", 1, "-b", "10M")
    assert data["error"].startswith("test duration too long"), data.get("error")
    logs_anew(duration_limited, why, before + 1)
    # A test of exactly the longest runs to its end, and the server serves on.
    data = iperf3_ok(duration_limited, "-t", LIMIT_MAX_S, "-b", "50M")
    check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 1)
    still_serves(duration_limited)


def test_test_running_past_max_duration_is_stopped(duration_limited):
    # -n without -t asks for no time (0): admitted, and stopped by the
    # server once the longest test and the grace have passed.
    began = time.monotonic()
    _, data, _ = run_iperf3(duration_limited.port, "-n", "10G", "-b", "50M", timeout=60)
    took = time.monotonic() - began
    assert data["error"].startswith("test duration too long"), data.get("error")
    assert LIMIT_MAX_S <= took < LIMIT_MAX_S + 10, took
    still_serves(duration_limited)


def test_bitrate_above_the_limit_is_refused(rate_limited):
    for args in (["-b", "300M"], ["-P", 2, "-b", "150M"], ["--bidir", "-b", "150M"]):
        _, data, _ = run_iperf3(rate_limited.port, "-t", 1, *args)
        assert data["error"] == "total required bandwidth is larger than server limit", (
            args,
            data.get("error"),
        )
    # Within the limit in all: runs.
    data = iperf3_ok(rate_limited, "-t", 1, "-P", 2, "-b", "90M")
    check_tcp_sums(data["end"], "sum_sent", "sum_received", True, 2)


@pytest.mark.parametrize("args", [[], ["-R"], ["-P", 4]], ids=["forward", "reverse", "P4"])
def test_unpaced_client_is_stopped_by_the_running_rate(rate_limited, args):
    # Loopback runs Gb/s: over the 5 s window the average passes the limit
    # and the server ends the test, telling the client why before its data
    # connections close, so the client prints iperf3's own error.
    why = "over 5 s; this server allows 200.00 Mb/s"
    before = log_count(rate_limited, why)
    began = time.monotonic()
    _, data, stderr = run_iperf3(rate_limited.port, "-t", 30, *args, timeout=60)
    took = time.monotonic() - began
    assert data is not None, stderr
    assert data.get("error") == "total required bandwidth is larger than server limit", (
        data.get("error"),
        stderr,
    )
    assert took < 12, f"stopped after {took:.1f} s, not within the 5 s window and a check"
    assert len(data["intervals"]) < 10, len(data["intervals"])
    logs_anew(rate_limited, why, before)
    still_serves(rate_limited)


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--iperf3-max-duration", "0", "at least 1"),
        ("--iperf3-max-duration", "1.5", "whole number of seconds"),
        ("--iperf3-max-duration", "forever", "forever"),
        ("--iperf3-max-duration", "100000", "86400"),
        ("--iperf3-server-bitrate-limit", "0", "must be positive"),
        ("--iperf3-server-bitrate-limit", "fast", "fast"),
        ("--iperf3-server-bitrate-limit", "5X", "5X"),
        # More than the 16 tests there are in all.
        ("--iperf3-max-tests-per-source", "17", "1..16"),
        ("--iperf3-max-pending-per-source", "0", "1..=256"),
    ],
)
def test_bad_limit_flags_exit_2_naming_the_flag(flag, value, why):
    need_binaries()
    result = subprocess.run(
        [str(LONGHAUL), "serve", "--iperf3-listen", "127.0.0.1:0", f"{flag}={value}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert flag in result.stderr and why in result.stderr, result.stderr


# ------------------------------------------------------------ longhaul as the client


def send_to_iperf3_server(processes, name, *args):
    """`longhaul send --protocol iperf3 ARGS` (2 streams, 2 s) against one
    test of Debian's `iperf3 -s -J`: (our final JSON, the server's "end")."""
    need_binaries()
    port = helpers.free_port()
    iperf3 = processes.start(name, [IPERF3, "-s", "-1", "-J", "-p", port])
    # Not by connecting: `-s -1` would take that for its one test.
    helpers.wait_until(lambda: listening(port), 10, f"iperf3 -s on port {port}", 0.1)
    processes.check_running(iperf3)
    result = subprocess.run(
        [LONGHAUL, "send", "--protocol", "iperf3", "--to", f"127.0.0.1:{port}"]
        + ["--time", "2", "--streams", "2", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout.strip().splitlines()[-1])
    iperf3.wait(timeout=30)
    return ours, json.loads(processes.log(name))["end"]


@pytest.mark.parametrize("direction", [[], ["--reverse"], ["--bidir"]], ids=["forward", "reverse", "bidir"])
def test_send_protocol_iperf3_against_iperf3_server(processes, direction):
    ours, end = send_to_iperf3_server(processes, "iperf3-s", *direction)

    def server(key):
        return end.get(key, {}).get("bytes", 0) + end.get(key + "_bidir_reverse", {}).get("bytes", 0)

    assert ours["bytes"] == ours["bytes_sent"] + ours["bytes_received"] > 0
    for mine, theirs in ((ours["bytes_sent"], server("sum_received")), (ours["bytes_received"], server("sum_sent"))):
        assert abs(mine - theirs) <= theirs / 100, (ours, end)
    if direction != ["--reverse"]:
        assert ours["bytes_sent"] > 0
    if direction:
        assert ours["bytes_received"] > 0
    assert ours["iperf3"]["server"]["streams"], ours["iperf3"]


def test_send_protocol_iperf3_starts_at_the_instant_given(server):
    # Campaign phases hand every sender one --start-at instant: the iperf3
    # client connects then, not before; an instant already past is refused.
    def send_at(at):
        return subprocess.run(
            [LONGHAUL, "send", "--protocol", "iperf3", "--to", f"127.0.0.1:{server.port}"]
            + ["--time", "1", "--json", "--start-at", f"{at:.3f}"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    at = time.time() + 3
    result = send_at(at)
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout.strip().splitlines()[-1])
    assert at <= ours["started_unix"] < at + 2, (at, ours["started_unix"])
    assert ours["bytes"] > 0
    late = send_at(time.time() - 5)
    assert late.returncode == 2, (late.returncode, late.stderr)
    assert "--start-at" in late.stderr and "passed" in late.stderr, late.stderr


# iperf3's UDP payload when the client names none (params.rs DEFAULT_UDP_BLOCK).
UDP_BLOCK = 1460


@pytest.mark.parametrize("direction", [[], ["--reverse"]], ids=["forward", "reverse"])
def test_send_protocol_iperf3_udp_against_iperf3_server(processes, direction):
    ours, end = send_to_iperf3_server(
        processes, "iperf3-s-udp", "--udp", "--rate", "100M", *direction
    )
    end = end["sum"]
    # Paced: 100 Mb/s for 2 s (25 MB), give or take the start; never more.
    # A sender starved of CPU offers less (a CI run beside the lab and a
    # build sent 18.5 MB): the counts below judge the code, this bound only
    # that it paced rather than trickled.
    assert ours["bytes"] < 30e6, ours["bytes"]
    assert ours["bytes"] > 12.5e6, (
        "the sender sent %.1f MB of the 25 asked: it could not pace at 100 Mb/s on this "
        "machine (a busy CPU, or a pacing fault)" % (ours["bytes"] / 1e6)
    )
    if direction:
        # What the server sent against what we counted (the datagrams in
        # flight at TEST_END are not counted, as iperf3 does).
        assert ours["bytes_received"] == ours["bytes"]
        assert abs(ours["bytes_received"] - end["bytes"]) <= end["bytes"] / 100, (ours, end)
    else:
        # The server's datagram count against ours (3.12's server reports
        # its UDP receive bytes as 0 in this sum).
        received = end["packets"] - end["lost_packets"]
        assert abs(ours["bytes_sent"] / UDP_BLOCK - received) <= received / 100, (ours, end)
        here = ours["iperf3"]["bytes_sent_here"] / UDP_BLOCK
        assert abs(here - received) <= received / 100, (here, end)
        assert "jitter_ms" in end
    server_streams = ours["iperf3"]["server"]["streams"]
    assert len(server_streams) == 2 and all("jitter" in s for s in server_streams), server_streams


def test_send_protocol_iperf3_udp_bidir_against_longhaul(server):
    result = subprocess.run(
        [LONGHAUL, "send", "--protocol", "iperf3", "--udp", "--rate", "200M", "--bidir"]
        + ["--to", f"127.0.0.1:{server.port}", "--time", "2", "--streams", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout.strip().splitlines()[-1])
    assert ours["direction"] == "bidir" and len(ours["streams"]) == 4, ours
    assert ours["bytes_sent"] > 0 and ours["bytes_received"] > 0, ours
    theirs = ours["iperf3"]["server"]["streams"]
    assert all(s["packets"] > 0 and s["errors"] >= 0 for s in theirs), theirs
    still_serves(server)


@pytest.mark.parametrize(
    "args, why",
    [
        (["--udp", "--rate", "1M"], "--protocol iperf3"),
        (["--protocol", "iperf3", "--udp"], "--rate"),
    ],
    ids=["without-protocol-iperf3", "without-rate"],
)
def test_send_udp_usage_errors(args, why):
    need_binaries()
    result = subprocess.run(
        [LONGHAUL, "send", "--to", "127.0.0.1:1", "--time", "1", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "--udp" in result.stderr and why in result.stderr, result.stderr
