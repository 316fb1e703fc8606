"""The transfer overview: throughput, streams, retransmits, RTT and cwnd of longhaul transfers,
other tools' flows and the engines' admission."""

from lib.promql import (
    CAMPAIGN,
    PROTOCOL,
    RECEIVER,
    SENDER,
    SESSION,
    max_over,
    of_protocol,
    rate,
    recorded,
    threshold,
)
from lib.variables import CAMPAIGN_VAR, INSTANCE, JOB, PROTOCOL_VAR, datasource_var, session_var
from lib.panels import dashboard, prom_target, stat, table, timeseries
from lib.shared_panels import (
    host_nic_panel,
    other_flows_gauge_panel,
    stream_throughput,
    total_throughput,
)


def transfer_overview():
    panels = [
        stat(
            "Active sessions",
            "longhaul sessions whose payload counters moved during the last rate interval.",
            "none",
            [
                prom_target(
                    "count(sum by (instance, session) (%s) > 0) or vector(0)"
                    % of_protocol(rate("longhaul_session_bytes_total", SESSION)),
                    instant=True,
                )
            ],
        ),
        stat(
            "Current throughput",
            "Payload bits per second of all selected sessions on the receiving engines.",
            "bps",
            [
                prom_target(
                    "8 * sum(%s)"
                    % of_protocol(rate("longhaul_session_bytes_total", SESSION, RECEIVER)),
                    instant=True,
                )
            ],
        ),
        stat(
            "Retransmits",
            "TCP segments retransmitted per second by the sending sockets of the selected "
            "sessions (whichever end sends).",
            "pps",
            [
                prom_target(
                    "sum(%s) or vector(0)"
                    % of_protocol(rate("longhaul_stream_retransmits_total", SESSION, SENDER)),
                    instant=True,
                )
            ],
        ),
        stat(
            "Max RTT",
            "Highest smoothed round-trip time of any sending socket of the selected sessions.",
            "s",
            [
                prom_target(
                    "max(%s)"
                    % of_protocol(max_over("longhaul_stream_rtt_seconds", SESSION, SENDER)),
                    instant=True,
                )
            ],
        ),
        total_throughput(),
        timeseries(
            "Throughput per session",
            "Payload bits per second of each session and direction on each engine.",
            "bps",
            [
                prom_target(
                    "8 * sum by (instance, session, direction) (%s)"
                    % of_protocol(rate("longhaul_session_bytes_total", SESSION)),
                    "{{instance}} {{session}} {{direction}}",
                )
            ],
        ),
        timeseries(
            "Session throughput and drop threshold",
            "Each session's 1m rate, and the rate below which LonghaulThroughputDrop fires (dashed): "
            "the session's deployed baseline (a quantile of its 1m rate over a window; by default "
            "the 90th percentile over 2 h) times the deployed throughput_drop_ratio.",
            "bps",
            [
                prom_target(
                    "8 * %s"
                    % of_protocol(recorded("longhaul:session_throughput_bytes:rate1m", SESSION)),
                    "{{instance}} {{session}} {{direction}}",
                    "A",
                ),
                prom_target(
                    "8 * %s * on () group_left () %s"
                    % (
                        of_protocol(
                            recorded("longhaul:session_throughput_bytes:baseline", SESSION)
                        ),
                        threshold("throughput_drop_ratio"),
                    ),
                    "{{instance}} {{session}} {{direction}} alert below",
                    "B",
                ),
            ],
            threshold_refs=["B"],
        ),
        stream_throughput(),
        timeseries(
            "Retransmits per stream",
            "TCP segments retransmitted per second by each stream's sending socket "
            "(tcpi_total_retrans; the client reports its sockets to the server, so this is the "
            "sending side whichever end sends).",
            "pps",
            [
                prom_target(
                    "sum by (instance, session, stream) (%s)"
                    % of_protocol(rate("longhaul_stream_retransmits_total", SESSION, SENDER)),
                    "{{session}}/{{stream}}",
                )
            ],
        ),
        timeseries(
            "Retransmit ratio per session",
            "Retransmitted / sent data segments of each session's sending sockets over 5 minutes, "
            "and the deployed threshold of LonghaulHighRetransmits (dashed).",
            "percentunit",
            [
                prom_target(
                    of_protocol(recorded("longhaul:session_retransmit_ratio:rate5m", SESSION)),
                    "{{instance}} {{session}}",
                    "A",
                ),
                prom_target(threshold("retransmit_ratio"), "alert above", "B"),
            ],
            threshold_refs=["B"],
        ),
        timeseries(
            "RTT per stream",
            "Smoothed round-trip time of each stream's sending socket, from TCP_INFO.",
            "s",
            [
                prom_target(
                    "max by (instance, session, stream) (%s)"
                    % of_protocol(max_over("longhaul_stream_rtt_seconds", SESSION, SENDER)),
                    "{{session}}/{{stream}}",
                )
            ],
        ),
        timeseries(
            "Congestion window per stream",
            "Congestion window of each stream's sending socket in bytes (snd_cwnd x MSS). With the "
            "RTT it bounds the stream's throughput at cwnd / RTT.",
            "bytes",
            [
                prom_target(
                    "max by (instance, session, stream) (%s)"
                    % of_protocol(max_over("longhaul_stream_cwnd_bytes", SESSION, SENDER)),
                    "{{session}}/{{stream}}",
                )
            ],
        ),
        timeseries(
            "Pacing rate per stream",
            "TCP pacing rate of each stream's sending socket (tcpi_pacing_rate): what the "
            "congestion control (or --rate) lets the socket send.",
            "Bps",
            [
                prom_target(
                    "max by (instance, session, stream) (%s)"
                    % of_protocol(
                        max_over("longhaul_stream_pacing_rate_bytes_per_second", SESSION, SENDER)
                    ),
                    "{{session}}/{{stream}}",
                )
            ],
        ),
        timeseries(
            "TCP throughput on the transfer ports",
            "Bytes acknowledged (send) and received per second by the TCP sockets of other tools "
            "(FDT, iperf3) on the exporter's configured ports; longhaul's own are in the panels above.",
            "bps",
            [
                prom_target(
                    "8 * sum by (instance) (%s)" % rate("longhaul_tcp_bytes_acked_total"),
                    "{{instance}} send",
                    "A",
                ),
                prom_target(
                    "8 * sum by (instance) (%s)" % rate("longhaul_tcp_bytes_received_total"),
                    "{{instance}} receive",
                    "B",
                ),
            ],
        ),
        other_flows_gauge_panel(
            "RTT of other tools' connections",
            "Smoothed round-trip time of each TCP connection of other tools (FDT, iperf3) on the "
            "exporter's configured ports, per remote host and port range; connections beyond "
            'the exporter\'s flow cap are averaged into flow="other".',
            "s",
            "longhaul_tcp_rtt_seconds",
        ),
        other_flows_gauge_panel(
            "Congestion window of other tools' connections",
            "Congestion window in bytes (snd_cwnd x MSS) of each TCP connection of other tools "
            "on the configured ports; connections beyond the flow cap are summed into "
            'flow="other".',
            "bytes",
            "longhaul_tcp_cwnd_bytes",
        ),
        timeseries(
            "Retransmits of other tools' connections",
            "TCP segments retransmitted per second on the connections of other tools with each "
            "remote host on each configured port range (tcpi_total_retrans).",
            "pps",
            [
                prom_target(
                    "sum by (instance, remote, ports) (%s)"
                    % rate("longhaul_tcp_retransmits_total"),
                    "{{instance}} {{remote}} {{ports}}",
                )
            ],
        ),
        host_nic_panel(
            "Host NIC traffic",
            "Bits per second received (in) and sent (out) by each network interface of the "
            "selected hosts (node_exporter's netdev; loopback, veth and bridges left out): "
            "everything the host moves, longhaul or not.",
        ),
        timeseries(
            "Sessions begun and failed",
            "Sessions each engine began and ended as failed, per minute (longhaul_sessions_total, "
            "longhaul_sessions_failed_total: longhaul sessions and iperf3 tests; the server's log "
            "says why a session failed). A restart of the engine starts its counters again at 0, "
            "which the rate takes in its stride.",
            "opm",
            [
                prom_target(
                    "60 * sum by (instance) (%s)" % rate("longhaul_sessions_total"),
                    "{{instance}} begun",
                    "A",
                ),
                prom_target(
                    "60 * sum by (instance) (%s)" % rate("longhaul_sessions_failed_total"),
                    "{{instance}} failed",
                    "B",
                ),
            ],
        ),
        timeseries(
            "Connections at the engines' ports",
            "Per second at each listening port of each engine (listener: longhaul, the control and "
            "data port, or iperf3): connections accepted, control connections admitted (they proved "
            "themselves and became a session, a test or a probe), and connections dropped before "
            "admission by reason (evicted from a full pre-authentication pool, expired past the "
            "admission deadline, garbage that is not the protocol). LonghaulAdmissionDrops fires "
            "when a port drops more than 1 a second over 5 minutes (docs/threat-model.md).",
            "cps",
            [
                prom_target(
                    "sum by (instance, listener) (%s)" % rate("longhaul_admission_accepted_total"),
                    "{{instance}} {{listener}} accepted",
                    "A",
                ),
                prom_target(
                    "sum by (instance, listener) (%s)" % rate("longhaul_admission_admitted_total"),
                    "{{instance}} {{listener}} admitted",
                    "B",
                ),
                prom_target(
                    "sum by (instance, listener, reason) (%s)"
                    % rate("longhaul_admission_dropped_total"),
                    "{{instance}} {{listener}} dropped: {{reason}}",
                    "C",
                ),
            ],
        ),
        table(
            "Sessions",
            "Sessions the engines report (running, and finished ones for a short while) with "
            "their current receive and send throughput.",
            "bps",
            [
                prom_target(
                    "max by (instance, session, protocol, peer, peer_host, mode, direction) (%s)"
                    % max_over("longhaul_session_info", SESSION, PROTOCOL),
                    ref="A",
                    instant=True,
                    table=True,
                ),
                prom_target(
                    "8 * sum by (instance, session) (%s)"
                    % of_protocol(rate("longhaul_session_bytes_total", SESSION)),
                    ref="B",
                    instant=True,
                    table=True,
                ),
            ],
        ),
    ]
    return dashboard(
        "transfer",
        "longhaul / Transfer overview",
        "Throughput, streams, retransmits, RTT and cwnd of longhaul transfers.",
        [
            datasource_var("prometheus"),
            JOB,
            INSTANCE,
            PROTOCOL_VAR,
            CAMPAIGN_VAR,
            session_var(PROTOCOL, CAMPAIGN),
        ],
        panels,
    )
