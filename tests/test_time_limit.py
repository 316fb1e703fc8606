"""`--time` ends on time through a slow bottleneck.

Everything a sending socket holds when the deadline comes must still cross
the path before the receiver sees the end of the stream. With a full 2 MB
buffer per stream (4 MB as the kernel sizes it), `--time 5` with 35 streams
through a 100 Mb/s bottleneck lasted 15 s. A `--time` stream now keeps at
most half a second of its delivery rate unsent (TCP_NOTSENT_LOWAT,
crates/core/src/stream.rs), so the run ends within about a second of
its time, in both directions, and still fills the bottleneck.

1024 streams paced to 90 Mb/s (`--rate`) through the same bottleneck share
it evenly and end on time too: the pacer hands each stream at most 100 ms
of its share at once (crates/core/src/pacer.rs), and a paced stream
queues at most half a second of its share from its first byte.

Two network namespaces this test creates, joined by a veth pair with a tbf
bottleneck on each end; nothing else is touched. Needs root, ip and tc.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

import helpers
import hostile

RATE_MBIT = 100
STREAMS = 35
SECONDS = 4
# What the run may last beyond --time: the capped queues (half a second),
# the bottleneck's own queue and the end-of-session exchange.
LATE_S = 1.5
# The bottleneck still carries at least this share of its rate (payload
# against the tbf rate, which counts headers too).
FILLED = 0.85


def sh(*argv):
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True)


@pytest.fixture
def bottleneck():
    """Namespaces (client, server), the server's address."""
    if os.geteuid() != 0:
        helpers.cannot_run("network namespaces need root")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            helpers.cannot_run("%s (iproute2) is missing" % tool)
    tag = "lhtl%d" % os.getpid()
    client, server = tag + "c", tag + "s"
    sh("ip", "netns", "add", client)
    sh("ip", "netns", "add", server)
    try:
        sh("ip", "link", "add", "tl0", "netns", client, "type", "veth", "peer", "name", "tl1", "netns", server)
        for ns, dev, addr in ((client, "tl0", "10.213.0.1/24"), (server, "tl1", "10.213.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
               "rate", "%dmbit" % RATE_MBIT, "burst", "64kb", "latency", "20ms")
        yield client, server, "10.213.0.2"
    finally:
        sh("ip", "netns", "del", client)
        sh("ip", "netns", "del", server)


def timed_run(bottleneck, tmp_path, args):
    """`longhaul send` from the client namespace to a server in the other:
    (the final JSON report, wall seconds)."""
    client, server, address = bottleneck
    longhaul = helpers.dist_dir() / "longhaul"
    assert longhaul.is_file(), f"{longhaul} missing: run `make build` or set LONGHAUL_DIST"
    processes = helpers.Processes(tmp_path)
    try:
        serve = processes.start(
            "serve",
            ["ip", "netns", "exec", server, longhaul, "serve",
             "--listen", address + ":7400", "--allow-unauthenticated"],
        )
        helpers.wait_until(
            lambda: processes.check_running(serve)
            or subprocess.run(
                ["ip", "netns", "exec", server, "ss", "-Hltn", "sport = :7400"],
                capture_output=True, text=True,
            ).stdout.strip(),
            30,
            "longhaul serve listening in %s" % server,
            interval=0.1,
        )
        started = time.monotonic()
        run = subprocess.run(
            ["ip", "netns", "exec", client, longhaul, "send", "--to", address + ":7400",
             "--buffer", "2M", "--json", *args],
            capture_output=True, text=True, timeout=120,
        )
        took = time.monotonic() - started
    finally:
        processes.stop()
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), took


@pytest.mark.parametrize("reverse", [False, True], ids=["client sends", "server sends"])
def test_a_timed_run_through_a_slow_bottleneck_ends_on_time(bottleneck, reverse, tmp_path):
    summary, took = timed_run(
        bottleneck, tmp_path,
        ["--streams", str(STREAMS), "--time", str(SECONDS)] + (["--reverse"] if reverse else []),
    )
    mbps = summary["throughput_bps"] / 1e6
    print("%s: %.2f s (wall %.2f s) for --time %d, %.1f Mb/s"
          % ("reverse" if reverse else "forward", summary["seconds"], took, SECONDS, mbps))
    assert summary["seconds"] <= SECONDS + LATE_S, summary["seconds"]
    assert took <= SECONDS + LATE_S + 1.0, took
    assert mbps >= FILLED * RATE_MBIT, mbps
    # Every stream moved data: the caps starve none.
    assert len(summary["streams"]) == STREAMS
    assert all(s["bytes"] > 0 for s in summary["streams"]), summary["streams"]


# 1024 streams through the 100 Mb/s bottleneck, paced to 90 Mb/s in all:
# each stream's share is 11 kB/s.
MANY = 1024
PACED_MBIT = 90


@pytest.mark.parametrize("reverse", [False, True], ids=["client sends", "server sends"])
def test_1024_paced_streams_share_a_slow_bottleneck_evenly_and_end_on_time(
        bottleneck, reverse, tmp_path):
    # Before the pacer's chunk followed a stream's share, each stream was
    # handed 64 KiB at a time, 6 s of its share, and queued all of it: the
    # last streams started seconds late, up to 338 of 1024 moved nothing in
    # 4 s, and the run ended after 9.0-11.3 s at 32-40 Mb/s.
    hostile.raise_open_files_limit()
    summary, took = timed_run(
        bottleneck, tmp_path,
        ["--streams", str(MANY), "--rate", "%dM" % PACED_MBIT, "--time", str(SECONDS)]
        + (["--reverse"] if reverse else []),
    )
    mbps = summary["throughput_bps"] / 1e6
    moved = sorted(s["bytes"] for s in summary["streams"])
    mean = sum(moved) / len(moved)
    print("%s: %.2f s (wall %.2f s) for --time %d, %.1f Mb/s of --rate %dM, "
          "streams from %.2f to %.2f of the mean"
          % ("reverse" if reverse else "forward", summary["seconds"], took, SECONDS, mbps,
             PACED_MBIT, moved[0] / mean, moved[-1] / mean))
    assert summary["seconds"] <= SECONDS + LATE_S, summary["seconds"]
    assert took <= SECONDS + LATE_S + 2.0, took
    assert mbps >= FILLED * PACED_MBIT, mbps
    assert len(moved) == MANY
    # Every stream got about its share, none starved.
    assert moved[0] >= 0.5 * mean, moved[:20]
