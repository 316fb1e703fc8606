"""CPU: each mode, softirq included, per CPU and per host."""

from lib.promql import rate
from lib.variables import CAMPAIGN_VAR, INSTANCE, JOB, datasource_var
from lib.panels import dashboard, prom_target, timeseries
from lib.shared_panels import cpu_modes_panel


def cpu():
    panels = [
        cpu_modes_panel(repeat=True),
        timeseries(
            "Softirq per host",
            "Share of all CPUs spent in softirq: kernel network (and block) completion work. "
            "FDT's reference receiver spent about 15 % here at 545 MB/s.",
            "percentunit",
            [
                prom_target(
                    "avg by (instance) (%s)" % rate("node_cpu_seconds_total", 'mode="softirq"'),
                    "{{instance}}",
                )
            ],
        ),
        timeseries(
            "Softirq per CPU",
            "Softirq time of each CPU. One CPU near 100 % while others idle means the NIC's "
            "interrupts land on one core.",
            "percentunit",
            [
                prom_target(
                    "sum by (instance, cpu) (%s)"
                    % rate("node_cpu_seconds_total", 'mode="softirq"'),
                    "{{instance}} cpu{{cpu}}",
                )
            ],
        ),
        timeseries(
            "Busy per host",
            "Share of all CPUs not idle, per host.",
            "percentunit",
            [
                prom_target(
                    "1 - avg by (instance) (%s)" % rate("node_cpu_seconds_total", 'mode="idle"'),
                    "{{instance}}",
                )
            ],
        ),
    ]
    return dashboard(
        "cpu",
        "longhaul / CPU",
        "CPU time per host by mode (user, system, softirq, iowait, irq), softirq on its own.",
        [datasource_var("prometheus"), JOB, INSTANCE, CAMPAIGN_VAR],
        panels,
    )
