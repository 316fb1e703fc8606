//! The `run` subcommand: create the two TUN devices, optionally install the
//! policy routing, start one forwarding thread per direction, report
//! counters, and on SIGINT/SIGTERM stop the threads, remove the routing and
//! print the final counters. The TUN devices vanish when their descriptors
//! close at the end.

use crate::error::{Error, Result};
use crate::forward::Direction;
use crate::routing::{self, Plan};
use crate::schedule::Shaper;
use crate::stats::{DirectionStats, Report, Snapshot};
use crate::tun::{Tun, MAX_GSO_PACKET, VNET_HDR_LEN};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Settings of the delay line itself.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub dev_a: String,
    pub dev_b: String,
    pub delay: Duration,
    pub rate_bps: u64,
    /// `None`: derived from rate and delay.
    pub queue_limit: Option<u64>,
    pub mtu: u32,
    pub txqueuelen: u32,
    pub sites: Option<(String, String)>,
    pub table_a: u32,
    pub table_b: u32,
    pub rule_priority: u32,
    pub stats_interval: Duration,
    pub realtime_priority: i32,
    /// GSO/checksum offload on the TUN devices (see `frame`).
    pub offload: bool,
}

/// Smallest MTU IPv4 allows; largest a TUN device takes.
pub const MTU_RANGE: std::ops::RangeInclusive<u32> = 68..=65535;
/// Default TUN transmit queue: packets the kernel may queue for us while the
/// forwarding thread is descheduled (the default 500 is 6 ms at 1 Gb/s).
pub const DEFAULT_TXQUEUELEN: u32 = 10_000;
/// SCHED_FIFO priority of the forwarding threads. Real time because a WAN
/// emulator must release packets on time even when the router's CPUs are
/// busy (on a loaded 2-core machine the normal scheduler let releases slip
/// by milliseconds and capped 1 Gb/s at 0.3-0.6 Gb/s); low within the RT range
/// so kernel threads (priority 50) still come first. The threads sleep
/// whenever nothing is due, and the kernel's RT throttling bounds them.
pub const DEFAULT_REALTIME_PRIORITY: i32 = 10;

/// Queue limit without a rate (nothing to derive it from).
const DEFAULT_UNPACED_LIMIT: u64 = 32 << 20;
/// The default queue holds at least this many full-size packets, so short
/// delays still absorb a burst.
const MIN_QUEUE_PACKETS: u64 = 64;
/// Extra ring space for packets whose release time has passed but that
/// are not written yet because the thread was descheduled (a loaded lab
/// router); overrunning it costs `dropped_ring` drops, never memory.
const RING_SLACK: Duration = Duration::from_millis(20);
/// How often the main thread checks for signals and dead threads.
const SUPERVISE_TICK: Duration = Duration::from_millis(200);

/// Bottleneck buffer used when `--queue-limit` is not given: one
/// bandwidth-delay product of the round trip (rate x 2 x delay), the
/// classic router buffer rule, but at least 64 MTU-sized packets.
pub fn default_queue_limit(rate_bps: u64, delay: Duration, mtu: u32) -> u64 {
    if rate_bps == 0 {
        return DEFAULT_UNPACED_LIMIT;
    }
    let bdp = (rate_bps as u128 * 2 * delay.as_nanos() / 8 / 1_000_000_000) as u64;
    bdp.max(MIN_QUEUE_PACKETS * mtu as u64)
}

/// Bytes of preallocated ring per direction: the queue, the bytes "on the
/// wire" (rate x delay), slack for a late thread, a read batch and
/// wrap-around waste (`max_frame` is the largest frame a read returns).
pub fn ring_bytes(rate_bps: u64, delay: Duration, queue_limit: u64, max_frame: usize) -> usize {
    let waste = (4 + 64) * max_frame as u64;
    if rate_bps == 0 {
        return (queue_limit + waste) as usize;
    }
    let in_flight = rate_bps as u128 * (delay + RING_SLACK).as_nanos() / 8 / 1_000_000_000;
    (queue_limit + in_flight as u64 + waste) as usize
}

fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, zero-initialized set; the mask
    // change affects this thread and the threads it spawns afterwards.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits up to `timeout` for SIGINT/SIGTERM; returns the signal if one came.
fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; we do not ask for siginfo.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

fn format_rate(bps: u64) -> String {
    match bps {
        0 => "unlimited".into(),
        b if b % 1_000_000_000 == 0 => format!("{}G", b / 1_000_000_000),
        b if b % 1_000_000 == 0 => format!("{}M", b / 1_000_000),
        b => format!("{b}"),
    }
}

/// One forwarding thread: its direction's label, its counters, the thread,
/// and its counters as last reported.
type Leg = (
    &'static str,
    Arc<DirectionStats>,
    thread::JoinHandle<Result<()>>,
    Snapshot,
);

/// Reports every leg's counters each `stats_interval` until a stop signal
/// comes or a forwarding thread ends; says which.
fn supervise(
    cfg: &RunConfig,
    signals: &libc::sigset_t,
    workers: &mut [Leg],
    input_names: &[String],
) -> String {
    let mut last_report = Instant::now();
    loop {
        if let Some(sig) = wait_signal(signals, SUPERVISE_TICK) {
            break format!("signal {sig}");
        }
        if let Some((label, ..)) = workers.iter().find(|w| w.2.is_finished()) {
            break format!("forwarding thread {label} stopped");
        }
        let elapsed = last_report.elapsed();
        if !cfg.stats_interval.is_zero() && elapsed >= cfg.stats_interval {
            for ((label, stats, _, prev), input) in workers.iter_mut().zip(input_names) {
                let now = Snapshot::observe(stats, input, true);
                crate::log(Report {
                    direction: label,
                    now,
                    prev: *prev,
                    seconds: elapsed.as_secs_f64(),
                });
                *prev = now;
            }
            last_report = Instant::now();
        }
    }
}

/// Joins the stopped forwarding threads and logs each one's totals; the
/// last failure, if any.
fn join_all(workers: Vec<Leg>, input_names: &[String]) -> Option<Error> {
    let mut failure = None;
    for ((label, stats, handle, _), input) in workers.into_iter().zip(input_names) {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(_) => {
                failure = Some(Error::Io {
                    what: "forwarding thread panicked",
                    source: std::io::Error::other(label),
                })
            }
        }
        // Joined: its thread id may be another thread's now; its recorded
        // times stand in.
        stats.tid.store(0, Relaxed);
        crate::log(format_args!(
            "total {}",
            Report {
                direction: label,
                now: Snapshot::observe(&stats, input, false),
                prev: Snapshot::default(),
                seconds: 0.0,
            },
        ));
    }
    failure
}

/// Runs the delay line until SIGINT/SIGTERM or a forwarding thread fails.
pub fn run(cfg: &RunConfig) -> Result<()> {
    let signals = block_stop_signals();
    let queue_limit = cfg
        .queue_limit
        .unwrap_or_else(|| default_queue_limit(cfg.rate_bps, cfg.delay, cfg.mtu));
    let max_frame = if cfg.offload {
        VNET_HDR_LEN + MAX_GSO_PACKET
    } else {
        cfg.mtu as usize
    };
    let ring = ring_bytes(cfg.rate_bps, cfg.delay, queue_limit, max_frame);

    let tun_a = Arc::new(Tun::create(&cfg.dev_a, cfg.offload)?);
    let tun_b = Arc::new(Tun::create(&cfg.dev_b, cfg.offload)?);
    tun_a.configure(cfg.mtu, cfg.txqueuelen)?;
    tun_b.configure(cfg.mtu, cfg.txqueuelen)?;
    let mut routing = match &cfg.sites {
        Some((site_a, site_b)) => Some(routing::install(&Plan {
            site_a: site_a.clone(),
            site_b: site_b.clone(),
            tun_a: tun_a.name().to_string(),
            tun_b: tun_b.name().to_string(),
            table_a: cfg.table_a,
            table_b: cfg.table_b,
            priority: cfg.rule_priority,
        })?),
        None => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let delay_ns = cfg.delay.as_nanos() as u64;
    let legs = [("a->b", &tun_a, &tun_b), ("b->a", &tun_b, &tun_a)];
    let input_names = [tun_a.name().to_string(), tun_b.name().to_string()];
    let mut workers = Vec::new();
    for (label, input, output) in legs {
        let stats = Arc::new(DirectionStats::default());
        let direction = Direction {
            label,
            input: input.fd(),
            output: output.fd(),
            shaper: Shaper::new(delay_ns, cfg.rate_bps, queue_limit),
            ring_bytes: ring,
            max_frame,
            offload: cfg.offload,
            stats: stats.clone(),
            stop: stop.clone(),
            realtime_priority: cfg.realtime_priority,
        };
        let handle = thread::Builder::new()
            .name(format!("delay {label}"))
            .spawn(move || direction.run())
            .map_err(|source| Error::Io {
                what: "starting a forwarding thread",
                source,
            })?;
        workers.push((label, stats, handle, Snapshot::default()));
    }

    println!(
        "longhaul-delay: ready dev-a={} dev-b={} delay={:?} rate={} queue-limit={} mtu={} offload={} ring={} routing={}",
        tun_a.name(),
        tun_b.name(),
        cfg.delay,
        format_rate(cfg.rate_bps),
        queue_limit,
        cfg.mtu,
        cfg.offload,
        ring,
        match &cfg.sites {
            Some((a, b)) => format!("{a}<->{b}"),
            None => "none".into(),
        }
    );
    let _ = std::io::stdout().flush();

    let reason = supervise(cfg, &signals, &mut workers, &input_names);
    crate::log(format_args!("stopping ({reason})"));
    stop.store(true, Relaxed);
    let failure = join_all(workers, &input_names);
    if let Some(installed) = routing.as_mut() {
        for e in installed.remove() {
            crate::log(format_args!("teardown: {e}"));
        }
    }
    drop(routing);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_queue_is_one_round_trip_bdp() {
        // 1 Gb/s x 93 ms = 11.625 MB.
        assert_eq!(
            default_queue_limit(1_000_000_000, Duration::from_micros(46_500), 1500),
            11_625_000
        );
        // Tiny delay: at least 64 full packets.
        assert_eq!(
            default_queue_limit(1_000_000_000, Duration::from_micros(10), 1500),
            96_000
        );
        assert_eq!(
            default_queue_limit(0, Duration::from_millis(10), 1500),
            32 << 20
        );
    }

    #[test]
    fn ring_covers_queue_and_wire() {
        let limit = 11_625_000;
        let bytes = ring_bytes(1_000_000_000, Duration::from_micros(46_500), limit, 1500);
        // queue + 66.5 ms at 1 Gb/s + waste
        assert!(bytes as u64 >= limit + 8_312_500);
        assert!(bytes < 25 << 20);
    }
}
