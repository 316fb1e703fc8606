"""Panels more than one dashboard draws: throughput, router traffic from
Telegraf's SNMP data, host NICs, other tools' flows, CPU modes, disk bytes."""

from lib.promql import (
    CPU_MODES,
    DEVICE,
    RECEIVER,
    SESSION,
    SNMP_IF_TAG,
    SNMP_MEASUREMENT,
    SNMP_ROUTER_TAG,
    VIRTUAL_NICS,
    of_protocol,
    rate,
    sel,
)
from lib.panels import influx_target, prom_target, timeseries


def total_throughput():
    return timeseries(
        "Total throughput",
        "Payload bits per second of all selected longhaul sessions, by direction as seen by "
        "each engine (send on the sender, receive on the receiver). Comparable with the "
        "engine's reported throughput_bps.",
        "bps",
        [
            prom_target(
                "8 * sum by (direction) (%s)"
                % of_protocol(rate("longhaul_session_bytes_total", SESSION)),
                "{{direction}}",
            )
        ],
    )


def stream_throughput():
    return timeseries(
        "Per-stream throughput",
        "Payload bits per second each data stream delivers (its receiving end); streams beyond "
        'the exporter\'s label cap are summed into stream="other".',
        "bps",
        [
            prom_target(
                "8 * sum by (instance, session, stream) (%s)"
                % of_protocol(rate("longhaul_stream_bytes_total", SESSION, RECEIVER)),
                "{{session}}/{{stream}}",
            )
        ],
    )


def snmp_series(field):
    """Telegraf's SNMP field as Prometheus has it (its prometheus_client
    output: measurement_field), filtered by the router and interface variables."""
    return '%s_%s{%s=~"$router", %s=~"$interface"}' % (
        SNMP_MEASUREMENT,
        field,
        SNMP_ROUTER_TAG,
        SNMP_IF_TAG,
    )


def snmp_last(field):
    """A gauge per router interface; max over the Telegrafs that poll it."""
    return "max by (%s, %s) (%s)" % (SNMP_ROUTER_TAG, SNMP_IF_TAG, snmp_series(field))


def snmp_rate(field):
    """A counter's per-second rate per router interface."""
    return "max by (%s, %s) (rate(%s[$__rate_interval]))" % (
        SNMP_ROUTER_TAG,
        SNMP_IF_TAG,
        snmp_series(field),
    )


def router_query(field, router_total=False, factor=" * 8", name="bps"):
    """Per-second rate of an SNMP counter per interface (or per router): by
    default bits/s of an octet counter; factor="" and a name for packet
    counters (errors, discards). (InfluxQL, its PromQL twin)."""
    twin = snmp_rate(field)
    if router_total:
        twin = "sum by (%s) (%s)" % (SNMP_ROUTER_TAG, twin)
    if factor:
        twin = "8 * %s" % twin
    inner = (
        'SELECT non_negative_derivative(mean("{f}"), 1s){x} AS "{n}" FROM "{m}" '
        'WHERE "{r}" =~ /^$router$/ AND "{i}" =~ /^$interface$/ AND $timeFilter '
        'GROUP BY time($__interval), "{r}", "{i}" fill(none)'
    ).format(f=field, x=factor, n=name, m=SNMP_MEASUREMENT, r=SNMP_ROUTER_TAG, i=SNMP_IF_TAG)
    if not router_total:
        return inner, twin
    return (
        'SELECT sum("{n}") AS "{n}" FROM ({inner}) WHERE $timeFilter '
        'GROUP BY time($__interval), "{r}" fill(none)'
    ).format(inner=inner, n=name, r=SNMP_ROUTER_TAG), twin


def router_packets_panel(title, description, in_field, out_field):
    """Packets per second of two 32-bit ifTable counters (in and out) per interface."""
    return timeseries(
        title,
        description,
        "pps",
        [
            influx_target(
                router_query(in_field, factor="", name="pps"), "$tag_router $tag_ifName in", "A"
            ),
            influx_target(
                router_query(out_field, factor="", name="pps"), "$tag_router $tag_ifName out", "B"
            ),
        ],
    )


def host_nic_panel(title, description):
    """Bits per second in and out of each host NIC (node_exporter's netdev)."""
    return timeseries(
        title,
        description,
        "bps",
        [
            prom_target(
                "8 * sum by (instance, device) (%s)"
                % rate("node_network_receive_bytes_total", VIRTUAL_NICS),
                "{{instance}} {{device}} in",
                "A",
            ),
            prom_target(
                "8 * sum by (instance, device) (%s)"
                % rate("node_network_transmit_bytes_total", VIRTUAL_NICS),
                "{{instance}} {{device}} out",
                "B",
            ),
        ],
    )


def other_flows_gauge_panel(title, description, unit, metric):
    """A per-connection TCP_INFO gauge of other tools' connections (the tcp
    collector's `flow` slots of each remote host and port range)."""
    return timeseries(
        title,
        description,
        unit,
        [
            prom_target(
                "max by (instance, remote, ports, flow) (max_over_time(%s[$__rate_interval]))"
                % sel(metric),
                "{{instance}} {{remote}} {{ports}} flow {{flow}}",
            )
        ],
    )


def router_in_out_panel(title, description, full_width=False):
    return timeseries(
        title,
        description,
        "bps",
        [
            influx_target(router_query("ifHCInOctets"), "$tag_router $tag_ifName in", "A"),
            influx_target(router_query("ifHCOutOctets"), "$tag_router $tag_ifName out", "B"),
        ],
        full_width=full_width,
    )


def cpu_modes_panel(repeat):
    return timeseries(
        "CPU by mode ($instance)" if repeat else "Receiver CPU by mode",
        "Share of all CPUs of the host spent in user, system, softirq, iowait and irq, stacked. "
        "Network receive processing shows as softirq, disk waits as iowait.",
        "percentunit",
        [
            prom_target(
                "avg by (instance, mode) (%s)"
                % rate("node_cpu_seconds_total", 'mode=~"%s"' % CPU_MODES),
                "{{instance}} {{mode}}",
            )
        ],
        stack=True,
        repeat="instance" if repeat else None,
    )


def disk_bytes_panel(title, description):
    return timeseries(
        title,
        description,
        "Bps",
        [
            prom_target(
                "sum by (instance, device) (%s)" % rate("node_disk_read_bytes_total", DEVICE),
                "{{instance}} {{device}} read",
                "A",
            ),
            prom_target(
                "sum by (instance, device) (%s)" % rate("node_disk_written_bytes_total", DEVICE),
                "{{instance}} {{device}} write",
                "B",
            ),
        ],
    )
