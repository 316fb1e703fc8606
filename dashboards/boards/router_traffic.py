"""Router traffic: Telegraf's SNMP counters of the routers (InfluxDB, with PromQL twins)."""

from lib.promql import OPER_STATUS, SNMP_IF_TAG, SNMP_MEASUREMENT, SNMP_ROUTER_TAG
from lib.variables import INTERFACE_VAR, ROUTER_VAR, campaign_var, datasource_var
from lib.panels import dashboard, influx_target, state_timeline, timeseries
from lib.shared_panels import (
    router_in_out_panel,
    router_packets_panel,
    router_query,
    snmp_last,
    snmp_rate,
)


def router_traffic():
    panels = [
        router_in_out_panel(
            "Traffic per interface",
            "Bits per second in and out of each selected router interface: InfluxQL "
            "non_negative_derivative of the 64-bit IF-MIB octet counters Telegraf polls over SNMP.",
            full_width=True,
        ),
        timeseries(
            "In per interface",
            "Bits per second received by each selected router interface (ifHCInOctets).",
            "bps",
            [influx_target(router_query("ifHCInOctets"), "$tag_router $tag_ifName")],
        ),
        timeseries(
            "Out per interface",
            "Bits per second sent by each selected router interface (ifHCOutOctets).",
            "bps",
            [influx_target(router_query("ifHCOutOctets"), "$tag_router $tag_ifName")],
        ),
        timeseries(
            "Total per link",
            "In plus out bits per second of each selected interface: everything the link "
            "carries in both directions.",
            "bps",
            [
                influx_target(
                    (
                        (
                            'SELECT non_negative_derivative(mean("ifHCInOctets"), 1s) * 8 '
                            '+ non_negative_derivative(mean("ifHCOutOctets"), 1s) * 8 AS "bps" '
                            'FROM "{m}" WHERE "{r}" =~ /^$router$/ AND "{i}" =~ /^$interface$/ '
                            'AND $timeFilter GROUP BY time($__interval), "{r}", "{i}" fill(none)'
                        ).format(m=SNMP_MEASUREMENT, r=SNMP_ROUTER_TAG, i=SNMP_IF_TAG),
                        "8 * (%s + %s)" % (snmp_rate("ifHCInOctets"), snmp_rate("ifHCOutOctets")),
                    ),
                    "$tag_router $tag_ifName",
                )
            ],
        ),
        timeseries(
            "Total per router",
            "Bits per second in and out summed over the selected interfaces of each router.",
            "bps",
            [
                influx_target(router_query("ifHCInOctets", True), "$tag_router in", "A"),
                influx_target(router_query("ifHCOutOctets", True), "$tag_router out", "B"),
            ],
        ),
        timeseries(
            "Interface speed",
            "Nominal speed of each selected interface (ifHighSpeed, reported in Mb/s), the "
            "ceiling for the traffic panels.",
            "bps",
            [
                influx_target(
                    (
                        (
                            'SELECT last("ifHighSpeed") * 1000000 AS "bps" FROM "{m}" '
                            'WHERE "{r}" =~ /^$router$/ AND "{i}" =~ /^$interface$/ AND $timeFilter '
                            'GROUP BY time($__interval), "{r}", "{i}" fill(none)'
                        ).format(m=SNMP_MEASUREMENT, r=SNMP_ROUTER_TAG, i=SNMP_IF_TAG),
                        "1000000 * %s" % snmp_last("ifHighSpeed"),
                    ),
                    "$tag_router $tag_ifName",
                )
            ],
        ),
        router_packets_panel(
            "Errors per interface",
            "Packets per second received (in) or not sent (out) because of errors on each "
            "selected interface (ifInErrors, ifOutErrors).",
            "ifInErrors",
            "ifOutErrors",
        ),
        router_packets_panel(
            "Discards per interface",
            "Packets per second dropped without an error on each selected interface (ifInDiscards, "
            "ifOutDiscards): typically full buffers, the router's own congestion loss.",
            "ifInDiscards",
            "ifOutDiscards",
        ),
        state_timeline(
            "Oper status per interface",
            "Operational state of each selected interface (ifOperStatus): up, down, testing, "
            "unknown, dormant, notPresent, lowerLayerDown.",
            [
                influx_target(
                    (
                        (
                            'SELECT last("ifOperStatus") AS "status" FROM "{m}" '
                            'WHERE "{r}" =~ /^$router$/ AND "{i}" =~ /^$interface$/ AND $timeFilter '
                            'GROUP BY time($__interval), "{r}", "{i}" fill(none)'
                        ).format(m=SNMP_MEASUREMENT, r=SNMP_ROUTER_TAG, i=SNMP_IF_TAG),
                        snmp_last("ifOperStatus"),
                    ),
                    "$tag_router $tag_ifName",
                )
            ],
            OPER_STATUS,
        ),
    ]
    return dashboard(
        "router",
        "longhaul / Router traffic",
        "Router interface traffic from Telegraf's SNMP polls stored in InfluxDB.",
        # Prometheus for the campaign's runs as annotations.
        [
            datasource_var("prometheus"),
            datasource_var("influxdb"),
            campaign_var(hosts=False),
            ROUTER_VAR,
            INTERFACE_VAR,
        ],
        panels,
    )
