"""A local monitoring stack on loopback, for checking dashboards and rules
against live data without Grafana.

Each `start_*` method starts one real component with a temporary directory
and free ports: the longhaul engine (`longhaul serve`) and longhaul-exporter,
node_exporter, snmpd (IF-MIB of this host, an SNMPv3 authPriv user), InfluxDB
1.x, Telegraf polling snmpd into InfluxDB with the configuration the telegraf
role writes (rendered from the role by lab/compose/render.yml, nothing written
here by hand), and Prometheus with the repository's rules scraping the
exporters every second. Query helpers run PromQL and InfluxQL against it.
"""

import json
import os
import subprocess
import time
import urllib.error
from pathlib import Path

import yaml

import helpers

# Scrape, rule and Telegraf poll period of the stack. One second keeps the
# test short; $__rate_interval is four of these, as Grafana computes it.
SCRAPE_S = 1
RATE_INTERVAL = "%ds" % (4 * SCRAPE_S)
# The host name every Prometheus job's `instance` is relabelled to, as the
# prometheus role does with inventory names.
HOST = "testhost"
# The host's site and the WAN link its traffic takes, as the prometheus role
# attaches the inventory's `site` and `link` (rules/longhaul-links.yml).
SITE = "site-a"
LINK = "site-a--site-b"
HOST_LABEL_JOBS = ("longhaul", "node")
ROUTER = "test-router"
# The router's SNMPv3 user, as an inventory would give it (authPriv, SHA/AES).
SNMP_V3 = {
    "snmp_version": 3,
    "snmp_v3_user": "longhaul-test",
    "snmp_v3_auth_password": "stack-auth-secret",
    "snmp_v3_priv_password": "stack-priv-secret",
}
INFLUX_DB = "routers"
# Telegraf's SNMP table as the telegraf role writes it.
SNMP_MEASUREMENT = "interface"
SNMP_INTERFACES = ["lo", "eth0"]

RENDER = helpers.REPO / "lab" / "compose" / "render.yml"
CACHE = Path(os.environ.get("LONGHAUL_CACHE") or "/var/cache/longhaul")
VENV_BIN = CACHE / "venv" / "bin"
PROMETHEUS = "/usr/bin/prometheus"
VICTORIA_METRICS = "/usr/bin/victoria-metrics"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
INFLUXD = "/usr/bin/influxd"
SNMPD = "/usr/sbin/snmpd"
TELEGRAF = (
    os.environ.get("LONGHAUL_TELEGRAF", "/usr/local/bin/telegraf"),
    str(CACHE / "go" / "bin" / "telegraf"),
    "telegraf",
)


def require(path, what):
    found = helpers.find_binary(*([path] if isinstance(path, str) else path))
    if not found:
        raise AssertionError("%s not found (%s): run scripts/setup / make build" % (what, path))
    return found


class Stack:
    def __init__(self, processes, workdir):
        self.processes = processes
        self.workdir = Path(workdir)
        self.targets = {}  # Prometheus job -> "127.0.0.1:port"
        self.prometheus_url = None
        self.influx_url = None
        self.engine_port = None
        self.stats_port = None
        self.other_tool_port = None
        self.snmp_port = None
        self.snmp_host = None

    def _dir(self, name):
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # --- components -----------------------------------------------------------

    def start_engine(self, dist):
        binary = require(str(Path(dist) / "longhaul"), "longhaul")
        self.engine_port = helpers.free_port()
        self.stats_port = helpers.free_port()
        process = self.processes.start(
            "longhaul-serve",
            [
                binary,
                "serve",
                "--listen",
                "%s:%d" % (helpers.LOOPBACK, self.engine_port),
                "--stats-listen",
                "%s:%d" % (helpers.LOOPBACK, self.stats_port),
                "--root",
                self._dir("receiver-root"),
            ],
        )
        self.processes.wait_port(process, self.engine_port)
        self.processes.wait_port(process, self.stats_port)
        return binary

    def start_exporter(self, dist, *extra):
        binary = require(str(Path(dist) / "longhaul-exporter"), "longhaul-exporter")
        port = helpers.free_port()
        process = self.processes.start(
            "longhaul-exporter",
            [
                binary,
                "--web.listen-address",
                "%s:%d" % (helpers.LOOPBACK, port),
                "--engine.url",
                "http://%s:%d" % (helpers.LOOPBACK, self.stats_port),
                "--collector.tcp.ports",
                ",".join(str(p) for p in (self.engine_port, self.other_tool_port) if p),
                *extra,
            ],
        )
        self.processes.wait_port(process, port)
        self.targets["longhaul"] = "%s:%d" % (helpers.LOOPBACK, port)

    def start_other_tool(self):
        """An iperf3 server: another tool's TCP flows, which the exporter's tcp
        collector reports (longhaul's own it leaves to the engine collector).
        Start it before the exporter, which then watches its port too."""
        iperf3 = require("/usr/bin/iperf3", "iperf3")
        self.other_tool_port = helpers.free_port()
        process = self.processes.start(
            "iperf3-server",
            [iperf3, "-s", "-B", helpers.LOOPBACK, "-p", str(self.other_tool_port)],
        )
        self.processes.wait_port(process, self.other_tool_port)

    def run_other_tool(self, seconds):
        """An iperf3 transfer of `seconds` at a modest rate; returns the Popen."""
        return subprocess.Popen(
            [
                require("/usr/bin/iperf3", "iperf3"),
                "-c",
                helpers.LOOPBACK,
                "-p",
                str(self.other_tool_port),
                "-t",
                str(seconds),
                "-b",
                "200M",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start_node_exporter(self):
        port = helpers.free_port()
        process = self.processes.start(
            "node-exporter",
            [
                require(NODE_EXPORTER, "node_exporter"),
                "--web.listen-address=%s:%d" % (helpers.LOOPBACK, port),
                "--collector.disable-defaults",
                "--collector.cpu",
                "--collector.diskstats",
                # the host NIC panels (the role enables netdev too)
                "--collector.netdev",
            ],
        )
        self.processes.wait_port(process, port)
        self.targets["node"] = "%s:%d" % (helpers.LOOPBACK, port)

    def start_victoriametrics(self):
        """VictoriaMetrics (Debian's victoria-metrics, single node) with the flags the
        victoriametrics role gives it, bar the latency offset (a scrape interval of
        this stack's instead of 30 s); start_prometheus(remote_write=...) feeds it.
        Returns its URL."""
        port = helpers.free_port()
        data = self._dir("victoriametrics")
        process = self.processes.start(
            "victoria-metrics",
            [
                require(VICTORIA_METRICS, "victoria-metrics"),
                "-storageDataPath=%s" % data,
                "-retentionPeriod=1d",
                "-httpListenAddr=%s:%d" % (helpers.LOOPBACK, port),
                "-dedup.minScrapeInterval=1ms",
                "-search.latencyOffset=%ds" % SCRAPE_S,
            ],
        )
        self.processes.wait_port(process, port)
        url = "http://%s:%d" % (helpers.LOOPBACK, port)
        helpers.wait_until(lambda: helpers.http_get(url + "/health"), 30, "VictoriaMetrics ready")
        return url

    def start_prometheus(self, rules_dir, remote_write=()):
        """Prometheus scraping every target, with the rules of `rules_dir`, writing
        each sample on to every Prometheus remote-write URL of `remote_write`."""
        port = helpers.free_port()
        data = self._dir("prometheus")
        scrape_configs = [
            {
                "job_name": job,
                "static_configs": [{"targets": [target]}],
                "relabel_configs": [{"target_label": "instance", "replacement": HOST}]
                + (
                    [
                        {"target_label": "site", "replacement": SITE},
                        {"target_label": "link", "replacement": LINK},
                    ]
                    if job in HOST_LABEL_JOBS
                    else []
                ),
            }
            for job, target in sorted(self.targets.items())
        ]
        config = {
            "global": {
                "scrape_interval": "%ds" % SCRAPE_S,
                "scrape_timeout": "%ds" % SCRAPE_S,
                "evaluation_interval": "%ds" % SCRAPE_S,
            },
            "rule_files": [str(Path(rules_dir).resolve() / "*.yml")],
            "scrape_configs": scrape_configs,
            "remote_write": [
                {"url": url, "queue_config": {"batch_send_deadline": "%ds" % SCRAPE_S}} for url in remote_write
            ],
        }
        config_path = data / "prometheus.yml"
        # JSON is YAML: no YAML library needed.
        config_path.write_text(json.dumps(config, indent=2))
        process = self.processes.start(
            "prometheus",
            [
                require(PROMETHEUS, "prometheus"),
                "--config.file=%s" % config_path,
                "--storage.tsdb.path=%s" % (data / "tsdb"),
                "--web.listen-address=%s:%d" % (helpers.LOOPBACK, port),
                "--storage.tsdb.retention.time=1d",
            ],
        )
        self.processes.wait_port(process, port)
        self.prometheus_url = "http://%s:%d" % (helpers.LOOPBACK, port)
        helpers.wait_until(
            lambda: helpers.http_get(self.prometheus_url + "/-/ready"), 30, "Prometheus ready"
        )

    def start_snmpd(self, address=helpers.LOOPBACK):
        """snmpd answering IF-MIB for this host's interfaces on a UDP port of
        `address` (an IPv6 one works too), to an SNMPv3 authPriv user."""
        self.snmp_port = helpers.free_udp_port()
        self.snmp_host = address
        listen = "udp6:[%s]" % address if ":" in address else "udp:%s" % address
        conf = self._dir("snmpd") / "snmpd.conf"
        conf.write_text(
            'agentAddress %s:%d\ncreateUser %s SHA "%s" AES "%s"\nrouser -s usm %s priv\n'
            % (
                listen,
                self.snmp_port,
                SNMP_V3["snmp_v3_user"],
                SNMP_V3["snmp_v3_auth_password"],
                SNMP_V3["snmp_v3_priv_password"],
                SNMP_V3["snmp_v3_user"],
            )
        )
        process = self.processes.start(
            "snmpd",
            [
                require(SNMPD, "snmpd"),
                "-f",
                "-Lo",
                "-C",
                "-c",
                conf,
                "-p",
                conf.with_suffix(".pid"),
            ],
            # Own state directory; no MIB files to load (we use numeric OIDs).
            env={"SNMP_PERSISTENT_DIR": str(self._dir("snmpd/state")), "MIBS": ""},
        )
        # UDP: no port to wait for; Telegraf retries, and the test waits for data.
        time.sleep(0.5)
        self.processes.check_running(process)

    def start_influxdb(self):
        http_port = helpers.free_port()
        rpc_port = helpers.free_port()
        data = self._dir("influxdb")
        conf = data / "influxdb.conf"
        conf.write_text(
            "\n".join(
                [
                    "reporting-disabled = true",
                    'bind-address = "%s:%d"' % (helpers.LOOPBACK, rpc_port),
                    "[meta]",
                    '  dir = "%s"' % (data / "meta"),
                    "  logging-enabled = false",
                    "[data]",
                    '  dir = "%s"' % (data / "data"),
                    '  wal-dir = "%s"' % (data / "wal"),
                    "  query-log-enabled = false",
                    "[monitor]",
                    "  store-enabled = false",
                    "[http]",
                    '  bind-address = "%s:%d"' % (helpers.LOOPBACK, http_port),
                    "  log-enabled = false",
                    "[subscriber]",
                    "  enabled = false",
                    "[continuous_queries]",
                    "  enabled = false",
                    "",
                ]
            )
        )
        process = self.processes.start(
            "influxd", [require(INFLUXD, "influxd"), "run", "-config", conf]
        )
        self.processes.wait_port(process, http_port)
        self.influx_url = "http://%s:%d" % (helpers.LOOPBACK, http_port)
        helpers.wait_until(
            lambda: helpers.http_post(
                self.influx_url + "/query", {"q": "CREATE DATABASE " + INFLUX_DB}
            ),
            30,
            "InfluxDB database " + INFLUX_DB,
        )

    def render_telegraf_config(self, binary, prometheus_listen=None):
        """telegraf.conf as the telegraf role writes it for this stack's router:
        lab/compose/render.yml (the role's template, and its deploy-time walk that
        resolves snmp_interfaces to ifIndex values) with an inventory of one router
        and this stack's addresses and 1 s poll as extra variables."""
        out = self._dir("telegraf")
        inventory = out / "inventory.yml"
        router = dict(SNMP_V3, snmp_host=self.snmp_host, snmp_port=self.snmp_port)
        router["snmp_interfaces"] = SNMP_INTERFACES
        inventory.write_text(
            yaml.safe_dump({"all": {"children": {"routers": {"hosts": {ROUTER: router}}}}})
        )
        extra = {
            "compose_output": str(out / "rendered"),
            "telegraf_binary_src": binary,
            "telegraf_interval": "%ds" % SCRAPE_S,
            "telegraf_flush_interval": "%ds" % SCRAPE_S,
            "telegraf_snmp_timeout": "2s",
            "telegraf_snmp_retries": 1,
            "telegraf_influxdb_urls": [self.influx_url or "http://%s:8086" % helpers.LOOPBACK],
            "telegraf_influxdb_username": "",
            "telegraf_input_cpu": False,
            "telegraf_prometheus_client": prometheus_listen is not None,
            "telegraf_prometheus_client_listen": prometheus_listen or ":9273",
        }
        env = dict(os.environ, ANSIBLE_CONFIG=str(helpers.REPO / "ansible" / "ansible.cfg"))
        # rendered for loopback, where the test runs it, whatever the shell exported
        for name in ("LONGHAUL_PUBLISH_ADDRESS", "LONGHAUL_PUBLISH_NAMES", "LONGHAUL_COMPOSE_GENERATED"):
            env.pop(name, None)
        env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
        done = subprocess.run(
            ["ansible-playbook", "-i", str(inventory), str(RENDER), "--tags", "telegraf"]
            + ["-e", json.dumps(extra)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, "render.yml failed:\n%s%s" % (done.stdout[-3000:], done.stderr)
        return out / "rendered" / "telegraf" / "telegraf.conf"

    def start_telegraf(self):
        """Telegraf polling snmpd every second into InfluxDB, configured by the
        telegraf role's template (measurement, tags, fields, SNMPv3)."""
        binary = require(TELEGRAF, "telegraf")
        outputs = subprocess.run(
            [binary, "plugins", "outputs"], capture_output=True, text=True, timeout=30
        ).stdout.split()
        # What RouterCountersStale watches: the same SNMP data and Telegraf's
        # own write statistics, scraped as job "telegraf". scripts/setup
        # builds Telegraf with it; a build without it is a broken setup.
        assert "outputs.prometheus_client" in outputs, (
            "%s has no outputs.prometheus_client (RouterCountersStale needs it): "
            "rebuild it with scripts/setup" % binary
        )
        port = helpers.free_port()
        self.targets["telegraf"] = "%s:%d" % (helpers.LOOPBACK, port)
        conf = self.render_telegraf_config(binary, "%s:%d" % (helpers.LOOPBACK, port))
        process = self.processes.start("telegraf", [binary, "--config", conf])
        self.processes.wait_port(process, port)

    # --- queries ---------------------------------------------------------------

    @staticmethod
    def _query(url, params):
        """GET a JSON answer; a rejected query fails with the server's reason."""
        try:
            return helpers.get_json(url, params)
        except urllib.error.HTTPError as error:
            raise AssertionError(
                "%s rejected %s: %s" % (url, params, error.read().decode(errors="replace"))
            ) from None

    def promql(self, expr, at=None):
        """Instant query; returns the result list, raises on a query error."""
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        answer = self._query(self.prometheus_url + "/api/v1/query", params)
        if answer.get("status") != "success":
            raise AssertionError("PromQL error for %s: %s" % (expr, answer))
        return answer["data"]["result"]

    def prom_range(self, expr, start, end, step=SCRAPE_S):
        """Range query as Grafana runs it for a time series panel."""
        params = {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": step}
        answer = self._query(self.prometheus_url + "/api/v1/query_range", params)
        if answer.get("status") != "success":
            raise AssertionError("PromQL error for %s: %s" % (expr, answer))
        return answer["data"]["result"]

    def prom_label_values(self, label, match, start, end):
        """The values of `label` over [start, end], of the series `match` selects (or all)."""
        params = {"start": "%.0f" % start, "end": "%.0f" % end}
        if match:
            params["match[]"] = match
        return self._query("%s/api/v1/label/%s/values" % (self.prometheus_url, label), params)[
            "data"
        ]

    def influxql(self, query):
        """Query the routers database; returns the list of series, raises on error."""
        params = {"db": INFLUX_DB, "q": query, "epoch": "s"}
        answer = self._query(self.influx_url + "/query", params)
        result = answer["results"][0]
        if "error" in result:
            raise AssertionError("InfluxQL error for %s: %s" % (query, result["error"]))
        return result.get("series", [])
