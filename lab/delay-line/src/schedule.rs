//! The delay line's model of one direction of a WAN path, as pure arithmetic
//! on nanosecond timestamps (no clock, no I/O, so it is unit-tested with a
//! fake clock).
//!
//! A packet that arrives at time `t` first waits in the bottleneck queue, is
//! serialized at `rate`, then spends `delay` on the "wire":
//!
//! ```text
//! start   = max(t, link_free_at)          // queue behind earlier packets
//! link_free_at = start + len * 8 / rate   // serialization (the pacing)
//! release = link_free_at + delay          // propagation
//! ```
//!
//! The delay is the same for every packet, so release times are increasing
//! and one FIFO per direction is the whole scheduler. The bottleneck queue
//! holds the bytes not yet serialized at time `t`, `(link_free_at - t) *
//! rate / 8`; a packet that would push it above the queue limit is tail
//! dropped, like a router's output buffer. Bytes already serialized and "on
//! the wire" do not count against the limit (they are the path's
//! bandwidth-delay product, not its buffer).
//!
//! With `rate == 0` there is no pacing: `release = t + delay` and the limit
//! caps all bytes held.

/// Nanoseconds in a second, for rate arithmetic.
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// What to do with an arriving packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hold it and write it out at this monotonic time (ns).
    Release(u64),
    /// The bottleneck queue is full: tail drop.
    Drop,
}

/// Delay, rate and queue limit of one direction, plus the virtual clock of
/// its bottleneck link.
#[derive(Debug, Clone)]
pub struct Shaper {
    delay_ns: u64,
    rate_bps: u64,
    queue_limit: u64,
    link_free_at: u64,
}

impl Shaper {
    /// A shaper with a one-way `delay_ns`, a bottleneck of `rate_bps` bits/s
    /// (0 = unlimited) and a bottleneck queue of `queue_limit` bytes.
    pub fn new(delay_ns: u64, rate_bps: u64, queue_limit: u64) -> Self {
        Shaper {
            delay_ns,
            rate_bps,
            queue_limit,
            link_free_at: 0,
        }
    }

    /// Serialization time of `len` bytes at the configured rate, rounded up.
    pub fn tx_time_ns(&self, len: usize) -> u64 {
        if self.rate_bps == 0 {
            return 0;
        }
        let bits = len as u128 * 8 * NANOS_PER_SEC;
        bits.div_ceil(self.rate_bps as u128) as u64
    }

    /// Bytes waiting in the bottleneck queue at time `now` (not yet
    /// serialized). `held` is what the caller holds in total; it is the
    /// answer when there is no rate.
    pub fn backlog_bytes(&self, now: u64, held: u64) -> u64 {
        if self.rate_bps == 0 {
            return held;
        }
        let waiting_ns = self.link_free_at.saturating_sub(now) as u128;
        (waiting_ns * self.rate_bps as u128 / 8 / NANOS_PER_SEC) as u64
    }

    /// Decides the fate of a `len`-byte packet read at `now`; `held` is the
    /// number of bytes the caller currently holds (used only without a rate).
    pub fn admit(&mut self, now: u64, len: usize, held: u64) -> Verdict {
        if self.backlog_bytes(now, held) + len as u64 > self.queue_limit {
            return Verdict::Drop;
        }
        if self.rate_bps == 0 {
            return Verdict::Release(now + self.delay_ns);
        }
        let start = self.link_free_at.max(now);
        self.link_free_at = start + self.tx_time_ns(len);
        Verdict::Release(self.link_free_at + self.delay_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const GBIT: u64 = 1_000_000_000;

    #[test]
    fn idle_packet_is_held_for_delay_plus_its_serialization() {
        let mut s = Shaper::new(46_500_000, GBIT, 1 << 20);
        // 1500 bytes at 1 Gb/s take 12 us on the wire.
        assert_eq!(
            s.admit(1_000 * MS, 1500, 0),
            Verdict::Release(1_000 * MS + 12_000 + 46_500_000)
        );
    }

    #[test]
    fn back_to_back_packets_are_paced_at_the_rate() {
        let mut s = Shaper::new(10 * MS, GBIT, 1 << 20);
        let t = 5 * MS;
        let releases: Vec<u64> = (0..4)
            .map(|_| match s.admit(t, 1500, 0) {
                Verdict::Release(r) => r,
                Verdict::Drop => panic!("dropped"),
            })
            .collect();
        for (i, r) in releases.iter().enumerate() {
            assert_eq!(*r, t + 10 * MS + 12_000 * (i as u64 + 1));
        }
        // The queue now holds the three packets behind the first one's
        // serialization: 4 * 1500 bytes not yet on the wire.
        assert_eq!(s.backlog_bytes(t, 0), 6000);
        // After the link drained, the next packet starts fresh.
        assert_eq!(
            s.admit(t + MS, 100, 0),
            Verdict::Release(t + MS + 800 + 10 * MS)
        );
    }

    #[test]
    fn long_run_rate_matches_setting() {
        let rate = 200_000_000;
        let mut s = Shaper::new(20 * MS, rate, u64::MAX);
        // Offer 10x the rate for a while; the last release tells the rate.
        let mut last = 0;
        let n = 10_000u64;
        for i in 0..n {
            let now = i * 6_000; // 1500 B every 6 us = 2 Gb/s offered
            if let Verdict::Release(r) = s.admit(now, 1500, 0) {
                last = r;
            }
        }
        let seconds = (last - 20 * MS) as f64 / 1e9;
        let bps = (n * 1500 * 8) as f64 / seconds;
        assert!((bps - rate as f64).abs() / (rate as f64) < 1e-3, "{bps}");
    }

    #[test]
    fn queue_limit_tail_drops_and_recovers() {
        let limit = 10 * 1500;
        let mut s = Shaper::new(MS, GBIT, limit);
        let now = 100 * MS;
        let mut admitted = 0;
        let mut dropped = 0;
        for _ in 0..30 {
            match s.admit(now, 1500, 0) {
                Verdict::Release(_) => admitted += 1,
                Verdict::Drop => dropped += 1,
            }
        }
        assert_eq!(admitted, 10);
        assert_eq!(dropped, 20);
        assert!(s.backlog_bytes(now, 0) <= limit);
        // One serialization time later there is room for exactly one more.
        let later = now + 12_000;
        assert!(matches!(s.admit(later, 1500, 0), Verdict::Release(_)));
        assert_eq!(s.admit(later, 1500, 0), Verdict::Drop);
    }

    #[test]
    fn unlimited_rate_only_delays_and_caps_held_bytes() {
        let mut s = Shaper::new(3 * MS, 0, 4000);
        assert_eq!(s.admit(7, 1500, 0), Verdict::Release(7 + 3 * MS));
        assert_eq!(s.admit(7, 1500, 1500), Verdict::Release(7 + 3 * MS));
        assert_eq!(s.admit(7, 1500, 3000), Verdict::Drop);
    }

    #[test]
    fn release_times_never_go_backwards() {
        let mut s = Shaper::new(46_500_000, GBIT, 1 << 22);
        let mut now = 0u64;
        let mut last = 0u64;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            now += seed % 20_000;
            let len = 40 + (seed >> 20) as usize % 1460;
            if let Verdict::Release(r) = s.admit(now, len, 0) {
                assert!(r >= last);
                assert!(r >= now + 46_500_000);
                last = r;
            }
        }
    }
}
