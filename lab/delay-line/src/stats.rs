//! Per-direction counters, shared between a forwarding thread (which bumps
//! them with relaxed atomics) and the main thread (which prints them every
//! `--stats-interval` and once on exit).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters and gauges of one direction.
#[derive(Debug, Default)]
pub struct DirectionStats {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Tail drops: the bottleneck queue was at its limit.
    pub dropped_queue: AtomicU64,
    /// Drops because the preallocated ring was full (should stay 0; means
    /// the thread fell far behind its release times).
    pub dropped_ring: AtomicU64,
    /// Writes to the output TUN that failed (packet dropped).
    pub tx_errors: AtomicU64,
    /// Bytes and packets held right now (queue + on the "wire").
    pub held_bytes: AtomicU64,
    pub held_packets: AtomicU64,
    /// Bytes waiting in the bottleneck queue right now.
    pub backlog_bytes: AtomicU64,
    /// How late packets left compared to their release time: sum (for the
    /// mean) and the maximum since the last report.
    pub late_sum_ns: AtomicU64,
    pub late_max_ns: AtomicU64,
    /// The largest lateness since start.
    pub late_max_total_ns: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub dropped_queue: u64,
    pub dropped_ring: u64,
    pub tx_errors: u64,
    pub held_bytes: u64,
    pub held_packets: u64,
    pub backlog_bytes: u64,
    pub late_sum_ns: u64,
    /// Maximum lateness since the last report (or since start, for totals).
    pub late_max_ns: u64,
}

impl DirectionStats {
    /// Reads all counters. With `reset_max` (interval reports) the maximum
    /// lateness is the interval's and restarts; without it, the all-time one.
    pub fn snapshot(&self, reset_max: bool) -> Snapshot {
        Snapshot {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            dropped_queue: self.dropped_queue.load(Relaxed),
            dropped_ring: self.dropped_ring.load(Relaxed),
            tx_errors: self.tx_errors.load(Relaxed),
            held_bytes: self.held_bytes.load(Relaxed),
            held_packets: self.held_packets.load(Relaxed),
            backlog_bytes: self.backlog_bytes.load(Relaxed),
            late_sum_ns: self.late_sum_ns.load(Relaxed),
            late_max_ns: if reset_max {
                self.late_max_ns.swap(0, Relaxed)
            } else {
                self.late_max_total_ns.load(Relaxed)
            },
        }
    }
}

/// One report line: totals, plus the rate over the interval since `prev`.
pub struct Report<'a> {
    pub direction: &'a str,
    pub now: Snapshot,
    pub prev: Snapshot,
    pub seconds: f64,
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.now;
        let bps = if self.seconds > 0.0 {
            (s.tx_bytes - self.prev.tx_bytes) as f64 * 8.0 / self.seconds
        } else {
            0.0
        };
        let late_mean_us = if s.tx_packets > 0 {
            s.late_sum_ns as f64 / s.tx_packets as f64 / 1e3
        } else {
            0.0
        };
        write!(
            f,
            "{} rx_packets={} rx_bytes={} tx_packets={} tx_bytes={} tx_mbps={:.1} \
             dropped_queue={} dropped_ring={} tx_errors={} held_packets={} held_bytes={} \
             backlog_bytes={} late_mean_us={:.1} late_max_us={:.1}",
            self.direction,
            s.rx_packets,
            s.rx_bytes,
            s.tx_packets,
            s.tx_bytes,
            bps / 1e6,
            s.dropped_queue,
            s.dropped_ring,
            s.tx_errors,
            s.held_packets,
            s.held_bytes,
            s.backlog_bytes,
            late_mean_us,
            s.late_max_ns as f64 / 1e3,
        )
    }
}
