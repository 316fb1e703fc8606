//! One direction of the delay line: read packets from the input TUN, stamp
//! and schedule them with a [`Shaper`], hold them in a [`PacketRing`], and
//! write each to the output TUN at its release time. One thread per
//! direction; the loop alternates a bounded batch of non-blocking reads, the
//! writes that are due, and a `ppoll` that sleeps until the next release or
//! the next readable packet.
//!
//! Writing a packet to a TUN device injects it into the kernel as if it had
//! been received on that device, so the kernel routes it on from there.

use crate::clock;
use crate::error::{Error, Result};
use crate::frame;
use crate::ring::PacketRing;
use crate::schedule::{Shaper, Verdict};
use crate::stats::DirectionStats;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Reads per loop turn before the due writes get a chance: bounds how late
/// a release can be while a burst arrives (64 x 12 us at 1 Gb/s / 1500 B).
const READ_BATCH: usize = 64;
/// Longest sleep when nothing is held, so a stop request is seen quickly.
const IDLE_WAIT_NS: u64 = 50_000_000;
/// Packets due within this much are written now instead of after another
/// sleep: a wake-up costs about as much, and it keeps bursts together.
const RELEASE_SLACK_NS: u64 = 5_000;

/// Everything one forwarding thread needs.
pub struct Direction {
    /// Label for errors and reports, e.g. `a->b`.
    pub label: &'static str,
    pub input: RawFd,
    pub output: RawFd,
    pub shaper: Shaper,
    pub ring_bytes: usize,
    /// Largest frame a read can return: the TUN MTU, or header plus a 64 KB
    /// GSO packet with offload.
    pub max_frame: usize,
    /// Frames carry a virtio-net header (see [`crate::frame`]).
    pub offload: bool,
    pub stats: Arc<DirectionStats>,
    pub stop: Arc<AtomicBool>,
    /// SCHED_FIFO priority for this thread; 0 keeps the normal scheduler.
    pub realtime_priority: i32,
}

enum ReadOutcome {
    Packet(usize),
    Empty,
}

fn read_packet(fd: RawFd, buf: &mut [u8]) -> io::Result<ReadOutcome> {
    loop {
        // SAFETY: buf is a valid writable slice of buf.len() bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return Ok(ReadOutcome::Packet(n as usize));
        }
        if n == 0 {
            return Ok(ReadOutcome::Empty);
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Empty),
            _ => return Err(err),
        }
    }
}

fn write_packet(fd: RawFd, packet: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: packet is a valid readable slice.
        let n = unsafe { libc::write(fd, packet.as_ptr().cast(), packet.len()) };
        if n >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Moves the calling thread to SCHED_FIFO. Needs CAP_SYS_NICE (and, in a
/// container on a cgroup-v1 host with RT group scheduling, an RT budget).
fn set_realtime(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_self is always valid; param is a valid sched_param.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

impl Direction {
    /// Forwards until `stop` is set. Returns an error only when the input
    /// device fails (e.g. it was deleted); failed writes are counted.
    pub fn run(self) -> Result<()> {
        let stats = self.stats.clone();
        stats.set_thread();
        let result = self.forward();
        stats.record_final_times();
        result
    }

    fn forward(mut self) -> Result<()> {
        clock::set_precise_timers();
        if self.realtime_priority > 0 {
            if let Err(e) = set_realtime(self.realtime_priority) {
                crate::log(format_args!(
                    "{}: cannot use SCHED_FIFO priority {} ({e}); \
                     staying on the normal scheduler, release times may slip under CPU load",
                    self.label, self.realtime_priority
                ));
            }
        }
        let stats = self.stats.clone();
        let mut ring = PacketRing::new(self.ring_bytes);
        let mut scratch = vec![0u8; self.max_frame];
        let read_err = |source| Error::Io {
            what: "reading from the input tun",
            source,
        };
        while !self.stop.load(Relaxed) {
            // 1. Take in what has arrived (bounded, so writes are not starved).
            let mut drained = false;
            for _ in 0..READ_BATCH {
                // Read straight into the ring; when it is full, into scratch
                // space, to count and drop.
                let (slot, in_ring) = match ring.reserve(self.max_frame) {
                    Some(slot) => (slot, true),
                    None => (&mut scratch[..], false),
                };
                let ReadOutcome::Packet(len) = read_packet(self.input, slot).map_err(read_err)?
                else {
                    drained = true;
                    break;
                };
                let wire = frame::wire_len(&slot[..len], self.offload);
                let now = clock::now_ns();
                stats.rx_packets.fetch_add(1, Relaxed);
                stats.rx_bytes.fetch_add(wire as u64, Relaxed);
                if !in_ring {
                    stats.dropped_ring.fetch_add(1, Relaxed);
                    continue;
                }
                match self.shaper.admit(now, wire, ring.held_bytes()) {
                    Verdict::Release(at) => ring.commit(self.max_frame, len, at),
                    Verdict::Drop => {
                        stats.dropped_queue.fetch_add(1, Relaxed);
                    }
                }
            }

            // 2. Write out everything that is due.
            let now = clock::now_ns();
            let mut late_max = 0;
            while let Some(release) = ring.next_release() {
                if release > now + RELEASE_SLACK_NS {
                    break;
                }
                let frame = ring.front().expect("a release time implies a packet");
                match write_packet(self.output, frame) {
                    Ok(()) => {
                        let wire = frame::wire_len(frame, self.offload);
                        stats.tx_packets.fetch_add(1, Relaxed);
                        stats.tx_bytes.fetch_add(wire as u64, Relaxed);
                    }
                    Err(_) => {
                        stats.tx_errors.fetch_add(1, Relaxed);
                    }
                }
                let late = now.saturating_sub(release);
                stats.late_sum_ns.fetch_add(late, Relaxed);
                late_max = late_max.max(late);
                ring.pop();
            }
            stats.late_max_ns.fetch_max(late_max, Relaxed);
            stats.late_max_total_ns.fetch_max(late_max, Relaxed);
            stats.held_bytes.store(ring.held_bytes(), Relaxed);
            stats.held_packets.store(ring.len() as u64, Relaxed);
            stats
                .backlog_bytes
                .store(self.shaper.backlog_bytes(now, ring.held_bytes()), Relaxed);

            // 3. Sleep until the next release or the next packet (unless the
            // batch ended with packets still waiting to be read).
            if !drained {
                continue;
            }
            let timeout = match ring.next_release() {
                Some(release) => release.saturating_sub(now).min(IDLE_WAIT_NS),
                None => IDLE_WAIT_NS,
            };
            clock::wait_readable(self.input, timeout).map_err(|source| Error::Io {
                what: "waiting for the input tun",
                source,
            })?;
        }
        Ok(())
    }
}
