"""A campaign: one run side by side, router traffic, per-stream throughput, receiver disk IO and CPU."""

from lib.promql import CAMPAIGN, PROTOCOL, rate
from lib.variables import (
    CAMPAIGN_VAR,
    DEVICE_VAR,
    INSTANCE,
    INTERFACE_VAR,
    JOB,
    PROTOCOL_VAR,
    ROUTER_VAR,
    datasource_var,
    session_var,
)
from lib.panels import dashboard, prom_target, timeseries
from lib.shared_panels import (
    cpu_modes_panel,
    disk_bytes_panel,
    host_nic_panel,
    router_in_out_panel,
    stream_throughput,
    total_throughput,
)


def campaign():
    panels = [
        router_in_out_panel(
            "Router traffic",
            "Bits per second in and out of the selected router interfaces (SNMP via Telegraf "
            "and InfluxDB).",
        ),
        stream_throughput(),
        disk_bytes_panel(
            "Receiver disk IO",
            "Bytes per second read and written per disk on the selected hosts (choose the "
            "receiver as Instance).",
        ),
        cpu_modes_panel(repeat=False),
        total_throughput(),
        timeseries(
            "Receiver softirq",
            "Share of all CPUs spent in softirq on the selected hosts.",
            "percentunit",
            [
                prom_target(
                    "avg by (instance) (%s)" % rate("node_cpu_seconds_total", 'mode="softirq"'),
                    "{{instance}}",
                )
            ],
        ),
        host_nic_panel(
            "Receiver NIC traffic",
            "Bits per second in and out of each network interface of the selected hosts "
            "(choose the receiver as Instance), to set beside the router's view.",
        ),
    ]
    return dashboard(
        "campaign",
        "longhaul / Campaign",
        "One run side by side: router traffic, per-stream throughput, receiver disk IO and CPU.",
        [
            datasource_var("prometheus"),
            datasource_var("influxdb"),
            JOB,
            INSTANCE,
            PROTOCOL_VAR,
            CAMPAIGN_VAR,
            session_var(PROTOCOL, CAMPAIGN),
            DEVICE_VAR,
            ROUTER_VAR,
            INTERFACE_VAR,
        ],
        panels,
    )
