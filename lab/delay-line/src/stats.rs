//! Per-direction counters, shared between a forwarding thread (which bumps
//! them with relaxed atomics) and the main thread (which prints them every
//! `--stats-interval` and once on exit), and what the kernel knows about the
//! direction: its thread's CPU time and run-queue wait, and the packets its
//! TUN device dropped before the thread read them. Together they tell a
//! bottleneck doing its job (`dropped_queue`) from an emulator that could not
//! keep up (`dropped_ring`, `kernel_dropped`, lateness, `wait_ms`).

use std::fmt;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

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
    /// The forwarding thread's kernel thread id (0 until it runs), whose
    /// schedstat the main thread reads.
    pub tid: AtomicI32,
    /// The thread's CPU time and run-queue wait when it ended (its schedstat
    /// is gone once it has been joined).
    pub final_cpu_ns: AtomicU64,
    pub final_wait_ns: AtomicU64,
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
    /// From the kernel (see [`Snapshot::observe`]): the forwarding thread's
    /// CPU time, its time runnable but waiting for a CPU, and the packets
    /// the input TUN device dropped because its queue towards the thread
    /// was full.
    pub cpu_ns: u64,
    pub wait_ns: u64,
    pub kernel_dropped: u64,
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
            cpu_ns: 0,
            wait_ns: 0,
            kernel_dropped: 0,
        }
    }

    /// Called by the forwarding thread as it starts: which thread to watch.
    pub fn set_thread(&self) {
        // SAFETY: gettid has no preconditions.
        self.tid.store(unsafe { libc::gettid() }, Relaxed);
    }

    /// Called by the forwarding thread as it ends: its last CPU and wait
    /// times, for the totals printed after it has been joined.
    pub fn record_final_times(&self) {
        if let Some(times) = read_thread_times("/proc/thread-self/schedstat") {
            self.final_cpu_ns.store(times.cpu_ns, Relaxed);
            self.final_wait_ns.store(times.wait_ns, Relaxed);
        }
    }
}

impl Snapshot {
    /// The counters plus what the kernel knows: the thread's times (live
    /// while it runs, the recorded ones after it ended) and the input
    /// device's drops.
    pub fn observe(stats: &DirectionStats, input_device: &str, reset_max: bool) -> Snapshot {
        let mut snap = stats.snapshot(reset_max);
        let tid = stats.tid.load(Relaxed);
        let live = (tid > 0)
            .then(|| read_thread_times(&format!("/proc/self/task/{tid}/schedstat")))
            .flatten();
        let times = live.unwrap_or(ThreadTimes {
            cpu_ns: stats.final_cpu_ns.load(Relaxed),
            wait_ns: stats.final_wait_ns.load(Relaxed),
        });
        snap.cpu_ns = times.cpu_ns;
        snap.wait_ns = times.wait_ns;
        snap.kernel_dropped = kernel_dropped(input_device);
        snap
    }
}

/// A thread's time on a CPU and time runnable but waiting for one (the
/// first two fields of its `schedstat`, nanoseconds since it started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadTimes {
    pub cpu_ns: u64,
    pub wait_ns: u64,
}

fn read_thread_times(path: &str) -> Option<ThreadTimes> {
    parse_schedstat(&std::fs::read_to_string(path).ok()?)
}

/// `schedstat`: "<ns on cpu> <ns waiting on a runqueue> <timeslices>".
fn parse_schedstat(text: &str) -> Option<ThreadTimes> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some(ThreadTimes {
        cpu_ns: fields.next()??,
        wait_ns: fields.next()??,
    })
}

/// Packets the kernel dropped because the TUN device's queue towards us was
/// full (`--txqueuelen` too small or the thread starved of CPU): the transmit
/// drop column of `/proc/net/dev`, which shows this thread's namespace (sysfs
/// would show the mounting namespace's, wrong under `nsenter -n`).
fn kernel_dropped(tun: &str) -> u64 {
    std::fs::read_to_string("/proc/self/net/dev")
        .map(|table| tx_dropped(&table, tun))
        .unwrap_or(0)
}

/// The transmit drop counter of `device` in a `/proc/net/dev` table.
fn tx_dropped(table: &str, device: &str) -> u64 {
    table
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim() == device)
        // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets errs drop
        .and_then(|(_, counters)| counters.split_whitespace().nth(11)?.parse().ok())
        .unwrap_or(0)
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
             dropped_queue={} dropped_ring={} kernel_dropped={} tx_errors={} held_packets={} \
             held_bytes={} backlog_bytes={} late_mean_us={:.1} late_max_us={:.1} late_sum_ms={} \
             cpu_ms={} wait_ms={}",
            self.direction,
            s.rx_packets,
            s.rx_bytes,
            s.tx_packets,
            s.tx_bytes,
            bps / 1e6,
            s.dropped_queue,
            s.dropped_ring,
            s.kernel_dropped,
            s.tx_errors,
            s.held_packets,
            s.held_bytes,
            s.backlog_bytes,
            late_mean_us,
            s.late_max_ns as f64 / 1e3,
            s.late_sum_ns / 1_000_000,
            s.cpu_ns / 1_000_000,
            s.wait_ns / 1_000_000,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tun_drops_from_proc_net_dev() {
        let table = "Inter-|   Receive |  Transmit\n face |bytes packets ...\n\
            \x20   lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n\
            \x20lhd-a: 900 9 0 0 0 0 0 0 800 8 0 37 0 0 0 0\n";
        assert_eq!(tx_dropped(table, "lhd-a"), 37);
        assert_eq!(tx_dropped(table, "lo"), 0);
        assert_eq!(tx_dropped(table, "lhd-b"), 0);
    }

    #[test]
    fn thread_times_from_schedstat() {
        assert_eq!(
            parse_schedstat("1446381 2398588 7\n"),
            Some(ThreadTimes {
                cpu_ns: 1_446_381,
                wait_ns: 2_398_588
            })
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12 x 3"), None);
    }

    #[test]
    fn a_threads_own_times_are_read_and_grow() {
        let stats = DirectionStats::default();
        stats.set_thread();
        let before = Snapshot::observe(&stats, "lo", false);
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let after = Snapshot::observe(&stats, "lo", false);
        assert!(x > 0);
        assert!(
            after.cpu_ns >= before.cpu_ns + 10_000_000,
            "{before:?} -> {after:?}"
        );
        // After the thread ends, the recorded times stand in for the live ones.
        stats.record_final_times();
        stats.tid.store(i32::MAX, Relaxed);
        let recorded = Snapshot::observe(&stats, "lo", false);
        assert!(recorded.cpu_ns >= after.cpu_ns, "{recorded:?}");
    }
}
