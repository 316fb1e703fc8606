"""Campaign phases in the lab: runs that start together through the router.

FDT's Figure 5 (two pairs sending in opposite directions at once, 35 streams x
2 MB each) as campaigns/mem-2pairs-both-directions.yml, and the four-pair
aggregate of campaigns/mem-4pairs-aggregate.yml, on two pairs of transfer
hosts (LAB_PAIRS=2, which conftest.py gives the lab): both directions carry
traffic at the same time, between hosts of their own, each direction's
aggregate agrees with what the router sent that way (SNMP, within 10 %), the
phase summary and the report's aggregate figure exist, and the senders of a
phase start within 1 s of each other (their JSON start times).
"""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labkit import REPO, SECRETS, transfer_hosts, wait_until

PHASE_SECONDS = 20
# Seconds before and after the phase the router comparison integrates over
# (more than two SNMP polls).
ROUTER_MARGIN_S = 15
TOLERANCE = 0.10
INFLUX_INTERVAL = "5s"
# The senders of a phase start within this many seconds of each other.
START_SPREAD_S = 1.0


def site_of(host):
    """A transfer host's site in the lab's inventory (lab/up writes it); the
    phase summary names directions and links by sites."""
    return transfer_hosts()[host].get("site", host)


def run_phase(lab, campaign, phase, tmp_path_factory):
    runs = yaml.safe_load((REPO / "campaigns" / ("%s.yml" % campaign)).read_text())["campaign_runs"]
    hosts = {run[end] for run in runs for end in ("sender", "receiver")}
    missing = sorted(hosts - set(transfer_hosts()))
    assert not missing, (
        "%s needs the transfer hosts %s, which the lab's inventory lacks (LAB_PAIRS=%s): "
        "bring the lab up with LAB_PAIRS=2"
        % (campaign, ", ".join(missing), lab.env.get("LAB_PAIRS"))
    )
    wait_until(
        lambda: lab.influxql(
            'SELECT count("ifHCOutOctets") FROM "interface" WHERE time > now() - 1m'
        ),
        90,
        "Telegraf's SNMP data from the router in InfluxDB",
    )
    results = tmp_path_factory.mktemp("results")
    run, directory = lab.campaign(campaign, results, "campaign_time=%d" % PHASE_SECONDS)
    assert run.rc == 0, "campaign %s failed:\n%s" % (campaign, run.tail())
    # Two more SNMP polls and scrapes after the end, so the window is stored.
    time.sleep(6)
    summary = json.loads((directory / ("%s.phase.json" % phase)).read_text())
    return directory, summary


@pytest.fixture(scope="module")
def two_pairs(provisioned, tmp_path_factory):
    return run_phase(provisioned, "mem-2pairs-both-directions", "both-directions", tmp_path_factory)


@pytest.fixture(scope="module")
def four_pairs(provisioned, tmp_path_factory):
    return run_phase(provisioned, "mem-4pairs-aggregate", "four-pairs", tmp_path_factory)


def router_bits(lab, interface, start, end):
    """Bits the router sent on `interface` between start and end (Unix s),
    integrated from Telegraf's SNMP samples (single samples alias with
    snmpd's counter cache, tests/lab/test_lab.py)."""
    series = lab.influxql(
        'SELECT non_negative_derivative(mean("ifHCOutOctets"), 1s) * 8 FROM "interface" '
        "WHERE \"router\" = 'router' AND \"ifName\" = '%s' AND time >= %dms AND time <= %dms "
        "GROUP BY time(%s) fill(none)" % (interface, start * 1000, end * 1000, INFLUX_INTERVAL)
    )
    points = [
        (row[0] / 1000, row[-1]) for s in series for row in s["values"] if row[-1] is not None
    ]
    assert len(points) >= 4, "too few router samples: %s" % series
    return sum(bps * (t - t_prev) for (t_prev, _), (t, bps) in zip(points, points[1:]))


def test_two_pairs_start_together_and_both_directions_carry_traffic(provisioned, two_pairs):
    directory, phase = two_pairs
    assert phase["start_spread_seconds"] < START_SPREAD_S, phase
    a, b = site_of("xfer-a"), site_of("xfer-b")
    assert set(phase["directions"]) == {"%s->%s" % (a, b), "%s->%s" % (b, a)}, phase
    starts = {
        r["name"]: (r["started_unix"], r["started_unix"] + r["seconds"]) for r in phase["runs"]
    }
    overlap = min(e for _, e in starts.values()) - max(s for s, _ in starts.values())
    assert overlap > 0.8 * PHASE_SECONDS, "the pairs did not run at the same time: %s" % starts
    # Figure 5's setup: each pair has a sender and a receiver of its own.
    pairs = [(r["sender"], r["receiver"]) for r in phase["runs"]]
    assert len({host for pair in pairs for host in pair}) == 4, pairs
    for key, d in phase["directions"].items():
        share = d["throughput_bps"] / provisioned.bottleneck_bps
        print(
            "%s: %.1f Mb/s (%.0f%% of %s)"
            % (key, d["throughput_bps"] / 1e6, 100 * share, provisioned.bottleneck_rate)
        )
        # tbf caps each direction of the router separately: both fill most of it.
        assert 0.5 < share < 1.05, phase


def test_each_directions_aggregate_agrees_with_the_router(provisioned, two_pairs):
    lab = provisioned
    _, phase = two_pairs
    # The router's interface on a site's network: what it sends there arrives in that site.
    towards = {
        site_of("xfer-b"): lab.router_interface(lab.env["LAB_IP_ROUTER_B"]),
        site_of("xfer-a"): lab.router_interface(lab.env["LAB_IP_ROUTER_A"]),
    }
    start, end = phase["started_unix"], phase["ended_unix"]
    for key, d in phase["directions"].items():
        bits = router_bits(lab, towards[d["to"]], start - ROUTER_MARGIN_S, end + ROUTER_MARGIN_S)
        router_bps = bits / phase["seconds"]
        engine_bps = d["throughput_bps"]
        print(
            "%s: router %s out %.1f Mb/s, engine %.1f Mb/s (%+.1f%%)"
            % (
                key,
                towards[d["to"]],
                router_bps / 1e6,
                engine_bps / 1e6,
                100 * (router_bps / engine_bps - 1),
            )
        )
        assert abs(router_bps - engine_bps) <= TOLERANCE * engine_bps, (key, router_bps, engine_bps)


def test_each_pairs_receiver_reports_its_run_to_prometheus(provisioned, two_pairs):
    """Pair 2's hosts are provisioned and watched like pair 1's: each run's
    receiver exported the bytes it took in, under its own instance label,
    about what its run's JSON says it moved."""
    lab = provisioned
    _, phase = two_pairs
    for run in phase["runs"]:
        # Per session the receiver had in the phase's window (an earlier
        # session may still be listed: finished ones stay for a minute).
        sessions = [
            float(s["value"][1])
            for s in lab.promql(
                'max by (session) (max_over_time(longhaul_session_bytes_total{instance="%s", '
                'direction="receive"}[%ds]))'
                % (run["receiver"], PHASE_SECONDS + 2 * ROUTER_MARGIN_S),
                at=phase["ended_unix"] + ROUTER_MARGIN_S,
            )
        ]
        expected = run["throughput_bps"] * run["seconds"] / 8
        print(
            "%s: %s exported sessions of %s MB received, the run %.0f MB"
            % (run["name"], run["receiver"], [round(b / 1e6) for b in sessions], expected / 1e6)
        )
        assert any(abs(b - expected) <= 0.1 * expected for b in sessions), (run, sessions)


def phase_figure(lab, directory, phase, prometheus_url, out):
    """The report's page and its first phase figure, the series read from the
    Prometheus API at prometheus_url (site.yml's TLS from the lab's CA, the admin user)."""
    dist = Path(os.environ.get("LONGHAUL_DIST", REPO / "dist"))
    subprocess.run(
        [
            str(dist / "longhaul"),
            "report",
            str(directory),
            "--out",
            str(out),
            "--prometheus",
            prometheus_url,
            "--prometheus-ca",
            str(SECRETS / "ca.crt"),
            "--prometheus-user",
            "admin",
            "--prometheus-password-file",
            str(SECRETS / "credentials" / "admin"),
            "--from",
            "%.0f" % (phase["started_unix"] - 60),
            "--to",
            "%.0f" % (phase["ended_unix"] + 60),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    html = out.read_text()
    start = html.index('<figure id="fig-phase-1">')
    return html, html[start : html.index("</figure>", start)]


def test_the_report_draws_the_phase_engine_and_router(provisioned, two_pairs, tmp_path):
    directory, phase = two_pairs
    page, figure = phase_figure(provisioned, directory, phase, provisioned.prometheus_url, tmp_path / "report.html")
    a, b = site_of("xfer-a"), site_of("xfer-b")
    assert "%s-&gt;%s engine" % (a, b) in figure and "%s-&gt;%s engine" % (b, a) in figure, figure[
        :2000
    ]
    assert "router router" in figure, "no router series in the phase figure"
    # The central view holds the same samples (every one remote-written to each
    # replica): the report drawn from a replica of the central store draws the same
    # series. (Not the same numbers to the bit: VictoriaMetrics' rate() does not
    # extrapolate to the window's edges as Prometheus' does.)
    for url in provisioned.central_urls:
        central_page, central = phase_figure(provisioned, directory, phase, url, tmp_path / "central.html")
        for series in ("%s-&gt;%s engine" % (a, b), "%s-&gt;%s engine" % (b, a), "router router"):
            assert series in central, "the report from %s draws no %s" % (url, series)
        # no query failed or came back empty there that did not at the monitor (the
        # report says so in a note "Prometheus, <figure>: ...")
        notes = re.findall(r"Prometheus, [^<]*", central_page)
        assert notes == re.findall(r"Prometheus, [^<]*", page), (url, notes)


def test_four_pairs_start_within_a_second(four_pairs):
    directory, phase = four_pairs
    assert len(phase["runs"]) == 4, phase
    # Four senders on four hosts: the start instant reaches each host separately.
    assert len({r["sender"] for r in phase["runs"]}) == 4, phase["runs"]
    starts = [
        json.loads((directory / ("%s.json" % r["name"])).read_text().strip().splitlines()[-1])[
            "started_unix"
        ]
        for r in phase["runs"]
    ]
    print("four pairs started %.3f s apart (%s)" % (max(starts) - min(starts), starts))
    assert max(starts) - min(starts) < START_SPREAD_S, starts
    meta = json.loads((directory / ("%s.run.json" % phase["runs"][0]["name"])).read_text())
    assert min(starts) >= float(meta["start_at"]) - 0.01, (starts, meta["start_at"])
    assert phase["throughput_bps"] > 0 and len(phase["directions"]) == 2, phase
