"""Many sites in the lab: each transfer host is a site (`site` a and b in the
inventory), the monitoring host's Prometheus labels their targets so and
remote-writes everything to each replica of the central store (roles/victoriametrics
on the `central` and `central2` hosts: VictoriaMetrics behind nginx), one queue per
replica, so that each holds the global view: longhaul_session_bytes_total of both
sites. vmalert on each replica runs only the central rules (rules/central): the sites
of the inventory are expected there, and LonghaulSiteNotSeen stays quiet while both
send; it sends to the monitor's Alertmanager.

Losing nothing (issue 45): a replica stopped for 3 minutes during a transfer gets
what it missed from the monitor's WAL once it is back, so both replicas then hold
exactly the samples the monitor's Prometheus holds for the transfer's series, and
the site-silent alert fired for neither site (its other replica saw both);
LonghaulCentralReplicaBehind fired at the monitor meanwhile. The monitor cut off
from both replicas for 3 minutes (an ip rule drops its packets to their port):
LonghaulCentralWriteBehind fires at the monitor, LonghaulSiteNotSeen for both sites
reaches the monitor's Alertmanager from the replicas (so vmalert's way to it, TLS
and login, works), and once the way is back the central view has no hole: again the
exact samples of the monitor.
"""

import calendar
import json
import math
import subprocess
import time

import pytest
from labkit import HTTP_TIMEOUT_S, sinks, wait_until

# A short transfer each way, so both sites' engines report a session.
SECONDS = 4
# How long a replica is stopped, and the monitor cut off (the 3 minutes).
OUTAGE_S = 180
# The series compared sample by sample between the monitor and the replicas: every
# series of the longhaul exporters (the transfer's streams and sessions among them)
# and every target's up.
COMPARED = '{job="longhaul"} or up'
CENTRAL_PORT = 8427


@pytest.fixture(scope="module")
def both_ways(provisioned):
    lab = provisioned
    for sender, receiver in (("xfer-a", "xfer-b"), ("xfer-b", "xfer-a")):
        lab.sh(
            sender,
            "/usr/local/bin/longhaul send --to %s:7400 --streams 2 --time %d "
            "--token-file /etc/longhaul/token --json >/dev/null" % (lab.address[receiver], SECONDS),
            timeout=120,
        )
    return lab


def write_urls(lab):
    return {url + "/api/v1/write" for url in lab.central_urls}


def queue_lags(lab):
    """url -> seconds the monitor's remote-write queue to it is behind."""
    return {s["metric"]["url"]: float(s["value"][1]) for s in lab.promql("longhaul:remote_write_lag:seconds")}


def caught_up(lab, within=15):
    lags = queue_lags(lab)
    return set(lags) == write_urls(lab) and all(lag < within for lag in lags.values()) and lags


def key(metric):
    return tuple(sorted((k, v) for k, v in metric.items()))


def monitor_samples(lab, start, end):
    """{series: [(ms, value)]} the monitor's Prometheus holds in (start, end]."""
    out = {}
    for expr in ('{job="longhaul"}', "up"):
        for series in lab.promql("%s[%ds]" % (expr, math.ceil(end - start)), at=end):
            samples = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
            samples = [(t, v) for t, v in samples if start * 1000 < t <= end * 1000 and not math.isnan(v)]
            if samples:
                out[key(series["metric"])] = samples
    return out


def replica_samples(lab, url, start, end):
    """The same series from a replica's export API (raw samples), cut to (start, end]."""
    out = {}
    for match in ('{job="longhaul"}', '{__name__="up"}'):
        params = {"match[]": match, "start": "%.3f" % (start - 1), "end": "%.3f" % (end + 1)}
        lines = lab.get_text(url + "/api/v1/export", params, timeout=6 * HTTP_TIMEOUT_S).splitlines()
        for line in lines:
            series = json.loads(line)
            out.setdefault(key(series["metric"]), []).extend(
                (t, float(v))
                for t, v in zip(series["timestamps"], series["values"])
                if start * 1000 < t <= end * 1000 and v is not None and not math.isnan(float(v))
            )
    return {k: sorted(set(v)) for k, v in out.items() if v}


def differences(site, central):
    """Series whose samples differ: {series: (timestamps missing centrally, timestamps
    only there, values that differ)}. Timestamps must match exactly; values to 1e-9
    (VictoriaMetrics stores floats in a decimal form: an engine's start time of 10
    significant digits comes back a few units of the 16th apart)."""
    found = {}
    for series in set(site) | set(central):
        here, there = dict(site.get(series, [])), dict(central.get(series, []))
        missing, extra = set(here) - set(there), set(there) - set(here)
        values = [t for t in set(here) & set(there) if not math.isclose(here[t], there[t], rel_tol=1e-9)]
        if missing or extra or values:
            found[series] = (len(missing), len(extra), len(values))
    return found


def assert_same_samples(lab, start, end, what):
    """Both replicas hold exactly the monitor's samples of COMPARED over (start, end]."""
    site = monitor_samples(lab, start, end)
    assert sum(len(v) for v in site.values()) > 0, "the monitor holds nothing over the window"
    counts = {"monitor": sum(len(v) for v in site.values())}
    for url in lab.central_urls:
        central = replica_samples(lab, url, start, end)
        counts[url] = sum(len(v) for v in central.values())
        differ = differences(site, central)
        assert not differ, "%s, %s: %d series differ (missing, extra, other values): %s" % (
            what,
            url,
            len(differ),
            sorted(differ.items())[:4],
        )
    print("%s: samples over %.0f s: %s" % (what, end - start, counts))
    return counts


def given_up(lab, start, end):
    """Samples the monitor's Prometheus gave up on over (start, end], per replica."""
    expr = (
        "increase(prometheus_remote_storage_samples_failed_total[%ds]) + increase(prometheus_remote_storage_samples_dropped_total[%ds])"
        % (
            math.ceil(end - start),
            math.ceil(end - start),
        )
    )
    return {
        s["metric"]["url"]: float(s["value"][1]) for s in lab.promql(expr, at=end) if float(s["value"][1]) > 0
    }


def no_sample_given_up(lab, start, end):
    """Asserts the monitor's Prometheus gave up on no sample over (start,
    end]; if it did, the failure carries its remote-write log lines and
    each replica's VictoriaMetrics and nginx lines of that time, to say why."""
    lost = given_up(lab, start, end)
    if not lost:
        return
    since = "@%d" % math.floor(start)
    why = [lab.sh("monitor", "journalctl -u prometheus --since %s --no-pager | grep -i remote | tail -20" % since, check=False).stdout]
    for host in ("central", "central2"):
        why.append(
            lab.sh(
                host,
                # VictoriaMetrics' log fields are tab-separated: its info lines left out
                "journalctl -u victoria-metrics --since %s --no-pager | grep -Eiv '[[:space:]]info[[:space:]]' | tail -10; "
                "grep -h ' 4[0-9][0-9] ' /var/log/nginx/*access*.log 2>/dev/null | tail -10" % since,
                check=False,
            ).stdout
        )
    raise AssertionError("samples given up, per replica: %s\n%s" % (lost, "\n".join(why)))


def docker(*args):
    subprocess.run(["docker", *args], check=True, capture_output=True, timeout=120)


def alert_firing(lab, name, url=None):
    return lab.promql('ALERTS{alertname="%s",alertstate="firing"}' % name, url=url)


def site_not_seen_deliveries(lab, since):
    """LonghaulSiteNotSeen alerts the monitor's Alertmanager delivered to the
    webhook sink that started after `since`: their sites."""
    found = set()
    for hook in sinks(lab)["hooks"]:
        for alert in hook.get("alerts", []):
            if alert["labels"].get("alertname") != "LonghaulSiteNotSeen":
                continue
            started = alert.get("startsAt", "")
            if (
                started
                and calendar.timegm(time.strptime(started[:19], "%Y-%m-%dT%H:%M:%S")) >= since
            ):
                found.add(alert["labels"].get("site"))
    return found


def test_the_central_store_is_two_replicas_that_both_take_the_monitors_writes(
    provisioned,
):
    lab = provisioned
    for url in lab.central_urls:
        # VictoriaMetrics' own metrics (it scrapes itself): the store is what it says.
        version = wait_until(
            lambda: lab.promql("vm_app_version", url=url),
            60,
            "VictoriaMetrics' own metrics at %s" % url,
        )
        print("%s: %s" % (url, version[0]["metric"].get("version")))
    # The monitor writes to each, on a queue of its own, and both are current.
    wait_until(lambda: caught_up(lab), 120, "the monitor's queues to both replicas current")


def test_each_replica_holds_both_sites_sessions(both_ways):
    lab = both_ways
    expr = "count by (site, instance) (last_over_time(longhaul_session_bytes_total[10m]))"
    for url in lab.central_urls:
        found = wait_until(
            lambda: {
                (s["metric"].get("site"), s["metric"].get("instance")) for s in lab.promql(expr, url=url)
            }
            >= {("a", "xfer-a"), ("b", "xfer-b")}
            and lab.promql(expr, url=url),
            120,
            "longhaul_session_bytes_total of sites a and b at %s" % url,
        )
        print("%s, sessions by site: %s" % (url, [s["metric"] for s in found]))


def test_each_replica_expects_both_sites_and_sees_them(provisioned):
    lab = provisioned
    for url in lab.central_urls:
        # vmalert records the inventory's sites into its replica...
        expected = wait_until(
            lambda: {s["metric"]["site"] for s in lab.promql("longhaul:expected:site", url=url)},
            60,
            "longhaul:expected:site at %s" % url,
        )
        assert expected == {"a", "b"}, (url, expected)
        # ... sees both sites' data ...
        seen = {s["metric"]["site"] for s in lab.promql('group by (site) (up{site!=""})', url=url)}
        assert seen >= {"a", "b"}, (url, seen)
        # ... and its alert is evaluated (its state series) and quiet.
        assert alert_firing(lab, "LonghaulSiteNotSeen", url=url) == [], url


def test_a_replica_stopped_for_3_minutes_loses_nothing(provisioned):
    lab = provisioned
    wait_until(lambda: caught_up(lab), 120, "both queues current before the outage")
    sender = lab.start_long_transfer(OUTAGE_S + 70, streams=4, campaign="central-replica", run="1")
    try:
        start = time.time()
        time.sleep(20)
        stopped = time.time()
        docker("stop", lab.container("central2"))
        behind = None
        while time.time() < stopped + OUTAGE_S:
            if behind is None and alert_firing(lab, "LonghaulCentralReplicaBehind"):
                behind = time.time() - stopped
            time.sleep(5)
        docker("start", lab.container("central2"))
        restarted = time.time()
        assert sender.wait(timeout=OUTAGE_S) == 0, sender.stderr.read()
        end = time.time()
    finally:
        docker("start", lab.container("central2"))
        if sender.poll() is None:
            lab.stop_long_transfer(sender)
    assert behind is not None, "LonghaulCentralReplicaBehind did not fire while central2 was stopped"
    print("LonghaulCentralReplicaBehind fired %.0f s after central2 stopped" % behind)
    wait_until(lambda: caught_up(lab), 180, "the monitor's queue to central2 caught up")
    print("caught up %.0f s after central2 started again" % (time.time() - restarted))
    time.sleep(10)  # the replicas' latency offset (5 s): the newest samples readable
    no_sample_given_up(lab, start, time.time())
    wait_until(
        lambda: assert_same_samples(lab, start, end, "central2 stopped %d s" % OUTAGE_S),
        60,
        "both replicas holding the monitor's samples",
        interval=10,
    )
    # The site-silent alert fired for neither site: at neither replica, nor delivered.
    for url in lab.central_urls:
        fired = lab.promql(
            'max_over_time(ALERTS{alertname="LonghaulSiteNotSeen",alertstate="firing"}[%ds])'
            % math.ceil(time.time() - start),
            url=url,
        )
        assert fired == [], (url, fired)
    assert site_not_seen_deliveries(lab, start) == set()


def test_a_site_cut_off_for_3_minutes_leaves_no_hole_and_says_so(provisioned):
    lab = provisioned
    wait_until(lambda: caught_up(lab), 120, "both queues current before the cut")
    centrals = [lab.address["central"], lab.address["central2"]]
    cut = "; ".join(
        "ip rule add to %s/32 ipproto 6 dport %d priority 100 blackhole" % (ip, CENTRAL_PORT)
        for ip in centrals
    )
    mend = "; ".join(
        "ip rule del to %s/32 ipproto 6 dport %d priority 100 blackhole" % (ip, CENTRAL_PORT)
        for ip in centrals
    )
    start = time.time()
    time.sleep(10)
    lab.sh("monitor", cut)
    cut_at = time.time()
    print("monitor cut off at %s" % time.strftime("%H:%M:%S", time.gmtime(cut_at)))
    write_behind = None
    not_seen = set()
    try:
        while time.time() < cut_at + OUTAGE_S:
            if write_behind is None and alert_firing(lab, "LonghaulCentralWriteBehind"):
                write_behind = time.time() - cut_at
            if not_seen < {"a", "b"}:
                not_seen = {a["labels"].get("site") for a in lab.alerts("LonghaulSiteNotSeen")}
            time.sleep(5)
    finally:
        lab.sh("monitor", mend, check=False)
    mended = time.time()
    print("monitor's way back at %s" % time.strftime("%H:%M:%S", time.gmtime(mended)))
    assert write_behind is not None, "LonghaulCentralWriteBehind did not fire while the monitor was cut off"
    print("LonghaulCentralWriteBehind fired %.0f s into the cut" % write_behind)
    # Both replicas' vmalert told the monitor's Alertmanager (TLS, login) of both sites.
    assert not_seen >= {"a", "b"}, not_seen
    wait_until(lambda: caught_up(lab), 180, "both queues caught up after the cut")
    print("caught up %.0f s after the cut ended" % (time.time() - mended))
    time.sleep(10)
    end = time.time()
    no_sample_given_up(lab, start, end)
    wait_until(
        lambda: assert_same_samples(lab, start, end, "monitor cut off %d s" % OUTAGE_S),
        60,
        "both replicas holding the monitor's samples after the cut",
        interval=10,
    )
    # The data is back: the central alert resolves (no later test inherits it).
    wait_until(
        lambda: not lab.alerts("LonghaulSiteNotSeen"),
        120,
        "LonghaulSiteNotSeen resolved after the cut",
    )
