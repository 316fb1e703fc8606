"""The template variables the dashboards share (data sources, job, instance,
session, campaign, protocol, controller, device, router, interface)."""

from lib.sdk import INFLUX, PROM, dashboard_builder, model
from lib.promql import (
    CAMPAIGN,
    SNMP_IF_TAG,
    SNMP_MEASUREMENT,
    SNMP_ROUTER_TAG,
    TWINS,
    sel,
)


def datasource_var(kind):
    label = "Prometheus data source" if kind == "prometheus" else "Influxdb data source"
    return (
        dashboard_builder.DatasourceVariable("%s_datasource" % kind)
        .label(label)
        .type(kind)
        .regex("")
    )


def query_var(name, label, datasource, query, all_value=None):
    variable = (
        dashboard_builder.QueryVariable(name)
        .label(label)
        .datasource(datasource)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .regex("")
    )
    if all_value is not None:
        variable.all_value(all_value)
    return variable


def prom_var(name, label, query):
    return query_var(name, label, PROM, query, all_value=".+")


def influx_var(name, label, query, twin):
    """An InfluxQL variable, and `twin`: the label_values() of the same values
    in Prometheus, the Perses rendering's (perses.py)."""
    TWINS[(query, None)] = {"expr": twin, "legend": ""}
    return query_var(name, label, INFLUX, query)


JOB = prom_var("job", "Job", "label_values(up, job)")
INSTANCE = prom_var("instance", "Instance", 'label_values(up{job=~"$job"}, instance)')


def session_var(*extra):
    """The sessions of longhaul_session_info (filtered by `extra` matchers)."""
    return prom_var(
        "session", "Session", "label_values(%s, session)" % sel("longhaul_session_info", *extra)
    )


SESSION_VAR = session_var(CAMPAIGN)


def campaign_var(hosts=True):
    """The campaigns of longhaul_session_info (a run's `--campaign`, which
    ansible/campaign.yml sets to the campaign's name), of the selected hosts
    where the dashboard has job and instance variables. "All" also matches
    sessions that name no campaign."""
    series = sel("longhaul_session_info") if hosts else "longhaul_session_info"
    return query_var(
        "campaign", "Campaign", PROM, "label_values(%s, campaign)" % series, all_value=".*"
    )


CAMPAIGN_VAR = campaign_var()
# The protocol a session speaks: longhaul, or iperf3 (an iperf3 client's test
# against `longhaul serve --iperf3-listen`). "All" also matches sessions of
# exporters older than the protocol label.
PROTOCOL_VAR = query_var(
    "protocol",
    "Protocol",
    PROM,
    "label_values(%s, protocol)" % sel("longhaul_session_info"),
    all_value=".*",
)
# Controllers of the raid collector and of the engine's per-device IO: the engine
# labels a device that has no controller (tmpfs, loop, ram) "virtual", which no
# RAID controller series lists; selecting controllers must not hide those devices.
CONTROLLER_VAR = prom_var(
    "controller",
    "Controller",
    "label_values(%s, controller)"
    % sel("", '__name__=~"longhaul_controller_info|longhaul_device_io_bytes_total"'),
)
DEVICE_VAR = prom_var(
    "device", "Device", "label_values(%s, device)" % sel("node_disk_io_time_seconds_total")
)
ROUTER_VAR = influx_var(
    "router",
    "Router",
    'SHOW TAG VALUES FROM "%s" WITH KEY = "%s"' % (SNMP_MEASUREMENT, SNMP_ROUTER_TAG),
    "label_values(%s_ifHCInOctets, %s)" % (SNMP_MEASUREMENT, SNMP_ROUTER_TAG),
)
INTERFACE_VAR = influx_var(
    "interface",
    "Interface",
    'SHOW TAG VALUES FROM "%s" WITH KEY = "%s" WHERE "%s" =~ /^$router$/'
    % (SNMP_MEASUREMENT, SNMP_IF_TAG, SNMP_ROUTER_TAG),
    'label_values(%s_ifHCInOctets{%s=~"$router"}, %s)'
    % (SNMP_MEASUREMENT, SNMP_ROUTER_TAG, SNMP_IF_TAG),
)
