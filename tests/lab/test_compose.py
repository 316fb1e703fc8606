"""docker-compose.yml, for real: the monitoring stack on one box, watching the lab.

The stack comes up with the images built here (Debian packages, the local
Telegraf; no registry is reachable), its configuration rendered from the
Ansible roles by lab/compose/render.yml with the lab's inventory: Prometheus
scrapes the lab's hosts, Telegraf polls the lab router with SNMPv3. Its
containers join the lab networks (docker network connect). Checks: every
Prometheus target up, longhaul and node series present, the router's series
in InfluxDB (written by Telegraf with its own user, read with Grafana's) under
the retention policy of the influxdb role, Grafana left out by default, the
upstream-images override well formed; then the stack is removed.
"""

import os
import subprocess
import urllib.error

import pytest
from labkit import LAB, REPO, Lab, wait_until

import helpers

PROJECT = "longhaul-test-%d" % os.getpid()
# Image builds (first run only) and start-up on a busy 2-core machine.
UP_TIMEOUT_S = 900
GENERATED = LAB / "compose" / "generated"


def compose(*args, check=True):
    done = subprocess.run(
        ["docker", "compose", "--project-directory", str(REPO), "-p", PROJECT, *args],
        capture_output=True,
        text=True,
    )
    assert not check or done.returncode == 0, "docker compose %s: %s" % (args, done.stderr)
    return done


@pytest.fixture(scope="module")
def stack(provisioned):
    lab = provisioned
    ports = {
        "LONGHAUL_PROMETHEUS_PORT": helpers.free_port(),
        "LONGHAUL_ALERTMANAGER_PORT": helpers.free_port(),
        "LONGHAUL_INFLUXDB_PORT": helpers.free_port(),
        "LONGHAUL_GRAFANA_PORT": helpers.free_port(),
    }
    env = Lab.env_for_ansible()
    env.update({name: str(port) for name, port in ports.items()})
    env["RENDER_INVENTORY"] = str(REPO / "ansible" / "inventories" / "lab")
    try:
        done = subprocess.run(
            [str(LAB / "compose" / "up"), "-p", PROJECT],
            capture_output=True,
            text=True,
            env=env,
            timeout=UP_TIMEOUT_S,
        )
        assert done.returncode == 0, "lab/compose/up failed:\n%s%s" % (
            done.stdout[-3000:],
            done.stderr[-3000:],
        )
        # The lab's hosts are on its two networks: let the stack reach them.
        for service in ("prometheus", "telegraf"):
            container = compose("ps", "-q", service).stdout.strip()
            for network in (lab.env["LAB_NET_A"], lab.env["LAB_NET_B"]):
                subprocess.run(["docker", "network", "connect", network, container], check=True)
        urls = {name: "http://127.0.0.1:%d" % port for name, port in ports.items()}
        yield lab, urls["LONGHAUL_PROMETHEUS_PORT"], urls["LONGHAUL_INFLUXDB_PORT"]
    finally:
        subprocess.run(
            [str(LAB / "compose" / "down"), "-p", PROJECT],
            capture_output=True,
            env=env,
            timeout=300,
        )


def query(prometheus, expr):
    answer = Lab.get_json(prometheus + "/api/v1/query", {"query": expr})
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_every_prometheus_target_is_up(stack):
    lab, prometheus, _ = stack
    wait_until(lambda: lab.ready(prometheus + "/-/ready"), 60, "Prometheus ready")

    def health():
        targets = Lab.get_json(prometheus + "/api/v1/targets")["data"]["activeTargets"]
        return {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}

    wait_until(
        lambda: health() and all(h == "up" for h in health().values()),
        120,
        "every target of the compose Prometheus up",
    )
    jobs = {job for job, _ in health()}
    assert {"prometheus", "alertmanager", "node", "longhaul", "telegraf"} <= jobs, health()
    instances = {instance for job, instance in health() if job == "longhaul"}
    assert instances == {"xfer-a", "xfer-b"}, health()


def test_longhaul_and_node_series(stack):
    _, prometheus, _ = stack
    wait_until(
        lambda: query(prometheus, 'longhaul_exporter_collector_success{collector="engine"}'),
        60,
        "longhaul-exporter series",
    )
    for expr in (
        'node_cpu_seconds_total{instance="xfer-b", mode="softirq"}',
        'longhaul_controller_info{instance="xfer-a"}',
    ):
        assert query(prometheus, expr), expr


def test_rules_come_with_the_roles_thresholds_and_durations(stack):
    _, prometheus, _ = stack
    rules = [
        rule
        for group in Lab.get_json(prometheus + "/api/v1/rules")["data"]["groups"]
        for rule in group["rules"]
    ]
    drop = next(r for r in rules if r["name"] == "LonghaulThroughputDrop")
    assert drop["duration"] == 300, "for: of the prometheus role's defaults (5m)"
    flags = Lab.get_json(prometheus + "/api/v1/status/flags")["data"]
    assert flags["storage.tsdb.retention.time"] == "30d", "the prometheus role's retention"


def test_telegraf_writes_the_routers_series_to_influxdb(stack):
    lab, _, influxdb = stack
    reader = ("grafana", (GENERATED / "secrets" / "influxdb-grafana-password").read_text().strip())

    def routers(query):
        answer = Lab.get_json(influxdb + "/query", {"db": "routers", "q": query}, auth=reader)
        return answer["results"][0].get("series", [])

    series = wait_until(
        lambda: routers(
            'SELECT last("ifHCOutOctets") FROM "interface" WHERE time > now() - 2m '
            'GROUP BY "router", "ifName"'
        ),
        120,
        "the lab router's counters in the compose InfluxDB",
    )
    names = {s["tags"]["ifName"] for s in series if s["tags"]["router"] == "router"}
    assert names == {
        lab.router_interface(lab.env["LAB_IP_ROUTER_A"]),
        lab.router_interface(lab.env["LAB_IP_ROUTER_B"]),
    }
    policies = routers("SHOW RETENTION POLICIES")[0]["values"]
    assert ["routers_30d", "720h0m0s", "24h0m0s", 1, True] in policies, policies
    # Only with credentials: InfluxDB runs with authentication.
    with pytest.raises(urllib.error.HTTPError) as refused:
        Lab.get_json(influxdb + "/query", {"q": "SHOW DATABASES"})
    assert refused.value.code == 401


def test_grafana_is_a_profile_left_off_by_default(stack):
    running = set(compose("ps", "--services", "--status", "running").stdout.split())
    assert running == {"prometheus", "alertmanager", "influxdb", "telegraf"}, running
    assert "grafana" in compose("--profile", "grafana", "config", "--services").stdout.split()


def test_the_upstream_images_override_is_well_formed(stack):
    done = compose(
        "-f",
        str(REPO / "docker-compose.yml"),
        "-f",
        str(REPO / "docker-compose.upstream.yml"),
        "config",
        "--images",
    )
    images = set(done.stdout.split())
    assert {
        "prom/prometheus:v2.53.2",
        "prom/alertmanager:v0.27.0",
        "influxdb:1.8",
        "telegraf:1.34",
    } <= images
    assert not any(image.startswith("longhaul/") for image in images), images
