"""The selectors every dashboard shares: uids, the metric
selectors by job and instance with $__rate_interval, the recorded series and
the alerts' threshold series (rules/), and the InfluxQL twins' register (TWINS)."""

TAG = "longhaul"
# (InfluxQL query text, alias; None for a variable) -> its PromQL twin {"expr", "legend"}
# (influx_target, influx_var): one query is drawn under several aliases.
TWINS = {}

# Telegraf's SNMP table (roles/telegraf): measurement, tags and fields.
SNMP_MEASUREMENT = "interface"
SNMP_ROUTER_TAG = "router"
SNMP_IF_TAG = "ifName"

UIDS = {
    "transfer": "longhaul-transfer-overview",
    "router": "longhaul-router-traffic",
    "disk": "longhaul-disk-io",
    "cpu": "longhaul-cpu",
    "campaign": "longhaul-campaign",
    "links": "longhaul-links",
}


# The alerts this project ships (rules/longhaul-alerts.yml): shown as
# annotations while they fire.
ALERT_NAMES = "Longhaul.+|RouterCountersStale"

# CPU modes the CPU views show (MonALISA's view plus irq).
CPU_MODES = "user|system|softirq|iowait|irq"

# Host interfaces the NIC panels leave out: loopback, and the virtual ends of
# containers and bridges (their traffic is counted again on the real NIC).
VIRTUAL_NICS = 'device!~"lo|veth.*|docker.*|br-.*|virbr.*"'

# IF-MIB ifOperStatus values (RFC 2863) as the oper status panel shows them.
OPER_STATUS = {
    1: ("up", "green"),
    2: ("down", "red"),
    3: ("testing", "blue"),
    4: ("unknown", "purple"),
    5: ("dormant", "yellow"),
    6: ("notPresent", "orange"),
    7: ("lowerLayerDown", "red"),
}


def sel(metric, *extra):
    """A selector filtered by the dashboard's job and instance variables."""
    matchers = ['job=~"$job"', 'instance=~"$instance"', *extra]
    return "%s{%s}" % (metric, ", ".join(matchers))


def rate(metric, *extra):
    return "rate(%s[$__rate_interval])" % sel(metric, *extra)


def max_over(metric, *extra):
    """A gauge's highest value over the rate interval, filtered as `sel`."""
    return "max_over_time(%s[$__rate_interval])" % sel(metric, *extra)


def recorded(series, *extra):
    """A recording rule's series: no `job` label (the rules aggregate it
    away), so only instance and the extra matchers filter it."""
    return "%s{%s}" % (series, ", ".join(['instance=~"$instance"', *extra]))


def threshold(name):
    """An alert threshold as a series, the value the alerts use."""
    return "longhaul:threshold:%s" % name


SESSION = 'session=~"$session"'
PROTOCOL = 'protocol=~"$protocol"'
CAMPAIGN = 'campaign=~"$campaign"'
# The end of a stream whose TCP state explains its throughput: the sending
# socket (the engine lists both ends of each stream).
SENDER = 'direction="send"'
RECEIVER = 'direction="receive"'


def of_protocol(vector):
    """`vector` (series with instance and session labels) kept for the
    sessions whose protocol (longhaul, or iperf3 for iperf3 clients' tests)
    and campaign the protocol and campaign variables select. Over the rate
    interval, so a session's last rates stay while its info series is
    already gone."""
    return "(%s and on (instance, session) %s)" % (
        vector,
        max_over("longhaul_session_info", SESSION, PROTOCOL, CAMPAIGN),
    )


CONTROLLER = 'controller=~"$controller"'
DEVICE = 'device=~"$device"'
