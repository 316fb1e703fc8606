"""The dashboards in the lab, during a campaign: every target of every panel
of every dashboard returns data from the lab's real Prometheus and InfluxDB,
and every dashboard's annotation queries return each run of the campaign and
its sessions, all run as Grafana runs them (tests/dashboard_queries.py,
from Grafana's documentation: Grafana itself is AGPL, and nothing of ours
builds or runs it). The grafana role provisioned the monitor as it would
for the vendor's Grafana; its data sources are checked against the lab's
servers the way Grafana's health checks reach them.

Generic over the dashboards: whatever dashboards dashboards/ holds, whatever
panels, targets, variables and annotation queries they have. Variables are
resolved against the lab with every value they find selected (not "All" =
.+, which would hide a panel whose series carry values its variable does not
list).
"""

import json
import subprocess
import time
import urllib.parse

import pytest
import yaml
from dashboard_queries import Dashboard, empty_targets, load_dashboards
from labkit import INFLUX_MIN_S, REPO, SCRAPE_S, Lab, admin, epoch, wait_until
from live_view import LiveView, describe, each_dashboard, not_all_data, not_recovered

CAMPAIGN = "disk-2-controllers"
# The live memory transfer the panels are queried during (a run of a campaign
# of its own); it must outlast the queries.
LIVE_CAMPAIGN, LIVE_RUN = "lab-live", "a-to-b-live"
LIVE_SECONDS = 600
LIVE_STREAMS = 8
# Seconds of an idle path the module leaves behind (test_lab.py's router check
# integrates 15 s before its run, over several 5 s SNMP polls).
QUIET_AFTER_S = 25
# Grafana samples annotation queries every `step` (30 s) on step-aligned instants.
ANNOTATION_STEP_S = 30


@pytest.fixture(scope="module")
def transfers(provisioned, tmp_path_factory):
    """A disk campaign (the engine's per-device panels, the annotations), then a
    long memory transfer that still runs while the tests query; yields (time
    range start, the campaign's PlaybookRun, its results directory, the live sender)."""
    lab = provisioned
    started = time.time()
    results = tmp_path_factory.mktemp("results")
    run, directory = lab.campaign(CAMPAIGN, results)
    sender = lab.start_long_transfer(
        LIVE_SECONDS, LIVE_STREAMS, campaign=LIVE_CAMPAIGN, run=LIVE_RUN
    )
    try:
        # The live run itself in Prometheus: its session listed with its
        # campaign and run, and moving. (A rate over every session of xfer-b
        # was still above zero from the disk campaign's last seconds: on a
        # loaded machine the live run could then be listed for the first time
        # after the annotation query's last step, and CI failed on it.)
        live = 'longhaul_session_info{instance="xfer-b", campaign="%s", run="%s"}' % (
            LIVE_CAMPAIGN,
            LIVE_RUN,
        )
        wait_until(
            lambda: lab.promql(
                'sum(rate(longhaul_session_bytes_total{instance="xfer-b", direction="receive"}'
                "[20s]) and on (session) %s) > 0" % live
            ),
            90,
            "the live transfer in Prometheus",
        )
        # Live for a while, so rates over $__rate_interval exist and an
        # annotation step (aligned to the step, as Grafana asks) holds it.
        time.sleep(ANNOTATION_STEP_S + 2 * SCRAPE_S)
        yield started, run, directory, sender
    finally:
        lab.stop_long_transfer(sender)
        # The next module's router checks integrate the seconds before their own runs:
        # leave the path idle for longer than that, once the last stream has closed.
        wait_until(
            lambda: lab.sh(
                "xfer-b", "ss -Htn state established '( sport = :7400 )' | wc -l"
            ).stdout.strip()
            == "0",
            60,
            "the live transfer's connections to close",
        )
        time.sleep(QUIET_AFTER_S)


def dashboards(lab, started, **options):
    return [
        Dashboard(
            board, lab, started, time.time(), SCRAPE_S, INFLUX_MIN_S, every_value=True, **options
        )
        for board in load_dashboards().values()
    ]


def campaign_runs(directory):
    """{run name: (start, end)} of the campaign's runs, from their .run.json."""
    runs = yaml.safe_load((REPO / "campaigns" / ("%s.yml" % CAMPAIGN)).read_text())["campaign_runs"]
    found = {}
    for spec in runs:
        meta = json.loads((directory / ("%s.run.json" % spec["name"])).read_text())
        found[spec["name"]] = (epoch(meta["start"]), epoch(meta["end"]))
    return found


def test_the_campaign_ran(transfers):
    _, run, directory, _ = transfers
    assert run.rc == 0, "campaign %s failed:\n%s" % (CAMPAIGN, run.tail())
    assert campaign_runs(directory)


def test_every_panel_returns_data_during_a_campaign(provisioned, transfers):
    lab = provisioned
    started, _, _, sender = transfers
    views = dashboards(lab, started)
    empty, queried = [], {}
    for view in views:
        for _, _, source_type, _ in view.targets():
            queried[source_type] = queried.get(source_type, 0) + 1
        empty += empty_targets(view)
    assert sender.poll() is None, "the live transfer ended before the queries did: %s" % (
        sender.stderr.read()
    )
    print("%d dashboards, targets queried: %s" % (len(views), queried))
    assert {"prometheus", "influxdb"} <= set(queried), queried
    assert not empty, "panels without data:\n  " + "\n  ".join(empty)


def test_every_dashboard_annotates_each_run_and_its_sessions(provisioned, transfers):
    """Each dashboard's "Campaign runs" annotation query draws every run of
    the campaign (ansible/campaign.yml named them: --campaign, --run), from
    about its start (a step and two scrapes later at most) to its end (the
    engine lists a session a minute after it ended), and the live run; its "Sessions" query returns the sessions;
    selecting another campaign shows none of the runs."""
    lab = provisioned
    started, run, directory, _ = transfers
    assert run.rc == 0, "campaign %s failed:\n%s" % (CAMPAIGN, run.tail())
    runs = campaign_runs(directory)
    last_end = max(end for _, end in runs.values())
    # The range reaches a step past the last run, so a sample falls on it.
    time.sleep(max(0, last_end + ANNOTATION_STEP_S - time.time()))
    for view in dashboards(lab, started):
        regions = view.annotations("Campaign runs")
        ours = {}
        for region in regions:
            ours.setdefault((region["labels"]["campaign"], region["labels"]["run"]), []).append(
                region
            )
        assert (LIVE_CAMPAIGN, LIVE_RUN) in ours, (view.title, sorted(ours))
        for name, (start, end) in runs.items():
            found = ours.get((CAMPAIGN, name))
            assert found, "%s: no annotation of run %s in %s" % (view.title, name, sorted(ours))
            (region,) = found
            print(
                "%s: run %s annotated %+.0f s from its start, %+.0f s from its end"
                % (view.title, name, region["start"] - start, region["end"] - end)
            )
            # Listed from the session's handshake, scraped within a scrape interval,
            # sampled at the next step-aligned instant.
            late = ANNOTATION_STEP_S + 2 * SCRAPE_S
            assert start - ANNOTATION_STEP_S <= region["start"] <= start + late, region
            assert end - ANNOTATION_STEP_S <= region["end"] <= end + 60 + ANNOTATION_STEP_S
            assert region["title"] == "%s: run %s" % (CAMPAIGN, name), region
        if "Sessions" in view.annotation_queries():
            assert view.annotations("Sessions"), "%s: no session annotated" % view.title
    for view in dashboards(lab, started, chosen={"campaign": "no-such-campaign"}, allow_empty=True):
        assert view.annotations("Campaign runs") == [], view.title


def test_the_provisioned_datasources_reach_the_lab_s_servers(provisioned):
    """The grafana role (grafana_install auto: no Grafana here) provisioned the
    monitor as for the vendor's Grafana. Its data sources file names the
    uids the dashboards' data source variables default to, and from the
    monitor its URLs answer as Grafana's health checks ask them: Prometheus
    a query over TLS, with the CA text, server name and admin user the file
    holds (Grafana itself cannot run here: its handling of those fields is
    taken from its documentation), InfluxDB a query of the routers database
    with the provisioned reader's password."""
    lab = provisioned
    text = lab.sh("monitor", "cat /etc/grafana/provisioning/datasources/longhaul.yml").stdout
    sources = {d["uid"]: d for d in yaml.safe_load(text)["datasources"]}
    assert set(sources) == {"prometheus", "central", "influxdb-routers"}, sources.keys()
    # As Grafana asks: only the CA of tlsCACert (tlsAuthWithCACert) is trusted, the
    # certificate must hold jsonData.serverName when set, basic auth when basicAuth is
    # set. The request (passwords, CA) goes by stdin, never on a command line.
    check = (
        "import base64, http.client, json, socket, ssl, sys, urllib.parse\n"
        "source = json.load(sys.stdin)\n"
        "url = urllib.parse.urlsplit(source['url'])\n"
        "headers = {}\n"
        "if source.get('user'):\n"
        "    pair = '%s:%s' % (source['user'], source['password'])\n"
        "    headers['Authorization'] = 'Basic ' + base64.b64encode(pair.encode()).decode()\n"
        "if url.scheme == 'https':\n"
        "    context = ssl.create_default_context(cadata=source['ca'])\n"
        "    sock = socket.create_connection((url.hostname, url.port), timeout=10)\n"
        "    sock = context.wrap_socket(sock, server_hostname=source.get('server_name') or url.hostname)\n"
        "    connection = http.client.HTTPSConnection(url.hostname, url.port, timeout=10)\n"
        "    connection.sock = sock\n"
        "else:\n"
        "    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)\n"
        "connection.request('GET', url.path + ('?' + url.query if url.query else ''), headers=headers)\n"
        "answer = connection.getresponse()\n"
        "assert answer.status == 200, (answer.status, answer.read()[:300])\n"
        "print(answer.read().decode())\n"
    )

    def ask(source):
        done = subprocess.run(
            ["docker", "exec", "-i", lab.container("monitor"), "python3", "-c", check],
            input=json.dumps(source),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, "the data source's request failed: %s" % done.stderr[-2000:]
        return done.stdout

    prometheus = sources["prometheus"]
    # site.yml's TLS: Prometheus on the monitor, checked for its inventory name, with the
    # CA's text and the admin user (roles/longhaul_pki)
    assert prometheus["url"].startswith("https://127.0.0.1:"), prometheus["url"]
    assert prometheus["jsonData"]["tlsAuthWithCACert"] is True, prometheus["jsonData"]
    assert prometheus["jsonData"]["serverName"] == "monitor", prometheus["jsonData"]
    assert prometheus["basicAuth"] is True and prometheus["basicAuthUser"] == "admin", prometheus
    secure = prometheus["secureJsonData"]
    source = {
        "url": prometheus["url"] + "/api/v1/query?query=up",
        "user": "admin",
        "password": secure["basicAuthPassword"],
        "ca": secure["tlsCACert"],
        "server_name": prometheus["jsonData"]["serverName"],
    }
    out = ask(source)
    assert json.loads(out)["data"]["result"], out
    # ... and without the name check the request would prove less: another name fails.
    wrong = subprocess.run(
        ["docker", "exec", "-i", lab.container("monitor"), "python3", "-c", check],
        input=json.dumps({**source, "server_name": "not-the-monitor"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in wrong.stderr, wrong.stderr[-1000:]
    # The central store (a second Prometheus-API source, the first replica of the
    # central store, checked for its inventory name, read as admin): the sites' data.
    central = sources["central"]
    assert central["type"] == "prometheus" and central["isDefault"] is False, central
    assert central["url"] == lab.central_url, central["url"]
    assert central["jsonData"]["serverName"] == "central", central["jsonData"]
    out = ask(
        {
            "url": central["url"] + "/api/v1/query?" + urllib.parse.urlencode({"query": 'up{site!=""}'}),
            "user": central["basicAuthUser"],
            "password": central["secureJsonData"]["basicAuthPassword"],
            "ca": central["secureJsonData"]["tlsCACert"],
            "server_name": central["jsonData"]["serverName"],
        }
    )
    assert {r["metric"]["site"] for r in json.loads(out)["data"]["result"]} >= {"a", "b"}, out
    influx = sources["influxdb-routers"]
    # InfluxDB over https on the monitor's lab address, with the CA's text
    assert influx["url"].startswith("https://"), influx["url"]
    assert influx["jsonData"]["tlsAuthWithCACert"] is True, influx["jsonData"]
    query = urllib.parse.urlencode({"db": influx["jsonData"]["dbName"], "q": "SHOW MEASUREMENTS"})
    out = ask(
        {
            "url": "%s/query?%s" % (influx["url"], query),
            "user": influx["user"],
            "password": influx["secureJsonData"]["password"],
            "ca": influx["secureJsonData"]["tlsCACert"],
        }
    )
    assert "interface" in out, out
    # The dashboards' data source variables find these by type, the site's Prometheus
    # first (the default); the role's uids are the ones its README names.
    assert prometheus["isDefault"] is True and prometheus["type"] == "prometheus", prometheus
    assert influx["type"] == "influxdb", influx


# --- the live view in Chromium ------------------------------------------------------

LIVE_VIEW_PORT = 8443
# Screenshots of each dashboard during the campaign, and with Prometheus stopped.
SHOTS = REPO / "results" / "live-view"
# The first load of a dashboard on the lab's loaded machine: every panel drawn.
DRAWN_S = 90


def test_the_live_view_draws_every_panel_during_a_campaign(provisioned, transfers):
    """The live view (roles/live_view on the monitor) in headless Chromium during
    the live memory run: the page over TLS with the lab's CA for the admin login;
    on every dashboard it lists, every panel draws data (no error, no "No data";
    the firing-alerts table may say "No data": no alert fires); the per-stream
    panel shows the live run's streams, the router panels both interfaces of the
    lab router. A screenshot of each dashboard is kept in results/live-view/."""
    lab = provisioned
    base = "https://%s:%d" % (lab.monitor, LIVE_VIEW_PORT)
    # TLS as the lab's CA says (the browser is told to skip it: checked here).
    index = Lab.get_json(base + "/dashboards/index.json", auth=admin())
    assert [entry["name"] for entry in index][0] == "transfer-overview", index
    assert len(index) == len(list((REPO / "dashboards" / "perses").glob("*.json")))
    SHOTS.mkdir(parents=True, exist_ok=True)
    failures = []
    with LiveView(base, *admin()) as view:
        for entry, _ in each_dashboard(view, index, failures, SHOTS, timeout_s=DRAWN_S):
            if entry["name"] == "transfer-overview":
                # "session/stream": the live run's streams and the disk campaign's
                streams = view.panel_until("Per-stream throughput", lambda p: p["legendCount"] >= LIVE_STREAMS)
                assert streams["legendCount"] >= LIVE_STREAMS, streams
            if entry["name"] == "router-traffic":
                traffic = view.panel_until("Traffic per interface", lambda p: len(interfaces_of(p["legend"])) >= 2)
                assert len(interfaces_of(traffic["legend"])) >= 2, traffic["legend"]
    assert not failures, "panels not drawn with data:\n" + "\n".join(failures)


def test_the_live_view_s_central_pages_show_both_sites_and_outlive_the_first_replica(provisioned, transfers):
    """The live view's central pages (/central/d/NAME) on the monitor during the
    campaign, read from the central store (the replicas in turn, each checked for
    its inventory name, with the viewer's login): /live-view.json lists two
    replicas; every panel of every dashboard draws data, every query goes to
    /central/api/, and the store answers for both sites. The first replica's
    VictoriaMetrics stopped (its nginx answers 502): the API answers the same and
    the transfer overview draws every panel again, from the second replica."""
    lab = provisioned
    base = "https://%s:%d" % (lab.monitor, LIVE_VIEW_PORT)
    assert Lab.get_json(base + "/live-view.json", auth=admin()) == {"central": True, "central_replicas": 2}
    SHOTS.mkdir(parents=True, exist_ok=True)
    sites_expr = {"query": 'group by (site) (up{site!=""})'}

    def central_sites():
        answer = Lab.get_json(base + "/central/api/v1/query", params=sites_expr, auth=admin())
        return {s["metric"]["site"] for s in answer["data"]["result"]}

    assert central_sites() >= {"a", "b"}
    index = Lab.get_json(base + "/dashboards/index.json", auth=admin())
    failures = []
    with LiveView(base, *admin()) as view:
        for entry, _ in each_dashboard(view, index, failures, SHOTS, pages="/central", timeout_s=DRAWN_S):
            asked = view.queries()
            elsewhere = sorted({q["path"] for q in asked if not q["path"].startswith("/central/api/v1/")})
            assert asked and not elsewhere, (entry["name"], elsewhere, len(asked))
            if entry["name"] == "transfer-overview":
                streams = view.panel_until("Per-stream throughput", lambda p: p["legendCount"] >= LIVE_STREAMS)
                assert streams["legendCount"] >= LIVE_STREAMS, streams
        assert not failures, "central panels not drawn with data:\n" + "\n".join(failures)

        lab.sh("central", "systemctl stop victoria-metrics")
        try:
            assert central_sites() >= {"a", "b"}
            view.open("/central/d/transfer-overview?refresh=5s")
            during = view.settle_with_data(DRAWN_S)
            view.screenshot(SHOTS / "central-transfer-overview-first-replica-stopped.png")
            failure = not_all_data("transfer-overview", during)
            # refreshes go on answering (5 s each): still every panel with data
            time.sleep(12)
            later = view.settle_with_data(DRAWN_S)
        finally:
            lab.sh("central", "systemctl start victoria-metrics")
        assert failure is None, "with the first replica stopped: " + failure
        assert not_all_data("transfer-overview", later) is None, describe(later)
    wait_until(lambda: lab.promql("vm_app_version", url=lab.central_urls[0]), 60, "the first replica back")
    # what the monitor kept for it written, before the next test reads it
    wait_until(
        lambda: (lambda lags: len(lags) == 2 and all(float(s["value"][1]) < 15 for s in lags))(
            lab.promql("longhaul:remote_write_lag:seconds")
        ),
        180,
        "the monitor's queues to both replicas current",
    )


def interfaces_of(legend):
    """The interfaces a router-traffic legend lists ("router ifname in|out")."""
    return {entry.split()[1] for entry in legend if len(entry.split()) >= 2}


def test_the_live_view_says_prometheus_is_away_and_recovers(provisioned, transfers):
    """Prometheus stopped under an open transfer overview: every panel shows an
    error a person can read and the page stays up; Prometheus back: the panels
    fill again without a reload."""
    lab = provisioned
    base = "https://%s:%d" % (lab.monitor, LIVE_VIEW_PORT)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with LiveView(base, *admin()) as view:
        view.open("/d/transfer-overview?refresh=5s")
        before = view.settle_with_data(DRAWN_S)
        assert before["held"], describe(before)
        lab.sh("monitor", "systemctl stop prometheus")
        try:
            down = view.settle("error", 90)
            view.screenshot(SHOTS / "transfer-overview-prometheus-stopped.png")
        finally:
            lab.sh("monitor", "systemctl start prometheus")
        assert down["title"] == "longhaul / Transfer overview", down["title"]
        assert down["held"], "not every panel says Prometheus is away:\n" + describe(down)
        unreadable = [p["title"] for p in down["panels"] if "Prometheus does not answer the live view" not in p["text"]]
        assert not unreadable, describe(down)
        back = view.settle_recovered(before, 120)
        view.screenshot(SHOTS / "transfer-overview-prometheus-back.png")
        problem = not_recovered(before, back)
        assert problem is None, problem
