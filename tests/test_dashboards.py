"""Every Grafana dashboard panel and annotation query returns data from a live
stack, queried as Grafana would query it (tests/dashboard_queries.py: its
variables, formats and macros, from Grafana's documentation; no Grafana).

The stack (tests/stack.py) is fed by the real exporters and Telegraf during
real `longhaul send`s on loopback, two runs of one campaign (`--campaign
stack-campaign --run ...`): a memory-to-memory transfer (with an iperf3
transfer beside it, the other tools' TCP flows), then a short disk-to-disk
one for the engine's per-device panels. Every target of every panel of
every dashboard returns data (and a copy of a dashboard with one wrong
metric name does not); every dashboard's "Campaign runs" annotations show
both runs, each from its start to its end; the Transfer overview's total
throughput agrees with the engine's own numbers. The lab runs the same
checks during a campaign (tests/lab/test_dashboards.py).
"""

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse

import pytest
import yaml

import helpers
from dashboard_queries import Dashboard, empty_targets, load_dashboards, panels_of
from live_view import (
    MAY_BE_EMPTY,
    LiveView,
    SlowStore,
    away_and_back,
    describe,
    each_dashboard,
    not_all_data,
    refresh_requests,
    start_live_view,
)
from stack import ROUTER, SCRAPE_S, SNMP_INTERFACES, Stack

RULES = helpers.REPO / "rules"

MEMORY_SECONDS = 20
STREAMS = 4
# Disk transfer: rate-limited so it spans several scrapes.
DISK_FILE_MIB = 160
DISK_RATE = "200M"
# Interval lines of the memory transfer left out of the steady window.
SKIP_FIRST, SKIP_LAST = 3, 2
TOLERANCE = 0.10
# The InfluxDB data source's minimum interval for this stack (Telegraf polls every second).
INFLUX_MIN_S = 2
# A sender's session is in Prometheus this soon after the sender starts, at most.
SESSION_LISTED_S = 10
# The campaign and runs the stack's transfers name.
CAMPAIGN = "stack-campaign"
RUNS = ("memory", "disk")

# Panels that can only show data while the engine runs in disk mode.
DISK_MODE_PANELS = {("disk-io.json", "Engine IO per device")}


def panel_targets():
    """(dashboard file, panel title, refId) of every query."""
    return [
        (name, panel["title"], target["refId"])
        for name, board in load_dashboards().items()
        for panel in panels_of(board)
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


TARGETS = panel_targets()


# --- the live stack --------------------------------------------------------------


class Run:
    """What happened during the transfers, for the assertions."""

    def __init__(self):
        self.started = time.time()
        self.memory_report = None
        self.intervals = []  # (arrival wall time, interval line)
        self.disk_ok = False
        self.disk_error = ""
        self.runs = {}  # run name -> (start, end), wall time


def run_memory_transfer(stack, longhaul, run):
    command = [
        longhaul,
        "send",
        "--to",
        "%s:%d" % (helpers.LOOPBACK, stack.engine_port),
        "--streams",
        str(STREAMS),
        "--time",
        str(MEMORY_SECONDS),
        "--interval",
        "1",
        "--json",
        "--campaign",
        CAMPAIGN,
        "--run",
        "memory",
    ]
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A hung sender must not hang the test: kill it well after its --time.
    watchdog = threading.Timer(MEMORY_SECONDS + 60, process.kill)
    watchdog.start()
    errors = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)
    reader.start()
    lines = []
    for line in process.stdout:
        line = line.strip()
        if line.startswith("{"):
            lines.append((time.time(), json.loads(line)))
    process.wait()
    watchdog.cancel()
    reader.join(timeout=5)
    run.runs["memory"] = (started, time.time())
    assert process.returncode == 0, "longhaul send failed: %s" % "".join(errors)
    assert lines, "longhaul send --json printed nothing"
    run.memory_report = lines[-1][1]
    run.intervals = [(at, line) for at, line in lines[:-1] if line.get("type") == "interval"]


def run_disk_transfer(stack, longhaul, run, workdir):
    source = workdir / "disk-source"
    source.mkdir()
    block = os.urandom(1 << 20)
    with open(source / "payload.bin", "wb") as payload:
        for _ in range(DISK_FILE_MIB):
            payload.write(block)
    command = [
        longhaul,
        "send",
        "--to",
        "%s:%d" % (helpers.LOOPBACK, stack.engine_port),
        "--streams",
        "2",
        "--rate",
        DISK_RATE,
        "--json",
        "--dest",
        "disk-test",
        "--campaign",
        CAMPAIGN,
        "--run",
        "disk",
        str(source / "payload.bin"),
    ]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    run.runs["disk"] = (started, time.time())
    run.disk_ok = done.returncode == 0
    run.disk_error = done.stderr.strip()[-2000:]


@pytest.fixture(scope="module")
def live(module_processes, tmp_path_factory):
    """The whole stack, after both transfers; yields (stack, run)."""
    workdir = tmp_path_factory.mktemp("stack")
    stack = Stack(module_processes, workdir)
    run = Run()
    longhaul = stack.start_engine(helpers.dist_dir())
    stack.start_other_tool()
    stack.start_exporter(helpers.dist_dir())
    stack.start_node_exporter()
    stack.start_influxdb()
    stack.start_snmpd()
    stack.start_telegraf()
    # The central store the live view's central pages read: fed by this Prometheus.
    stack.central_url = stack.start_victoriametrics()
    stack.start_prometheus(RULES, remote_write=[stack.central_url + "/api/v1/write"])
    # Everything scraped at least twice before the transfer starts.
    helpers.wait_until(
        lambda: len(stack.promql("up == 1")) == len(stack.targets),
        30,
        "every Prometheus target up: %s" % sorted(stack.targets),
    )
    helpers.wait_until(
        lambda: stack.influxql('SELECT count("ifHCInOctets") FROM "interface"'),
        30,
        "Telegraf's SNMP data in InfluxDB",
    )
    other_tool = stack.run_other_tool(MEMORY_SECONDS)
    run_memory_transfer(stack, longhaul, run)
    other_tool.wait(timeout=60)
    run_disk_transfer(stack, longhaul, run, workdir)
    # Two more scrapes and SNMP polls, so the last values are stored.
    time.sleep(3)
    yield stack, run
    # The disk payload and its copy are large; pytest keeps old tmp dirs.
    for directory in ("disk-source", "receiver-root"):
        shutil.rmtree(workdir / directory, ignore_errors=True)


def time_range(run):
    return run.started, time.time()


def dashboard(stack, run, board, **options):
    """A dashboard over the stack's whole run, its variables resolved as Grafana would."""
    start, end = time_range(run)
    return Dashboard(board, stack, start, end, SCRAPE_S, INFLUX_MIN_S, **options)


def steady_window(run):
    """Wall-clock (start, end) and engine bits/s of the steady part of the
    memory transfer, from the engine's own interval lines."""
    lines = run.intervals[SKIP_FIRST : len(run.intervals) - SKIP_LAST]
    assert len(lines) >= 5, "too few interval lines: %s" % run.intervals
    first_at, first = lines[0]
    last_at, last = lines[-1]
    start = first_at - (first["end"] - first["start"])
    seconds = last["end"] - first["start"]
    bits = 8 * sum(line["bytes"] for _, line in lines)
    return start, last_at, bits / seconds


# --- tests -----------------------------------------------------------------------


def test_transfers_ran(live):
    _, run = live
    report = run.memory_report
    assert report["mode"] == "memory"
    assert report["throughput_bps"] > 0
    assert len(report["streams"]) == STREAMS


def test_disk_transfer_ran(live):
    """The disk transfer feeds the engine's per-device panels."""
    _, run = live
    assert run.disk_ok, "disk mode transfer failed: %s" % run.disk_error


@pytest.mark.parametrize(
    "name,title,ref",
    TARGETS,
    ids=["%s:%s:%s" % (name[:-5], title, ref) for name, title, ref in TARGETS],
)
def test_panel_returns_data(live, name, title, ref):
    """The target's query, its variables resolved and rendered and Grafana's
    macros expanded as Grafana does, returns data: a range query over the
    whole run, or an instant one in the middle of the steady transfer (an
    instant panel shows "now")."""
    stack, run = live
    board = dashboard(stack, run, load_dashboards()[name])
    steady_start, steady_end, _ = steady_window(run)
    target, source_type, query = next(
        (target, source_type, query)
        for panel, target, source_type, query in board.targets()
        if panel == title and target["refId"] == ref
    )
    result = board.run_target(target, source_type, query, at=(steady_start + steady_end) / 2)
    if not result and (name, title) in DISK_MODE_PANELS:
        assert run.disk_ok, "needs the engine's disk mode, which failed: %s" % run.disk_error
    assert result, "panel %r of %s returned no data for %s" % (title, name, query)


def test_a_wrong_metric_name_leaves_its_panel_without_data(live):
    """The check above can fail: a copy of a dashboard with one metric name
    misspelt has exactly that panel's target empty, and every other target
    still returns data."""
    stack, run = live
    board = load_dashboards()["cpu.json"]
    wrong = json.loads(
        json.dumps(board).replace("node_cpu_seconds_total", "node_cpu_second_total", 1)
    )
    assert wrong != board
    steady_start, steady_end, _ = steady_window(run)
    at = (steady_start + steady_end) / 2
    assert empty_targets(dashboard(stack, run, board), at) == []
    empty = empty_targets(dashboard(stack, run, wrong), at)
    assert len(empty) == 1 and "node_cpu_second_total" in empty[0], empty


def test_variables_have_values(live):
    """Every query variable's own query finds values, those of the InfluxDB
    variables and the campaign variable included (Dashboard fails on one
    that finds none)."""
    stack, run = live
    for name, board in load_dashboards().items():
        found = dashboard(stack, run, board).found
        if "campaign" in found:
            assert CAMPAIGN in found["campaign"], (name, found["campaign"])


def first_seen(stack, run_name, started, ended):
    """When Prometheus first stored the run's session (its info series), which
    must be soon after the sender started: the engine lists a session once its
    streams are up, and everything is scraped every SCRAPE_S."""
    series = stack.prom_range(
        'longhaul_session_info{campaign="%s", run="%s"}' % (CAMPAIGN, run_name),
        started - 5,
        ended,
        SCRAPE_S,
    )
    assert series, "Prometheus never stored run %s's session" % run_name
    seen = min(float(t) for one in series for t, _ in one["values"])
    assert seen <= started + SESSION_LISTED_S, (run_name, started, seen)
    return seen


def test_every_dashboard_annotates_the_campaign_s_runs(live):
    """Each dashboard's "Campaign runs" annotation query, run as Grafana runs
    it, draws one region per run of the campaign, from (about) the run's start
    to its end, titled with the campaign and the run; the engine lists a
    session for a minute after it ends, so a region may end up to that much
    (and a step) later. Selecting another campaign shows none of them."""
    stack, run = live
    step = 30
    # Grafana samples an annotation query every step, on step-aligned instants:
    # the range must reach a step past the last run (listed a minute after it).
    time.sleep(max(0, max(end for _, end in run.runs.values()) + step - time.time()))
    seen = {name: first_seen(stack, name, *span) for name, span in run.runs.items()}
    for name, board in load_dashboards().items():
        regions = dashboard(stack, run, board).annotations("Campaign runs")
        ours = {r["labels"]["run"]: r for r in regions if r["labels"].get("campaign") == CAMPAIGN}
        assert set(ours) == set(RUNS), (name, regions)
        for run_name, (started, ended) in run.runs.items():
            region = ours[run_name]
            assert region["title"] == "%s: run %s" % (CAMPAIGN, run_name), region
            # The region starts at the first step that sees the run's session,
            # at most a step after Prometheus first stored it; that may be
            # more than a step after the sender started (CI: started 0.96 s
            # before a step, stored after it, so drawn from the next step).
            first = seen[run_name]
            assert started - step <= region["start"] <= first + step, (name, region, started, first)
            assert ended - step <= region["end"] <= ended + 60 + step, (name, region, ended)
        other = dashboard(
            stack, run, board, chosen={"campaign": "no-such-campaign"}, allow_empty=True
        )
        assert other.annotations("Campaign runs") == [], name


def test_session_annotations_and_panels_follow_the_campaign_variable(live):
    """The Transfer overview's Sessions annotation and session panels keep
    the selected campaign's sessions: both runs with the campaign, none with
    another one."""
    stack, run = live
    board = load_dashboards()["transfer-overview.json"]
    sessions = dashboard(stack, run, board).annotations("Sessions")
    assert len({r["labels"]["session"] for r in sessions}) >= 2, sessions
    other = dashboard(stack, run, board, chosen={"campaign": "no-such-campaign"}, allow_empty=True)
    assert other.annotations("Sessions") == []
    panel = next(p for p in panels_of(board) if p["title"] == "Throughput per session")
    for chosen, shown in ((CAMPAIGN, True), ("no-such-campaign", False)):
        view = dashboard(stack, run, board, chosen={"campaign": chosen}, allow_empty=True)
        ((_, target, source_type, query),) = [t for t in view.targets() if t[0] == panel["title"]]
        assert bool(view.run_target(target, source_type, query)) == shown, (chosen, query)


def test_total_throughput_matches_engine(live):
    """Transfer overview's Total throughput, over the steady window, within
    10 % of what the engine itself measured over the same seconds."""
    stack, run = live
    board = load_dashboards()["transfer-overview.json"]
    panel = next(p for p in panels_of(board) if p["title"] == "Total throughput")
    start, end, engine_bps = steady_window(run)
    # Grafana widens $__rate_interval with the time range; over exactly the
    # window the panel's value is the window's mean.
    window = "%dms" % ((end - start) * 1000)
    expr = dashboard(stack, run, board).render(
        panel["targets"][0]["expr"].replace("$__rate_interval", window), "prometheus"
    )
    result = stack.promql(expr, at=end)
    by_direction = {
        series["metric"].get("direction"): float(series["value"][1]) for series in result
    }
    assert "receive" in by_direction, "no receive series: %s" % result
    panel_bps = by_direction["receive"]
    print(
        "steady window %.1f s: panel %.4g bit/s, engine %.4g bit/s (%+.1f %%)"
        % (end - start, panel_bps, engine_bps, 100 * (panel_bps / engine_bps - 1))
    )
    assert (
        abs(panel_bps - engine_bps) <= TOLERANCE * engine_bps
    ), "Total throughput panel %.3g bit/s vs engine %.3g bit/s (final report %.3g bit/s)" % (
        panel_bps,
        engine_bps,
        run.memory_report["throughput_bps"],
    )


def test_protocol_variable_selects_sessions(live):
    """The Transfer overview's session panels keep the sessions of the
    selected protocol: the stack's transfers are longhaul sessions (its
    iperf3 runs against iperf3's own server, no longhaul session), so
    protocol=longhaul shows them and protocol=iperf3 shows none."""
    stack, run = live
    board = load_dashboards()["transfer-overview.json"]
    panel = next(p for p in panels_of(board) if p["title"] == "Throughput per session")
    (target,) = panel["targets"]
    assert "$protocol" in target["expr"], target["expr"]
    shown = {}
    for protocol in ("longhaul", "iperf3"):
        view = dashboard(stack, run, board, chosen={"protocol": protocol}, allow_empty=True)
        ((_, target, source_type, query),) = [t for t in view.targets() if t[0] == panel["title"]]
        result = view.run_target(target, source_type, query)
        shown[protocol] = {series["metric"]["session"] for series in result}
    assert shown["longhaul"], "protocol=longhaul shows no session"
    assert shown["iperf3"] == set(), "protocol=iperf3 shows longhaul sessions: %s" % shown


def test_rules_loaded(live):
    """Prometheus loaded the repository's rule files and evaluates them."""
    stack, _ = live
    groups = helpers.get_json(stack.prometheus_url + "/api/v1/rules")["data"]["groups"]
    names = {group["name"] for group in groups}
    assert {"longhaul-throughput", "longhaul-transfers", "longhaul-thresholds"} <= names
    assert stack.promql("longhaul:session_throughput_bits:rate1m") or stack.promql(
        "max_over_time(longhaul:session_throughput_bits:rate1m[5m])"
    )
    for group in groups:
        for rule in group["rules"]:
            assert rule.get("health") != "err", rule


def test_normal_transfers_raise_no_throughput_alert(live):
    """Neither transfer, nor its normal end, made LonghaulThroughputDrop's
    condition true even for one evaluation (it would show as pending)."""
    stack, run = live
    start, end = time_range(run)
    expr = 'max_over_time(ALERTS{alertname="LonghaulThroughputDrop"}[%ds])' % (end - start + 1)
    assert stack.promql(expr) == []


def test_router_counters_stale_watches_live_telegraf(live):
    """RouterCountersStale's inputs exist in a real Telegraf's
    prometheus_client output, and none of its conditions holds while Telegraf
    polls snmpd and writes to InfluxDB."""
    stack, _ = live
    assert "telegraf" in stack.targets, "Telegraf is not scraped (job telegraf)"
    counters = stack.promql('interface_ifHCInOctets{job="telegraf"}')
    assert {series["metric"].get("router") for series in counters} == {ROUTER}
    assert stack.promql('internal_write_errors{job="telegraf", output="influxdb"}')
    # The router's inputs carry its name as alias (snmp_errors condition).
    assert stack.promql('internal_gather_errors{job="telegraf", input="snmp", alias="%s"}' % ROUTER)
    groups = yaml.safe_load((RULES / "longhaul-alerts.yml").read_text())["groups"]
    exprs = [
        rule["expr"]
        for group in groups
        for rule in group["rules"]
        if rule.get("alert") == "RouterCountersStale"
    ]
    assert len(exprs) == 5, exprs
    for expr in exprs:
        assert stack.promql(expr) == [], "RouterCountersStale condition holds: %s" % expr
    # router_not_polled compares with the inventory's routers (longhaul-expected.yml,
    # empty in rules/): with the polled router and one nobody polls listed, only the
    # latter is not seen.
    (not_polled,) = [
        rule["expr"]
        for group in groups
        for rule in group["rules"]
        if rule.get("labels", {}).get("reason") == "router_not_polled"
    ]
    listed = " or ".join(
        'label_replace(vector(1), "router", "%s", "", "")' % router for router in (ROUTER, "lost-router")
    )
    lost = stack.promql(not_polled.replace("longhaul:expected:router", "(%s)" % listed))
    assert [series["metric"]["router"] for series in lost] == ["lost-router"], lost


# --- the live view: the Perses rendering in Chromium, through the role's nginx ----------


def stop(processes, name):
    """Stop the process `name`."""
    process = next(p for p in processes.started if p.name == name)
    process.terminate()
    process.wait(timeout=30)


def start_again(processes, name, ready_url):
    """Start again, with the same command line, the process `name` stopped, and
    wait until `ready_url` answers."""
    old = next(p for p in processes.started if p.name == name)
    process = processes.start(name, old.args)
    helpers.wait_until(lambda: helpers.http_get(ready_url), 60, "%s back" % name)
    return process


def test_the_live_view_draws_every_dashboard_and_outlives_prometheus(live, module_processes, tmp_path):
    """The live view (web/, dist/web) served by nginx with the live_view role's site,
    in headless Chromium, against the stack's Prometheus after its transfers:
    every panel of every dashboard draws data (the firing-alerts table says "No
    data": none fires), the per-stream panel lists the memory run's streams, the
    router panels the interfaces Telegraf polls. Then Prometheus stopped under the
    open page: every panel says so (nginx's 502), the page stays; Prometheus back
    on the same port and data: every panel draws again, without a reload."""
    stack, run = live
    base = start_live_view(module_processes, tmp_path / "nginx", stack.prometheus_url, tmp_path)
    index = helpers.get_json(base + "/dashboards/index.json")
    assert [entry["name"] for entry in index][0] == "transfer-overview"
    failures = []
    with LiveView(base) as view:
        for entry, settled in each_dashboard(view, index, failures, tmp_path):
            if entry["name"] == "transfer-overview":
                streams = view.panel_until("Per-stream throughput", lambda p: p["legendCount"] >= STREAMS)
                assert streams["legendCount"] >= STREAMS, describe(settled)
            if entry["name"] == "router-traffic":
                wanted = {"%s %s in" % (ROUTER, name) for name in SNMP_INTERFACES}
                legend = view.panel_until("Traffic per interface", lambda p: wanted <= set(p["legend"]))["legend"]
                assert wanted <= set(legend), legend
        assert not failures, "panels not drawn with data:\n" + "\n".join(failures)

        # From here on the table of current sessions may say "No data": it lists the
        # sessions of the last $__rate_interval, and the stack's transfers ended
        # before the dashboards above were drawn (CI PP: it emptied between the page
        # opened again and its narrowing, on a machine slower than this one).
        ended = MAY_BE_EMPTY | {SESSIONS_TABLE}
        view.open("/d/transfer-overview?refresh=5s")
        before = view.settle_with_data(90, ended)
        assert before["held"], "opened again: " + describe(before)
        # A narrower window: the panels narrow and every chart is drawn again to
        # fill its box (our EChart resizes a chart when its box changes size,
        # web/src/echart.jsx).
        view.viewport(1000, 4000)
        narrow = view.settle_with_data(90, ended)
        view.viewport(1600, 4000)
        assert narrow["held"], "narrowed: " + describe(narrow)
        narrowed = [p for p, w in zip(narrow["panels"], before["panels"])
                    if p["chartWidth"] > 0 and p["boxWidth"] < 0.9 * w["boxWidth"]]
        assert len(narrowed) >= 10, "narrowed, %d panels narrower: %s" % (len(narrowed), describe(narrow))
        unfit = ["%s: chart %.0f px in a box of %.0f" % (p["title"], p["chartWidth"], p["boxWidth"])
                 for p in narrow["panels"] if p["chartWidth"] > 0 and abs(p["chartWidth"] - p["boxWidth"]) > 2]
        assert not unfit, "charts not drawn again to their narrower boxes:\n" + "\n".join(unfit)
        before = view.settle_with_data(90, ended)
        assert before["held"], "widened again: " + describe(before)
        down, restarted = away_and_back(
            view,
            before,
            lambda: stop(module_processes, "prometheus"),
            lambda: start_again(module_processes, "prometheus", stack.prometheus_url + "/-/ready"),
            "Prometheus does not answer the live view",
        )
        assert down["title"] == "longhaul / Transfer overview", (down["title"], describe(down))
        module_processes.check_running(restarted)


def test_the_live_view_draws_every_panel_from_a_prometheus_slower_than_its_refresh(live, module_processes, tmp_path):
    """The live view against the stack's Prometheus answering every request 2 s
    late (a Prometheus busy with other work, as the lab's beside Molecule on 2
    cores), the page refreshed every 5 s. Over HTTP/1.1 Chromium asks one origin
    six requests at a time, so one refresh of the transfer overview (37 requests)
    takes longer than 5 s. Each refresh waits for the last one's answers
    (web/src/refresh.js): every panel draws with data, the per-stream panel lists
    the memory run's streams, no panel says Prometheus is away during half a
    minute of refreshes (a health check queued behind the panels' queries is no
    news of it), and over that half minute the page asks no more than one
    refresh's queries beyond those that reached Prometheus. Before, each refresh
    piled a whole dashboard's queries on the browser's queue: the answers came
    for time ranges the page had left, and the panels not drawn by then never
    were."""
    stack, run = live
    ended = MAY_BE_EMPTY | {SESSIONS_TABLE}
    per_refresh = sum(refresh_requests("transfer-overview"))
    health = "/api/v1/status/buildinfo"
    with SlowStore(stack.prometheus_url, delay_s=2) as slow:
        base = start_live_view(module_processes, tmp_path / "nginx", slow.url, tmp_path)
        with LiveView(base) as view:
            view.open("/d/transfer-overview?refresh=5s")
            settled = view.settle_with_data(120, ended)
            assert settled["held"], describe(settled)
            view.screenshot(tmp_path / "slow-transfer-overview.png")
            streams = view.panel_until("Per-stream throughput", lambda p: p["legendCount"] >= STREAMS)
            assert streams["legendCount"] >= STREAMS, describe(settled)
            view.queries()
            before = len(slow.arrived)
            for _ in range(6):
                time.sleep(5)
                now = view.settle("drawn", 30, stable_s=0)
                said = [p["title"] for p in now["panels"] if p["state"] != "data" and p["title"] not in ended]
                assert not said, "during the refreshes: " + describe(now)
            issued = [q for q in view.queries() if not q["path"].endswith(health)]
            arrived = [path for path in slow.arrived[before:] if not path.endswith(health)]
            assert len(arrived) > per_refresh, (len(arrived), per_refresh)
            assert len(issued) - len(arrived) <= per_refresh, (len(issued), len(arrived), per_refresh)
            later = view.settle_with_data(60, ended)
            assert later["held"], "after half a minute of refreshes: " + describe(later)


def test_the_live_view_s_central_pages_read_the_first_replica_that_answers(live, module_processes, tmp_path):
    """The live view with a central store of two replicas: the first listed never
    answers (nothing listens on its port), the second is a real VictoriaMetrics
    that the stack's Prometheus remote-writes to. /live-view.json says there is a
    central store; every central page (/central/d/NAME) draws every panel with data,
    each query going to /central/api/ (POST bodies too, passed on to the second
    replica when the first gives no answer) and none to the site's Prometheus; the
    Site/Central switch leads from one to the other, keeping the time range.
    VictoriaMetrics stopped: every panel says the central store does not answer,
    and draws again when it is back. A live view without central URLs says so at
    /central/ and answers 404 for its API."""
    stack, run = live
    # All of the memory run's streams in the central store: remote write is batched
    # (and the run has ended: its series are stale, so looked back on).
    streams = "last_over_time(longhaul_stream_bytes_total[1h])"
    helpers.wait_until(
        lambda: len(query_central(stack, streams)) >= STREAMS,
        30,
        "the memory run's streams in VictoriaMetrics",
    )
    # The first replica: a port of ours, bound and not listening (no other process can
    # take it meanwhile): each connection to it is refused.
    holder = socket.socket()
    holder.bind((helpers.LOOPBACK, 0))
    dead = "http://%s:%d" % holder.getsockname()
    base = start_live_view(
        module_processes, tmp_path / "nginx", stack.prometheus_url, tmp_path,
        live_view_central_urls=[dead, stack.central_url],
    )
    assert helpers.get_json(base + "/live-view.json") == {"central": True, "central_replicas": 2}
    # The API through the second replica, by GET and by POST (a form body, as the page sends).
    answer = helpers.get_json(base + "/central/api/v1/query?query=vm_app_version")
    assert answer["status"] == "success", answer
    posted = json.loads(helpers.http_post(base + "/central/api/v1/query", {"query": "count(%s)" % streams}))
    assert posted["data"]["result"][0]["value"][1] == str(len(query_central(stack, streams))), posted
    index = helpers.get_json(base + "/dashboards/index.json")
    failures = []
    empty_on_site = {}
    with LiveView(base) as view:
        for entry in index:
            # What the site's page shows now: the central page shows the same.
            view.open("/d/%s?refresh=5s" % entry["name"])
            empty = {p["title"] for p in view.settle("drawn", 90)["panels"] if p["state"] == "nodata"}
            # The transfers have ended, and the engine forgets an ended session a
            # minute later: the instant table of sessions is then empty on the
            # central store at once, where Prometheus still shows its last minute
            # (VictoriaMetrics ends a series at its staleness marker). It may be empty
            # here only once the engine lists no session.
            empty_on_site[entry["name"]] = empty | {SESSIONS_TABLE}
            view.open("/central/d/%s?refresh=5s" % entry["name"])
            settled = view.settle_with_data(90, may_be_empty=MAY_BE_EMPTY | empty_on_site[entry["name"]])
            view.screenshot(tmp_path / ("central-%s.png" % entry["name"]))
            failure = not_all_data(entry["name"], settled, MAY_BE_EMPTY | empty_on_site[entry["name"]])
            if failure:
                failures.append("central " + failure)
            tables = [p for p in settled["panels"] if p["title"] == SESSIONS_TABLE and p["state"] == "nodata"]
            listed = helpers.get_json("http://%s:%d/v1/sessions" % (helpers.LOOPBACK, stack.stats_port))["sessions"]
            if SESSIONS_TABLE not in empty and tables and (len(tables) > 1 or listed):
                failures.append("central %s: %d panels %r say No data while the engine lists %d sessions"
                                % (entry["name"], len(tables), SESSIONS_TABLE, len(listed)))
            asked = view.queries()
            elsewhere = sorted({q["path"] for q in asked if not q["path"].startswith("/central/api/v1/")})
            assert asked and not elsewhere, (entry["name"], elsewhere, len(asked))
            if entry["name"] == "transfer-overview":
                streams = view.panel_until("Per-stream throughput", lambda p: p["legendCount"] >= STREAMS)
                assert streams["legendCount"] >= STREAMS, describe(settled)
        assert not failures, "central panels not drawn with data:\n" + "\n".join(failures)
        # The switch: from the central page to the site's, the time range kept.
        view.open("/central/d/cpu?start=30m&refresh=5s")
        view.settle_with_data(90)
        switched = view.click("[data-testid=store-switch] a:has-text('Site')")
        assert switched["path"] == "/d/cpu" and "start=30m" in switched["search"], switched
        site = view.settle_with_data(90)
        assert not_all_data("cpu", site) is None, describe(site)
        # From here on (a refresh of 5 s later) the page asks the site's Prometheus only.
        view.queries()
        time.sleep(6)
        assert {q["path"].split("/")[1] for q in view.queries()} == {"prometheus"}

        view.open("/central/d/transfer-overview?refresh=5s")
        before = view.settle_with_data(90, may_be_empty=MAY_BE_EMPTY | empty_on_site["transfer-overview"])
        _, restarted = away_and_back(
            view,
            before,
            lambda: stop(module_processes, "victoria-metrics"),
            lambda: start_again(module_processes, "victoria-metrics", stack.central_url + "/health"),
            "The central store does not answer the live view",
        )
        module_processes.check_running(restarted)

    # Without central URLs: no central store, said at /central/, its API not there.
    plain = start_live_view(module_processes, tmp_path / "nginx-plain", stack.prometheus_url, tmp_path)
    assert helpers.get_json(plain + "/live-view.json") == {"central": False, "central_replicas": 0}
    with pytest.raises(urllib.error.HTTPError) as refused:
        helpers.http_get(plain + "/central/api/v1/query?query=up")
    assert refused.value.code == 404
    with LiveView(plain) as view:
        view.open("/central/d/cpu")
        # (after "Loading…", the same element)
        message = helpers.wait_until(
            lambda: (lambda text: "no central store" in text and text)(view.text("[data-testid=live-view-message]")),
            30,
            "the page saying there is no central store",
        )
        assert "open the site's pages" in message, message
    holder.close()


# The transfer overview's table of current sessions (and its chart of them).
SESSIONS_TABLE = "Sessions"


def query_central(stack, expr):
    """An instant PromQL query to the stack's VictoriaMetrics; its result list."""
    answer = helpers.get_json(stack.central_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]
