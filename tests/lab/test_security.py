"""The monitoring plane answers only its own (issue 41): site.yml's CA, the hosts'
certificates and the scrape user's password, as users run it.

From a lab host that has no credentials (the router: it holds the CA, which is
public, and its own certificate, but no password), every exporter (Telegraf's
Prometheus output among them), both Prometheus servers, Alertmanager and
InfluxDB answer 401 over TLS, with or without a wrong password, and plain HTTP
gets nothing; with the password the controller
generated, the same request is answered, so the 401 is the password's doing.
A forged remote write to the central store (a replica's nginx in front of
VictoriaMetrics) is refused and none of its samples appears there, while the same
write with the sites' credentials lands; the sites' credentials cannot read it;
an anonymous silence is refused and no silence exists afterwards. Prometheus
scrapes every exporter over https, verifying the certificate against the CA.
The exporters export the expiry of the host's certificate: on the transfer hosts
(job longhaul) and on every other host (job certificates: the monitoring and
central hosts, whose servers are the plane's).
"""

import base64
import json
import subprocess
import time

from labkit import SECRETS, SITE, transfer_hosts, wait_until
CA = "/usr/local/share/ca-certificates/longhaul-ca.crt"
HOST_CERT = "/etc/ssl/certs/longhaul-host.pem"
# Telegraf's Prometheus output, on the monitor
TELEGRAF_PORT = 9273

# Run in a lab host: each request of stdin's list, its status (or the error).
PROBE = r"""
import base64, json, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context(cafile=sys.argv[1])
out = []
for request in json.load(sys.stdin):
    headers = dict(request.get("headers", {}))
    if request.get("user") is not None:
        pair = "%s:%s" % (request["user"], request["password"])
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    body = base64.b64decode(request["body"]) if "body" in request else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(request["url"], data=body, headers=headers, method=request.get("method")),
            timeout=10,
            context=context,
        ) as answer:
            out.append({"status": answer.status, "body": answer.read(4096).decode("latin-1")})
    except urllib.error.HTTPError as error:
        # A server that refuses a request may close before its answer's body is read
        # (Go's answer to plain HTTP on a TLS port, while a POST's body is still
        # arriving): the status is the answer.
        try:
            body = error.read(4096).decode("latin-1")
        except OSError as gone:
            body = "(body unread: %s)" % gone
        out.append({"status": error.code, "body": body})
    except Exception as error:
        out.append({"status": None, "body": "%s: %s" % (type(error).__name__, error)})
print(json.dumps(out))
"""


def probe(lab, host, requests):
    """Each request ({url, user?, password?}) made from a lab host; the requests
    (passwords) go by stdin, never on a command line."""
    done = subprocess.run(
        ["docker", "exec", "-i", lab.container(host), "python3", "-c", PROBE, CA],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, "the probe failed in %s: %s" % (host, done.stderr[-2000:])
    return json.loads(done.stdout)


# The lab's hosts without a transfer engine: longhaul-exporter there watches the
# certificates only (job certificates).
OTHER_HOSTS = ("router", "monitor", "central", "central2")


def exporters(lab):
    """(inventory name, address, port) of every exporter Prometheus scrapes:
    node_exporter, longhaul-exporter, and Telegraf's Prometheus output."""
    found = [(name, lab.address[name], port) for name in OTHER_HOSTS for port in (9100, 9743)]
    found.append(("monitor", lab.address["monitor"], TELEGRAF_PORT))
    for host in sorted(transfer_hosts()):
        found += [(host, lab.address[host], 9100), (host, lab.address[host], 9743)]
    return found


def test_every_exporter_refuses_a_host_without_the_password(provisioned):
    lab = provisioned
    scrape = (SECRETS / "credentials" / "scrape").read_text().strip()
    telegraf = (SECRETS / "credentials" / "telegraf").read_text().strip()
    assert len(scrape) == len(telegraf) == 32 and scrape != telegraf
    for _, address, port in exporters(lab):
        url = "https://%s:%d/metrics" % (address, port)
        # Telegraf keeps its password in clear: a login of its own, which opens
        # nothing else, and the scrape user's (Prometheus' own login) is not it.
        if port == TELEGRAF_PORT:
            refused_without_the_password(lab, url, "telegraf", telegraf, "# HELP")
            [answer] = probe(lab, "router", [{"url": url, "user": "prometheus", "password": scrape}])
            assert answer["status"] == 401, answer
        else:
            refused_without_the_password(lab, url, "prometheus", scrape, "# HELP")
    config = lab.sh("monitor", "cat /etc/telegraf/telegraf.conf").stdout
    own, prometheus_s = telegraf in config, scrape in config
    assert own and not prometheus_s, "telegraf.conf holds its password: %s, the scrape user's: %s" % (
        own,
        prometheus_s,
    )


def test_influxdb_answers_its_users_only_over_tls(provisioned):
    """InfluxDB on the monitor (bound to its lab address), as its reader user
    (Grafana's); "results" is in every answer of InfluxDB's query API."""
    lab = provisioned
    url = lab.influxdb_url + "/query?db=routers&q=SHOW%20MEASUREMENTS"
    assert url.startswith("https://"), url
    reader = lab.secret("influxdb-grafana-password")
    refused_without_the_password(lab, url, "grafana", reader, '"results"')


def test_influxdb_s_counters_and_version_need_a_login(provisioned):
    """What InfluxDB 1.6 answers anyone (its version, its counters, the user
    names and addresses of recent requests, the Go runtime's metrics) the
    influxdb role's front (nginx) answers only to a login InfluxDB accepts:
    /ping to its users, the rest to its admin; a user that is no admin gets 403."""
    lab = provisioned
    admin = lab.secret("influxdb-admin-password")
    reader = lab.secret("influxdb-grafana-password")
    base = lab.influxdb_url
    answers = probe(
        lab,
        "router",
        [
            {"url": base + "/ping"},
            {"url": base + "/ping", "user": "grafana", "password": "not-the-password"},
            {"url": base + "/ping", "user": "grafana", "password": reader},
        ],
    )
    assert [answer["status"] for answer in answers] == [401, 401, 204], answers
    for path, leak in (
        ("/debug/vars", '"memstats"'),
        ("/debug/requests?seconds=1", "{"),
        ("/metrics", "go_goroutines"),
    ):
        refused_without_the_password(lab, base + path, "admin", admin, leak)
        [answer] = probe(lab, "router", [{"url": base + path, "user": "grafana", "password": reader}])
        assert answer["status"] == 403 and leak not in answer["body"], (path, answer)
    # A path nginx would read as "/x" and InfluxDB as /debug/vars: refused, even to the admin.
    for login in ({}, {"user": "admin", "password": admin}):
        [answer] = probe(lab, "router", [{"url": base + "/debug/vars/../../x", **login}])
        assert answer["status"] == 400 and "memstats" not in answer["body"], answer


def test_prometheus_scrapes_every_exporter_over_verified_tls(provisioned):
    lab = provisioned
    want = {(host, port) for host, _, port in exporters(lab)}

    def scraped():
        targets = lab.get_json(lab.prometheus_url + "/api/v1/targets")["data"]["activeTargets"]
        found = {}
        for target in targets:
            port = int(target["scrapeUrl"].split("/")[2].rsplit(":", 1)[1])
            found[(target["labels"]["instance"], port)] = target
        return found

    wait_until(
        lambda: all(
            scraped().get(key, {}).get("health") == "up" for key in want
        ),
        60,
        "every exporter up in Prometheus",
    )
    found = scraped()
    for key in sorted(want):
        target = found[key]
        assert target["scrapeUrl"].startswith("https://"), target
        assert target["lastError"] == "", target


def test_the_hosts_certificates_expire_in_a_year_and_are_watched(provisioned):
    lab = provisioned
    now = time.time()
    watched = [(host, "longhaul") for host in sorted(transfer_hosts())]
    watched += [(host, "certificates") for host in OTHER_HOSTS]
    for host, job in watched:
        result = lab.promql(
            'longhaul_certificate_not_after_timestamp_seconds{job="%s", instance="%s", file="%s", position="0"}'
            % (job, host, HOST_CERT)
        )
        assert len(result) == 1, "%s: %s" % (host, result)
        days = (float(result[0]["value"][1]) - now) / 86400
        assert 363 < days <= 365, "%s: the certificate ends in %.1f days" % (host, days)
    # The other hosts' exporters run their certificates collector only (no engine,
    # TCP or RAID collector), and it succeeds.
    ran = lab.promql('longhaul_exporter_collector_success{job="certificates"}')
    by_host = {}
    for series in ran:
        by_host.setdefault(series["metric"]["instance"], {})[series["metric"]["collector"]] = series["value"][1]
    assert by_host == {host: {"certificates": "1"} for host in OTHER_HOSTS}, by_host
    assert lab.alerts("LonghaulCertificateExpiresSoon") == []


def test_a_check_run_passes_changes_nothing_and_prints_no_secret(provisioned):
    # `--check --diff` is what the example inventory recommends before a change. On the
    # provisioned lab it must pass, change nothing, and show no password, hash or key:
    # before, its check mode failed (the hashes were empty, the exporters refused them).
    lab = provisioned
    run = lab.playbook(SITE, "--check", "--diff")
    assert run.rc == 0, run.tail()
    assert run.changed_tasks() == [], run.changed_tasks()
    output = run.output
    secrets = {
        path.name: path.read_text().strip() for path in (SECRETS / "credentials").iterdir()
    }
    names = sorted(secrets)
    secrets["the CA key"] = (SECRETS / "ca.key").read_text().strip().splitlines()[1]
    for host in ["monitor"] + sorted(transfer_hosts()):
        for name in names:
            stored = lab.sh(host, "cat /etc/longhaul/credentials/%s.bcrypt" % name).stdout.strip()
            secrets["%s's hash on %s" % (name, host)] = stored
    for name, secret in secrets.items():
        assert len(secret) >= 32 and secret not in output, "site.yml --check --diff printed %s" % name


def refused_without_the_password(lab, url, user, password, expect_body):
    """From the router: no password, a wrong one, a wrong user: 401 and nothing of
    `expect_body`; plain HTTP: nothing of it; the right one: 200 with it."""
    answers = probe(
        lab,
        "router",
        [
            {"url": url},
            {"url": url, "user": user, "password": "not-the-password"},
            {"url": url, "user": "someone", "password": password},
            {"url": url.replace("https://", "http://", 1)},
            {"url": url, "user": user, "password": password},
        ],
    )
    for answer, what in zip(answers[:3], ("no password", "a wrong password", "a wrong user")):
        assert answer["status"] == 401, "%s with %s: %s" % (url, what, answer)
        assert expect_body not in answer["body"], url
    assert answers[3]["status"] != 200 and expect_body not in answers[3]["body"], (
        "%s answered plain HTTP: %s" % (url, answers[3])
    )
    assert answers[4]["status"] == 200 and expect_body in answers[4]["body"], (
        "%s refused its user: %s" % (url, answers[4])
    )


def test_prometheus_and_alertmanager_answer_their_users_only(provisioned):
    lab = provisioned
    admin = (SECRETS / "credentials" / "admin").read_text().strip()
    for url, body in (
        (lab.prometheus_url + "/api/v1/query?query=up", '"resultType"'),
        *((url + "/api/v1/query?query=up", '"resultType"') for url in lab.central_urls),
        (lab.prometheus_url + "/federate?match[]=up", "up{"),
        (lab.alertmanager_url + "/api/v2/silences", "["),
        (lab.alertmanager_url + "/api/v2/status", '"cluster"'),
    ):
        refused_without_the_password(lab, url, "admin", admin, body)


def test_the_live_view_and_its_prometheus_answer_admin_only(provisioned):
    """The live view on the monitor (roles/live_view, port 8443): its page,
    its dashboards, the Prometheus read API and the central store's it passes
    on, and what it says it has, each 401 from the router without the
    password, with a wrong one or a wrong user, and nothing over plain HTTP."""
    lab = provisioned
    admin = (SECRETS / "credentials" / "admin").read_text().strip()
    base = "https://%s:8443" % lab.address["monitor"]
    for path, body in (
        ("/", "longhaul live view"),
        ("/dashboards/index.json", '"transfer-overview"'),
        ("/prometheus/api/v1/query?query=up", '"resultType"'),
        ("/central/api/v1/query?query=up", '"resultType"'),
        ("/live-view.json", '"central":true'),
    ):
        refused_without_the_password(lab, base + path, "admin", admin, body)


# --- remote write, by hand: Prometheus' WriteRequest in protobuf, snappy-framed ----------


def varint(number):
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def field(number, wire, payload):
    """A protobuf field: a length-delimited one (wire 2) or a fixed 64-bit one (1)."""
    key = varint(number << 3 | wire)
    return key + (varint(len(payload)) + payload if wire == 2 else payload)


def write_request(name, labels, value, at_ms):
    """One sample of one series, as remote write sends it (snappy block format:
    the length, then the bytes as literals of at most 60 bytes each)."""
    import struct

    series = b"".join(
        field(1, 2, field(1, 2, key.encode()) + field(2, 2, text.encode()))
        for key, text in sorted({"__name__": name, **labels}.items())
    )
    sample = field(1, 1, struct.pack("<d", value)) + varint(2 << 3 | 0) + varint(at_ms)
    message = field(1, 2, series + field(2, 2, sample))
    framed = bytearray(varint(len(message)))
    for start in range(0, len(message), 60):
        chunk = message[start : start + 60]
        framed.append((len(chunk) - 1) << 2)
        framed += chunk
    return base64.b64encode(bytes(framed)).decode()


WRITE_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def test_a_forged_remote_write_is_refused_and_leaves_no_sample(provisioned):
    lab = provisioned
    scrape = (SECRETS / "credentials" / "scrape").read_text().strip()
    url = lab.central_url + "/api/v1/write"
    now_ms = int(time.time() * 1000)
    attempts = {
        "anonymous": {},
        "wrong-password": {"user": "prometheus", "password": "not-the-password"},
        "plain-http": {"url": url.replace("https://", "http://", 1)},
        # a reader (people, Grafana) may read the central view, not write to it
        "reader": {"user": "admin", "password": (SECRETS / "credentials" / "admin").read_text().strip()},
        "site": {"user": "prometheus", "password": scrape},
    }
    requests = []
    for attempt, extra in attempts.items():
        body = write_request("longhaul_forged_throughput", {"attempt": attempt, "site": "a"}, 1e12, now_ms)
        requests.append(
            {"url": url, "method": "POST", "headers": WRITE_HEADERS, "body": body, **extra}
        )
    answers = dict(zip(attempts, probe(lab, "router", requests)))
    assert answers["anonymous"]["status"] == 401, answers["anonymous"]
    assert answers["wrong-password"]["status"] == 401, answers["wrong-password"]
    assert answers["plain-http"]["status"] != 204, answers["plain-http"]
    assert answers["reader"]["status"] == 401, answers["reader"]
    # The same write with the sites' credentials lands: the payload is a real one.
    assert answers["site"]["status"] == 204, answers["site"]
    found = wait_until(
        lambda: lab.promql("longhaul_forged_throughput", url=lab.central_url),
        30,
        "the credentialed write's sample at the central store",
    )
    assert {s["metric"]["attempt"] for s in found} == {"site"}, found
    time.sleep(5)
    attempts_seen = {
        s["metric"]["attempt"]
        for s in lab.promql("last_over_time(longhaul_forged_throughput[10m])", url=lab.central_url)
    }
    assert attempts_seen == {"site"}, attempts_seen
    # ... and a writer may not read it.
    query = lab.central_url + "/api/v1/query?query=up"
    [read] = probe(lab, "router", [{"url": query, "user": "prometheus", "password": scrape}])
    assert read["status"] == 401, read


def test_an_anonymous_silence_is_refused_and_none_exists(provisioned):
    lab = provisioned
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    silence = {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True, "isEqual": True}],
        "startsAt": now,
        "endsAt": later,
        "createdBy": "a stranger",
        "comment": "longhaul-test: silence everything",
    }
    body = base64.b64encode(json.dumps(silence).encode()).decode()
    url = lab.alertmanager_url + "/api/v2/silences"
    headers = {"Content-Type": "application/json"}
    answers = probe(
        lab,
        "router",
        [
            {"url": url, "method": "POST", "headers": headers, "body": body},
            {"url": url, "method": "POST", "headers": headers, "body": body, "user": "admin", "password": "guess"},
            {"url": url.replace("https://", "http://", 1), "method": "POST", "headers": headers, "body": body},
        ],
    )
    assert [a["status"] for a in answers[:2]] == [401, 401], answers
    assert answers[2]["status"] != 200, answers[2]
    silences = lab.get_json(url)
    assert [s for s in silences if s["createdBy"] == "a stranger"] == [], silences
    # The admin user may: the same request is a well-formed one.
    made = lab.get_json(url, data={**silence, "createdBy": "longhaul-test admin"}, method="POST")
    lab.get_json(lab.alertmanager_url + "/api/v2/silence/" + made["silenceID"], method="DELETE")


def test_each_prometheus_reaches_itself_and_alertmanager_over_tls(provisioned):
    # Its own door and Alertmanager's now want TLS and a user: a wrong server name, CA or
    # password would leave these jobs down and the alerts undelivered, with no alert of
    # its own to say so.
    lab = provisioned
    # (The central store's vmalert reaches Alertmanager too: test_many_sites sees its
    # alert delivered.)
    for url, instance, jobs in ((lab.prometheus_url, "monitor", ("prometheus", "alertmanager")),):
        def own(job):
            targets = lab.get_json(url + "/api/v1/targets")["data"]["activeTargets"]
            return [t for t in targets if t["labels"]["job"] == job]

        for job in jobs:
            wait_until(
                lambda: [t for t in own(job) if t["health"] == "up"],
                60,
                "job %s up at %s" % (job, url),
            )
            for target in own(job):
                assert target["scrapeUrl"].startswith("https://"), target
                assert target["labels"]["instance"] in (instance, "monitor"), target
        found = lab.get_json(url + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        assert [a["url"] for a in found] == ["https://%s:9093/api/v2/alerts" % lab.monitor], found
        # The first provisioning's own seconds (Prometheus configured before
        # Alertmanager's TLS) are not this check's business: the last 3 minutes are.
        errors = lab.promql(
            'sum(increase(prometheus_notifications_errors_total{instance="%s"}[3m]))' % instance, url=url
        )
        assert errors and float(errors[0]["value"][1]) == 0, "%s: alerts not delivered: %s" % (url, errors)
