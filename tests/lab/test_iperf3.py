"""iperf3 on the wire in the lab (issue 22): the campaign mem-iperf3-8x2M
runs `longhaul send --protocol iperf3` on xfer-a against xfer-b's iperf3
port (the longhaul_engine role's longhaul_engine_iperf3_listen, 5201)
through the router. Its result lands as any run's does (the JSON has
DESIGN's required fields and the server's own figures), the run record
names the protocol, the receiver's stats API shows the test as an iperf3
session with its 8 streams while it runs and its journal logs it finished,
and `longhaul report` draws the results directory.

iperf3's UDP test, the campaign mem-iperf3-udp: one UDP stream at half the
lab's bottleneck arrives whole, and one at twice the bottleneck arrives at
the bottleneck's rate with the rest counted lost by the server, which names
it a udp test in its journal.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from labkit import MONITORING_VARS, REPO, wait_until

CAMPAIGN = "mem-iperf3-8x2M"
RUN = "a-to-b-iperf3"
STREAMS = 8
SECONDS = 8
# tbf's burst and the 5 ms at which the receiver notices its last byte.
TOLERANCE = 0.03
# A UDP sender above the bottleneck must offer at least this many times its
# rate for the run to show the excess dropped.
MIN_EXCESS = 1.2

ENGINE_SESSIONS = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:7401/v1/sessions', timeout=5).read().decode())"
)


def iperf3_sessions(lab):
    done = lab.sh("xfer-b", 'python3 -c "%s"' % ENGINE_SESSIONS, check=False)
    if done.returncode != 0:
        return []
    return [s for s in json.loads(done.stdout)["sessions"] if s.get("protocol") == "iperf3"]


def serve_journal(lab, began):
    """xfer-b's longhaul-serve journal from 5 s before `began` (epoch)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(began - 5))
    return lab.sh(
        "xfer-b",
        "TZ=UTC journalctl -u longhaul-serve --since '%s' --no-pager -o cat" % since,
    ).stdout


def receiving(session):
    return [s for s in session.get("streams", []) if s.get("direction") == "receive"]


@pytest.fixture(scope="module")
def iperf3_run(provisioned, tmp_path_factory):
    lab = provisioned
    results = tmp_path_factory.mktemp("results")
    began = time.time()
    campaign = lab.campaign_process(CAMPAIGN, results, "campaign_time=%d" % SECONDS)
    try:
        seen = wait_until(
            lambda: [s for s in iperf3_sessions(lab) if len(receiving(s)) == STREAMS],
            90,
            "an iperf3 session with %d streams in xfer-b's stats API" % STREAMS,
            interval=0.5,
        )
        output, _ = campaign.communicate(timeout=600)
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.wait()
    assert campaign.returncode == 0, "campaign %s failed:\n%s" % (CAMPAIGN, output[-6000:])
    runs = sorted(p for p in (results / CAMPAIGN).glob("*") if p.is_dir())
    assert runs, "campaign %s left no results directory:\n%s" % (CAMPAIGN, output[-3000:])
    directory = runs[-1]
    report = json.loads((directory / ("%s.json" % RUN)).read_text().strip().splitlines()[-1])
    meta = json.loads((directory / ("%s.run.json" % RUN)).read_text())
    return lab, directory, report, meta, seen[0], began


def test_iperf3_campaign_result_has_designs_fields(iperf3_run):
    lab, _, report, _, _, _ = iperf3_run
    for key in ("mode", "direction", "bytes", "seconds", "throughput_bps", "streams", "cpu"):
        assert key in report, (key, sorted(report))
    assert report["mode"] == "memory" and report["direction"] == "send", report
    assert report["bytes"] > 0 and len(report["streams"]) == STREAMS, report
    share = report["throughput_bps"] / lab.bottleneck_bps
    print(
        "%s: %.1f Mb/s, %.0f%% of the %s bottleneck"
        % (CAMPAIGN, report["throughput_bps"] / 1e6, 100 * share, lab.bottleneck_rate)
    )
    assert share > 0.3, report["throughput_bps"]
    # What sat in the router's queue and the streams' buffers when the client
    # stopped writing arrives later: the run lasts until the server has it
    # all (the server's end_time), so the rate never exceeds what the path
    # carried.
    assert share <= 1 + TOLERANCE, report["throughput_bps"]
    # The iperf3 server's own figures: what it received is what we count,
    # over the time it took to arrive.
    server = report["iperf3"]["server"]
    received = sum(s["bytes"] for s in server["streams"])
    assert abs(received - report["bytes"]) <= 0.01 * report["bytes"], (received, report["bytes"])
    arrived = max(s["end_time"] for s in server["streams"])
    # seconds is rounded to the microsecond, end_time is not.
    assert report["seconds"] + 1e-6 >= arrived > SECONDS, (report["seconds"], arrived)


def test_iperf3_run_record_names_the_protocol_and_the_iperf3_port(iperf3_run):
    lab, _, _, meta, _, _ = iperf3_run
    assert meta["run"]["protocol"] == "iperf3", meta["run"]
    command = meta["command"]
    assert command[command.index("--protocol") + 1] == "iperf3", command
    assert command[command.index("--to") + 1] == "%s:5201" % lab.address["xfer-b"], command
    assert "--token-file" not in command, command
    assert int(meta["rc"]) == 0, meta


def test_receiver_saw_an_iperf3_session(iperf3_run):
    lab, _, _, _, session, began = iperf3_run
    assert session["protocol"] == "iperf3" and len(receiving(session)) == STREAMS, session
    assert session["peer"].startswith(lab.address["xfer-a"]), session
    journal = serve_journal(lab, began)
    assert "iperf3 test from %s:" % lab.address["xfer-a"] in journal, journal[-3000:]
    assert "tcp, %d streams" % STREAMS in journal, journal[-3000:]


def test_longhaul_report_draws_the_iperf3_campaign(iperf3_run, tmp_path):
    _, directory, report, _, _, _ = iperf3_run
    out = tmp_path / "report.html"
    dist = Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))
    subprocess.run(
        [str(dist / "longhaul"), "report", str(directory), "--out", str(out)],
        check=True,
        timeout=60,
    )
    html = out.read_text()
    assert RUN in html, "the report does not name the run"


def test_prometheus_sees_the_iperf3_test_from_both_hosts(iperf3_run):
    """The receiving engine's exporter names the test protocol="iperf3" with
    its streams; on the sending host the client's flow to port 5201 is the
    tcp collector's (its engine knows no send to another host's server)."""
    lab, _, report, _, session, _ = iperf3_run
    sid = session["id"]
    window = "[15m]"
    info = wait_until(
        lambda: lab.promql(
            'last_over_time(longhaul_session_info{instance="xfer-b",protocol="iperf3",session="%s"}%s)'
            % (sid, window)
        ),
        90,
        'longhaul_session_info{protocol="iperf3"} of session %s in Prometheus' % sid,
    )
    assert info[0]["metric"]["mode"] == "memory", info
    streams = lab.promql(
        'count(last_over_time(longhaul_stream_bytes_total{instance="xfer-b",session="%s",direction="receive"}%s))'
        % (sid, window)
    )
    assert streams and int(float(streams[0]["value"][1])) == STREAMS, streams
    acked = wait_until(
        lambda: lab.promql(
            'max_over_time(longhaul_tcp_bytes_acked_total{instance="xfer-a",ports="5201",remote="%s"}%s)'
            % (lab.address["xfer-b"], window)
        ),
        90,
        "xfer-a's tcp collector series of the flow to xfer-b:5201",
    )
    # Scraped every scrape_s during the SECONDS run, the flow's last sample
    # comes at least SECONDS - scrape_s into it: at least that share of its
    # bytes (less a tenth for the ramp-up), and never more than the run moved
    # (CI once saw 49 % of an 8 s run at a 5 s scrape interval).
    scrape_s = scrape_interval_s()
    least = (SECONDS - scrape_s) / SECONDS * 0.9
    seen = float(acked[0]["value"][1])
    assert least * report["bytes"] <= seen <= 1.05 * report["bytes"], (
        acked,
        report["bytes"],
        "at least %.2f of it" % least,
    )


def scrape_interval_s():
    """The lab Prometheus' scrape interval in seconds (its group_vars)."""
    interval = MONITORING_VARS["prometheus_global"]["scrape_interval"]
    assert interval.endswith("s") and interval[:-1].isdigit(), interval
    seconds = int(interval[:-1])
    assert seconds < SECONDS, "a %s scrape interval may miss an %d s run" % (interval, SECONDS)
    return seconds


UDP_CAMPAIGN = "mem-iperf3-udp"
UDP_SECONDS = 6


@pytest.fixture(scope="module")
def udp_runs(provisioned, tmp_path_factory):
    lab = provisioned
    results = tmp_path_factory.mktemp("udp-results")
    began = time.time()
    run, directory = lab.campaign(UDP_CAMPAIGN, results, "campaign_time=%d" % UDP_SECONDS)
    assert run.rc == 0 and directory, "campaign %s failed:\n%s" % (UDP_CAMPAIGN, run.tail(80))
    runs = {}
    for name in ("a-to-b-udp-under", "a-to-b-udp-over"):
        text = (directory / ("%s.json" % name)).read_text()
        meta = json.loads((directory / ("%s.run.json" % name)).read_text())
        assert "--udp" in meta["command"], meta["command"]
        runs[name] = (json.loads(text.strip().splitlines()[-1]), rate_of(meta["run"]["rate"]))
    return lab, runs, began


def rate_of(campaign_rate):
    """A campaign's rate (500M, 1G) in bits/s."""
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}
    return float(campaign_rate[:-1]) * scale[campaign_rate[-1]]


def udp_figures(report):
    """(rate the sender offered, rate received, both in b/s; share of
    datagrams the server counted lost). The offer is the client's own bytes
    over its sending time: on a busy machine it falls short of the asked rate
    (one CI run offered 281 of 400 Mb/s), so the path is judged against it."""
    (stream,) = report["iperf3"]["server"]["streams"]
    assert stream["packets"] > 0, stream
    (ours,) = report["iperf3"]["client"]["streams"]
    seconds = ours["end_time"] - ours["start_time"]
    assert seconds > 0, ours
    lost = stream["errors"] / stream["packets"]
    return 8 * ours["bytes"] / seconds, report["throughput_bps"], lost


def starved(offered, asked):
    """The failure message of a sender that could not pace at its rate."""
    return (
        "the sender offered only %.1f Mb/s of the %.0f asked: it could not pace at the "
        "asked rate on this machine (a busy CPU, or a pacing fault), so this run cannot "
        "judge the path" % (offered / 1e6, asked / 1e6)
    )


def test_udp_below_the_bottleneck_arrives_whole(udp_runs):
    lab, runs, _ = udp_runs
    report, asked = runs["a-to-b-udp-under"]
    assert asked <= 0.6 * lab.bottleneck_bps, (asked, lab.bottleneck_rate)
    offered, received, lost = udp_figures(report)
    print(
        "UDP asked at %.0f Mb/s: offered %.1f Mb/s, received %.1f Mb/s, %.2f%% lost"
        % (asked / 1e6, offered / 1e6, received / 1e6, 100 * lost)
    )
    assert offered <= (1 + TOLERANCE) * asked, (offered, asked)
    # A sender starved by a busy machine offers less (rehearsal D: 84.3 of 100
    # Mb/s beside the integration tests); the path is judged on what it got.
    assert offered >= 0.5 * asked, starved(offered, asked)
    # Under the bottleneck, the path carries the whole offer.
    assert abs(received - offered) <= 0.05 * offered, (received, offered)
    assert lost < 0.01, report["iperf3"]["server"]


def test_udp_above_the_bottleneck_arrives_at_its_rate_and_the_rest_is_lost(udp_runs):
    """The loss is judged against what the sender offered, not the asked rate:
    one CI run's sender offered 281 of the 400 Mb/s asked and the server
    rightly counted 31 % lost, not half. An offer too close to the bottleneck
    to show the excess dropped fails naming the sender, not the path."""
    lab, runs, _ = udp_runs
    report, asked = runs["a-to-b-udp-over"]
    assert asked >= 1.5 * lab.bottleneck_bps, (asked, lab.bottleneck_rate)
    offered, received, lost = udp_figures(report)
    print(
        "UDP asked at %.0f Mb/s over %s: offered %.1f Mb/s, received %.1f Mb/s, %.1f%% lost"
        % (asked / 1e6, lab.bottleneck_rate, offered / 1e6, received / 1e6, 100 * lost)
    )
    # Paced: never above the asked rate (a sender that ignores its rate would
    # otherwise see its loss judged against its own overshoot).
    assert offered <= (1 + TOLERANCE) * asked, (offered, asked)
    assert offered >= MIN_EXCESS * lab.bottleneck_bps, "%s (under %.1f times the %s)" % (
        starved(offered, asked),
        MIN_EXCESS,
        lab.bottleneck_rate,
    )
    # tbf lets its burst through at once, then the bottleneck's rate.
    assert 0.85 * lab.bottleneck_bps <= received <= (1 + TOLERANCE) * lab.bottleneck_bps, received
    # What tbf did not carry of the offer is counted lost by the server. The
    # received rate, not the bottleneck's, is the carried share: tbf counts
    # the datagrams' headers too (195 Mb/s of payload through 200mbit).
    expected = 1 - received / offered
    assert expected - 0.05 <= lost <= expected + 0.05, (lost, expected, report["iperf3"]["server"])


def test_the_receiver_logs_udp_tests(udp_runs):
    lab, _, began = udp_runs
    journal = serve_journal(lab, began)
    finished = [
        line
        for line in journal.splitlines()
        if "iperf3 test from %s:" % lab.address["xfer-a"] in line and "finished" in line
    ]
    assert len([line for line in finished if "udp, 1 streams" in line]) == 2, journal[-3000:]
