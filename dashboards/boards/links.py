"""Links and sites: the roll-ups of rules/longhaul-links.yml."""

from lib.variables import INTERFACE_VAR, ROUTER_VAR, campaign_var, datasource_var, prom_var
from lib.panels import dashboard, influx_target, prom_target, stat, timeseries
from lib.shared_panels import router_query


# The roll-ups of rules/longhaul-links.yml: a link's direction is told by the
# sending site ({link="a--b", site="a"} is what site a sends over a--b).
LINK_VAR = prom_var("link", "Link", "label_values(longhaul:link_throughput_bits:rate1m, link)")
SITE_VAR = prom_var("site", "Site", "label_values(longhaul:site_throughput_bits:rate1m, site)")


def links():
    link = 'link=~"$link"'
    site = 'site=~"$site"'
    engine = prom_target(
        "longhaul:link_throughput_bits:rate1m{%s}" % link, "engine {{link}} from {{site}}", "A"
    )
    panels = [
        timeseries(
            "Engine beside router, per link direction",
            "Bits per second each site sends over each selected link as the transfer hosts "
            "count it (engine sessions plus every other socket on the transfer ports, "
            "rules/longhaul-links.yml), beside what the selected router interfaces send "
            "(IF-MIB ifHCOutOctets that Telegraf polls, as Telegraf's Prometheus endpoint "
            "exposes them). The router's out on the interface towards a site is the link's "
            "direction into that site: the two lines should agree within the packet headers "
            "(a few percent); a gap is traffic the hosts do not see, or loss.",
            "bps",
            [
                engine,
                prom_target(
                    '8 * sum by (router, ifName) (rate(interface_ifHCOutOctets{job="telegraf", '
                    'router=~"$router", ifName=~"$interface"}[$__rate_interval]))',
                    "router {{router}} {{ifName}} out",
                    "B",
                ),
            ],
            full_width=True,
        ),
        timeseries(
            "Engine: per link and direction",
            "Bits per second each site sends over each selected link, summed over its transfer "
            "hosts (longhaul:link_throughput_bits:rate1m; the `link` and `site` inventory "
            "variables of the hosts).",
            "bps",
            [engine],
        ),
        timeseries(
            "Router: out per interface (SNMP in InfluxDB)",
            "Bits per second the selected router interfaces send, from Telegraf's SNMP polls "
            "in InfluxDB: the router's own view of each link direction, to set beside the "
            "engine's.",
            "bps",
            [influx_target(router_query("ifHCOutOctets"), "$tag_router $tag_ifName out")],
        ),
        timeseries(
            "Per site, in and out",
            "Bits per second leaving (send) and arriving at (receive) each selected site over "
            "the transfer ports, all its transfer hosts summed "
            "(longhaul:site_throughput_bits:rate1m).",
            "bps",
            [
                prom_target(
                    "longhaul:site_throughput_bits:rate1m{%s}" % site, "{{site}} {{direction}}"
                )
            ],
        ),
        timeseries(
            "Per transfer host",
            "Bits per second each transfer host of the selected sites sends and receives on "
            "the transfer ports, whichever end runs the server "
            "(longhaul:host_transfer_throughput_bytes:rate1m).",
            "bps",
            [
                prom_target(
                    "8 * longhaul:host_transfer_throughput_bytes:rate1m{%s}" % site,
                    "{{instance}} ({{site}}) {{direction}}",
                )
            ],
        ),
        stat(
            "Total",
            "Bits per second of all transfer hosts, every byte counted once where it was sent "
            "(longhaul:total_throughput_bits:rate1m).",
            "bps",
            [prom_target("longhaul:total_throughput_bits:rate1m", "total")],
        ),
    ]
    return dashboard(
        "links",
        "longhaul / Links",
        "Campaigns of many host pairs: throughput per link and direction, per site and in "
        "total, the engine-side roll-ups beside the routers' SNMP view of the same links.",
        [
            datasource_var("prometheus"),
            datasource_var("influxdb"),
            campaign_var(hosts=False),
            LINK_VAR,
            SITE_VAR,
            ROUTER_VAR,
            INTERFACE_VAR,
        ],
        panels,
    )
