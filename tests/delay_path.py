"""What a WAN path emulated by the delay line (lab/delay-line, longhaul-delay)
did over a run's window, from its counter lines, and whether it kept up.

A throughput test through the delay line judges the engine only when the path
itself kept up: the delay line logs one counter line per direction every
--stats-interval (totals since start), which say what it carried and whether
the emulator fell behind. tests/lab/labkit.py reads them from the lab router's
journal (Lab.path_check); tests/test_delay_path.py checks the judgement against
a delay line starved on purpose.
"""

import datetime
import re

# Beyond these limits over a run's window the path, not the engine, fell short:
# - time the forwarding thread waited for a CPU (runnable, not running) while the
#   path carried less than PATH_FULL of its rate: such gaps leave the bottleneck
#   idle while packets wait in the kernel (the 2-core lab host shares its CPUs with
#   everything else; a real router does not). Waits while the bottleneck queue
#   holds a backlog cost nothing: the link stays busy, so a full path is not
#   blamed for them (measured at load 60: 31 % waiting, 98.6 % carried);
PATH_WAIT_LIMIT = 0.05
PATH_FULL = 0.95
# - the thread busy for most of a core: the emulator at its own limit;
PATH_BUSY_LIMIT = 0.90
# - packets leaving later than their release time, on average (about 0.05 ms when
#   the router keeps up: scripts/bench-delay);
PATH_LATE_LIMIT_MS = 1.0
# - and any packet the emulator lost rather than the bottleneck: its ring full,
#   its TUN device's queue full (kernel_dropped), a failed write.
PATH_EMULATOR_DROPS = ("dropped_ring", "kernel_dropped", "tx_errors")
# "2026-11-28T02:33:20.970Z longhaul-delay: a->b rx_packets=91158 ... wait_ms=82"
DELAY_LINE_LINE = re.compile(r"^(\S+) longhaul-delay: (?:total )?(a->b|b->a) (\w+=.*)$")


def delay_line_samples(journal):
    """The delay line's counter lines in its log: [(epoch, direction, {key: number})]."""
    samples = []
    for line in journal.splitlines():
        match = DELAY_LINE_LINE.match(line.strip())
        if not match:
            continue
        stamp = datetime.datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))
        counters = dict(kv.split("=", 1) for kv in match.group(3).split())
        samples.append((stamp.timestamp(), match.group(2), {k: float(v) for k, v in counters.items()}))
    return samples


class PathCheck:
    """What the delay line did between its first and last counter lines inside a
    run's window [start, end] (epoch seconds): what it carried from site A to B
    (`carried_bps`, `utilisation` of `rate_bps`), the bottleneck's tail drops,
    and `shortfalls`: why the path itself fell short (empty when it kept up).
    `summary` says all of it in one line, for test output and failures."""

    def __init__(self, samples, start, end, rate_bps):
        self.rate_bps = rate_bps
        self.shortfalls = []
        parts = []
        for direction in ("a->b", "b->a"):
            inside = [(t, c) for t, d, c in samples if d == direction and start <= t <= end]
            assert len(inside) >= 2, (
                "the delay line logged %d %s counter lines within the run's %.0f s: it needs "
                "--stats-interval of a few seconds at most (lab_router_delay_stats_interval)"
                % (len(inside), direction, end - start)
            )
            (t0, first), (t1, last) = inside[0], inside[-1]
            totals = [c["tx_packets"] for _, c in inside]
            if any(b < a for a, b in zip(totals, totals[1:])):
                self.shortfalls.append("the delay line restarted during the run (its %s totals fell)" % direction)
                first = {key: 0 for key in last}
            seconds = t1 - t0
            delta = {key: last[key] - first.get(key, 0) for key in last}
            wait, busy = delta["wait_ms"] / 1e3 / seconds, delta["cpu_ms"] / 1e3 / seconds
            late_ms = delta["late_sum_ms"] / max(delta["tx_packets"], 1)
            lost = {key: int(delta[key]) for key in PATH_EMULATOR_DROPS if delta[key] > 0}
            if direction == "a->b":
                self.seconds = seconds
                self.carried_bps = delta["tx_bytes"] * 8 / seconds
                self.utilisation = self.carried_bps / rate_bps
                self.bottleneck_drops = int(delta["dropped_queue"])
                parts.append(
                    "carried %.1f Mb/s (%.1f%% of %.0f Mb/s) over %.1f s, %d bottleneck drops"
                    % (self.carried_bps / 1e6, 100 * self.utilisation, rate_bps / 1e6, seconds,
                       self.bottleneck_drops)
                )
            parts.append(
                "%s thread busy %.0f%%, waited for a CPU %.1f%%, late %.2f ms on average, "
                "emulator drops %s" % (direction, 100 * busy, 100 * wait, late_ms, lost or 0)
            )
            if wait > PATH_WAIT_LIMIT and self.utilisation < PATH_FULL:
                self.shortfalls.append(
                    "the delay line's %s forwarding thread waited for a CPU %.1f%% of the time (limit %.0f%% "
                    "while the path carries under %.0f%% of its rate): starved"
                    % (direction, 100 * wait, 100 * PATH_WAIT_LIMIT, 100 * PATH_FULL)
                )
            if busy > PATH_BUSY_LIMIT:
                self.shortfalls.append(
                    "the delay line's %s forwarding thread was busy %.0f%% of a core (limit %.0f%%): at its own limit"
                    % (direction, 100 * busy, 100 * PATH_BUSY_LIMIT)
                )
            if late_ms > PATH_LATE_LIMIT_MS:
                self.shortfalls.append(
                    "%s packets left the delay line %.2f ms late on average (limit %.1f ms)"
                    % (direction, late_ms, PATH_LATE_LIMIT_MS)
                )
            if lost:
                self.shortfalls.append("the emulator itself lost %s packets: %s" % (direction, lost))
        self.summary = "; ".join(parts)

    def verdict(self):
        """One line: the path kept up, or why not."""
        if not self.shortfalls:
            return "the path kept up (%s)" % self.summary
        return "THE PATH fell short, not the engine: %s (%s)" % (
            "; ".join(self.shortfalls),
            self.summary,
        )
