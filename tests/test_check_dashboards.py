"""scripts/check-dashboards and its rules (dashboards/lint.py): the committed
dashboards pass; a scratch copy of them passes as copied and fails, naming
the rule and the panel, once one dashboard breaks one rule."""

import json
import shutil
import subprocess

import pytest

import helpers
from stack import VENV_BIN

DASHBOARDS = helpers.REPO / "dashboards"
PYTHON = str(VENV_BIN / "python3")


def check(script, directory):
    """dashboards/SCRIPT on `directory`, finished."""
    return subprocess.run(
        [PYTHON, str(DASHBOARDS / script), str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def lint(directory):
    return check("lint.py", directory)


@pytest.fixture
def scratch(tmp_path):
    """A copy of dashboards/ (the JSON files and .lint) that passes."""
    for path in list(DASHBOARDS.glob("*.json")) + [DASHBOARDS / ".lint"]:
        shutil.copy(path, tmp_path / path.name)
    done = lint(tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path


def edit(directory, name, change):
    path = directory / name
    board = json.loads(path.read_text())
    change(board)
    path.write_text(json.dumps(board, indent=2))


def panel(board, title):
    return next(p for p in board["panels"] if p.get("title") == title)


def fails(directory, rule, *words):
    done = lint(directory)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if "[%s]" % rule in line]
    assert lines, "no [%s] finding: %s" % (rule, done.stderr)
    for word in words:
        assert any(word in line for line in lines), "%r not in %s" % (word, lines)
    return lines


def test_the_committed_dashboards_pass():
    """scripts/check-dashboards: current (generate.py --check) and lint-clean."""
    done = subprocess.run(
        [str(helpers.REPO / "scripts" / "check-dashboards")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "6 dashboards pass every rule" in done.stdout or "dashboards pass every rule" in done.stdout
    )


def test_a_rate_without_rate_interval_fails(scratch):
    def change(board):
        target = panel(board, "Total throughput")["targets"][0]
        target["expr"] = target["expr"].replace("[$__rate_interval]", "[5m]", 1)

    edit(scratch, "transfer-overview.json", change)
    fails(scratch, "rate-interval", "Total throughput", "[5m]")


def test_a_dashboard_without_its_datasource_variable_fails(scratch):
    def change(board):
        board["templating"]["list"] = [
            v for v in board["templating"]["list"] if v["name"] != "prometheus_datasource"
        ]

    edit(scratch, "cpu.json", change)
    fails(scratch, "datasource-variables", "prometheus_datasource", "CPU by mode")


def test_a_panel_with_a_fixed_datasource_fails(scratch):
    def change(board):
        board["panels"][0]["datasource"] = {"type": "prometheus", "uid": "prometheus"}
        for target in board["panels"][0]["targets"]:
            target["datasource"] = {"type": "prometheus", "uid": "prometheus"}

    edit(scratch, "cpu.json", change)
    fails(scratch, "datasource-variables", "'prometheus' is not a data source variable")


def test_a_duplicate_uid_fails(scratch):
    uid = json.loads((scratch / "cpu.json").read_text())["uid"]
    edit(scratch, "disk-io.json", lambda board: board.update(uid=uid))
    fails(scratch, "uids", uid, "cpu.json", "disk-io.json")


def test_a_uid_that_is_not_fixed_fails(scratch):
    edit(scratch, "cpu.json", lambda board: board.update(uid="${uid}"))
    fails(scratch, "uids", "${uid}")


def test_a_selector_without_job_or_instance_fails(scratch):
    def change(board):
        target = panel(board, "Total throughput")["targets"][0]
        target["expr"] = target["expr"].replace('job=~"$job", ', "", 1)

    edit(scratch, "transfer-overview.json", change)
    fails(
        scratch,
        "job-instance-selectors",
        "Total throughput",
        "longhaul_session_bytes_total",
        'job=~"$job"',
    )


def test_a_missing_job_variable_fails(scratch):
    def change(board):
        board["templating"]["list"] = [v for v in board["templating"]["list"] if v["name"] != "job"]
        for p in board["panels"]:
            for target in p.get("targets", []):
                target["expr"] = target["expr"].replace('job=~"$job", ', "")

    edit(scratch, "cpu.json", change)
    fails(scratch, "job-instance-variables", "no $job variable")


def test_a_panel_without_a_unit_fails(scratch):
    edit(
        scratch, "cpu.json", lambda board: board["panels"][0]["fieldConfig"]["defaults"].pop("unit")
    )
    fails(scratch, "units", "has no unit")
    edit(
        scratch,
        "cpu.json",
        lambda board: board["panels"][0]["fieldConfig"]["defaults"].update(unit="furlongs"),
    )
    fails(scratch, "units", "'furlongs'")


def test_a_panel_without_a_description_or_a_duplicate_title_fails(scratch):
    edit(scratch, "cpu.json", lambda board: board["panels"][0].pop("description"))
    fails(scratch, "titles", "has no description")
    title = json.loads((scratch / "cpu.json").read_text())["title"]
    edit(scratch, "disk-io.json", lambda board: board.update(title=title))
    fails(scratch, "titles", title)


def test_an_undefined_variable_fails(scratch):
    def change(board):
        target = panel(board, "Total throughput")["targets"][0]
        target["expr"] = target["expr"].replace("$session", "$sesion", 1)

    edit(scratch, "transfer-overview.json", change)
    fails(scratch, "variables-defined", "$sesion")


def test_an_influxql_query_without_its_time_filter_fails(scratch):
    def change(board):
        target = board["panels"][0]["targets"][0]
        target["query"] = target["query"].replace(" AND $timeFilter", "")

    edit(scratch, "router-traffic.json", change)
    fails(scratch, "influxql", "$timeFilter")


def test_a_variable_that_never_refreshes_fails(scratch):
    edit(scratch, "cpu.json", lambda board: board["templating"]["list"][1].update(refresh=0))
    fails(scratch, "variable-refresh", "$job")


def test_an_exclusion_needs_a_reason(scratch):
    (scratch / ".lint").write_text("exclusions:\n  units:\n    entries: [{dashboard: x}]\n")
    done = lint(scratch)
    assert done.returncode == 2 and "gives no reason" in done.stderr, done.stderr


# --- the two renderings: Grafana's JSON and the live view's Perses dashboards ------


def consistency(directory):
    return check("consistency.py", directory)


@pytest.fixture
def renderings(tmp_path):
    """A copy of both renderings (dashboards/*.json and dashboards/perses/) that agrees."""
    (tmp_path / "perses").mkdir()
    for path in DASHBOARDS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
        shutil.copy(DASHBOARDS / "perses" / path.name, tmp_path / "perses" / path.name)
    done = consistency(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "6 dashboards agree in Grafana and Perses" in done.stdout, done.stdout
    return tmp_path


def disagrees(directory, *words):
    done = consistency(directory)
    assert done.returncode == 1, (done.stdout, done.stderr)
    for word in words:
        assert word in done.stderr, "%r not in %s" % (word, done.stderr)
    return done.stderr


def edit_perses(directory, name, change):
    edit(directory / "perses", name, change)


def perses_panel(board, title):
    return next(p for p in board["spec"]["panels"].values() if p["spec"]["display"]["name"] == title)


def test_a_panel_in_only_one_rendering_fails(renderings):
    """A panel the Perses dashboard lacks, and one only it has, are both named."""

    def drop(board):
        key = next(k for k, p in board["spec"]["panels"].items() if p["spec"]["display"]["name"] == "Per-stream throughput")
        del board["spec"]["panels"][key]

    edit_perses(renderings, "transfer-overview.json", drop)
    disagrees(renderings, "transfer-overview.json: panel 'Per-stream throughput' is in Grafana's dashboard only")

    edit(renderings, "cpu.json", lambda board: panel(board, "Busy per host").update(title="Busy per node"))
    disagrees(
        renderings,
        "cpu.json: panel 'Busy per node' is in Grafana's dashboard only",
        "cpu.json: panel 'Busy per host' is in the Perses dashboard only",
    )


def test_a_query_unit_or_variable_that_differs_fails(renderings):
    def change(board):
        spec = perses_panel(board, "Total throughput")["spec"]
        query = spec["queries"][0]["spec"]["plugin"]["spec"]
        query["query"] = query["query"].replace("$__rate_interval", "5m")
        spec["plugin"]["spec"]["yAxis"]["format"]["unit"] = "bytes/sec"
        board["spec"]["variables"] = board["spec"]["variables"][:-1]

    edit_perses(renderings, "transfer-overview.json", change)
    disagrees(
        renderings,
        "panel 'Total throughput' query 1 differs",
        "panel 'Total throughput' unit differs: Grafana's is 'bits/sec' in Perses, Perses has 'bytes/sec'",
        "transfer-overview.json: variables differ",
    )


def test_a_missing_rendering_fails(renderings):
    (renderings / "perses" / "links.json").unlink()
    disagrees(renderings, "links.json: no Perses rendering")


def test_generate_writes_the_perses_rendering_of_every_influxql_query_as_promql(tmp_path):
    """generate.py writes both renderings; the router panels' Perses queries are
    the PromQL twins of their InfluxQL (Telegraf's counters in Prometheus), with
    the alias's tags as legend labels; Grafana's annotations are Perses panels."""
    done = subprocess.run(
        [PYTHON, str(DASHBOARDS / "generate.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    router = json.loads((tmp_path / "perses" / "router-traffic.json").read_text())
    spec = perses_panel(router, "Total per router")["spec"]
    queries = [q["spec"]["plugin"]["spec"] for q in spec["queries"]]
    assert queries[0]["query"] == (
        '8 * sum by (router) (max by (router, ifName) '
        '(rate(interface_ifHCInOctets{router=~"$router", ifName=~"$interface"}[$__rate_interval])))'
    )
    assert [q["seriesNameFormat"] for q in queries] == ["{{router}} in", "{{router}} out"]
    names = [v["spec"]["name"] for v in router["spec"]["variables"]]
    assert names == ["campaign", "router", "interface"]
    interface = router["spec"]["variables"][2]["spec"]["plugin"]["spec"]
    assert interface == {"labelName": "ifName", "matchers": ['interface_ifHCInOctets{router=~"$router"}']}
    cpu = json.loads((tmp_path / "perses" / "cpu.json").read_text())
    titles = {p["spec"]["display"]["name"] for p in cpu["spec"]["panels"].values()}
    assert {"CPU by mode", "Campaign runs", "Longhaul alerts", "Sessions"} <= titles


def test_a_legend_or_variable_option_that_differs_fails(renderings):
    def change(board):
        spec = perses_panel(board, "Per-stream throughput")["spec"]
        spec["queries"][0]["spec"]["plugin"]["spec"]["seriesNameFormat"] = "{{stream}}"
        board["spec"]["variables"][0]["spec"]["customAllValue"] = ".*"

    edit_perses(renderings, "transfer-overview.json", change)
    disagrees(
        renderings,
        "panel 'Per-stream throughput' query 1's legend differs: Grafana '{{session}}/{{stream}}', Perses '{{stream}}'",
        "transfer-overview.json: variables differ",
    )
