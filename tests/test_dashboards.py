"""Every Grafana dashboard panel returns data from a live stack.

The fast, unit-level check of the queries (the lab's tests/lab/test_grafana.py
sends every panel through a real Grafana). Without Grafana, this test does
what Grafana would: it reads every dashboard in dashboards/, extracts each
panel's queries, substitutes the template variables the way Grafana does with "All" selected,
and runs them against a real Prometheus (PromQL) and InfluxDB (InfluxQL).
The stack (tests/stack.py) is fed by the real exporters and Telegraf during
a real `longhaul send` on loopback: a memory-to-memory transfer (with an
iperf3 transfer beside it, the other tools' TCP flows), then a short
disk-to-disk one for the engine's per-device panels. The Transfer
overview's total throughput must agree with the engine's own numbers.
"""

import json
import os
import re
import shutil
import subprocess
import threading
import time

import pytest
import yaml

import helpers
from stack import RATE_INTERVAL, ROUTER, Stack

DASHBOARDS = helpers.REPO / "dashboards"
RULES = helpers.REPO / "rules"

MEMORY_SECONDS = 20
STREAMS = 4
# Disk transfer: rate-limited so it spans several scrapes.
DISK_FILE_MIB = 160
DISK_RATE = "200M"
# Interval lines of the memory transfer left out of the steady window.
SKIP_FIRST, SKIP_LAST = 3, 2
TOLERANCE = 0.10
# Grafana's $__interval for InfluxQL panels in a short time range.
INFLUX_INTERVAL = "2s"

# Panels that can only show data while the engine runs in disk mode.
DISK_MODE_PANELS = {("disk-io.json", "Engine IO per device")}


# --- reading dashboards ---------------------------------------------------------


def load_dashboards():
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels_of(board):
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_targets():
    """(dashboard file, panel title, refId, target) of every query."""
    found = []
    for name, board in load_dashboards().items():
        for panel in panels_of(board):
            if panel["type"] == "row":
                continue
            for target in panel["targets"]:
                found.append((name, panel["title"], target["refId"], target))
    return found


TARGETS = panel_targets()


def variables_of(name):
    return load_dashboards()[name]["templating"]["list"]


# --- Grafana's variable substitution ----------------------------------------------

VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(text, values):
    def one(match):
        name = match.group(1) or match.group(2)
        if name not in values:
            raise AssertionError("unknown variable $%s in %r" % (name, text))
        return values[name]

    return VARIABLE.sub(one, text)


def influx_regex(values):
    """How Grafana renders a multi-value InfluxDB variable inside /^...$/."""
    return "(" + "|".join(re.escape(v).replace("/", "\\/") for v in values) + ")"


# --- the live stack --------------------------------------------------------------


class Run:
    """What happened during the transfers, for the assertions."""

    def __init__(self):
        self.started = time.time()
        self.memory_report = None
        self.intervals = []  # (arrival wall time, interval line)
        self.disk_ok = False
        self.disk_error = ""


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
    ]
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
        str(source / "payload.bin"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
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
    stack.start_prometheus(RULES)
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


def prom_values(name):
    """Grafana's rendering of the Prometheus variables with "All" selected."""
    values = {"__rate_interval": RATE_INTERVAL}
    for variable in variables_of(name):
        if variable["type"] == "datasource":
            values[variable["name"]] = variable["name"]
        elif variable["datasource"]["type"] == "prometheus":
            values[variable["name"]] = variable["allValue"]
    return values


def prom_regex(values):
    """How Grafana renders a multi-value variable inside a PromQL "..." matcher:
    a regex escape is a doubled backslash there."""
    return "(" + "|".join(re.sub(r"[$^*{}\[\]'+?.()|\\]", r"\\\\\g<0>", v) for v in values) + ")"


def influx_found(stack, name, start, end):
    """The values of the InfluxDB variables, each found by its own query (the
    time filter and the variables before it substituted)."""
    values = {"timeFilter": "time >= %dms AND time <= %dms" % (start * 1000, end * 1000)}
    found_by = {}
    for variable in variables_of(name):
        if variable["type"] == "query" and variable["datasource"]["type"] == "influxdb":
            query = substitute(variable["query"], values)
            found = [row[1] for series in stack.influxql(query) for row in series["values"]]
            assert found, "variable %s of %s has no values (%s)" % (variable["name"], name, query)
            found_by[variable["name"]] = found
            values[variable["name"]] = influx_regex(found)
    return found_by


def influx_values(stack, name, start, end):
    """Grafana's rendering of the InfluxDB variables with "All" selected: the
    alternation of every value their own queries return."""
    values = {
        "__interval": INFLUX_INTERVAL,
        "timeFilter": "time >= %dms AND time <= %dms" % (start * 1000, end * 1000),
    }
    for variable, found in influx_found(stack, name, start, end).items():
        values[variable] = influx_regex(found)
    return values


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
    "name,title,ref,target",
    TARGETS,
    ids=["%s:%s:%s" % (name[:-5], title, ref) for name, title, ref, _ in TARGETS],
)
def test_panel_returns_data(live, name, title, ref, target):
    stack, run = live
    start, end = time_range(run)
    if "expr" in target:
        # A PromQL target may use an InfluxDB variable too (the Links dashboard
        # selects Telegraf's router series by the router and interface variables).
        values = prom_values(name)
        for variable, found in influx_found(stack, name, start, end).items():
            values[variable] = prom_regex(found)
        expr = substitute(target["expr"], values)
        if target.get("instant"):
            # Instant panels show "now": take now as during the transfer.
            steady_start, steady_end, _ = steady_window(run)
            result = stack.promql(expr, at=(steady_start + steady_end) / 2)
        else:
            result = stack.prom_range(expr, start, end)
    else:
        query = substitute(target["query"], influx_values(stack, name, start, end))
        result = stack.influxql(query)
    if not result and (name, title) in DISK_MODE_PANELS:
        assert run.disk_ok, "needs the engine's disk mode, which failed: %s" % run.disk_error
    assert result, "panel %r of %s returned no data for %s" % (title, name, target)


def test_variables_have_values(live):
    """Every Prometheus variable's own query finds values."""
    stack, run = live
    start, end = time_range(run)
    for name in load_dashboards():
        values = prom_values(name)
        for variable in variables_of(name):
            if variable["type"] != "query" or variable["datasource"]["type"] != "prometheus":
                continue
            match = re.fullmatch(r"label_values\((.*), *(\w+)\)", variable["query"])
            assert match, "unexpected variable query %s" % variable["query"]
            selector, label = substitute(match.group(1), values), match.group(2)
            answer = helpers.get_json(
                "%s/api/v1/label/%s/values" % (stack.prometheus_url, label),
                {"match[]": selector, "start": "%.0f" % start, "end": "%.0f" % end},
            )
            assert answer["data"], "variable %s of %s has no values" % (variable["name"], name)


def test_total_throughput_matches_engine(live):
    """Transfer overview's Total throughput, over the steady window, within
    10 % of what the engine itself measured over the same seconds."""
    stack, run = live
    board = load_dashboards()["transfer-overview.json"]
    panel = next(p for p in panels_of(board) if p["title"] == "Total throughput")
    start, end, engine_bps = steady_window(run)
    values = prom_values("transfer-overview.json")
    # Grafana widens $__rate_interval with the time range; over exactly the
    # window the panel's value is the window's mean.
    values["__rate_interval"] = "%dms" % ((end - start) * 1000)
    expr = substitute(panel["targets"][0]["expr"], values)
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
    start, end = time_range(run)
    board = load_dashboards()["transfer-overview.json"]
    panel = next(p for p in panels_of(board) if p["title"] == "Throughput per session")
    (target,) = panel["targets"]
    assert "$protocol" in target["expr"], target["expr"]
    values = prom_values("transfer-overview.json")
    shown = {}
    for protocol in ("longhaul", "iperf3"):
        values["protocol"] = protocol
        result = stack.prom_range(substitute(target["expr"], values), start, end)
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
