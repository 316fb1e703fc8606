"""Handles on the running lab for the end-to-end tests (tests/lab): its
scripts, playbooks, containers, and its Prometheus, Alertmanager and
InfluxDB APIs (the same query methods as tests/stack.py's Stack, so the
dashboard checks of tests/dashboard_queries.py run against either)."""

import base64
import datetime
import functools
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # tests/: the dashboard checks shared with the other suites
from delay_path import PathCheck, delay_line_samples  # noqa: E402  (tests/, after the path)

LAB = REPO / "lab"
SITE = REPO / "ansible" / "site.yml"
# The monitor's settings the tests derive their timings from (scrape
# interval, the dashboards' data source intervals): lab/inventory/group_vars/monitoring.
MONITORING_VARS = yaml.safe_load(
    (LAB / "inventory" / "group_vars" / "monitoring" / "main.yml").read_text()
)
# The lab's scrape interval (the Prometheus data source's, so $__rate_interval
# is 4 x it) and the InfluxDB data source's minimum interval (the router panels'
# $__interval), in seconds: what tests/dashboard_queries.py's Dashboard takes.
SCRAPE_S = int(MONITORING_VARS["prometheus_global"]["scrape_interval"].rstrip("s"))
INFLUX_MIN_S = int(MONITORING_VARS["grafana_datasource_influxdb_time_interval"].rstrip("s"))
CAMPAIGN = REPO / "ansible" / "campaign.yml"
VENV_BIN = Path(os.environ.get("LONGHAUL_CACHE", "/var/cache/longhaul")) / "venv" / "bin"
# The lab's playbooks (site.yml twice, every campaign, test_compose's
# lab/compose/render.yml: whatever runs with env_for_ansible) run under Mitogen's
# strategy (scripts/requirements.txt): one Python interpreter per host for the
# whole run instead of one per task. On a quiet 2-core machine site.yml on the
# provisioned lab took 61 s with it and 186 s without, a fresh lab 111 s.
# LONGHAUL_LAB_MITOGEN=0 (or false, no) runs them with plain Ansible, as a user
# without Mitogen does; Molecule always runs the roles with plain Ansible.
MITOGEN = os.environ.get("LONGHAUL_LAB_MITOGEN", "1").lower() not in ("0", "false", "no")

# Generous ceilings: the machine has 2 cores shared with everything else. The first
# site.yml run installs five hosts (the monitor and a central Prometheus among them):
# more than 15 min measured under a load of 20 on 2 cores (merge of issues 19 and 20).
PLAYBOOK_TIMEOUT_S = 1800
HTTP_TIMEOUT_S = 10
# Where the shell of start_long_transfer's sender in xfer-a leaves its pid.
LONG_TRANSFER_PIDFILE = "/run/longhaul-long-transfer.pid"

RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@functools.lru_cache(maxsize=None)
def mitogen_strategies():
    """The directory of Mitogen's strategy plugins in the toolchain's venv."""
    done = subprocess.run(
        [
            str(VENV_BIN / "python"),
            "-c",
            "import ansible_mitogen, os; print(os.path.dirname(ansible_mitogen.__file__))",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        "Mitogen is not in %s (run make setup, or LONGHAUL_LAB_MITOGEN=0 for plain Ansible): %s"
        % (VENV_BIN.parent, done.stderr.strip())
    )
    return str(Path(done.stdout.strip()) / "plugins" / "strategy")


def transfer_hosts():
    """{host: its inventory variables} of the lab's transfer hosts, as lab/up
    wrote them into INVENTORY/hosts.yml."""
    inventory = yaml.safe_load((INVENTORY / "hosts.yml").read_text())
    return inventory["all"]["children"]["transfer_hosts"]["hosts"]


def lab_env():
    """lab/lab.env's values, as lab/up sees them."""
    out = subprocess.run(
        ["bash", "-c", '. "$1"; set | grep "^LAB_"', "lab.env", str(LAB / "lab.env")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# What lab/up generated for the lab LAB_ID picks: its inventory and its secrets.
_GENERATED = lab_env()
INVENTORY = REPO / _GENERATED["LAB_INVENTORY"]
STATE = REPO / _GENERATED["LAB_STATE"]


def rate_bps(rate):
    """tc rate syntax (200mbit, 1gbit, 100mbps, 1Mibit) -> bits/s."""
    match = re.fullmatch(r"([0-9.]+)([kmgt]?)(i?)(bit|bps)", rate.lower())
    assert match, "not a tc rate: %s" % rate
    base = 1024 if match.group(3) else 1000
    value = float(match.group(1)) * base ** " kmgt".index(match.group(2) or " ")
    return value * (8 if match.group(4) == "bps" else 1)


def epoch(ansible_time):
    """The command module's '2026-11-21 08:09:07.123456' (UTC in the lab) -> epoch."""
    return (
        datetime.datetime.strptime(ansible_time, "%Y-%m-%d %H:%M:%S.%f")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
    )


class PlaybookRun:
    def __init__(self, done, seconds):
        self.rc = done.returncode
        self.output = done.stdout + done.stderr
        self.seconds = seconds
        self.recap = {
            m.group("host"): {k: int(v) for k, v in m.groupdict().items() if k != "host"}
            for m in RECAP.finditer(done.stdout)
        }

    def tail(self, lines=60):
        return "\n".join(self.output.splitlines()[-lines:])

    def slowest_tasks(self, count):
        """The first `count` lines of profile_tasks's table (slowest first):
        "role : task ---- 12.34s", after the last line of '=' it prints."""
        lines = self.output.splitlines()
        rules = [i for i, line in enumerate(lines) if line.startswith("=" * 20)]
        if not rules:
            return []
        table = [line for line in lines[rules[-1] + 1 :] if re.search(r"-+ \d+\.\d+s$", line)]
        return table[:count]

    def changed_tasks(self):
        """ "host: TASK [role : name]" for every task that reported a change."""
        found, task = [], "?"
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line.rstrip(" *")
            elif line.startswith("changed: ["):
                found.append("%s: %s" % (line[len("changed: [") :].split("]", 1)[0], task))
        return found


class Lab:
    """Handles on the running lab."""

    def __init__(self):
        env = lab_env()
        self.env = env
        self.prefix = env["LAB_PREFIX"]
        self.monitor = env["LAB_IP_MONITOR_A"]
        # site.yml's TLS (roles/longhaul_pki): Prometheus and Alertmanager answer https
        # to the admin user only, with a certificate of the inventory's CA.
        self.prometheus_url = "https://%s:9090" % self.monitor
        self.alertmanager_url = "https://%s:9093" % self.monitor
        self.influxdb_url = "https://%s:8086" % self.monitor
        # The central store: two VictoriaMetrics replicas behind nginx (roles/victoriametrics).
        self.central_urls = ["https://%s:8427" % env[v] for v in ("LAB_IP_CENTRAL", "LAB_IP_CENTRAL2")]
        self.central_url = self.central_urls[0]
        self.bottleneck_rate = env["LAB_BOTTLENECK_RATE"]
        self.bottleneck_bps = rate_bps(self.bottleneck_rate)
        self.address = {
            "router": env["LAB_IP_ROUTER_A"],
            "monitor": env["LAB_IP_MONITOR_A"],
            "central": env["LAB_IP_CENTRAL"],
            "central2": env["LAB_IP_CENTRAL2"],
        }
        # Every pair's transfer hosts: LAB_IP_XFER_A is xfer-a, LAB_IP_XFER_B2 xfer-b2.
        for name, value in env.items():
            pair = re.fullmatch(r"LAB_IP_XFER_([AB])(\d*)", name)
            if pair:
                self.address["xfer-%s%s" % (pair.group(1).lower(), pair.group(2))] = value
        self.provision = []  # PlaybookRun of the first and second site.yml
        self.bring_up = []  # (step, seconds) of the session's bring-up, for its summary
        self.reused = False  # LONGHAUL_LAB_REUSE=1: a running lab, not a fresh one

    @staticmethod
    def secret(name):
        """A secret lab/up generated (STATE/NAME), e.g. influxdb-grafana-password."""
        return (STATE / name).read_text().strip()

    # --- processes -----------------------------------------------------------
    def container(self, host):
        return "%s-%s" % (self.prefix, host)

    def sh(self, host, script, check=True, timeout=120):
        """Run a shell script in a lab host; returns the CompletedProcess."""
        done = subprocess.run(
            ["docker", "exec", self.container(host), "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, "%s: %s failed: %s%s" % (
                host,
                script,
                done.stdout,
                done.stderr,
            )
        return done

    def router_interface(self, address):
        """The router's interface that holds this address (eth0/eth1, by docker's order)."""
        out = self.sh("router", "ip -o -4 addr show").stdout
        names = [line.split()[1] for line in out.splitlines() if " %s/" % address in line]
        assert names, "the router has no interface with %s:\n%s" % (address, out)
        return names[0]

    def script(self, name, timeout=600):
        done = subprocess.run(
            [str(LAB / name)], capture_output=True, text=True, timeout=timeout, cwd=REPO
        )
        assert done.returncode == 0, "lab/%s failed:\n%s%s" % (name, done.stdout, done.stderr)
        return done.stdout

    @staticmethod
    def env_for_ansible():
        env = dict(os.environ)
        env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
        env["ANSIBLE_CONFIG"] = str(REPO / "ansible" / "ansible.cfg")
        env["ANSIBLE_NOCOLOR"] = "1"
        env["ANSIBLE_FORCE_COLOR"] = "0"
        if MITOGEN:
            env["ANSIBLE_STRATEGY_PLUGINS"] = mitogen_strategies()
            env["ANSIBLE_STRATEGY"] = "mitogen_linear"
        return env

    def playbook(self, playbook, *args, timeout=PLAYBOOK_TIMEOUT_S):
        t0 = time.time()
        done = subprocess.run(
            ["ansible-playbook", "-i", str(INVENTORY), str(playbook), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env_for_ansible(),
            cwd=REPO,
        )
        return PlaybookRun(done, time.time() - t0)

    def campaign_process(self, name, results_dir, *extra):
        """Start ansible/campaign.yml in the background; returns the Popen."""
        args = ["-e", "campaign=%s" % name, "-e", "campaign_results_dir=%s" % results_dir]
        for item in extra:
            args += ["-e", item]
        return subprocess.Popen(
            ["ansible-playbook", "-i", str(INVENTORY), str(CAMPAIGN), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env_for_ansible(),
            cwd=REPO,
        )

    def campaign(self, name, results_dir, *extra, timeout=PLAYBOOK_TIMEOUT_S):
        """Run a campaign; returns (PlaybookRun, newest results directory)."""
        args = ["-e", "campaign=%s" % name, "-e", "campaign_results_dir=%s" % results_dir]
        for item in extra:
            args += ["-e", item]
        run = self.playbook(CAMPAIGN, *args, timeout=timeout)
        runs = sorted(p for p in (Path(results_dir) / name).glob("*") if p.is_dir())
        return run, (runs[-1] if runs else None)

    def send_command(self, seconds, streams=8, rate_bps=None, campaign=None, run=None):
        """The shell command of a memory `longhaul send` xfer-a -> xfer-b (2M
        buffers, JSON report), paced to rate_bps when given, naming a campaign
        and a run when given."""
        return (
            "/usr/local/bin/longhaul send --to %s:7400 --streams %d --buffer 2M%s --time %d "
            "--token-file /etc/longhaul/token --json%s"
            % (
                self.address["xfer-b"],
                streams,
                " --rate %d" % rate_bps if rate_bps else "",
                seconds,
                "".join(
                    " --%s %s" % pair for pair in (("campaign", campaign), ("run", run)) if pair[1]
                ),
            )
        )

    def start_long_transfer(self, seconds, streams=8, campaign=None, run=None):
        """send_command's transfer in the background; returns its Popen, for
        stop_long_transfer."""
        return subprocess.Popen(
            [
                "docker",
                "exec",
                self.container("xfer-a"),
                "sh",
                "-c",
                "echo $$ >%s; exec %s"
                % (
                    LONG_TRANSFER_PIDFILE,
                    self.send_command(seconds, streams, campaign=campaign, run=run),
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop_long_transfer(self, sender):
        self.sh(
            "xfer-a",
            "[ -s {0} ] && kill $(cat {0}); rm -f {0}".format(LONG_TRANSFER_PIDFILE),
            check=False,
        )
        sender.wait(timeout=60)

    # --- monitoring APIs (the same shapes as tests/stack.py's Stack) ---------------
    @staticmethod
    def get_text(url, params=None, auth=None, data=None, method=None, timeout=HTTP_TIMEOUT_S):
        """An answer's body; auth=(user, password) for HTTP basic authentication, by
        default the admin user's for an https URL (the lab's Prometheus, Alertmanager
        and central store), whose certificate is checked against the lab's CA. `data`
        (JSON) is sent with the request."""
        if params:
            url += "?" + urllib.parse.urlencode(params)
        body = None if data is None else json.dumps(data).encode()
        request = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if auth is None and url.startswith("https://"):
            auth = admin()
        if auth:
            request.add_header("Authorization", basic_auth(*auth))
        with urllib.request.urlopen(request, timeout=timeout, context=tls_context()) as answer:
            return answer.read().decode()

    @staticmethod
    def get_json(url, params=None, auth=None, data=None, method=None):
        """A JSON answer, asked as get_text asks."""
        raw = Lab.get_text(url, params, auth, data, method)
        return json.loads(raw) if raw else None

    def promql(self, expr, at=None, url=None):
        """Instant query of the monitor's Prometheus (or the one at `url`)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        answer = self.get_json((url or self.prometheus_url) + "/api/v1/query", params)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def prom_range(self, expr, start, end, step=5):
        answer = self.get_json(
            self.prometheus_url + "/api/v1/query_range",
            {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": step},
        )
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def prom_label_values(self, label, match, start, end):
        """The values of `label` over [start, end] of the series `match` selects (or all)."""
        params = {"start": "%.0f" % start, "end": "%.0f" % end}
        if match:
            params["match[]"] = match
        answer = self.get_json("%s/api/v1/label/%s/values" % (self.prometheus_url, label), params)
        assert answer["status"] == "success", answer
        return answer["data"]

    def influxql(self, query, db="routers"):
        """A query as the dashboards' data source runs it: InfluxDB's reader
        user (influxdb_users; the one the grafana role provisions)."""
        answer = self.get_json(
            self.influxdb_url + "/query",
            {"db": db, "q": query, "epoch": "ms"},
            auth=("grafana", self.secret("influxdb-grafana-password")),
        )
        result = answer["results"][0]
        assert "error" not in result, "%s: %s" % (query, result["error"])
        return result.get("series", [])

    def alerts(self, name):
        """Active (not silenced) alerts of that name in Alertmanager."""
        found = self.get_json(
            self.alertmanager_url + "/api/v2/alerts",
            {"active": "true", "silenced": "false", "inhibited": "false"},
        )
        return [a for a in found if a["labels"].get("alertname") == name]

    def ready(self, url, login=None):
        """True once url answers 200 or 204: with `login` (user, password), else
        with the plane's admin over https."""
        request = urllib.request.Request(url)
        if login is not None:
            request.add_header("Authorization", basic_auth(*login))
        elif url.startswith("https://"):
            request.add_header("Authorization", basic_auth(*admin()))
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=tls_context()) as answer:
            return answer.status in (200, 204)

    def path_check(self, start, end, rate_bps):
        """PathCheck of the router's delay line, paced to rate_bps, over [start,
        end] (epoch seconds), from its journal."""
        journal = self.sh(
            "router",
            "journalctl -u longhaul-delay --since @%d --until @%d -o cat --no-pager"
            % (start - 5, end + 5),
        ).stdout
        return PathCheck(delay_line_samples(journal), start, end, rate_bps)

    def prometheus_alert_state(self, name):
        states = {
            alert["state"]
            for group in self.get_json(self.prometheus_url + "/api/v1/rules")["data"]["groups"]
            for rule in group["rules"]
            if rule.get("name") == name
            for alert in rule.get("alerts", [])
        }
        return states


MAIL_DIR = "/var/lib/lab-alert-mail/maildir/new"
HOOK_DIR = "/var/lib/lab-alert-webhook"
# Run on the monitor: every mail (subject and decoded text) and every webhook
# body the sinks hold, as one JSON object.
READ_SINKS = r"""
import email, email.policy, glob, json
mails = []
for path in sorted(glob.glob("%s/*")):
    with open(path, "rb") as f:
        mail = email.message_from_binary_file(f, policy=email.policy.default)
    mails.append({"subject": str(mail["Subject"]), "text": mail.get_body(("plain",)).get_content()})
hooks = []
for path in sorted(glob.glob("%s/*.json")):
    with open(path) as f:
        hooks.append(json.load(f))
print(json.dumps({"mails": mails, "hooks": hooks}))
""" % (MAIL_DIR, HOOK_DIR)


def sinks(lab):
    """What the lab's alert sinks on the monitor hold (role lab_alert_sink):
    {"mails": [{"subject", "text"}], "hooks": [webhook bodies]}."""
    done = subprocess.run(
        ["docker", "exec", lab.container("monitor"), "python3", "-c", READ_SINKS],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


# The controller's secrets site.yml keeps for the lab (roles/longhaul_pki).
SECRETS = INVENTORY / ".longhaul-secrets"


def admin():
    """(user, password) of the admin credential site.yml generated."""
    return ("admin", (SECRETS / "credentials" / "admin").read_text().strip())


def tls_context():
    """Trusts the lab's CA only (none before site.yml made it: plain HTTP then)."""
    ca = SECRETS / "ca.crt"
    return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else None


def basic_auth(user, password):
    """The Authorization header value of HTTP basic authentication."""
    return "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()


def wait_until(check, timeout, what, interval=2):
    """Poll check() until it returns something truthy; fail naming `what`."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError, AssertionError) as error:  # not up yet
            last = error
        time.sleep(interval)
    raise AssertionError("timed out after %ds waiting for %s (last: %r)" % (timeout, what, last))
