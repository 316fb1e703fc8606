"""Many sites in the lab: each transfer host is a site (`site` a and b in the
inventory), the monitoring host's Prometheus labels their targets so and
remote-writes everything to the central Prometheus on the `central` host (the
prometheus role with prometheus_remote_write_receiver), which thus holds the
global view: longhaul_session_bytes_total of both sites. It runs only the
central rules (rules/central): the sites of the inventory are expected there,
and LonghaulSiteNotSeen stays quiet while both send; it sends to the
monitor's Alertmanager.
"""

import pytest
from labkit import wait_until

# A short transfer each way, so both sites' engines report a session.
SECONDS = 4


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


def test_the_central_prometheus_receives_remote_writes(provisioned):
    lab = provisioned
    flags = lab.get_json(lab.central_url + "/api/v1/status/flags")["data"]
    assert flags["web.enable-remote-write-receiver"] == "true"
    targets = lab.get_json(lab.central_url + "/api/v1/targets")["data"]["activeTargets"]
    assert {t["labels"]["job"] for t in targets} == {"prometheus"}, "it scrapes only itself"


def test_the_central_prometheus_holds_both_sites_sessions(both_ways):
    lab = both_ways
    expr = "count by (site, instance) (last_over_time(longhaul_session_bytes_total[10m]))"
    found = wait_until(
        lambda: {
            (s["metric"].get("site"), s["metric"].get("instance"))
            for s in lab.promql(expr, url=lab.central_url)
        }
        >= {("a", "xfer-a"), ("b", "xfer-b")}
        and lab.promql(expr, url=lab.central_url),
        120,
        "longhaul_session_bytes_total of sites a and b in the central Prometheus",
    )
    print("central Prometheus, sessions by site: %s" % [s["metric"] for s in found])


def test_the_central_prometheus_expects_both_sites_and_sees_them(provisioned):
    lab = provisioned
    expected = {s["metric"]["site"] for s in lab.promql("longhaul:expected:site", url=lab.central_url)}
    assert expected == {"a", "b"}, expected
    rules = {
        rule["name"]: rule
        for group in lab.get_json(lab.central_url + "/api/v1/rules")["data"]["groups"]
        for rule in group["rules"]
    }
    assert set(rules) == {"longhaul:expected:site", "LonghaulSiteNotSeen"}, set(rules)
    assert rules["LonghaulSiteNotSeen"]["health"] == "ok", rules["LonghaulSiteNotSeen"]
    # Both sites' data arrives: its condition holds for neither.
    seen = {s["metric"]["site"] for s in lab.promql('group by (site) (up{site!=""})', url=lab.central_url)}
    assert seen >= {"a", "b"}, seen
    assert rules["LonghaulSiteNotSeen"]["alerts"] == [], rules["LonghaulSiteNotSeen"]
    alertmanagers = wait_until(
        lambda: lab.get_json(lab.central_url + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"],
        60,
        "the monitor's Alertmanager among the central Prometheus's",
    )
    assert [a["url"] for a in alertmanagers] == ["https://%s:9093/api/v2/alerts" % lab.monitor], alertmanagers
