"""The WAN path's own verdict (tests/delay_path.py): a throughput test through
the delay line fails naming the path when the emulator fell short, not the
engine. Here the real longhaul-delay forwards an iperf3 flow between network
namespaces this test creates (site A -- router -- site B, 10.98.x, names
carrying the pid), once as the lab runs it and once starved on purpose: on
the normal scheduler (no real-time priority, as in a lab container), niced
and pinned to one CPU beside a busy loop there. The starved run's counter
lines must say it waited for a CPU (or released late), the path's fault;
both runs' lines must parse into what the path carried. Needs root, ip,
taskset and iperf3.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest

import helpers
from delay_path import PathCheck, delay_line_samples

RATE_BPS = 200e6
SECONDS = 3


def sh(*argv):
    subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True)


@pytest.fixture
def path():
    """Namespaces (a, router, b): a 10.98.1.2 -- 10.98.1.1 router 10.98.2.1 -- 10.98.2.2 b."""
    if os.geteuid() != 0:
        helpers.cannot_run("network namespaces need root")
    for tool in ("ip", "iperf3", "taskset", "nice"):
        if not shutil.which(tool):
            helpers.cannot_run("%s is missing" % tool)
    if not os.path.exists("/dev/net/tun"):
        helpers.cannot_run("no /dev/net/tun")
    tag = "lhdp%d" % os.getpid()
    a, r, b = tag + "a", tag + "r", tag + "b"
    for ns in (a, r, b):
        sh("ip", "netns", "add", ns)
    try:
        for ns, dev, peer, addr, gw in ((a, "pa", "ra", "10.98.1.2/24", "10.98.1.1"),
                                        (b, "pb", "rb", "10.98.2.2/24", "10.98.2.1")):
            sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", r)
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", r, "addr", "add", gw + "/24", "dev", peer)
            for n, d in ((ns, dev), (ns, "lo"), (r, peer)):
                sh("ip", "-n", n, "link", "set", d, "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", gw)
        sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield a, r, b
    finally:
        for ns in (a, r, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def forward(path, tmp_path, starved):
    """An iperf3 flow a -> b through the delay line; its counter lines and the
    flow's window (epoch seconds)."""
    a, r, b = path
    delay = helpers.dist_dir() / "longhaul-delay"
    assert delay.is_file(), "%s missing: run `make build` or set LONGHAUL_DIST" % delay
    command = ["ip", "netns", "exec", r, str(delay), "run", "--delay", "5ms", "--rate", "200M",
               "--site-a", "ra", "--site-b", "rb", "--stats-interval", "1s"]
    hogs = []
    if starved:
        # One CPU, shared with a busy loop that weighs 9 times more.
        command = ["taskset", "-c", "0", "nice", "-n", "10"] + command + ["--realtime-priority", "0"]
        hogs = [subprocess.Popen(["taskset", "-c", "0", "sh", "-c", "while :; do :; done"])]
    log = open(tmp_path / ("delay-%s.log" % starved), "w+")
    line = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    server = subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-1", "-B", "10.98.2.2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert "ready" in line.stdout.readline(), log.read()
        time.sleep(0.5)
        start = time.time()
        subprocess.run(["ip", "netns", "exec", a, "iperf3", "-c", "10.98.2.2", "-t", str(SECONDS), "-P", "2"],
                       capture_output=True, timeout=60)
        end = time.time()
        time.sleep(1.5)  # one more counter line after the flow
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        line.send_signal(signal.SIGTERM)
        line.wait(timeout=30)
        server.kill()
        server.wait()
    log.seek(0)
    return delay_line_samples(log.read()), start, end


def test_a_starved_delay_line_is_named_as_the_path_that_fell_short(path, tmp_path):
    samples, start, end = forward(path, tmp_path, starved=True)
    check = PathCheck(samples, start - 1, end + 1, RATE_BPS)
    print(check.verdict())
    assert check.carried_bps > 0, check.summary
    assert check.shortfalls, "a starved delay line passed for a healthy path: %s" % check.summary
    assert any("waited for a CPU" in s or "late" in s for s in check.shortfalls), check.shortfalls
    assert check.verdict().startswith("THE PATH fell short, not the engine: "), check.verdict()


def test_the_delay_line_as_the_lab_runs_it_reports_what_it_carried(path, tmp_path):
    samples, start, end = forward(path, tmp_path, starved=False)
    check = PathCheck(samples, start - 1, end + 1, RATE_BPS)
    print(check.verdict())
    # What the path carried is measured whatever the machine's load: at most
    # the rate, and a real flow.
    assert 0.2 * RATE_BPS < check.carried_bps <= 1.02 * RATE_BPS, check.summary
    assert "carried" in check.verdict() and "thread busy" in check.summary, check.summary
