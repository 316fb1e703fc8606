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
from helpers import run_local_playbook

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


def test_the_sites_password_goes_only_to_the_inventorys_central_over_https(tmp_path):
    # Prometheus' identity (the scrape user, whose password also opens every exporter and
    # Alertmanager) is added to a remote_write entry only when it is https, names a host of
    # central_monitoring (not through userinfo) and has no credentials nor TLS settings of
    # its own. The first version added it to
    # every entry: a plain-HTTP URL sent the password in clear, a third-party store got it,
    # and an entry with a bearer token got two auth methods (promtool refused the file).
    role = ROLES / "prometheus"
    out = tmp_path / "prometheus.yml"
    tasks = [
        {"ansible.builtin.include_vars": str(role / "defaults" / "main.yml")},
        {"ansible.builtin.include_vars": str(role / "vars" / "main.yml")},
        {"ansible.builtin.template": {"src": str(role / "templates" / "prometheus.yml.j2"), "dest": str(out)}},
    ]
    central = "https://10.0.0.5:9090/api/v1/write"
    overrides = {
        "prometheus_scrape_tls_ca_file": "/ca.crt",
        "prometheus_scrape_basic_auth": {"username": "prometheus", "password": "p" * 32},
        "prometheus_remote_write": [
            {"url": central},
            {"url": "http://10.0.0.5:9090/api/v1/write"},
            {"url": "https://store.example.org/push"},
            {"url": central, "bearer_token_file": "/token"},
            {"url": "https://central:9090/api/v1/write", "tls_config": {"insecure_skip_verify": True}},
            {"url": "https://[2001:DB8::5]:9090/api/v1/write"},
            {"url": "https://central:x@store.example.org/push"},
        ],
    }
    inventory = {
        "all": {
            "children": {
                "central_monitoring": {
                    "hosts": {
                        "central": {"prometheus_target_host": "10.0.0.5"},
                        "central6": {"prometheus_target_host": "2001:db8::5"},
                    }
                }
            }
        }
    }
    done = run_local_playbook(tmp_path, tasks, overrides, inventory=inventory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = yaml.safe_load(out.read_text())["remote_write"]
    auth = {"username": "prometheus", "password_file": "/etc/prometheus/scrape.password"}
    assert written[0] == {"url": central, "basic_auth": auth, "tls_config": {"ca_file": "/ca.crt"}}
    assert written[1] == {"url": "http://10.0.0.5:9090/api/v1/write"}
    assert written[2] == {"url": "https://store.example.org/push"}
    assert "basic_auth" not in written[3], written[3]
    # an entry with a TLS setting of its own is not the testbed's: no password there
    assert written[4] == {"url": "https://central:9090/api/v1/write", "tls_config": {"insecure_skip_verify": True}}
    # a central by its IPv6 address, in brackets and any case
    assert written[5]["basic_auth"] == auth and written[5]["tls_config"] == {"ca_file": "/ca.crt"}
    # userinfo naming a central before another host
    assert written[6] == {"url": "https://central:x@store.example.org/push"}
    assert "p" * 32 not in out.read_text()
