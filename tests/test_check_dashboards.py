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


def lint(directory):
    return subprocess.run(
        [PYTHON, str(DASHBOARDS / "lint.py"), str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )


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
