"""A local monitoring stack on loopback, for checking dashboards and rules
against live data without Grafana.

Each `start_*` method starts one real component with a temporary directory
and free ports: the longhaul engine (`longhaul serve`) and longhaul-exporter,
node_exporter, snmpd (IF-MIB of this host), InfluxDB 1.x, Telegraf polling
snmpd into InfluxDB, and Prometheus with the repository's rules scraping the
exporters every second. Query helpers run PromQL and InfluxQL against it.
"""

import json
import os
import subprocess
import time
import urllib.error
from pathlib import Path

import helpers

# Scrape, rule and Telegraf poll period of the stack. One second keeps the
# test short; $__rate_interval is four of these, as Grafana computes it.
SCRAPE_S = 1
RATE_INTERVAL = "%ds" % (4 * SCRAPE_S)
# The host name every Prometheus job's `instance` is relabelled to, as the
# prometheus role does with inventory names.
HOST = "testhost"
ROUTER = "test-router"
SNMP_COMMUNITY = "longhaul-test"
INFLUX_DB = "routers"
# Telegraf's SNMP table as the telegraf role writes it.
SNMP_MEASUREMENT = "interface"
SNMP_INTERFACES = ["lo", "eth0"]

PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
INFLUXD = "/usr/bin/influxd"
SNMPD = "/usr/sbin/snmpd"
TELEGRAF = (
    os.environ.get("LONGHAUL_TELEGRAF", "/usr/local/bin/telegraf"),
    "/var/cache/longhaul/go/bin/telegraf",
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
        self.snmp_port = None

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

    def start_exporter(self, dist):
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
                str(self.engine_port),
            ],
        )
        self.processes.wait_port(process, port)
        self.targets["longhaul"] = "%s:%d" % (helpers.LOOPBACK, port)

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

    def start_prometheus(self, rules_dir):
        port = helpers.free_port()
        data = self._dir("prometheus")
        scrape_configs = [
            {
                "job_name": job,
                "static_configs": [{"targets": [target]}],
                "relabel_configs": [{"target_label": "instance", "replacement": HOST}],
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

    def start_snmpd(self):
        """snmpd answering IF-MIB for this host's interfaces on a UDP port."""
        self.snmp_port = helpers.free_udp_port()
        conf = self._dir("snmpd") / "snmpd.conf"
        conf.write_text(
            "agentAddress udp:%s:%d\nrocommunity %s %s\n"
            % (helpers.LOOPBACK, self.snmp_port, SNMP_COMMUNITY, helpers.LOOPBACK)
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

    def start_telegraf(self):
        """Telegraf polling snmpd every second into InfluxDB, configured like
        roles/telegraf (measurement, tags and fields)."""
        fields = "".join(
            '\n    [[inputs.snmp.table.field]]\n      name = "%s"\n      oid = "%s"%s\n'
            % (name, oid, "\n      is_tag = true" if name == "ifName" else "")
            for name, oid in [
                ("ifName", ".1.3.6.1.2.1.31.1.1.1.1"),
                ("ifHCInOctets", ".1.3.6.1.2.1.31.1.1.1.6"),
                ("ifHCOutOctets", ".1.3.6.1.2.1.31.1.1.1.10"),
                ("ifHighSpeed", ".1.3.6.1.2.1.31.1.1.1.15"),
            ]
        )
        conf = self._dir("telegraf") / "telegraf.conf"
        conf.write_text(
            """[agent]
  interval = "{interval}s"
  round_interval = false
  flush_interval = "{interval}s"
  snmp_translator = "gosmi"

[[inputs.snmp]]
  agents = ["udp://{host}:{port}"]
  version = 2
  community = "{community}"
  timeout = "2s"
  retries = 1
  agent_host_tag = "source"
  path = []

  [inputs.snmp.tags]
    router = "{router}"

  [inputs.snmp.tagpass]
    ifName = {interfaces}

  [[inputs.snmp.field]]
    name = "sysName"
    oid = ".1.3.6.1.2.1.1.5.0"
    is_tag = true

  [[inputs.snmp.table]]
    name = "{measurement}"
    inherit_tags = ["sysName"]
{fields}
[[outputs.influxdb]]
  urls = ["{influx}"]
  database = "{db}"
  timeout = "5s"
""".format(
                interval=SCRAPE_S,
                host=helpers.LOOPBACK,
                port=self.snmp_port,
                community=SNMP_COMMUNITY,
                router=ROUTER,
                interfaces=json.dumps(SNMP_INTERFACES),
                measurement=SNMP_MEASUREMENT,
                fields=fields,
                influx=self.influx_url,
                db=INFLUX_DB,
            )
        )
        binary = require(TELEGRAF, "telegraf")
        outputs = subprocess.run(
            [binary, "plugins", "outputs"], capture_output=True, text=True, timeout=30
        ).stdout.split()
        port = None
        if "outputs.prometheus_client" in outputs:
            # What RouterCountersStale watches: the same SNMP data and
            # Telegraf's own write statistics, scraped as job "telegraf".
            port = helpers.free_port()
            with conf.open("a") as text:
                text.write(
                    "\n[[inputs.internal]]\n\n[[outputs.prometheus_client]]\n"
                    '  listen = "%s:%d"\n  metric_version = 2\n' % (helpers.LOOPBACK, port)
                )
            self.targets["telegraf"] = "%s:%d" % (helpers.LOOPBACK, port)
        process = self.processes.start("telegraf", [binary, "--config", conf])
        if port:
            self.processes.wait_port(process, port)
        else:
            time.sleep(0.5)
            self.processes.check_running(process)

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

    def influxql(self, query):
        """Query the routers database; returns the list of series, raises on error."""
        params = {"db": INFLUX_DB, "q": query, "epoch": "s"}
        answer = self._query(self.influx_url + "/query", params)
        result = answer["results"][0]
        if "error" in result:
            raise AssertionError("InfluxQL error for %s: %s" % (query, result["error"]))
        return result.get("series", [])
