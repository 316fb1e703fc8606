"""docker-compose.yml, for real: the monitoring stack on one box.

No registry is reachable here, so the stack runs with lab/compose.offline.yml
(images built from Debian's packages and the local Telegraf; no Grafana). The
configuration is rendered from the Ansible roles by lab/compose/render.yml.
Every service must answer; the stack is removed afterwards.
"""

import os
import subprocess
import urllib.request

import pytest
from labkit import LAB, Lab, wait_until

import helpers

PROJECT = "longhaul-test-%d" % os.getpid()
# Image builds (first run only) and start-up on a busy 2-core machine.
UP_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def compose():
    ports = {
        "LONGHAUL_PROMETHEUS_PORT": helpers.free_port(),
        "LONGHAUL_ALERTMANAGER_PORT": helpers.free_port(),
        "LONGHAUL_INFLUXDB_PORT": helpers.free_port(),
        "LONGHAUL_GRAFANA_PORT": helpers.free_port(),
    }
    env = Lab.env_for_ansible()
    env.update({name: str(port) for name, port in ports.items()})
    try:
        done = subprocess.run(
            [str(LAB / "compose" / "up"), "--offline", "-p", PROJECT],
            capture_output=True,
            text=True,
            env=env,
            timeout=UP_TIMEOUT_S,
        )
        assert done.returncode == 0, "lab/compose/up --offline failed:\n%s%s" % (
            done.stdout[-3000:],
            done.stderr[-3000:],
        )
        yield {name: "http://127.0.0.1:%d" % port for name, port in ports.items()}
    finally:
        subprocess.run(
            [str(LAB / "compose" / "down"), "-p", PROJECT],
            capture_output=True,
            env=env,
            timeout=300,
        )


def status(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status


def test_prometheus_answers_with_the_rules(compose):
    url = compose["LONGHAUL_PROMETHEUS_PORT"]
    wait_until(lambda: status(url + "/-/ready") == 200, 60, "Prometheus ready")
    groups = Lab.get_json(url + "/api/v1/rules")["data"]["groups"]
    assert {"longhaul-throughput", "longhaul-transfers"} <= {g["name"] for g in groups}


def test_an_empty_stack_raises_no_alert(compose):
    """Before any host is provisioned the stack scrapes only itself,
    Alertmanager and Telegraf. Once every rule group has been evaluated, no
    alert is pending or firing: alerts only watch targets that are expected
    to be up (LonghaulExporterDown used to fire for the missing longhaul job)."""
    url = compose["LONGHAUL_PROMETHEUS_PORT"]
    wait_until(lambda: status(url + "/-/ready") == 200, 60, "Prometheus ready")
    def evaluations():
        """Each rule group's last evaluation (year 1 until the first one)."""
        groups = Lab.get_json(url + "/api/v1/rules")["data"]["groups"]
        return {g["name"]: g["lastEvaluation"] for g in groups}

    def all_evaluated():
        found = evaluations()
        return found if found and not any(at.startswith("0001-") for at in found.values()) else None

    first = wait_until(all_evaluated, 120, "every rule group evaluated")
    wait_until(
        lambda: all(first[name] != at for name, at in evaluations().items()),
        120,
        "every rule group evaluated once more",
    )
    alerts = Lab.get_json(url + "/api/v1/alerts")["data"]["alerts"]
    assert alerts == [], alerts


def test_alertmanager_answers_and_prometheus_reaches_it(compose):
    url = compose["LONGHAUL_ALERTMANAGER_PORT"]
    wait_until(lambda: status(url + "/-/ready") == 200, 60, "Alertmanager ready")
    prometheus = compose["LONGHAUL_PROMETHEUS_PORT"]
    wait_until(
        lambda: Lab.get_json(prometheus + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"],
        60,
        "Alertmanager among Prometheus's alertmanagers",
    )


def test_influxdb_answers_and_telegraf_writes_to_it(compose):
    url = compose["LONGHAUL_INFLUXDB_PORT"]
    wait_until(lambda: status(url + "/ping") == 204, 60, "InfluxDB /ping")

    def measurements():
        answer = Lab.get_json(url + "/query", {"db": "routers", "q": "SHOW MEASUREMENTS"})
        return answer["results"][0].get("series")

    wait_until(measurements, 90, "Telegraf's measurements in InfluxDB (database routers)")


def test_no_grafana_offline(compose):
    """Grafana cannot be installed here: the offline stack leaves it out."""
    done = subprocess.run(
        ["docker", "compose", "-p", PROJECT, "ps", "--services", "--status", "running"],
        capture_output=True,
        text=True,
        check=True,
    )
    services = set(done.stdout.split())
    assert services == {"prometheus", "alertmanager", "influxdb", "telegraf"}, services
