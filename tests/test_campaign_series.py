"""Campaigns recorded as series, end to end on loopback: `longhaul send
--campaign fig5 --run a-to-b` (and `--protocol iperf3`, and Debian's iperf3
client naming them in its --extra-data) against a real `longhaul serve
--iperf3-listen`: the stats API lists both names with each session, and the
real exporter puts them on longhaul_session_info only."""

import os
import subprocess

import pytest

import helpers

IPERF3 = "/usr/bin/iperf3"


@pytest.fixture(scope="module")
def engine(module_processes):
    iperf3 = helpers.free_port()
    proc, port, stats = helpers.start_engine(
        module_processes, "--iperf3-listen", "127.0.0.1:%d" % iperf3, name="serve-campaign"
    )
    module_processes.wait_port(proc, iperf3)
    exporter = helpers.dist_dir() / "longhaul-exporter"
    assert exporter.is_file(), "%s missing: run `make build`" % exporter
    metrics = helpers.free_port()
    started = module_processes.start(
        "exporter-campaign",
        [
            str(exporter),
            "--web.listen-address=127.0.0.1:%d" % metrics,
            "--engine.url=http://127.0.0.1:%d" % stats,
            "--no-collector.tcp",
            "--no-collector.raid",
        ],
    )
    module_processes.wait_port(started, metrics)
    return {"port": port, "iperf3": iperf3, "stats": stats, "metrics": metrics}


def longhaul(*args):
    done = subprocess.run(
        [str(helpers.dist_dir() / "longhaul"), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def scrape(port):
    """[(metric name, {label: value})] of one /metrics answer."""
    text = helpers.http_get("http://127.0.0.1:%d/metrics" % port)
    return [(name, labels) for name, labels, _ in helpers.parse_exposition(text) if labels]


def test_a_campaign_s_runs_are_listed_and_exported_with_their_names(engine):
    longhaul(
        "send",
        "--to",
        "127.0.0.1:%d" % engine["port"],
        "--time",
        "1",
        "--streams",
        "2",
        "--campaign",
        "fig5",
        "--run",
        "a-to-b",
    )
    longhaul(
        "send",
        "--protocol",
        "iperf3",
        "--to",
        "127.0.0.1:%d" % engine["iperf3"],
        "--time",
        "1",
        "--campaign",
        "fig5",
        "--run",
        "iperf3-run",
    )
    if not os.access(IPERF3, os.X_OK):
        helpers.cannot_run("%s is missing (Debian package iperf3)" % IPERF3)
    stock = subprocess.run(
        [
            IPERF3,
            "-c",
            "127.0.0.1",
            "-p",
            str(engine["iperf3"]),
            "-t",
            "1",
            "-J",
            "--extra-data",
            "campaign=fig5 run=stock-iperf3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stock.returncode == 0, stock.stdout[-2000:] + stock.stderr
    longhaul("send", "--to", "127.0.0.1:%d" % engine["port"], "--time", "1")

    listed = helpers.get_json("http://127.0.0.1:%d/v1/sessions" % engine["stats"])["sessions"]
    names = sorted((s["protocol"], s.get("campaign", ""), s.get("run", "")) for s in listed)
    assert names == [
        ("iperf3", "fig5", "iperf3-run"),
        ("iperf3", "fig5", "stock-iperf3"),
        ("longhaul", "", ""),
        ("longhaul", "fig5", "a-to-b"),
    ], listed

    samples = scrape(engine["metrics"])
    info = sorted(
        (labels["protocol"], labels.get("campaign", ""), labels.get("run", ""))
        for name, labels in samples
        if name == "longhaul_session_info"
    )
    assert info == names, info
    for name, labels in samples:
        if name != "longhaul_session_info":
            assert "campaign" not in labels and "run" not in labels, (name, labels)
    assert any(name == "longhaul_stream_bytes_total" for name, _ in samples)
