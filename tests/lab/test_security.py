"""The monitoring plane answers only its own (issue 41): site.yml's CA, the hosts'
certificates and the scrape user's password, as users run it.

From a lab host that has no credentials (the router: it holds the CA, which is
public, and its own certificate, but not the scrape password), every exporter
answers 401 over TLS, with or without a wrong password, and plain HTTP gets no
metrics; with the password the controller generated, the same request gets
them, so the 401 is the password's doing. Prometheus scrapes every exporter
over https, verifying the certificate against the CA. The exporters export the
expiry of the host's certificate.
"""

import json
import subprocess
import time

from labkit import INVENTORY, SITE, transfer_hosts, wait_until

SECRETS = INVENTORY / ".longhaul-secrets"
CA = "/usr/local/share/ca-certificates/longhaul-ca.crt"
HOST_CERT = "/etc/ssl/certs/longhaul-host.pem"

# Run in a lab host: each request of stdin's list, its status (or the error).
PROBE = r"""
import base64, json, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context(cafile=sys.argv[1])
out = []
for request in json.load(sys.stdin):
    headers = {}
    if request.get("user") is not None:
        pair = "%s:%s" % (request["user"], request["password"])
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(request["url"], headers=headers), timeout=10, context=context
        ) as answer:
            out.append({"status": answer.status, "body": answer.read(4096).decode("latin-1")})
    except urllib.error.HTTPError as error:
        out.append({"status": error.code, "body": error.read(4096).decode("latin-1")})
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


def exporters(lab):
    """(inventory name, address, port) of every exporter Prometheus scrapes."""
    found = [(name, lab.address[name], 9100) for name in ("router", "monitor")]
    for host in sorted(transfer_hosts()):
        found += [(host, lab.address[host], 9100), (host, lab.address[host], 9743)]
    return found


def test_every_exporter_refuses_a_host_without_the_password(provisioned):
    lab = provisioned
    password = (SECRETS / "credentials" / "scrape").read_text().strip()
    assert len(password) == 32
    for host, address, port in exporters(lab):
        https = "https://%s:%d/metrics" % (address, port)
        answers = probe(
            lab,
            "router",
            [
                {"url": https},
                {"url": https, "user": "prometheus", "password": "not-the-password"},
                {"url": https, "user": "someone", "password": password},
                {"url": "http://%s:%d/metrics" % (address, port)},
                {"url": https, "user": "prometheus", "password": password},
            ],
        )
        where = "%s:%d (%s)" % (host, port, address)
        for answer, what in zip(answers[:3], ("no password", "a wrong password", "a wrong user")):
            assert answer["status"] == 401, "%s with %s: %s" % (where, what, answer)
            assert "# HELP" not in answer["body"], where
        plain = answers[3]
        assert plain["status"] != 200 and "# HELP" not in plain["body"], (
            "%s answered plain HTTP: %s" % (where, plain)
        )
        assert answers[4]["status"] == 200 and "# HELP" in answers[4]["body"], (
            "%s refused the scrape user: %s" % (where, answers[4])
        )


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
    for host in sorted(transfer_hosts()):
        result = lab.promql(
            'longhaul_certificate_not_after_timestamp_seconds{instance="%s", file="%s", position="0"}'
            % (host, HOST_CERT)
        )
        assert len(result) == 1, "%s: %s" % (host, result)
        days = (float(result[0]["value"][1]) - now) / 86400
        assert 363 < days <= 365, "%s: the certificate ends in %.1f days" % (host, days)
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
