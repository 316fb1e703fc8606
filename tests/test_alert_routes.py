"""Every alert reaches someone: the Alertmanager configuration the
alertmanager role renders, asked with `amtool config routes test` where each
label set our rules can produce goes, plus a severity no rule of ours uses
and none at all (a site's own rules may have either).

An alert whose severity no notification takes used to go to the root route's
receiver, which has no integration: it reached nobody, silently.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO, run_local_playbook

ROLE = REPO / "roles" / "alertmanager"
RULE_FILES = sorted((REPO / "rules").glob("*.yml")) + sorted((REPO / "rules" / "central").glob("*.yml"))
LAB_MONITORING = REPO / "lab" / "inventory" / "group_vars" / "monitoring" / "main.yml"
# The role's receiver for alerts no notification wants: no integration.
NOBODY = "longhaul-none"

SMTP = {"smarthost": "127.0.0.1:2525", "from": "alertmanager@longhaul.test", "require_tls": False}
SPLIT = [
    {"name": "noc-mail", "email": "noc@longhaul.test", "severities": ["critical"]},
    {"name": "hook", "webhook": "http://127.0.0.1:9099/alerts"},
    {"name": "chat", "slack": "http://127.0.0.1:5002/hooks/longhaul", "severities": ["warning"]},
]


def lab_notifications():
    lab = yaml.safe_load(LAB_MONITORING.read_text())
    return {"alertmanager_smtp": lab["alertmanager_smtp"], "alertmanager_notifications": lab["alertmanager_notifications"]}


# name -> (role variables, the notifications that get alerts of other severities or none)
CONFIGURATIONS = {
    "the lab's": (lab_notifications(), ["lab-mail", "lab-hook"]),
    "severities split": ({"alertmanager_smtp": SMTP, "alertmanager_notifications": SPLIT}, ["noc-mail", "hook", "chat"]),
    "severities split, default named": (
        {"alertmanager_smtp": SMTP, "alertmanager_notifications": SPLIT, "alertmanager_default_notifications": ["noc-mail"]},
        ["noc-mail"],
    ),
}


def rule_label_sets():
    """alertname and the static labels of every alert of rules/ and rules/central/."""
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    labels = {"alertname": rule["alert"], **rule.get("labels", {})}
                    if labels not in found:
                        found.append(labels)
    return found


# A site's own rules: a severity of their own, and none at all (nor a scope).
UNROUTED = [
    {"alertname": "SiteDiskAlmostFull", "severity": "info", "scope": "host", "instance": "xfer-a"},
    {"alertname": "SiteWatchdog"},
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every configuration rendered by the role's template in one run: name -> path."""
    tmp_path = tmp_path_factory.mktemp("alertmanager")
    tasks = [
        {"ansible.builtin.include_vars": {"file": str(ROLE / "defaults" / "main.yml")}},
        {"ansible.builtin.include_vars": {"file": str(ROLE / "vars" / "main.yml")}},
    ]
    paths = {}
    for index, (name, (variables, _)) in enumerate(CONFIGURATIONS.items()):
        paths[name] = tmp_path / ("alertmanager-%d.yml" % index)
        tasks += [
            {"ansible.builtin.set_fact": {"alertmanager_default_notifications": [], **variables}},
            {"ansible.builtin.template": {
                "src": str(ROLE / "templates" / "alertmanager.yml.j2"), "dest": str(paths[name]), "mode": "0644",
            }},
        ]
    done = run_local_playbook(tmp_path, tasks, {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return paths


def amtool(*args):
    return subprocess.run(
        [shutil.which("amtool") or "/usr/bin/amtool", *args], capture_output=True, text=True, timeout=60
    )


def routed_to(config: Path, labels):
    done = amtool(
        "config", "routes", "test", "--config.file=%s" % config, *("%s=%s" % item for item in labels.items())
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(",")


def test_the_rules_have_the_label_sets_routing_depends_on():
    sets = rule_label_sets()
    assert {s.get("severity") for s in sets} == {"critical", "warning"}, sets
    assert {s.get("scope") for s in sets} == {"session", "stream", "host", "router", "site"}, sets


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_every_alert_our_rules_can_raise_reaches_a_receiver(rendered, name):
    config = rendered[name]
    check = amtool("check-config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    notifications = {n["name"]: n for n in CONFIGURATIONS[name][0]["alertmanager_notifications"]}
    for labels in rule_label_sets():
        want = [
            n for n, spec in notifications.items()
            if labels["severity"] in spec.get("severities", ["critical", "warning"])
        ]
        assert routed_to(config, labels) == want, labels


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_an_alert_of_another_severity_or_none_reaches_the_default_notifications(rendered, name):
    for labels in UNROUTED:
        receivers = routed_to(rendered[name], labels)
        assert NOBODY not in receivers, (labels, receivers)
        assert receivers == CONFIGURATIONS[name][1], (labels, receivers)
