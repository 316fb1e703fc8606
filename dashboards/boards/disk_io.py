"""Disk IO: throughput, IOPS and utilisation per device and per RAID controller."""

from lib.promql import CONTROLLER, DEVICE, SESSION, rate, sel, threshold
from lib.variables import (
    CAMPAIGN_VAR,
    CONTROLLER_VAR,
    DEVICE_VAR,
    INSTANCE,
    JOB,
    SESSION_VAR,
    datasource_var,
)
from lib.panels import dashboard, prom_target, row, stat, timeseries
from lib.shared_panels import disk_bytes_panel


def disk_io():
    controller_util = (
        "sum by (instance, controller) (%s) / on (instance, controller) "
        "clamp_min(max by (instance, controller) (max_over_time(%s[$__rate_interval])), 1)"
        % (
            rate("longhaul_controller_io_time_seconds_total", CONTROLLER),
            sel("longhaul_controller_disks", CONTROLLER),
        )
    )
    panels = [
        row("Per device: operating system and longhaul engine"),
        disk_bytes_panel(
            "Read and write per device",
            "Bytes per second read from and written to each whole disk, from /proc/diskstats "
            "via node_exporter.",
        ),
        timeseries(
            "Engine IO per device",
            "Bytes per second the longhaul engine itself reads (sender) or writes (receiver) on "
            "each device in disk mode; compare with the operating system's view beside it.",
            "Bps",
            [
                prom_target(
                    "sum by (instance, device, controller, direction) (%s)"
                    % rate("longhaul_device_io_bytes_total", SESSION, CONTROLLER),
                    "{{instance}} {{device}} ({{controller}}) {{direction}}",
                )
            ],
        ),
        timeseries(
            "IOPS per device",
            "Read and write operations completed per second on each disk.",
            "iops",
            [
                prom_target(
                    "sum by (instance, device) (%s)"
                    % rate("node_disk_reads_completed_total", DEVICE),
                    "{{instance}} {{device}} read",
                    "A",
                ),
                prom_target(
                    "sum by (instance, device) (%s)"
                    % rate("node_disk_writes_completed_total", DEVICE),
                    "{{instance}} {{device}} write",
                    "B",
                ),
            ],
        ),
        timeseries(
            "Utilisation per device",
            "Fraction of time each disk had IO in flight (io_time). Near 100 % the disk is the "
            "bottleneck.",
            "percentunit",
            [
                prom_target(
                    "sum by (instance, device) (%s)"
                    % rate("node_disk_io_time_seconds_total", DEVICE),
                    "{{instance}} {{device}}",
                )
            ],
        ),
        stat(
            "Busiest device",
            "The disk with the highest utilisation right now.",
            "percentunit",
            [
                prom_target(
                    "topk(1, sum by (instance, device) (%s))"
                    % rate("node_disk_io_time_seconds_total", DEVICE),
                    "{{instance}} {{device}}",
                    instant=True,
                )
            ],
        ),
        row("Per RAID controller (longhaul-exporter)"),
        timeseries(
            "Read and write per controller",
            "Bytes per second read and written through each storage controller: its whole "
            "disks summed, never partitions or md/dm devices twice.",
            "Bps",
            [
                prom_target(
                    "sum by (instance, controller) (%s)"
                    % rate("longhaul_controller_read_bytes_total", CONTROLLER),
                    "{{instance}} {{controller}} read",
                    "A",
                ),
                prom_target(
                    "sum by (instance, controller) (%s)"
                    % rate("longhaul_controller_written_bytes_total", CONTROLLER),
                    "{{instance}} {{controller}} write",
                    "B",
                ),
            ],
        ),
        timeseries(
            "IOPS per controller",
            "Read and write operations completed per second by the disks of each controller.",
            "iops",
            [
                prom_target(
                    "sum by (instance, controller) (%s)"
                    % rate("longhaul_controller_reads_completed_total", CONTROLLER),
                    "{{instance}} {{controller}} read",
                    "A",
                ),
                prom_target(
                    "sum by (instance, controller) (%s)"
                    % rate("longhaul_controller_writes_completed_total", CONTROLLER),
                    "{{instance}} {{controller}} write",
                    "B",
                ),
            ],
        ),
        timeseries(
            "Utilisation per controller",
            "Busy time of a controller's disks divided by their number: 100 % means every disk "
            "behind it is always busy. The dashed line is LonghaulControllerSaturated's deployed "
            "threshold.",
            "percentunit",
            [
                prom_target(controller_util, "{{instance}} {{controller}}", "A"),
                prom_target(threshold("controller_utilisation"), "saturated above", "B"),
            ],
            threshold_refs=["B"],
        ),
    ]
    return dashboard(
        "disk",
        "longhaul / Disk IO",
        "Disk throughput, IOPS and utilisation per device and per RAID controller.",
        [
            datasource_var("prometheus"),
            JOB,
            INSTANCE,
            DEVICE_VAR,
            CONTROLLER_VAR,
            CAMPAIGN_VAR,
            SESSION_VAR,
        ],
        panels,
    )
