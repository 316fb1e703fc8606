"""docker-compose.yml published beyond loopback (issue 41), for real.

On 127.0.0.1 the stack speaks plain HTTP without logins (its other tests,
tests/lab/test_compose.py). Published on another address
(LONGHAUL_PUBLISH_ADDRESS), lab/compose/render.yml gives every published
port TLS and a login through the roles' own settings (lab/compose/tls.yml).
Here the stack comes up on an address of an interface this test makes,
with the images built here, and from outside its containers:
- plain HTTP to each port gets no data;
- over TLS (the certificate checked against the stack's CA, for that
  address) every port answers 401 without a login or with a wrong password,
  and works with the admin login; InfluxDB's front (the influxdb role's
  nginx) asks for a login where InfluxDB 1.6 itself does not (/ping,
  /status, and an admin's for /metrics and /debug/);
- an anonymous silence is refused and no silence exists afterwards;
- inside, over TLS: Prometheus scrapes itself and Alertmanager (every
  target up), Telegraf writes to InfluxDB, the live view reads Prometheus;
- a second render issues no new certificate and keeps the hashes;
- a configuration rendered for loopback does not start on another address.
"""

import base64
import fcntl
import http.client
import json
import os
import secrets
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import threading
import time

import pytest

import helpers
from helpers import REPO

UP_TIMEOUT_S = 900
SERVICES = {
    "prometheus": "LONGHAUL_PROMETHEUS_PORT",
    "alertmanager": "LONGHAUL_ALERTMANAGER_PORT",
    "influxdb": "LONGHAUL_INFLUXDB_PORT",
    "live-view": "LONGHAUL_LIVE_VIEW_PORT",
}
# Where each service shows what it holds, to a login.
DATA_PATHS = {
    "prometheus": "/api/v1/query?query=up",
    "alertmanager": "/api/v2/status",
    "influxdb": "/query?q=SHOW+DATABASES",
    "live-view": "/dashboards/index.json",
}


def need_docker():
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        helpers.cannot_run("the compose stack needs a Docker engine that answers (make setup starts dockerd)")
    if subprocess.run(["ip", "link", "show"], capture_output=True).returncode != 0:
        helpers.cannot_run("the published address is made on an interface of its own: needs ip(8) and root")


class Address:
    """An address of this machine that is not loopback's, on an interface
    made for the test (and removed after it): a name and an address no other
    link has."""

    def __init__(self):
        while True:
            tag = secrets.token_hex(3)
            self.link = "lhpub" + tag
            self.ip = "10.213.%d.%d" % (secrets.randbelow(250) + 1, secrets.randbelow(250) + 1)
            taken = subprocess.run(["ip", "-o", "addr", "show", "to", self.ip], capture_output=True, text=True).stdout
            if not taken.strip() and subprocess.run(["ip", "link", "show", self.link], capture_output=True).returncode != 0:
                return

    def __enter__(self):
        for cmd in (
            # this kernel has no dummy links; one end of a veth pair holds the address
            ["ip", "link", "add", self.link, "type", "veth", "peer", "name", self.link + "p"],
            ["ip", "addr", "add", self.ip + "/32", "dev", self.link],
            ["ip", "link", "set", self.link, "up"],
            ["ip", "link", "set", self.link + "p", "up"],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                subprocess.run(["ip", "link", "del", self.link], capture_output=True)
                helpers.cannot_run("%s: %s" % (" ".join(cmd), done.stderr.strip()))
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)


def stack_env(address, generated):
    env = dict(os.environ)
    env.update({name: str(helpers.free_port()) for name in SERVICES.values()})
    env["LONGHAUL_PUBLISH_ADDRESS"] = address
    env["LONGHAUL_COMPOSE_GENERATED"] = str(generated)
    env.setdefault("LONGHAUL_DIST", str(helpers.dist_dir()))
    return env


def compose(env, project, *args, timeout=UP_TIMEOUT_S):
    return subprocess.run(
        ["docker", "compose", "--project-directory", str(REPO), "-p", project, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def render(env, inventory=None):
    venv_bin = os.path.join(os.environ.get("LONGHAUL_CACHE", "/var/cache/longhaul"), "venv", "bin")
    env = {**env, "PATH": "%s:%s" % (venv_bin, env.get("PATH", "")), "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg")}
    done = subprocess.run(
        ["ansible-playbook", *(["-i", str(inventory)] if inventory else []), str(REPO / "lab" / "compose" / "render.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    need_docker()
    with Address() as address:
        generated = tmp_path_factory.mktemp("generated")
        env = stack_env(address.ip, generated)
        project = "longhaul-published-%d" % os.getpid()
        try:
            done = subprocess.run(
                [str(REPO / "lab" / "compose" / "up"), "-p", project],
                capture_output=True,
                text=True,
                env=env,
                timeout=UP_TIMEOUT_S,
            )
            assert done.returncode == 0, "lab/compose/up failed:\n%s%s" % (done.stdout[-3000:], done.stderr[-3000:])
            yield {"ip": address.ip, "env": env, "generated": generated, "project": project}
        finally:
            subprocess.run([str(REPO / "lab" / "compose" / "down"), "-p", project], capture_output=True, env=env, timeout=300)


def context(stack):
    """Checks the stack's certificate against its CA, for the published address."""
    return ssl.create_default_context(cafile=str(stack["generated"] / "tls" / "ca.crt"))


def secret(stack, name):
    return (stack["generated"] / "secrets" / name).read_text().strip()


def admin(stack):
    return ("admin", secret(stack, "pki/credentials/admin"))


def request(stack, service, path, login=None, scheme="https", method="GET", body=None):
    """(status, body) of one request to `service`'s published port."""
    url = "%s://%s:%s%s" % (scheme, stack["ip"], stack["env"][SERVICES[service]], path)
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if login:
        req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % login).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=20, context=context(stack) if scheme == "https" else None) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def login_for(stack, service):
    if service == "influxdb":
        return ("admin", secret(stack, "influxdb-admin-password"))
    return admin(stack)


@pytest.mark.parametrize("service", list(SERVICES))
def test_plain_http_gets_no_data(published, service):
    """Each TLS port answers a plain request 400, with no data."""
    status, body = request(published, service, DATA_PATHS[service], scheme="http")
    assert status == 400, (service, status, body[:300])
    assert b"success" not in body and b"results" not in body and b"dashboards" not in body, body[:300]


@pytest.mark.parametrize("service", list(SERVICES))
def test_each_port_asks_for_a_login_over_tls(published, service):
    status, body = request(published, service, DATA_PATHS[service])
    assert status == 401, (service, status, body[:300])
    user, password = login_for(published, service)
    status, body = request(published, service, DATA_PATHS[service], (user, password + "x"))
    assert status == 401, (service, "wrong password", status, body[:300])
    status, body = request(published, service, DATA_PATHS[service], (user, password))
    assert status == 200, (service, status, body[:300])


def test_an_anonymous_silence_is_refused_and_none_exists(published):
    silence = {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": "2026-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "a stranger",
        "comment": "blind them",
    }
    status, body = request(published, "alertmanager", "/api/v2/silences", method="POST", body=json.dumps(silence).encode())
    assert status == 401, (status, body[:300])
    status, body = request(published, "alertmanager", "/api/v2/silences", admin(published))
    assert status == 200 and json.loads(body) == [], body[:500]


def test_inside_the_stack_everything_speaks_tls(published):
    """Prometheus scrapes itself and Alertmanager over TLS with its login (all
    targets up), reaches Alertmanager to send alerts; Telegraf writes to
    InfluxDB over TLS; the live view reads Prometheus over TLS."""
    login = admin(published)

    def targets():
        status, body = request(published, "prometheus", "/api/v1/targets", login)
        active = json.loads(body)["data"]["activeTargets"] if status == 200 else []
        return {t["labels"]["job"]: (t["scrapeUrl"], t["health"], t["lastError"]) for t in active}

    helpers.wait_until(
        lambda: (lambda t: t and all(h == "up" for _, h, _ in t.values()))(targets()),
        120,
        "every target of the published stack up",
    )
    seen = targets()
    assert {"prometheus", "alertmanager"} <= set(seen), seen
    assert seen["prometheus"][0].startswith("https://") and seen["alertmanager"][0].startswith("https://"), seen

    status, body = request(published, "prometheus", "/api/v1/alertmanagers", login)
    active = json.loads(body)["data"]["activeAlertmanagers"]
    assert [a["url"][:8] for a in active] == ["https://"], active

    reader = ("grafana", secret(published, "influxdb-grafana-password"))

    def measurements():
        q = urllib.parse.urlencode({"q": "SHOW MEASUREMENTS", "db": "routers"})
        status, body = request(published, "influxdb", "/query?" + q, reader)
        series = json.loads(body)["results"][0].get("series", []) if status == 200 else []
        return {row[0] for s in series for row in s["values"]}

    helpers.wait_until(lambda: "cpu" in measurements(), 120, "Telegraf's cpu series in InfluxDB over TLS")

    status, body = request(published, "live-view", "/prometheus/api/v1/query?query=up", login)
    assert status == 200 and json.loads(body)["status"] == "success", (status, body[:300])
    status, body = request(published, "live-view", "/prometheus/api/v1/query?query=up")
    assert status == 401, (status, body[:300])


def test_a_second_render_issues_nothing_new(published):
    generated = published["generated"]
    files = ["tls/stack.crt", "tls/stack.key", "tls/ca.crt", "secrets/admin.bcrypt", "secrets/scrape.bcrypt", "live-view/htpasswd"]
    before = {name: (generated / name).read_bytes() for name in files}
    render(published["env"])
    after = {name: (generated / name).read_bytes() for name in files}
    assert [name for name in files if before[name] != after[name]] == []


def no_answer(stack, service, path):
    """Whether a plain request to `service` gets no HTTP answer (refused,
    cut, or nothing behind Docker's proxy)."""
    try:
        request(stack, service, path, scheme="http")
    except (OSError, http.client.HTTPException):
        return True
    return False


def test_a_loopback_configuration_does_not_start_elsewhere(published, tmp_path):
    """Rendered for 127.0.0.1 (plain, no logins), then `docker compose up`
    by hand with the other address: every published service refuses to
    start, naming both addresses, and none answers there; the same with
    `--no-deps`, which skips any service the others wait for."""
    loopback = stack_env("127.0.0.1", tmp_path / "generated")
    render(loopback)
    project = published["project"] + "-misused"
    env = {**loopback, "LONGHAUL_PUBLISH_ADDRESS": published["ip"]}
    misused = {**published, "env": env}
    try:
        done = compose(env, project, "up", "-d", "--no-deps", *SERVICES)
        assert done.returncode == 0, done.stdout + done.stderr
        said = "rendered for 127.0.0.1 but LONGHAUL_PUBLISH_ADDRESS is %s" % published["ip"]

        def refused(service):
            return said in compose(env, project, "logs", service, timeout=60).stdout.replace("\n", " ")

        for service in SERVICES:
            helpers.wait_until(lambda: refused(service), 60, "%s refusing to start" % service)
        for _ in range(3):
            for service in SERVICES:
                assert no_answer(misused, service, DATA_PATHS[service]), service
            time.sleep(1)
    finally:
        compose(env, project, "down", "-v", timeout=300)


# What InfluxDB 1.6 answers anyone, what in the answer gives it away, and
# what the front answers: without a login (or with a wrong one), to a user
# that is not an admin, to the admin. The profiler is off (InfluxDB's 404);
# a path not sent canonical, which nginx would match as one path and
# InfluxDB as another, is refused (400) before any login.
INFLUXDB_OPEN = (
    ("/ping", b"", 401, 204, 204),
    ("/status", b"", 401, 204, 204),
    ("/debug/vars", b"memstats", 401, 403, 200),
    ("/debug/requests?seconds=1", b"{", 401, 403, 200),
    ("/debug/pprof/", b"goroutine", 401, 403, 404),
    ("/metrics", b"go_goroutines", 401, 403, 200),
    ("//debug/vars", b"memstats", 400, 400, 400),
    ("/%64ebug/vars", b"memstats", 400, 400, 400),
    ("/debug/vars/../../x", b"memstats", 400, 400, 400),
    ("/debug/requests/%2e%2e/%2e%2e/ping?seconds=1", b"{", 400, 400, 400),
)


@pytest.mark.parametrize(
    "path,leak,anonymous,for_reader,for_admin", INFLUXDB_OPEN, ids=[case[0] for case in INFLUXDB_OPEN]
)
def test_influxdb_tells_nothing_without_a_login(published, path, leak, anonymous, for_reader, for_admin):
    admin_login = login_for(published, "influxdb")
    reader = ("grafana", secret(published, "influxdb-grafana-password"))
    for login in (None, (admin_login[0], admin_login[1] + "x"), ("someone", admin_login[1])):
        status, body = request(published, "influxdb", path, login)
        assert status == anonymous and (not leak or leak not in body), (path, login and login[0], status, body[:300])
    status, body = request(published, "influxdb", path, reader)
    assert status == for_reader and (for_reader != 200 or leak in body), (path, status, body[:300])
    if for_reader != 200 and leak:
        assert leak not in body, (path, body[:300])
    status, body = request(published, "influxdb", path, admin_login)
    assert status == for_admin and (for_admin != 200 or leak in body), (path, status, body[:300])
    if for_admin != 200 and leak:
        assert leak not in body, (path, body[:300])


def test_no_stranger_makes_himself_influxdb_s_first_admin(published):
    """InfluxDB 1.x takes an anonymous CREATE USER ... WITH ALL PRIVILEGES
    while it has no user at all. The stack's InfluxDB started on an empty
    volume, with a stranger asking for that over and over from before it
    starts: never accepted (the admin is made before the port answers), and
    afterwards InfluxDB knows no user of the stranger's."""
    env, project = published["env"], published["project"]
    assert compose(env, project, "rm", "-s", "-f", "influxdb", timeout=120).returncode == 0
    volume = "%s_influxdb-data" % project
    done = subprocess.run(["docker", "volume", "rm", volume], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    grab = urllib.parse.urlencode({"q": "CREATE USER stranger WITH PASSWORD 'stranger1' WITH ALL PRIVILEGES"})
    answers, stop = [], threading.Event()

    def stranger():
        while not stop.is_set():
            try:
                answers.append(request(published, "influxdb", "/query?" + grab, method="POST", body=b""))
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=stranger, daemon=True)
    thread.start()
    try:
        done = compose(env, project, "up", "-d", "--no-deps", "--wait", "influxdb")
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(2)
    finally:
        stop.set()
        thread.join(10)
    assert answers, "the stranger never got an answer"
    taken = [(status, body[:200]) for status, body in answers if status == 200 and b"error" not in body]
    assert taken == [], taken
    # The stranger's 50 requests a second from one address spent its share at the
    # front (10 a second, 40 at once): 429s. The admin asks from the same address once
    # that share is back.
    assert any(status == 429 for status, _ in answers), sorted({status for status, _ in answers})
    q = urllib.parse.urlencode({"q": "SHOW USERS"})
    answer = []
    helpers.wait_until(
        lambda: answer.append(request(published, "influxdb", "/query?" + q, login_for(published, "influxdb")))
        or answer[-1][0] != 429,
        15,
        "the front to take this address's requests again",
    )
    status, body = answer[-1]
    assert status == 200 and b"stranger" not in body and b"admin" in body, body


def test_an_inventory_s_ca_signs_the_stack_and_is_left_as_it_was(tmp_path):
    """Rendered with an inventory that site.yml provisioned (its CA and
    generated passwords in .longhaul-secrets beside it, roles/longhaul_pki):
    the stack's certificate is signed by that CA, Prometheus logs in with the
    inventory's scrape password, and nothing of .longhaul-secrets changes."""
    inventory = tmp_path / "inventory"
    pki = inventory / ".longhaul-secrets"
    (pki / "credentials").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    xfer-1:\n      ansible_host: 192.0.2.10\n")
    openssl = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True)
    openssl("ecparam", "-name", "secp384r1", "-genkey", "-noout", "-out", str(pki / "ca.key"))
    openssl("req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=longhaul CA inventory", "-days", "3650",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-out", str(pki / "ca.crt"))
    for name in ("admin", "scrape"):
        (pki / "credentials" / name).write_text(secrets.token_hex(16) + "\n")
    before = {p: p.read_bytes() for p in sorted(pki.rglob("*")) if p.is_file()}
    generated = tmp_path / "generated"
    render(stack_env("10.213.0.1", generated), inventory=inventory / "hosts.yml")
    after = {p: p.read_bytes() for p in sorted(pki.rglob("*")) if p.is_file()}
    assert after == before, [str(p) for p in after if after[p] != before.get(p)] + [str(p) for p in before if p not in after]
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(pki / "ca.crt"), str(generated / "tls" / "stack.crt")],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    scrape = (pki / "credentials" / "scrape").read_text().strip()
    assert (generated / "prometheus" / "tls" / "scrape.password").read_text() == scrape


def test_one_up_at_a_time_per_configuration(tmp_path):
    """Two lab/compose/up runs on one generated/ would mix their files. While
    one holds it, another stops at once, naming the directory, and writes
    nothing there. A relative LONGHAUL_COMPOSE_GENERATED is taken from the
    current directory (render.yml and docker compose would each read it from
    another). No Docker: it stops before the live view's check, and LONGHAUL_DIST
    names nothing, so nothing could start either way."""
    generated = tmp_path / "relative" / "generated"
    generated.mkdir(parents=True)
    with open(generated / ".up.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        env = {**os.environ, "LONGHAUL_COMPOSE_GENERATED": "relative/generated", "LONGHAUL_DIST": str(tmp_path / "none")}
        env.pop("LONGHAUL_PUBLISH_ADDRESS", None)
        done = subprocess.run(
            [str(REPO / "lab" / "compose" / "up"), "-p", "lhlock"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "another lab/compose/up" in done.stderr and str(generated) in done.stderr, done.stderr
    assert sorted(p.name for p in generated.iterdir()) == [".up.lock"]
    assert not (REPO / "relative").exists()
