"""docker-compose.yml, for real: the monitoring stack on one box, watching the lab.

The stack comes up with the images built here (Debian packages, the local
Telegraf; no registry is reachable), its configuration rendered from the
Ansible roles by lab/compose/render.yml with the lab's inventory: Prometheus
scrapes the lab's hosts, Telegraf polls the lab router with SNMPv3. Its
containers join the lab networks (docker network connect). Checks: first an
empty stack (no inventory, as before any host is provisioned) answers a
query right after `up --wait` returns (its healthchecks: 20 of 20 tries) and
raises no alert; then, against the lab: every Prometheus target up, Alertmanager
reached, longhaul and node series present, the router's series
in InfluxDB (written by Telegraf with its own user, read with the dashboards'
reader) under the retention policy of the influxdb role, no Grafana in the
stack (users bring their vendor's), the upstream-images override well formed;
then the stack is removed.
"""

import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from labkit import INVENTORY, LAB, REPO, Lab, basic_auth, transfer_hosts, wait_until

import helpers

PROJECT = "longhaul-test-%d" % os.getpid()
# Image builds (first run only) and start-up on a busy 2-core machine.
UP_TIMEOUT_S = 900
GENERATED = LAB / "compose" / "generated"


def compose(*args, check=True, project=PROJECT, env=None):
    done = subprocess.run(
        ["docker", "compose", "--project-directory", str(REPO), "-p", project, *args],
        capture_output=True,
        text=True,
        env=env,
    )
    assert not check or done.returncode == 0, "docker compose %s: %s" % (args, done.stderr)
    return done


@contextlib.contextmanager
def compose_stack(project, inventory=None):
    """lab/compose/up on free ports (rendered with `inventory`'s hosts and
    routers, or none), yields the services' URLs (and under "env" the
    environment it ran with), then lab/compose/down. Both stacks render into
    lab/compose/generated/: one at a time."""
    ports = {
        "LONGHAUL_PROMETHEUS_PORT": helpers.free_port(),
        "LONGHAUL_ALERTMANAGER_PORT": helpers.free_port(),
        "LONGHAUL_INFLUXDB_PORT": helpers.free_port(),
        "LONGHAUL_LIVE_VIEW_PORT": helpers.free_port(),
    }
    env = Lab.env_for_ansible()
    # on loopback, into lab/compose/generated/, whatever the shell exported
    for name in ("LONGHAUL_PUBLISH_ADDRESS", "LONGHAUL_PUBLISH_NAMES", "LONGHAUL_COMPOSE_GENERATED"):
        env.pop(name, None)
    env.update({name: str(port) for name, port in ports.items()})
    if inventory:
        env["RENDER_INVENTORY"] = str(inventory)
    try:
        done = subprocess.run(
            [str(LAB / "compose" / "up"), "-p", project],
            capture_output=True,
            text=True,
            env=env,
            timeout=UP_TIMEOUT_S,
        )
        assert done.returncode == 0, "lab/compose/up failed:\n%s%s" % (
            done.stdout[-3000:],
            done.stderr[-3000:],
        )
        yield {**{name: "http://127.0.0.1:%d" % port for name, port in ports.items()}, "env": env}
    finally:
        subprocess.run(
            [str(LAB / "compose" / "down"), "-p", project],
            capture_output=True,
            env=env,
            timeout=300,
        )


@pytest.fixture(scope="module")
def empty_stack():
    """The stack as a user brings it up before any host is provisioned: no
    inventory, so Prometheus scrapes only itself, Alertmanager and Telegraf.
    Up and down around its tests, before the lab-backed stack below (it needs
    no lab)."""
    with compose_stack(PROJECT + "-empty") as urls:
        yield urls


@pytest.fixture(scope="module")
def stack(provisioned):
    lab = provisioned
    with compose_stack(PROJECT, INVENTORY) as urls:
        # The lab's hosts are on its two networks: let the stack reach them.
        for service in ("prometheus", "telegraf"):
            container = compose("ps", "-q", service).stdout.strip()
            for network in (lab.env["LAB_NET_A"], lab.env["LAB_NET_B"]):
                subprocess.run(["docker", "network", "connect", network, container], check=True)
        # Telegraf started before it could reach the router: a poll that failed then
        # may leave its SNMPv3 session unusable (one run got no router data in 120 s).
        # Start it again now that the router is reachable, as a host would boot.
        compose("restart", "telegraf")
        yield (
            lab,
            urls["LONGHAUL_PROMETHEUS_PORT"],
            urls["LONGHAUL_INFLUXDB_PORT"],
        )


def query(prometheus, expr):
    answer = Lab.get_json(prometheus + "/api/v1/query", {"query": expr})
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


# `up -d --wait` followed at once by one query of each service, this many times.
READY_TRIES = 20
READY_SERVICES = ("prometheus", "alertmanager", "influxdb")


# A slow answer is an answer: the machine may be busy (InfluxDB checks the
# reader's password with bcrypt, which took over 10 s once on a machine at load
# 40). What must not happen is a refused or reset connection or an error.
READY_QUERY_TIMEOUT_S = 60


def query_each_service(urls):
    """One query of each service, no retry: [what failed]."""
    reader = ("grafana", (GENERATED / "secrets" / "influxdb-grafana-password").read_text().strip())
    queries = {
        "prometheus": (urls["LONGHAUL_PROMETHEUS_PORT"] + "/api/v1/query?query=up", None),
        "alertmanager": (urls["LONGHAUL_ALERTMANAGER_PORT"] + "/api/v2/status", None),
        "influxdb": (urls["LONGHAUL_INFLUXDB_PORT"] + "/query?q=SHOW+DATABASES", reader),
    }
    failed = []
    for name, (url, credentials) in queries.items():
        request = urllib.request.Request(url)
        if credentials:
            request.add_header("Authorization", basic_auth(*credentials))
        try:
            with urllib.request.urlopen(request, timeout=READY_QUERY_TIMEOUT_S) as answer:
                assert answer.status == 200 and json.load(answer), "empty answer"
        except (OSError, AssertionError, ValueError) as error:
            failed.append("%s: %s" % (name, error))
    return failed


def test_an_empty_stack_raises_no_alert(empty_stack):
    """Once every rule group has been evaluated twice, no alert is pending or
    firing: alerts only watch targets that are expected to be up
    (LonghaulExporterDown used to fire for the missing longhaul job), and
    an empty inventory expects no router, exporter host or site."""
    url = empty_stack["LONGHAUL_PROMETHEUS_PORT"]
    targets = Lab.get_json(url + "/api/v1/targets")["data"]["activeTargets"]
    assert "longhaul" not in {t["labels"]["job"] for t in targets}, targets

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


def test_the_live_view_serves_the_page_and_prometheus(empty_stack):
    """The stack's live view (roles/live_view's site, rendered by render.yml):
    the application as make build wrote it, its dashboards, and Prometheus's
    read API on the same origin; Prometheus's admin API is not passed on.
    Before the next test restarts Prometheus twenty times (nginx resolves its
    name when it starts)."""
    base = empty_stack["LONGHAUL_LIVE_VIEW_PORT"]
    with urllib.request.urlopen(base + "/d/transfer-overview?refresh=5s", timeout=30) as answer:
        page = answer.read().decode()
    built = (Path(os.environ.get("LONGHAUL_DIST") or REPO / "dist") / "web" / "index.html").read_text()
    assert page == built
    names = [entry["name"] for entry in Lab.get_json(base + "/dashboards/index.json")]
    assert sorted(names) == sorted(p.stem for p in (REPO / "dashboards" / "perses").glob("*.json"))
    # Prometheus's first scrape of itself may come a few seconds after `up --wait`.
    result = wait_until(
        lambda: Lab.get_json(base + "/prometheus/api/v1/query", {"query": 'up{job="prometheus"} == 1'})["data"]["result"],
        60,
        "Prometheus's self-scrape through the live view",
    )
    assert result[0]["value"][1] == "1", result
    request = urllib.request.Request(base + "/prometheus/api/v1/admin/tsdb/snapshot", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 404


def test_a_query_right_after_up_wait_succeeds(empty_stack):
    """`docker compose up -d --wait` returned once the processes ran, before
    Prometheus, Alertmanager and InfluxDB answered: a script that queried at
    once failed (after a kill, every time). With each service's healthcheck
    it returns when they answer: 20 times the three are killed and brought
    up again, and each time a query of each succeeds at once. (After the
    empty stack's alert check: the kills make Telegraf's writes fail.)"""
    failures = []
    project = PROJECT + "-empty"
    for attempt in range(READY_TRIES):
        compose("kill", *READY_SERVICES, project=project, env=empty_stack["env"])
        compose("up", "-d", "--wait", "--no-deps", *READY_SERVICES, project=project, env=empty_stack["env"])
        failures += ["try %d: %s" % (attempt + 1, failed) for failed in query_each_service(empty_stack)]
    assert not failures, "%d of %d tries failed:\n%s" % (
        len({f.split(":")[0] for f in failures}),
        READY_TRIES,
        "\n".join(failures),
    )


def test_every_prometheus_target_is_up(stack):
    lab, prometheus, _ = stack

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
    assert instances == set(transfer_hosts()), health()


def test_prometheus_reaches_alertmanager(stack):
    _, prometheus, _ = stack
    wait_until(
        lambda: Lab.get_json(prometheus + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"],
        60,
        "Alertmanager among Prometheus's alertmanagers",
    )


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
        # The engine's admission counters, through its stats API and the exporter.
        'longhaul_admission_accepted_total{instance="xfer-b", listener="longhaul"}',
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

    try:
        series = wait_until(
            lambda: routers(
                'SELECT last("ifHCOutOctets") FROM "interface" WHERE time > now() - 2m '
                'GROUP BY "router", "ifName"'
            ),
            120,
            "the lab router's counters in the compose InfluxDB",
        )
    except AssertionError as missing:
        # The containers' logs go with the stack: keep Telegraf's with the failure.
        logs = compose("logs", "--no-color", "--tail", "60", "telegraf", check=False)
        raise AssertionError("%s\ncompose Telegraf's log:\n%s" % (missing, logs.stdout)) from None
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


def test_the_stack_has_no_grafana(stack):
    """Grafana is AGPL: nothing of ours builds, ships or runs it. The stack is
    its four services (and the init job), and no profile adds one."""
    default = set(compose("config", "--services").stdout.split())
    assert default == {"prometheus", "alertmanager", "influxdb", "influxdb-init", "telegraf", "live-view"}
    running = set(compose("ps", "--services", "--status", "running").stdout.split())
    assert running == {"prometheus", "alertmanager", "influxdb", "telegraf", "live-view"}, running
    text = (REPO / "docker-compose.yml").read_text() + (
        REPO / "docker-compose.upstream.yml"
    ).read_text()
    assert "profiles:" not in text and "grafana/grafana" not in text


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
        "nginx:1.27-bookworm",
    } <= images
    assert not any(image.startswith("longhaul/") for image in images), images


@pytest.mark.parametrize("upstream", [False, True], ids=["local images", "upstream images"])
def test_every_long_running_service_has_a_healthcheck(upstream):
    """`up --wait` means ready only for services with a healthcheck; the
    upstream prom/* images have wget, not curl."""
    files = ["-f", str(REPO / "docker-compose.yml")]
    if upstream:
        files += ["-f", str(REPO / "docker-compose.upstream.yml")]
    services = json.loads(compose(*files, "config", "--format", "json").stdout)["services"]
    for name, service in services.items():
        if service.get("restart") == "no":
            continue  # influxdb-init: runs once, and the others wait for it to complete
        test = service.get("healthcheck", {}).get("test", [])
        assert test[:2] in (["CMD", "curl"], ["CMD", "wget"]), (name, service.get("healthcheck"))
        if upstream and service["image"].startswith("prom/"):
            assert test[1] == "wget", (name, test)
