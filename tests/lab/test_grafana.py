"""Grafana in the lab: the monitor's Grafana (the server scripts/setup builds
from the Go module proxy, installed by the grafana role through site.yml)
provisions our datasources and dashboards, and every panel of every dashboard
returns data through Grafana's own query path (/api/ds/query: its PromQL and
InfluxQL clients, its macros) while a transfer runs. Campaigns leave start and
end annotations in it.

Generic over the dashboards: whatever dashboards Grafana lists, whatever
panels, targets and template variables they have. Grafana's backend does not
expand dashboard variables (its frontend does), so the test does it as the
frontend would: every query variable's own query runs through Grafana and
must find values in the lab, and a multi-value variable is rendered with
every value it found selected (not "All" = .+, which would hide a panel
whose series carry values its variable does not list), a single-value one
with its saved value if found, else the first. $__rate_interval,
$__interval and $timeFilter are left for Grafana to expand.
"""

import json
import re
import time
import urllib.error

import pytest
import yaml
from labkit import REPO, epoch, frame_values, wait_until

DASHBOARDS = REPO / "dashboards"
CAMPAIGN = "disk-2-controllers"
# The live memory transfer the panels are queried during; it must outlast the queries.
LIVE_SECONDS = 600
LIVE_STREAMS = 8
# Seconds of an idle path the module leaves behind (test_lab.py's router check
# integrates 15 s before its run, over several 5 s SNMP polls).
QUIET_AFTER_S = 25
MAX_DATA_POINTS = 1000
# The lab scrapes and polls every 5 s: Grafana's smallest useful interval there.
MIN_INTERVAL_MS = 5000

# Grafana's own variables and macros, expanded by Grafana itself.
VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")
GRAFANA_MACRO = re.compile(r"^(__\w+|timeFilter|interval|interval_ms|range|range_s|range_ms)$")


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


# --- Grafana's query path, as its frontend drives it --------------------------------------


class Dashboard:
    """A dashboard as Grafana serves it, with its variables resolved through Grafana."""

    def __init__(self, lab, uid, start_ms, end_ms):
        self.lab = lab
        self.start_ms, self.end_ms = start_ms, end_ms
        self.model = lab.grafana("/api/dashboards/uid/%s" % uid)["dashboard"]
        self.title = self.model["title"]
        self.datasources = lab.grafana("/api/datasources")
        self.values = {}  # variable name -> the selected values
        self.formats = {}  # variable name -> "prometheus" | "influxdb" (regex) | "plain"
        for variable in self.model.get("templating", {}).get("list", []):
            self.resolve(variable)

    # variables ---------------------------------------------------------------------
    def resolve(self, variable):
        name, kind = variable["name"], variable["type"]
        if kind == "datasource":
            matches = [d["uid"] for d in self.datasources if d["type"] == variable["query"]]
            assert matches, "%s: no %s datasource for $%s" % (self.title, variable["query"], name)
            self.values[name], self.formats[name] = matches[:1], "plain"
        elif kind == "query":
            source = self.datasource(variable["datasource"])
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            found = self.variable_values(source, self.render(query, source["type"]))
            assert found, "%s: variable $%s has no values (%s)" % (self.title, name, query)
            self.values[name], self.formats[name] = selection(variable, found, source["type"])
        elif kind == "custom":
            self.values[name] = [v.strip() for v in variable["query"].split(",") if v.strip()]
            self.formats[name] = "plain"
        elif kind in ("constant", "textbox"):
            self.values[name], self.formats[name] = [variable["query"]], "plain"
        else:
            raise AssertionError(
                "%s: variable type %s of $%s not handled" % (self.title, kind, name)
            )

    def variable_values(self, source, query):
        if source["type"] == "prometheus":
            match = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", query)
            assert match, "%s: unexpected Prometheus variable query %r" % (self.title, query)
            params = {"start": self.start_ms // 1000, "end": self.end_ms // 1000}
            if match.group(1):
                params["match[]"] = match.group(1).strip()
            answer = self.lab.grafana(
                "/api/datasources/uid/%s/resources/api/v1/label/%s/values"
                % (source["uid"], match.group(2)),
                params=params,
            )
            return sorted(answer["data"])
        if source["type"] == "influxdb":
            frames = self.query(
                {"refId": "V", "query": query, "rawQuery": True, "resultFormat": "table"}, source
            )
            # SHOW TAG VALUES: columns key, value.
            return sorted({row for f in frames for row in f["data"]["values"][-1]})
        raise AssertionError("%s: variables of %s datasources not handled" % (self.title, source))

    def render(self, text, datasource_type):
        """The text with the dashboard's variables in the format of this datasource
        (all their values selected); Grafana's own macros left as they are."""

        def one(match):
            name = next(g for g in (match.group(1), match.group(3), match.group(4)) if g)
            if name in self.values:
                return render_values(self.values[name], self.formats[name], datasource_type)
            if GRAFANA_MACRO.match(name):
                return match.group(0)
            raise AssertionError("%s: unknown variable $%s in %r" % (self.title, name, text))

        return VARIABLE.sub(one, text)

    # queries -----------------------------------------------------------------------
    def datasource(self, reference):
        """The datasource ({uid, type}) a panel or target names, variables resolved."""
        if reference is None:
            default = [d for d in self.datasources if d.get("isDefault")]
            assert default, "%s: a panel without datasource and no default datasource" % self.title
            return {"uid": default[0]["uid"], "type": default[0]["type"]}
        if isinstance(reference, str):  # older dashboards: the datasource's name or a variable
            reference = {"uid": reference}
        uid = self.render(reference.get("uid", ""), "plain")
        found = [d for d in self.datasources if uid in (d["uid"], d["name"])]
        assert found, "%s: datasource %r not in Grafana" % (self.title, reference)
        return {"uid": found[0]["uid"], "type": found[0]["type"]}

    def query(self, target, source):
        """POST /api/ds/query of one target; returns its frames (fails on errors)."""
        span_ms = self.end_ms - self.start_ms
        body = {
            "from": str(self.start_ms),
            "to": str(self.end_ms),
            "queries": [
                dict(
                    target,
                    datasource=source,
                    intervalMs=max(MIN_INTERVAL_MS, span_ms // MAX_DATA_POINTS),
                    maxDataPoints=MAX_DATA_POINTS,
                )
            ],
        }
        try:
            answer = self.lab.grafana("/api/ds/query", body)
        except urllib.error.HTTPError as error:
            raise AssertionError(
                "%s: /api/ds/query answered %s: %s" % (self.title, error.code, error.read()[:2000])
            ) from None
        result = answer["results"][target["refId"]]
        assert "error" not in result, "%s: %s: %s" % (self.title, target, result["error"])
        return result.get("frames", [])

    def targets(self):
        """(panel title, target with variables rendered, its datasource) of every panel."""
        for panel in panels_of(self.model):
            if panel.get("type") == "row":
                continue
            for target in panel.get("targets", []):
                if target.get("hide"):
                    continue
                source = self.datasource(target.get("datasource") or panel.get("datasource"))
                rendered = dict(target)
                for field in ("expr", "query"):
                    if isinstance(rendered.get(field), str):
                        rendered[field] = self.render(rendered[field], source["type"])
                yield panel.get("title", "?"), rendered, source


def panels_of(model):
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def selection(variable, found, fmt):
    """(values, format) of a query variable: every value found for a multi-value
    one; else its saved value if the lab has it, else the first found."""
    if variable.get("multi") or variable.get("includeAll"):
        return found, fmt
    saved = (variable.get("current") or {}).get("value")
    return ([saved] if saved in found else found[:1]), fmt


def render_values(values, fmt, datasource_type):
    """How Grafana renders a variable with these values selected inside a query of
    this datasource type: a regex alternation for multi-value variables."""
    if fmt == "plain" or datasource_type not in ("prometheus", "influxdb"):
        return values[0] if len(values) == 1 else "{%s}" % ",".join(values)
    if datasource_type == "prometheus":
        # inside a PromQL string: a regex escape is a doubled backslash
        escaped = [
            re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), v) for v in values
        ]
    else:
        escaped = [re.sub(r"[$^*{}\[\]+?.()|\\/]", lambda m: "\\" + m.group(0), v) for v in values]
    return "(" + "|".join(escaped) + ")"


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
