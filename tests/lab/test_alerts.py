"""Alerts a user can rely on, end to end in the lab.

One scenario on the lab's one bring-up (conftest.py), about five minutes:

1. a steady transfer xfer-a -> xfer-b (paced below the bottleneck, so the
   router never drops a packet), which must produce no message at all;
2. a long transfer at full rate; after a minute the router's bottleneck
   falls to 40 %: LonghaulThroughputDrop must reach the lab's real SMTP
   server and webhook receiver (role lab_alert_sink on the monitor), naming
   the session, both hosts, the baseline and the current rate; while it
   fires, the dashboards' annotation queries must find it, and the sending
   side's per-stream series (reported by the client) must show the
   retransmits the router's drops cause;
3. the bottleneck comes back: a resolved message must arrive.

Beside it, alerts of a severity no notification takes, and of none (a site's
own rules may raise either), must reach the webhook receiver and the mail
server too, saying their severity.

The lab runs the alerts on short `for:` durations and Alertmanager on short
group timings (lab/inventory/group_vars/monitoring), with the default
threshold (70 % of the baseline).
"""

import datetime
import json
import re
import subprocess
import time
from types import SimpleNamespace

import pytest
from dashboard_queries import Dashboard
from labkit import INFLUX_MIN_S, REPO, SCRAPE_S, sinks, wait_until

STREAMS = 8
# The steady transfer: paced well below the lab's 200 Mb/s bottleneck.
STEADY_SECONDS = 75
STEADY_RATE_FRACTION = 0.6
# The long transfer that drops: it outlasts the whole scenario (stopped at its end).
LONG_SECONDS = 900
# Full rate for this long before the drop: the session's baseline.
BASELINE_S = 70
# The bottleneck falls to this fraction of its rate.
DROP_FRACTION = 0.4
# The lab's `for:` (20 s) + the 1m rate's lag (~30 s to cross 70 %) +
# evaluation and scrape intervals + Alertmanager's group_wait (5 s), with room
# for a busy 2-core machine.
FIRES_WITHIN_S = 180
# The 1m rate back above 70 % (~30 s) + Alertmanager's group_interval (30 s).
RESOLVES_WITHIN_S = 180


def annotation_step_s():
    """The `step` of the Transfer overview's Prometheus annotations, in seconds:
    Grafana samples them no finer."""
    board = json.loads((REPO / "dashboards" / "transfer-overview.json").read_text())
    (step,) = {a["step"] for a in board["annotations"]["list"] if a.get("step")}
    return int(step.rstrip("s"))


ENGINE_SESSIONS = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:7401/v1/sessions', timeout=5).read().decode())"
)

SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def bytes_per_second(text):
    """Prometheus' humanize output ("9.981MB/s") -> bytes/s."""
    match = re.fullmatch(r"([0-9.]+)([kMGT]?)B/s", text.strip())
    assert match, "not a humanized rate: %r" % text
    return float(match.group(1)) * SI[match.group(2)]


def hook_alerts(found, session, status):
    """(webhook body, alert) pairs of LonghaulThroughputDrop for the session."""
    return [
        (hook, alert)
        for hook in found["hooks"]
        for alert in hook["alerts"]
        if alert["labels"].get("alertname") == "LonghaulThroughputDrop"
        and alert["labels"].get("session") == session
        and alert["status"] == status
    ]


def drop_mails(found, session, status):
    marker = "%s: LonghaulThroughputDrop" % status.upper()
    return [m for m in found["mails"] if marker in m["text"] and session in m["text"]]


def engine_sessions(lab):
    return json.loads(lab.sh("xfer-b", 'python3 -c "%s"' % ENGINE_SESSIONS).stdout)["sessions"]


def annotation_results(lab, start, end):
    """Every Prometheus annotation query of the Transfer overview over [start,
    end], run as Grafana runs them (tests/dashboard_queries.py: its variables
    resolved against the lab's Prometheus, every value they find selected);
    name -> the regions it draws."""
    board = json.loads((REPO / "dashboards" / "transfer-overview.json").read_text())
    # Every variable at "All", as a dashboard opens: the campaign variable's
    # allValue (.*) keeps the sessions that name no campaign (this scenario's
    # two), which selecting each campaign found would drop; and a campaign
    # variable with no value at all (no run named one yet) is Grafana's normal.
    dashboard = Dashboard(board, lab, start, end, SCRAPE_S, INFLUX_MIN_S, allow_empty=True)
    return {
        name: dashboard.annotations(name)
        for name, annotation in dashboard.annotation_queries().items()
        if annotation["datasource"].get("type") == "prometheus"
    }


def drop_annotations(annotations, session):
    """The firing LonghaulThroughputDrop of `session` among the dashboard's
    "Longhaul alerts" annotations."""
    return [
        r
        for r in annotations.get("Longhaul alerts", [])
        if r["labels"].get("alertname") == "LonghaulThroughputDrop"
        and r["labels"].get("session") == session
    ]


@pytest.fixture(scope="module")
def scenario(provisioned):
    """Runs the steady transfer and the drop; returns what was seen when."""
    lab = provisioned
    seen = SimpleNamespace(errors=[], bottleneck_bps=lab.bottleneck_bps)
    router_if_b = lab.router_interface(lab.env["LAB_IP_ROUTER_B"])
    tbf = "tc qdisc change dev %s root tbf rate %dbit burst 512kb latency 50ms"

    # 1. The steady transfer.
    steady = lab.sh(
        "xfer-a",
        lab.send_command(STEADY_SECONDS, STREAMS, int(lab.bottleneck_bps * STEADY_RATE_FRACTION)),
        timeout=STEADY_SECONDS + 120,
    )
    report = json.loads(steady.stdout.strip().splitlines()[-1])
    seen.steady_session = report["session"]
    seen.steady_end = time.time()
    seen.steady_start = seen.steady_end - report["seconds"]
    print("steady session %s: %.1f Mb/s" % (seen.steady_session, report["throughput_bps"] / 1e6))

    # 2. The long transfer, its baseline, the drop.
    sender = lab.start_long_transfer(LONG_SECONDS, STREAMS)
    try:
        running = wait_until(
            lambda: [
                s["id"]
                for s in engine_sessions(lab)
                if s["state"] == "running" and s["id"] != seen.steady_session
            ],
            60,
            "the long transfer's session on xfer-b",
        )
        seen.session = running[0]
        wait_until(
            lambda: lab.promql(
                'longhaul:session_throughput_bytes:rate1m{session="%s"} > 0' % seen.session
            ),
            60,
            "the long transfer's 1m rate in Prometheus",
        )
        time.sleep(BASELINE_S)
        lab.sh("router", tbf % (router_if_b, lab.bottleneck_bps * DROP_FRACTION))
        seen.drop_at = time.time()
        try:
            wait_until(
                lambda: hook_alerts(sinks(lab), seen.session, "firing"),
                FIRES_WITHIN_S,
                "LonghaulThroughputDrop for the session at the webhook receiver",
                interval=3,
            )
            seen.fired_after = time.time() - seen.drop_at
            print("LonghaulThroughputDrop delivered %.0f s after the drop" % seen.fired_after)
            wait_until(
                lambda: drop_mails(sinks(lab), seen.session, "firing"),
                60,
                "LonghaulThroughputDrop for the session at the SMTP server",
                interval=3,
            )
        except AssertionError as error:
            seen.errors.append(str(error))
        seen.firing = sinks(lab)

        # While it fires: the dashboards' annotations and the sending side.
        # Grafana samples the annotations every `step` on step-aligned instants,
        # so an alert that fired a few seconds ago may have no sample yet: ask
        # again until it shows, for up to two steps (it fires until the restore).
        seen.annotations, seen.annotation_error = {}, None

        def drop_annotated():
            seen.annotations = annotation_results(lab, seen.steady_start - 30, time.time())
            return drop_annotations(seen.annotations, seen.session)

        try:
            wait_until(
                drop_annotated,
                2 * annotation_step_s() + 15,
                "the drop in the dashboards' alert annotations",
                interval=5,
            )
        except AssertionError as error:
            # test_annotation_queries_find_the_alert_and_the_sessions says what it saw
            seen.annotation_error = str(error)
        seen.sending_side = {
            name: lab.promql(
                '%s{instance="xfer-b", session="%s", direction="send"}' % (name, seen.session)
            )
            for name in (
                "longhaul_stream_retransmits_total",
                "longhaul_stream_cwnd_bytes",
                "longhaul_stream_segments_sent_total",
            )
        }

        # 3. The bottleneck comes back.
        lab.sh("router", tbf % (router_if_b, lab.bottleneck_bps))
        seen.restored_at = time.time()
        try:
            wait_until(
                lambda: hook_alerts(sinks(lab), seen.session, "resolved")
                and drop_mails(sinks(lab), seen.session, "resolved"),
                RESOLVES_WITHIN_S,
                "the resolved LonghaulThroughputDrop at both sinks",
                interval=3,
            )
            print("resolved %.0f s after the restore" % (time.time() - seen.restored_at))
        except AssertionError as error:
            seen.errors.append(str(error))
        seen.high_retransmits = lab.promql(
            'max_over_time(ALERTS{alertname="LonghaulHighRetransmits", alertstate="firing", '
            'session="%s"}[%ds])'
            % (seen.session, int(time.time() - seen.drop_at) + BASELINE_S + 60)
        )
        seen.sender_alive = sender.poll() is None
    finally:
        lab.sh("router", tbf % (router_if_b, lab.bottleneck_bps), check=False)
        lab.stop_long_transfer(sender)
    seen.final = sinks(lab)
    return seen


def test_a_drop_reaches_the_mail_server_and_the_webhook_receiver(scenario):
    assert not scenario.errors, scenario.errors
    assert scenario.sender_alive, "the long transfer ended before the end of the scenario"
    (hook, alert), *_ = hook_alerts(scenario.firing, scenario.session, "firing")
    notes = alert["annotations"]
    assert alert["labels"]["instance"] == "xfer-b", alert
    assert alert["labels"]["peer_host"] == "xfer-a", alert
    assert (notes["sender"], notes["receiver"]) == ("xfer-a", "xfer-b"), notes
    assert hook["groupLabels"] == {"session": scenario.session}, hook
    baseline = bytes_per_second(notes["baseline_rate"])
    current = bytes_per_second(notes["current_rate"])
    print("webhook: %s; baseline %s, current %s" % (notes["summary"], baseline, current))
    # The session got most of the bottleneck before the drop.
    assert 0.5 < baseline * 8 / scenario.bottleneck_bps < 1.05, notes
    assert current < 0.7 * baseline, notes
    assert notes["dashboard"].startswith("http://"), notes

    mail = drop_mails(scenario.firing, scenario.session, "firing")[0]
    print("mail: %s" % mail["subject"])
    for line in (
        "Session:   %s" % scenario.session,
        "Sender:    xfer-a",
        "Receiver:  xfer-b",
        "Baseline:  %s" % notes["baseline_rate"].strip(),
        "Dashboard: http://",
    ):
        assert line in mail["text"], mail
    assert re.search(r"^Current:   [0-9.]+[kMG]?B/s$", mail["text"], re.MULTILINE), mail


def test_the_drop_fires_within_the_alert_time(scenario):
    assert not scenario.errors, scenario.errors
    assert scenario.fired_after <= FIRES_WITHIN_S


def test_restoring_the_rate_resolves_it(scenario):
    assert not scenario.errors, scenario.errors
    resolved = hook_alerts(scenario.final, scenario.session, "resolved")
    assert resolved, "no resolved webhook message for %s" % scenario.session
    assert resolved[0][1]["annotations"]["receiver"] == "xfer-b"
    assert drop_mails(scenario.final, scenario.session, "resolved")


def test_the_steady_transfer_produced_no_message(scenario):
    about_steady = [
        hook for hook in scenario.final["hooks"] if scenario.steady_session in json.dumps(hook)
    ] + [mail for mail in scenario.final["mails"] if scenario.steady_session in mail["text"]]
    assert not about_steady, about_steady


def test_annotation_queries_find_the_alert_and_the_sessions(scenario):
    """The dashboard's Prometheus annotations, run as Grafana runs them: the
    firing drop of the session, and each session as a region from its start
    to its end."""
    alerts = scenario.annotations.get("Longhaul alerts")
    drop = drop_annotations(scenario.annotations, scenario.session)
    assert drop, "the alert annotation does not show the firing drop: %s (%s)" % (
        alerts,
        scenario.annotation_error,
    )
    sessions = {}
    for region in scenario.annotations["Sessions"]:
        sessions.setdefault(region["labels"]["session"], []).append(region)
    assert {scenario.steady_session, scenario.session} <= set(sessions), sessions.keys()
    step = annotation_step_s()
    ((start, end),) = [(r["start"], r["end"]) for r in sessions[scenario.steady_session]]
    print(
        "steady session region %.0f..%.0f, transfer %.0f..%.0f"
        % (start, end, scenario.steady_start, scenario.steady_end)
    )
    # Listed from its handshake until a minute after its end (the engine's
    # retention), sampled at the annotation's step.
    assert abs(start - scenario.steady_start) <= step + 15
    assert scenario.steady_end - step <= end <= scenario.steady_end + 75 + step


def test_sending_side_series_show_the_drops_retransmits(scenario):
    series = scenario.sending_side
    for name, found in series.items():
        assert len(found) == STREAMS, "%s: %s" % (name, found)
    retransmits = sum(float(s["value"][1]) for s in series["longhaul_stream_retransmits_total"])
    print("sending side: %d retransmits on %d streams" % (retransmits, STREAMS))
    assert retransmits > 0
    assert all(float(s["value"][1]) > 0 for s in series["longhaul_stream_cwnd_bytes"])


def test_high_retransmits_fires_when_the_bottleneck_drops_packets(scenario):
    assert scenario.high_retransmits, (
        "LonghaulHighRetransmits never fired for %s" % scenario.session
    )


# Alerts of a site's own rules, posted to the lab's Alertmanager as Prometheus
# posts them: a severity no notification takes, and none at all.
UNROUTED_ALERTS = {
    "SiteDiskAlmostFull": {"severity": "info", "scope": "host", "instance": "xfer-a"},
    "SiteWatchdog": {},
}
# Alertmanager's group_wait (5 s in the lab) and a delivery, on a busy machine.
UNROUTED_DELIVERED_WITHIN_S = 120


def post_alerts(lab, alerts):
    # as the admin user, over TLS (labkit.get_json); a refusal raises
    lab.get_json(lab.alertmanager_url + "/api/v2/alerts", data=alerts, method="POST")


def unrouted_alerts(probe, starts_at, ends_at):
    """The alerts of UNROUTED_ALERTS as Prometheus posts them; posted again
    with the same start and an end of now, they resolve (Alertmanager refuses
    an end before the start with 400)."""
    return [
        {
            "labels": {"alertname": name, "probe": probe, **labels},
            "annotations": {"summary": "%s of a site's own rule" % name},
            "startsAt": starts_at.isoformat(),
            "endsAt": ends_at.isoformat(),
        }
        for name, labels in UNROUTED_ALERTS.items()
    ]


def test_alerts_of_another_severity_or_none_reach_the_webhook_and_the_mail_server(provisioned):
    """They used to go to the root route's receiver, which has no integration:
    nobody heard of them. Now they reach the lab's default notifications (all
    of them), and the mail says their severity."""
    lab = provisioned
    probe = "unrouted-%d" % time.time_ns()
    started = datetime.datetime.now(datetime.timezone.utc)
    post_alerts(lab, unrouted_alerts(probe, started, started + datetime.timedelta(minutes=10)))
    try:
        def delivered():
            found = sinks(lab)
            hooks = {
                alert["labels"]["alertname"]: alert
                for hook in found["hooks"]
                for alert in hook["alerts"]
                if alert["labels"].get("probe") == probe and alert["status"] == "firing"
            }
            mails = [m["text"] for m in found["mails"] if probe in m["text"]]
            return (hooks, mails) if set(hooks) == set(UNROUTED_ALERTS) and len(mails) == 2 else None

        hooks, mails = wait_until(
            delivered,
            UNROUTED_DELIVERED_WITHIN_S,
            "alerts of severity info and of none at the webhook receiver and the mail server",
            interval=3,
        )
    finally:
        ended = datetime.datetime.now(datetime.timezone.utc)
        post_alerts(lab, unrouted_alerts(probe, started, ended))
    assert hooks["SiteDiskAlmostFull"]["labels"]["severity"] == "info", hooks
    assert "severity" not in hooks["SiteWatchdog"]["labels"], hooks
    text = "\n".join(mails)
    assert "FIRING: SiteDiskAlmostFull (info)" in text, text
    assert "FIRING: SiteWatchdog (no severity)" in text, text
