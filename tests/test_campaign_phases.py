"""ansible/filter_plugins/campaign_phases.py: which runs of a campaign start
together, and the phase summary's aggregate per direction and per link, from
the engine's own final JSON (the shape `longhaul send --json` prints)."""

import importlib.util
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent.parent / "ansible" / "filter_plugins" / "campaign_phases.py"
spec = importlib.util.spec_from_file_location("campaign_phases", PLUGIN)
phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(phases)

GBIT = 1e9


def result(direction, started, seconds, sent=0, received=0):
    """A final JSON object as the engine prints it (the fields the summary reads)."""
    return {
        "direction": direction,
        "started_unix": started,
        "seconds": seconds,
        "bytes": sent + received,
        "bytes_sent": sent,
        "bytes_received": received,
        "throughput_bps": (sent + received) * 8 / seconds,
    }


def test_runs_group_into_phases_in_order():
    runs = [
        {"name": "warmup", "sender": "a1", "receiver": "b1"},
        {"name": "p1", "phase": "both", "sender": "a1", "receiver": "b1"},
        {"name": "p2", "phase": "both", "sender": "b2", "receiver": "a2"},
        {"name": "alone", "sender": "a1", "receiver": "b1"},
    ]
    got = phases.campaign_phases(runs)
    assert [(p["name"], [r["name"] for r in p["runs"]]) for p in got] == [
        ("warmup", ["warmup"]),
        ("both", ["p1", "p2"]),
        ("alone", ["alone"]),
    ]


def test_two_pairs_in_opposite_directions_sum_per_direction_and_link():
    # Figure 5's setup: pair 1 sends A->B while pair 2 sends B->A.
    hosts = {"a1": {"site": "A"}, "a2": {"site": "A"}, "b1": {"site": "B"}, "b2": {"site": "B"}}
    done = [
        {"run": {"name": "p1", "sender": "a1", "receiver": "b1"},
         "result": result("send", 1000.0, 10.0, sent=int(9.2 * GBIT * 10 / 8))},
        {"run": {"name": "p2", "sender": "b2", "receiver": "a2"},
         "result": result("send", 1000.4, 10.0, sent=int(9.0 * GBIT * 10 / 8))},
    ]
    s = phases.campaign_phase_summary("both", done, hosts, {"A--B": "cern-manlan"}, "1000.000")
    assert s["start_spread_seconds"] == pytest.approx(0.4)
    assert s["seconds"] == pytest.approx(10.4)
    ab, ba = s["directions"]["A->B"], s["directions"]["B->A"]
    assert (ab["link"], ba["link"]) == ("cern-manlan", "cern-manlan")
    # Each direction's bytes over the phase's window (10.4 s).
    assert ab["throughput_bps"] == pytest.approx(9.2 * GBIT * 10 / 10.4, rel=1e-6)
    assert ba["throughput_bps"] == pytest.approx(9.0 * GBIT * 10 / 10.4, rel=1e-6)
    link = s["links"]["cern-manlan"]
    assert link["directions"] == {"A->B": ab["throughput_bps"], "B->A": ba["throughput_bps"]}
    assert s["bytes"] == ab["bytes"] + ba["bytes"]


def test_pull_and_bidir_runs_count_in_the_direction_the_bytes_went():
    hosts = {"a1": {"site": "A"}, "b1": {"site": "B"}}
    done = [
        # `get` on a1 from b1: the bytes went B->A.
        {"run": {"name": "pull", "sender": "a1", "receiver": "b1"},
         "result": result("receive", 0.0, 4.0, received=400)},
        {"run": {"name": "both", "sender": "a1", "receiver": "b1"},
         "result": result("bidir", 0.0, 4.0, sent=100, received=200)},
    ]
    s = phases.campaign_phase_summary("mixed", done, hosts)
    assert s["directions"]["A->B"]["bytes"] == 100
    assert s["directions"]["B->A"]["bytes"] == 600
    assert s["directions"]["B->A"]["runs"] == ["pull", "both"]
    assert s["directions"]["B->A"]["run_bytes"] == {"pull": 400, "both": 200}
    # Without campaign_links the link is the site pair in name order.
    assert set(s["links"]) == {"A--B"}


def test_the_sending_hosts_link_variable_names_the_link():
    hosts = {"a1": {"site": "A", "link": "wan-1"}, "b1": {"site": "B", "link": ""}}
    done = [
        {"run": {"name": "r", "sender": "a1", "receiver": "b1"},
         "result": result("bidir", 0.0, 1.0, sent=1, received=2)},
    ]
    s = phases.campaign_phase_summary("r", done, hosts, {"A--B": "mapped"})
    assert s["directions"]["A->B"]["link"] == "wan-1"
    assert s["directions"]["B->A"]["link"] == "mapped"


def test_hosts_without_a_site_are_their_own_site():
    done = [{"run": {"name": "r", "sender": "x", "receiver": "y"}, "result": result("send", 5.0, 2.0, sent=10)}]
    s = phases.campaign_phase_summary("r", done, {})
    assert list(s["directions"]) == ["x->y"]
    assert s["throughput_bps"] == 40


def test_a_phase_with_no_successful_run_is_empty_not_an_error():
    s = phases.campaign_phase_summary("failed", [], {})
    assert s["runs"] == [] and s["directions"] == {} and s["throughput_bps"] == 0
