"""Grafana in the lab: the monitor's Grafana (the server scripts/setup builds
from the Go module proxy, installed by the grafana role through site.yml)
provisions our datasources and dashboards, and every panel of every dashboard
returns data through Grafana's own query path (/api/ds/query: its PromQL and
InfluxQL clients, its macros) while a transfer runs. Campaigns leave start and
end annotations in it, and every dashboard's annotation query of Grafana's
own `longhaul` annotations finds them.

Generic over the dashboards: whatever dashboards Grafana lists, whatever
panels, targets and template variables they have, driven as Grafana's
frontend would (grafana_frontend.py).
"""

import json
import time

import pytest
import yaml
from grafana_frontend import Dashboard
from labkit import REPO, epoch, frame_values, wait_until

DASHBOARDS = REPO / "dashboards"
CAMPAIGN = "disk-2-controllers"
# The live memory transfer the panels are queried during; it must outlast the queries.
LIVE_SECONDS = 600
LIVE_STREAMS = 8
# Seconds of an idle path the module leaves behind (test_lab.py's router check
# integrates 15 s before its run, over several 5 s SNMP polls).
QUIET_AFTER_S = 25

# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def grafana(provisioned):
    lab = provisioned
    wait_until(lambda: lab.grafana("/api/health")["database"] == "ok", 120, "Grafana /api/health")
    return lab


@pytest.fixture(scope="module")
def transfers(grafana, tmp_path_factory):
    """A disk campaign (the engine's per-device panels, the annotations), then a
    long memory transfer that still runs while the tests query; yields (time
    range start, the campaign's PlaybookRun, its results directory, the live sender)."""
    lab = grafana
    started = time.time()
    results = tmp_path_factory.mktemp("results")
    run, directory = lab.campaign(CAMPAIGN, results)
    sender = lab.start_long_transfer(LIVE_SECONDS, LIVE_STREAMS)
    try:
        # Live for a while in Prometheus, so rates over $__rate_interval exist.
        wait_until(
            lambda: lab.promql(
                'sum(rate(longhaul_session_bytes_total{instance="xfer-b", direction="receive"}'
                "[20s])) > 0"
            ),
            90,
            "the live transfer in Prometheus",
        )
        time.sleep(30)
        yield started, run, directory, sender
    finally:
        lab.stop_long_transfer(sender)
        # The next module's router checks integrate the seconds before their own runs:
        # leave the path idle for longer than that, once the last stream has closed.
        wait_until(
            lambda: lab.sh(
                "xfer-b", "ss -Htn state established '( sport = :7400 )' | wc -l"
            ).stdout.strip()
            == "0",
            60,
            "the live transfer's connections to close",
        )
        time.sleep(QUIET_AFTER_S)


# --- tests ---------------------------------------------------------------------------


def test_grafana_runs_the_artifact_built_here(grafana):
    lab = grafana
    health = lab.grafana("/api/health")
    assert health["version"].startswith("10."), health
    unit = lab.sh(
        "monitor", "systemctl show grafana-server -p ActiveState -p User -p ExecStart"
    ).stdout
    assert "ActiveState=active" in unit and "User=grafana" in unit, unit
    assert "/opt/grafana/current/bin/grafana" in unit, unit


def test_datasources_are_healthy(grafana):
    lab = grafana
    datasources = {d["type"]: d for d in lab.grafana("/api/datasources")}
    assert {"prometheus", "influxdb"} <= set(datasources), datasources
    for source in datasources.values():
        health = lab.grafana("/api/datasources/uid/%s/health" % source["uid"])
        assert health["status"] == "OK", (source["name"], health)


def test_every_dashboard_is_provisioned(grafana):
    lab = grafana
    want = {json.loads(p.read_text())["uid"]: p.name for p in DASHBOARDS.glob("*.json")}
    listed = wait_until(
        lambda: (lambda found: found if set(found) == set(want) else None)(
            {b["uid"]: b for b in lab.grafana("/api/search", params={"type": "dash-db"})}
        ),
        60,
        "every dashboard of dashboards/ in /api/search",
    )
    for uid, name in want.items():
        meta = lab.grafana("/api/dashboards/uid/%s" % uid)["meta"]
        assert meta["provisioned"] and meta["provisionedExternalId"] == name, meta
        assert listed[uid]["folderTitle"] == "longhaul", listed[uid]


def test_every_panel_returns_data_through_grafana_during_a_transfer(grafana, transfers):
    lab = grafana
    started, _, _, sender = transfers
    start_ms, end_ms = int(started * 1000), int(time.time() * 1000)
    empty, queried = [], {}
    for board in lab.grafana("/api/search", params={"type": "dash-db"}):
        dashboard = Dashboard(lab, board["uid"], start_ms, end_ms)
        for title, target, source in dashboard.targets():
            found = len(frame_values(dashboard.query(target, source)))
            queried.setdefault(source["type"], []).append(found)
            if not found:
                empty.append(
                    "%s: %s (%s): %s"
                    % (
                        dashboard.title,
                        title,
                        target["refId"],
                        target.get("expr") or target.get("query"),
                    )
                )
    assert sender.poll() is None, "the live transfer ended before the queries did: %s" % (
        sender.stderr.read()
    )
    print({kind: "%d targets, %d points" % (len(n), sum(n)) for kind, n in queried.items()})
    assert {"prometheus", "influxdb"} <= set(queried), queried
    assert not empty, "panels without data through Grafana:\n  " + "\n  ".join(empty)


def test_campaign_leaves_start_and_end_annotations(grafana, transfers):
    lab = grafana
    _, run, directory, _ = transfers
    assert run.rc == 0, "campaign %s failed:\n%s" % (CAMPAIGN, run.tail())
    runs = yaml.safe_load((REPO / "campaigns" / ("%s.yml" % CAMPAIGN)).read_text())["campaign_runs"]
    for spec in runs:
        meta = json.loads((directory / ("%s.run.json" % spec["name"])).read_text())
        found = lab.grafana(
            "/api/annotations",
            params={"tags": ["campaign:%s" % CAMPAIGN, "run:%s" % spec["name"]], "limit": 100},
        )
        by_phase = {}
        for annotation in found:
            for phase in ("start", "end"):
                if phase in annotation["tags"]:
                    by_phase.setdefault(phase, []).append(annotation)
        assert set(by_phase) == {"start", "end"}, found
        # The newest of each (an earlier run of the same campaign may have left its own).
        start = max(a["time"] for a in by_phase["start"]) / 1000
        end = max(a["time"] for a in by_phase["end"]) / 1000
        print(
            "run %s: annotated %.1f s before its start, %.1f s after its end"
            % (spec["name"], epoch(meta["start"]) - start, end - epoch(meta["end"]))
        )
        assert start <= epoch(meta["start"]) + 1 < end, (meta, by_phase)
        assert epoch(meta["end"]) <= end + 1, (meta, by_phase)


def test_every_dashboard_shows_the_campaign_annotations(grafana, transfers):
    """Each dashboard's annotation query of Grafana's own annotations (tag
    longhaul), run as the frontend runs it, finds the start and the end of every
    run of the campaign."""
    lab = grafana
    started, run, _, _ = transfers
    assert run.rc == 0, "campaign %s failed:\n%s" % (CAMPAIGN, run.tail())
    runs = yaml.safe_load((REPO / "campaigns" / ("%s.yml" % CAMPAIGN)).read_text())["campaign_runs"]
    boards = lab.grafana("/api/search", params={"type": "dash-db"})
    assert boards
    for board in boards:
        dashboard = Dashboard(lab, board["uid"], int(started * 1000), int(time.time() * 1000))
        queries = [a for a in dashboard.annotations() if a["datasource"].get("type") == "grafana"]
        assert queries, "%s: no annotation query of Grafana's own annotations" % dashboard.title
        found = [
            tags for a in queries for tags in (x["tags"] for x in dashboard.tag_annotations(a))
        ]
        for spec in runs:
            for phase in ("start", "end"):
                want = {"longhaul", "campaign:%s" % CAMPAIGN, "run:%s" % spec["name"], phase}
                assert any(
                    want <= set(tags) for tags in found
                ), "%s: no %s annotation of run %s in %s" % (
                    dashboard.title,
                    phase,
                    spec["name"],
                    found,
                )


def test_campaign_goes_on_when_grafana_is_down(grafana, transfers, tmp_path):
    """Annotations are a convenience: a Grafana that does not answer is reported
    and the campaign still runs and succeeds."""
    lab = grafana
    lab.sh("monitor", "systemctl stop grafana-server")
    try:
        run, directory = lab.campaign("mem-35x2M", tmp_path, "campaign_time=5")
    finally:
        lab.sh("monitor", "systemctl start grafana-server")
        wait_until(lambda: lab.grafana("/api/health")["database"] == "ok", 120, "Grafana back up")
    assert run.rc == 0, "the campaign failed without Grafana:\n%s" % run.tail()
    assert (directory / "a-to-b.json").is_file()
    said = [line for line in run.output.splitlines() if "did not take the" in line]
    assert len(said) == 2, "no warning for the start and end annotations:\n%s" % run.tail(80)
    print(said[0].strip())
