"""The throughput-drop cases of rules/tests/ against the rule they replaced.

rules/tests/throughput-drop.yml runs (scripts/check-rules) against today's
rules. This module shows that its cases are not trivially green: run against
the previous LonghaulThroughputDrop (1m rate below half of its own 15-minute
mean, a baseline that includes the drop), the lasting drops do not fire as
the tests require, while today's rules pass every case. Only firing and
timing are compared there: the previous rule had no `scope`/`peer` labels and
other annotations, so the expected alerts are reduced to its labels.
"""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
import helpers
from helpers import run_local_playbook

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "rules"
DROP_TESTS = RULES / "tests" / "throughput-drop.yml"

# The rule before issue 17, as it was in rules/ (annotations left out).
PREVIOUS_RULES = {
    "groups": [
        {
            "name": "previous-throughput-drop",
            "rules": [
                {"record": "longhaul:threshold:throughput_drop_ratio", "expr": "vector(0.5)"},
                {
                    "record": "longhaul:session_throughput_bytes:rate1m",
                    "expr": "sum by (instance, session, direction) "
                    "(rate(longhaul_session_bytes_total[1m]))",
                },
                {
                    "record": "longhaul:session_throughput_bytes:rate1m_avg15m",
                    "expr": "avg_over_time(longhaul:session_throughput_bytes:rate1m[15m])",
                },
                {
                    "alert": "LonghaulThroughputDrop",
                    "expr": "( longhaul:session_throughput_bytes:rate1m"
                    " < longhaul:session_throughput_bytes:rate1m_avg15m"
                    " * on () group_left () longhaul:threshold:throughput_drop_ratio )"
                    " and on (instance, session, direction)"
                    " (sum by (instance, session, direction)"
                    " (irate(longhaul_session_bytes_total[2m])) > 0)"
                    " and on (instance, session) longhaul_session_info",
                    "for": "5m",
                    "labels": {"severity": "critical"},
                },
            ],
        }
    ]
}

# Labels the previous rule's alert has (besides alertname).
PREVIOUS_LABELS = {"severity", "instance", "session", "direction"}

# Cases that must fail against the previous rule: the drops that last.
LASTING_DROPS = {
    "drop to 40 percent fires and is still firing 40 minutes into the drop",
    "drop to 60 percent fires for 40 minutes and resolves when the rate recovers",
    "drop of a session the server sends names the server as sender",
    "a firing drop resolves when the session ends",
}


def cases():
    return yaml.safe_load(DROP_TESTS.read_text())["tests"]


def timing_only(case):
    """The case with expected alerts reduced to the previous rule's labels."""
    case = copy.deepcopy(case)
    for check in case.get("alert_rule_test", []):
        check["exp_alerts"] = [
            {"exp_labels": {k: v for k, v in alert["exp_labels"].items() if k in PREVIOUS_LABELS}}
            for alert in check["exp_alerts"]
        ]
    return case


def promtool_passes(tmp_path, rule_files, case):
    test_file = tmp_path / "case.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(f) for f in rule_files],
                "evaluation_interval": "15s",
                "tests": [case],
            }
        )
    )
    done = subprocess.run(
        [shutil.which("promtool") or "promtool", "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode == 0, done.stdout + done.stderr


def current_rules():
    return [
        RULES / name
        for name in (
            "longhaul-thresholds.yml",
            "longhaul-recording.yml",
            "longhaul-baseline.yml",
            "longhaul-alerts.yml",
        )
    ]


@pytest.fixture
def previous_rules(tmp_path):
    path = tmp_path / "previous.yml"
    path.write_text(yaml.safe_dump(PREVIOUS_RULES))
    return [path]


def test_the_lasting_drop_cases_exist():
    names = {case["name"] for case in cases()}
    assert LASTING_DROPS <= names, LASTING_DROPS - names


@pytest.mark.parametrize("case", cases(), ids=lambda case: case["name"])
def test_case_against_the_current_and_the_previous_rule(case, tmp_path, previous_rules):
    passes, output = promtool_passes(tmp_path, current_rules(), case)
    assert passes, output
    if case["name"] in LASTING_DROPS:
        passes, output = promtool_passes(tmp_path, previous_rules, timing_only(case))
        assert not passes, "the previous rule passes %r too:\n%s" % (case["name"], output)


# --- rule files the prometheus role renders from its variables ----------------

ROLE = REPO / "roles" / "prometheus"


def template_task(template, dest):
    return {"ansible.builtin.template": {"src": str(ROLE / "templates" / template), "dest": str(dest), "mode": "0644"}}


def render_with_role_defaults(template, tmp_path, inventory=None, **overrides):
    """`template` of the prometheus role rendered with the role's defaults
    (and `overrides` of them), as the role (and lab/compose/render.yml)
    renders it; with `inventory`'s groups and hosts, if given."""
    out = tmp_path / template.replace(".j2", "")
    tasks = [
        {"ansible.builtin.include_vars": {"file": str(ROLE / "defaults" / "main.yml")}},
        {"ansible.builtin.include_vars": {"file": str(ROLE / "vars" / "main.yml")}},
        template_task(template, out),
    ]
    done = run_local_playbook(tmp_path, tasks, overrides, inventory=inventory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out.read_text()


def test_the_committed_baseline_is_the_roles_template_with_its_defaults(tmp_path):
    """rules/longhaul-baseline.yml, which promtool tests and the dashboards
    use, is exactly what the role deploys with its defaults (window and
    quantile are role variables; the template is the source).
    UPDATE_RULES=1 rewrites the committed copy."""
    rendered = render_with_role_defaults("baseline.yml.j2", tmp_path)
    committed = RULES / "longhaul-baseline.yml"
    if os.environ.get("UPDATE_RULES") == "1":
        committed.write_text(rendered)
    assert committed.read_text() == rendered, (
        "rules/longhaul-baseline.yml differs from roles/prometheus/templates/baseline.yml.j2 "
        "rendered with the role's defaults: edit the template, then run "
        "UPDATE_RULES=1 scripts/pytest-run tests/test_rules.py"
    )
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    window = defaults["prometheus_longhaul_baseline_window"]
    quantile = float(defaults["prometheus_longhaul_baseline_quantile"])
    exprs = {
        rule["record"]: rule["expr"]
        for group in yaml.safe_load(rendered)["groups"]
        for rule in group["rules"]
    }
    assert exprs == {
        "longhaul:session_throughput_bytes:baseline": "quantile_over_time(%s, "
        "longhaul:session_throughput_bytes:rate1m[%s])" % (quantile, window),
        "longhaul:host_other_tools_throughput_bytes:baseline": "quantile_over_time(%s, "
        "longhaul:host_other_tools_throughput_bytes:rate1m[%s])" % (quantile, window),
    }


def test_the_committed_thresholds_are_the_roles_template_with_its_defaults(tmp_path):
    """rules/longhaul-thresholds.yml (commented by hand) holds the same rules as
    the role's thresholds.yml.j2 rendered with its defaults (in any order:
    they are constants)."""

    def rules(text):
        groups = yaml.safe_load(text)["groups"]
        return {(g["name"], r["record"], r["expr"]) for g in groups for r in g["rules"]}

    rendered = rules(render_with_role_defaults("thresholds.yml.j2", tmp_path))
    assert rules((RULES / "longhaul-thresholds.yml").read_text()) == rendered
    assert len(rendered) == 3, rendered


# --- what a Prometheus must see: the expected sets, rendered from the inventory ---

EXPECTED_FIXTURES = RULES / "tests" / "expected"


def hosts(group_hosts):
    return {"hosts": group_hosts}


# The inventories of the promtool cases (rules/tests/expected-*.yml): each
# fixture in rules/tests/expected/ is a template of the role rendered with
# one of these, as a deploy renders it ("site": longhaul-expected.yml,
# "central": longhaul-expected-sites.yml). "after-removal": the same testbed
# after router lab-router and transfer host xfer-a (site a) left the
# inventory, deployed again. Sites come from the hosts' `site` (a router's does
# not count: nothing scrapes it) and from a site Prometheus's external labels.
EXPECTED_INVENTORIES = {
    "": {"all": {"children": {
        "routers": hosts({"lab-router": {"site": "r"}, "other-router": {}}),
        "transfer_hosts": hosts({"xfer-a": {"site": "a", "link": "a--b"}, "xfer-b": {"site": "b"}}),
        "monitoring": hosts({"monitor": {"prometheus_external_labels": {"site": "c"}}}),
        "central_monitoring": hosts({"central": {}}),
    }}},
    "-after-removal": {"all": {"children": {
        "routers": hosts({"other-router": {}}),
        "transfer_hosts": hosts({"xfer-b": {"site": "b"}}),
        "monitoring": hosts({"monitor": {"prometheus_external_labels": {"site": "c"}}}),
        "central_monitoring": hosts({"central": {}}),
    }}},
}
EXPECTED_TEMPLATES = {"site": "expected.yml.j2", "central": "expected-sites.yml.j2"}


def render_expected_sets(tmp_path, inventory=None):
    """Both expected-set templates rendered with the role's defaults and
    `inventory` (none: an empty one), in one run: {"site": text, "central": text}."""
    tasks = [
        {"ansible.builtin.include_vars": {"file": str(ROLE / "defaults" / "main.yml")}},
        {"ansible.builtin.include_vars": {"file": str(ROLE / "vars" / "main.yml")}},
    ] + [template_task(template, tmp_path / (kind + ".yml")) for kind, template in EXPECTED_TEMPLATES.items()]
    done = run_local_playbook(tmp_path, tasks, {"role_path": str(ROLE)}, inventory=inventory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {kind: (tmp_path / (kind + ".yml")).read_text() for kind in EXPECTED_TEMPLATES}


def expected_series(text):
    """(record, labels) of each rule of an expected-set file."""
    return sorted(
        (r["record"], tuple(sorted(r.get("labels", {}).items())))
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
    )


def check_or_update(committed, rendered, source):
    if os.environ.get("UPDATE_RULES") == "1":
        committed.parent.mkdir(exist_ok=True)
        committed.write_text(rendered)
    assert committed.read_text() == rendered, (
        "%s differs from %s rendered: edit the template, then run "
        "UPDATE_RULES=1 scripts/pytest-run tests/test_rules.py" % (committed.relative_to(REPO), source)
    )


def test_the_committed_expected_sets_are_the_roles_templates_without_inventory(tmp_path):
    """rules/longhaul-expected.yml and rules/central/longhaul-expected-sites.yml
    (what CI's rule checks and a compose stack without an inventory load) are
    the role's templates rendered with no inventory: nothing is expected.
    UPDATE_RULES=1 rewrites them."""
    rendered = render_expected_sets(tmp_path)
    for kind, committed in (
        ("site", RULES / "longhaul-expected.yml"),
        ("central", RULES / "central" / "longhaul-expected-sites.yml"),
    ):
        check_or_update(committed, rendered[kind], "roles/prometheus/templates/" + EXPECTED_TEMPLATES[kind])
        assert expected_series(rendered[kind]) == []


@pytest.mark.parametrize("when", sorted(EXPECTED_INVENTORIES), ids=lambda when: when.strip("-") or "before")
def test_the_expected_set_fixtures_are_rendered_from_their_inventories(tmp_path, when):
    """The promtool cases' expected sets are what a deploy of their inventory
    renders. UPDATE_RULES=1 rewrites them."""
    rendered = render_expected_sets(tmp_path, EXPECTED_INVENTORIES[when])
    for kind, text in rendered.items():
        check_or_update(EXPECTED_FIXTURES / ("%s%s.yml" % (kind, when)), text, "its inventory (tests/test_rules.py)")


def test_the_expected_sets_follow_the_inventory():
    """Routers from the routers group, exporter hosts from transfer_hosts with
    their site and link, sites from the hosts (not the routers) and from the
    sites' external labels; removed ones are gone."""
    def read(name):
        return expected_series((EXPECTED_FIXTURES / name).read_text())

    assert read("site.yml") == [
        ("longhaul:expected:exporter", (("instance", "xfer-a"), ("link", "a--b"), ("site", "a"))),
        ("longhaul:expected:exporter", (("instance", "xfer-b"), ("site", "b"))),
        ("longhaul:expected:router", (("router", "lab-router"),)),
        ("longhaul:expected:router", (("router", "other-router"),)),
    ]
    assert read("site-after-removal.yml") == [
        ("longhaul:expected:exporter", (("instance", "xfer-b"), ("site", "b"))),
        ("longhaul:expected:router", (("router", "other-router"),)),
    ]
    assert read("central.yml") == [("longhaul:expected:site", (("site", s),)) for s in ("a", "b", "c")]
    assert read("central-after-removal.yml") == [("longhaul:expected:site", (("site", s),)) for s in ("b", "c")]


def test_the_baseline_window_is_the_role_variable(tmp_path):
    """The window drives the alert: with a 30-minute window the baseline
    catches up with a 40 % drop after 27 minutes, so the lasting-drop case
    (still firing 40 minutes in) fails, while it passes with the default."""
    case = next(c for c in cases() if c["name"].startswith("drop to 40 percent fires"))
    baseline = render_with_role_defaults(
        "baseline.yml.j2", tmp_path, prometheus_longhaul_baseline_window="30m"
    )
    assert "rate1m[30m]" in baseline, baseline
    rule_files = [
        RULES / "longhaul-thresholds.yml",
        RULES / "longhaul-recording.yml",
        tmp_path / "baseline.yml",
        RULES / "longhaul-alerts.yml",
    ]
    passes, output = promtool_passes(tmp_path, rule_files, case)
    assert not passes, "a 30m baseline window still fires 40 minutes into the drop:\n" + output
    passes, output = promtool_passes(tmp_path, current_rules(), case)
    assert passes, output


def role_preflight(tmp_path, **overrides):
    """The prometheus role's preflight on this machine, with `overrides` of its
    variables, then its thresholds template: (passed, output, rendered
    thresholds or None)."""
    out = tmp_path / "thresholds.yml"
    out.unlink(missing_ok=True)
    tasks = [
        {"ansible.builtin.include_role": {"name": "prometheus", "tasks_from": "preflight.yml", "public": True}},
        template_task("thresholds.yml.j2", out),
    ]
    done = run_local_playbook(
        tmp_path, tasks, overrides, gather_facts=True, env={"ANSIBLE_ROLES_PATH": str(ROLE.parent)}
    )
    thresholds = None
    if out.exists():
        thresholds = {
            r["record"].removeprefix("longhaul:threshold:"): r["expr"]
            for g in yaml.safe_load(out.read_text())["groups"]
            for r in g["rules"]
        }
    return done.returncode == 0, done.stdout + done.stderr, thresholds


def test_a_site_that_sets_one_threshold_keeps_the_others(tmp_path):
    """Before, the variable replaced the role's whole dict: a site that set
    one threshold lost the other two series, and the alerts that join them
    never fired."""
    passed, output, thresholds = role_preflight(tmp_path, prometheus_longhaul_thresholds={"retransmit_ratio": 0.02})
    assert passed, output[-3000:]
    assert thresholds == {
        "throughput_drop_ratio": "vector(0.7)",
        "retransmit_ratio": "vector(0.02)",
        "controller_utilisation": "vector(0.9)",
    }


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            {"prometheus_longhaul_thresholds": {"retransmit_raito": 0.02}},
            r"prometheus_longhaul_thresholds names retransmit_raito, which no rule in \S+ uses; "
            r"the thresholds the rules use are controller_utilisation, retransmit_ratio, throughput_drop_ratio\.",
        ),
        (
            {"prometheus_longhaul_alert_for": {"LonghaulThroughputDorp": "5m", "LonghaulStreamStalled": "1m"}},
            r"prometheus_longhaul_alert_for names LonghaulThroughputDorp, which no rule file in \S+ defines; "
            r"its alerts are LonghaulAdmissionDrops, .*LonghaulThroughputDrop, RouterCountersStale\.",
        ),
    ],
    ids=["misspelt threshold", "misspelt alert"],
)
def test_the_role_refuses_a_name_no_rule_uses(tmp_path, overrides, says):
    """A misspelt name used to be accepted: the alert it was meant for kept
    its old value and nothing said so."""
    passed, output, thresholds = role_preflight(tmp_path, **overrides)
    assert not passed and thresholds is None, output[-3000:]
    assert re.search(says, output), output[-3000:]


LONGHAUL_JOB = {"job": "longhaul", "group": "transfer_hosts", "port": 9743}


@pytest.mark.parametrize(
    "overrides, passes",
    [
        ({"prometheus_global": {"scrape_interval": "1m"}}, False),
        ({"prometheus_global": {"scrape_interval": "21s"}}, False),
        ({"prometheus_global": {"evaluation_interval": "15s"}}, False),  # Prometheus's default: 1m
        ({"prometheus_global": {"scrape_interval": "1m"}, "prometheus_scrape_groups": [{**LONGHAUL_JOB, "scrape_interval": "10s"}]}, True),
        ({"prometheus_scrape_groups": [{**LONGHAUL_JOB, "scrape_interval": "1m30s"}]}, False),
        ({"prometheus_global": {"scrape_interval": "20s"}}, True),
        ({"prometheus_global": {"scrape_interval": "1m"}, "prometheus_scrape_groups": []}, True),
    ],
    ids=["global-1m", "global-21s", "global-unset", "job-10s-under-1m", "job-1m30s", "global-20s", "no-longhaul-job"],
)
def test_the_role_refuses_a_scrape_too_slow_for_the_rules(tmp_path, overrides, passes):
    """At a 60 s scrape interval every 1-minute rate the rules record was
    empty, so no drop or stall alert could fire, and nothing said so."""
    overrides.setdefault("prometheus_scrape_groups", [LONGHAUL_JOB])
    passed, output, _ = role_preflight(tmp_path, **overrides)
    assert passed == passes, output[-3000:]
    if not passes:
        assert "set scrape_interval to 20s or less" in output, output[-3000:]


CENTRAL_RULES = ["longhaul-central.yml", "longhaul-expected-sites.yml"]


@pytest.mark.parametrize(
    "overrides, rules, scrapes_alertmanager",
    [
        ({}, "site", True),
        ({"prometheus_remote_write_receiver": True}, "central", False),
        ({"prometheus_federate_targets": ["mon-a:9090"]}, "central", False),
        (
            {"prometheus_remote_write_receiver": True, "prometheus_rules_src": str(RULES),
             "prometheus_alertmanager_scrape": True},
            "site",
            True,
        ),
    ],
    ids=["site", "receiver", "federation", "receiver-that-asks-for-site-rules"],
)
def test_a_central_prometheus_runs_only_the_central_rules_by_default(
    tmp_path, overrides, rules, scrapes_alertmanager
):
    """A central Prometheus set up as the example said (the receiver flag,
    no scrape groups) got every rule file: the sites' remote-written
    longhaul:threshold:* series and its own made every threshold join fail
    ("many-to-many matching not allowed"), and it alerted on every site
    again. It runs rules/central (a site whose data stopped arriving: only it
    can see that) and sends to the monitoring hosts' Alertmanagers, without
    scraping them (the sites send it their Alertmanagers' series)."""
    out = tmp_path / "chosen.json"
    tasks = [
        {"ansible.builtin.include_role": {"name": "prometheus", "tasks_from": "preflight.yml", "public": True}},
        {
            "ansible.builtin.copy": {
                "content": "{{ {'rules': _prometheus_rule_sources, 'group': prometheus_alertmanager_group,"
                " 'scrape': prometheus_alertmanager_scrape | bool} | to_json }}",
                "dest": str(out),
                "mode": "0644",
            }
        },
    ]
    done = run_local_playbook(
        tmp_path,
        tasks,
        # role_path: what the role's default resolves against in the role's
        # own tasks (undefined in the copy task that reads it here).
        {"prometheus_scrape_groups": [], "role_path": str(ROLE), **overrides},
        gather_facts=True,
        env={"ANSIBLE_ROLES_PATH": str(ROLE.parent)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    chosen = json.loads(out.read_text())
    if rules == "central":
        assert chosen["rules"] == CENTRAL_RULES, chosen
    else:
        assert "longhaul-alerts.yml" in chosen["rules"] and "longhaul-expected.yml" in chosen["rules"], chosen
        assert not set(CENTRAL_RULES) & set(chosen["rules"]), chosen
    assert chosen["group"] == "monitoring", chosen
    assert chosen["scrape"] == scrapes_alertmanager, chosen


def test_a_threshold_a_sites_rule_uses_needs_a_value(tmp_path):
    """A site's own rule directory whose alert compares with a threshold the
    role has no value for is refused until the site gives it one."""
    rules = tmp_path / "rules"
    rules.mkdir()
    for name in ("longhaul-thresholds.yml", "longhaul-recording.yml", "longhaul-alerts.yml"):
        shutil.copy(RULES / name, rules / name)
    (rules / "site.yml").write_text(
        "groups:\n  - name: site\n    rules:\n      - alert: SiteTooManySessions\n"
        "        expr: count(longhaul_session_bytes_total) > on () group_left () longhaul:threshold:max_sessions\n"
    )
    passed, output, _ = role_preflight(tmp_path, prometheus_rules_src=str(rules))
    assert not passed, output[-3000:]
    assert re.search(
        r"The rules in \S+ compare with longhaul:threshold:max_sessions, which has no value: "
        r"set it in prometheus_longhaul_thresholds\.",
        output,
    ), output[-3000:]
    passed, output, thresholds = role_preflight(
        tmp_path,
        prometheus_rules_src=str(rules),
        prometheus_longhaul_thresholds={"max_sessions": 40},
        prometheus_longhaul_alert_for={"SiteTooManySessions": "10m"},
    )
    assert passed, output[-3000:]
    assert thresholds["max_sessions"] == "vector(40)" and thresholds["retransmit_ratio"] == "vector(0.01)"


@pytest.mark.parametrize("port_vars, port", [({}, 3000), ({"grafana_http_port": 3300}, 3300)])
def test_alert_links_follow_grafanas_port(tmp_path, port_vars, port):
    """The dashboard links in alerts named port 3000 even where the inventory
    moved Grafana (grafana_http_port): every notification linked nowhere."""
    out = tmp_path / "longhaul-alerts.yml"
    tasks = [
        {"ansible.builtin.include_role": {"name": "prometheus", "tasks_from": "preflight.yml", "public": True}},
        {
            "ansible.builtin.template": {"src": str(ROLE / "templates" / "rules.yml.j2"), "dest": str(out), "mode": "0644"},
            "vars": {"item": "longhaul-alerts.yml"},
        },
    ]
    done = run_local_playbook(
        tmp_path,
        tasks,
        {"prometheus_scrape_groups": [], "role_path": str(ROLE), **port_vars},
        gather_facts=True,
        env={"ANSIBLE_ROLES_PATH": str(ROLE.parent)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    links = [
        r["annotations"]["dashboard"]
        for g in yaml.safe_load(out.read_text())["groups"]
        for r in g["rules"]
        if "dashboard" in r.get("annotations", {})
    ]
    assert links, out.read_text()[:2000]
    assert all(link.startswith("http://localhost:%d/d/" % port) for link in links), links


# --- the expected set's deploy, on a real Prometheus ---------------------------


def test_a_deploy_without_a_router_ends_its_alert_at_the_next_evaluation(tmp_path, processes):
    """A real Prometheus with the site's rules and the expected set of
    rules/tests/expected/site.yml, no router polled: RouterCountersStale fires
    for lab-router and other-router. Then the deploy after lab-router left the
    inventory (the expected set replaced, Prometheus reloaded, as the role
    does): lab-router's alert ends within seconds, other-router's goes on. The
    alerts' `for:` is 0 here (the role's prometheus_longhaul_alert_for does the
    same) so that the test takes seconds."""
    rules = tmp_path / "rules.d"
    rules.mkdir()
    alerts = yaml.safe_load((RULES / "longhaul-alerts.yml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    (rules / "longhaul-alerts.yml").write_text(yaml.safe_dump(alerts))
    shutil.copy(EXPECTED_FIXTURES / "site.yml", rules / "longhaul-expected.yml")
    port = helpers.free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(rules / "*.yml")],
    }))
    prometheus = processes.start("prometheus", [
        shutil.which("prometheus") or "/usr/bin/prometheus",
        "--config.file=%s" % config,
        "--storage.tsdb.path=%s" % (tmp_path / "data"),
        "--web.listen-address=127.0.0.1:%d" % port,
    ])
    processes.wait_port(prometheus, port)
    url = "http://127.0.0.1:%d" % port

    def not_polled():
        answer = helpers.get_json(url + "/api/v1/query", {
            "query": 'ALERTS{alertname="RouterCountersStale", reason="router_not_polled", alertstate="firing"}'
        })
        return {s["metric"]["router"] for s in answer["data"]["result"]}

    helpers.wait_until(lambda: not_polled() == {"lab-router", "other-router"}, 30, "both routers' alerts")
    shutil.copy(EXPECTED_FIXTURES / "site-after-removal.yml", rules / "longhaul-expected.yml")
    os.kill(prometheus.pid, signal.SIGHUP)
    helpers.wait_until(lambda: not_polled() == {"other-router"}, 10, "lab-router's alert ended by the deploy")
    time.sleep(3)
    assert not_polled() == {"other-router"}
