"""No role prints a secret under `ansible-playbook --diff` (the inventory
example recommends `--check --diff` before a change): every task that
writes a file from a template (or `content:`) that uses a password, secret,
token or SNMP community has `diff: false` or `no_log: true`. Before, the
diffs of telegraf.conf, alertmanager.yml, Grafana's datasources and
prometheus.yml printed the SNMP, InfluxDB and SMTP passwords.
"""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
ROLES = REPO / "roles"
SECRET = re.compile(r"\{[{%][^}%]*(password|secret|token|community|passphrase|basic_auth)[^}%]*[}%]\}", re.I)
# Variables that name where a secret is, not the secret itself.
SECRET_PATHS = re.compile(r"\b(_longhaul_engine_token_file|_lab_router_snmp_cache_secret)\b")
INCLUDE = re.compile(r"\{%-?\s*include\s+['\"]([^'\"]+)['\"]")
WRITERS = ("ansible.builtin.template", "template", "ansible.builtin.copy", "copy")


def uses_secret(text, templates, seen=()):
    """Whether a template's text (or one it includes) uses a secret."""
    if SECRET.search(SECRET_PATHS.sub("", text)):
        return True
    for name in INCLUDE.findall(text):
        path = templates / name
        if path in seen or not path.is_file():
            continue
        if uses_secret(path.read_text(), templates, seen + (path,)):
            return True
    return False


def tasks(node):
    """Every task in a task file, blocks opened."""
    for task in node or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key))


def secret_writers():
    found = []
    for task_file in sorted(ROLES.glob("*/tasks/*.yml")):
        role = task_file.parent.parent
        for task in tasks(yaml.safe_load(task_file.read_text())):
            module = next((m for m in WRITERS if m in task), None)
            if module is None:
                continue
            args = task[module] or {}
            if "src" in args and str(args["src"]).endswith(".j2") and "{{" not in str(args["src"]):
                src = role / "templates" / args["src"]
                text = src.read_text() if src.is_file() else ""
            else:
                text = str(args.get("content", ""))
            if uses_secret(text, role / "templates"):
                found.append((f"{task_file.relative_to(REPO)}: {task.get('name')}", task))
    return found


WRITERS_OF_SECRETS = secret_writers()


def test_the_roles_write_secrets_at_all():
    # The check below must have something to check: telegraf.conf (through
    # its included snmp-agent.j2), Grafana's datasources and the token file
    # at least.
    names = " ".join(name for name, _ in WRITERS_OF_SECRETS)
    for expected in ("telegraf", "datasources", "token"):
        assert expected in names, names


@pytest.mark.parametrize(
    "task", [t for _, t in WRITERS_OF_SECRETS], ids=[n for n, _ in WRITERS_OF_SECRETS]
)
def test_a_task_writing_a_secret_shows_no_diff(task):
    assert task.get("diff") is False or task.get("no_log") is True, task


@pytest.mark.parametrize(
    "path",
    [
        "roles/alertmanager/tasks/configure.yml",
        "roles/prometheus/tasks/configure.yml",
    ],
)
def test_configs_that_may_carry_credentials_show_no_diff(path):
    # alertmanager.yml (SMTP passwords, webhook URLs) and prometheus.yml
    # (remote_write credentials) take them from dictionaries the template
    # walks, so the scan above does not see them by name.
    found = [
        t
        for t in tasks(yaml.safe_load((REPO / path).read_text()))
        if any(m in t for m in WRITERS)
        and (t.get("ansible.builtin.template") or {}).get("src")
        in ("alertmanager.yml.j2", "prometheus.yml.j2")
    ]
    assert found, path
    for t in found:
        assert t.get("diff") is False or t.get("no_log") is True, t
