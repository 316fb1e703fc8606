//! In-process pacing shared by all sending streams of one direction.
//!
//! SO_MAX_PACING_RATE is set too, but it only shapes what TCP emits, per
//! socket; this pacer bounds what the application hands to the kernel, in
//! total, so `--rate` holds even where the kernel does not pace. It is a
//! virtual clock: each chunk reserves `bytes * 8 / rate` seconds after the
//! previous reservation, and the stream sends it once its slot has come
//! (the data workers wait for the slot with a timer, never asleep).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far the virtual clock may lag real time before it is pulled forward.
/// Bounds the burst after a stall (e.g. a blocked write) to ~10 ms worth of
/// data instead of letting the pacer "catch up" at line rate.
const MAX_LAG: Duration = Duration::from_millis(10);

/// Largest chunk senders use while paced: small enough that 35 streams
/// sharing a few hundred Mb/s still interleave smoothly.
pub(crate) const PACED_CHUNK: usize = 64 << 10;

/// Smallest paced chunk: about one MTU-sized segment.
const MIN_PACED_CHUNK: usize = 1500;

/// At low rates a chunk is what the whole rate carries in this time, so
/// streams interleave smoothly.
const CHUNK_TIME: Duration = Duration::from_millis(10);

/// And at most what one stream's share carries in this time: the streams
/// take their chunks in turn, so this is about how long the last of many
/// waits for its first one. With chunks of 10 ms of the whole rate, 1024
/// streams sharing 90 Mb/s waited 6 s, while each socket, paced at its
/// share (11 kB/s), took 6 s to send the 64 KiB chunk it had.
const SHARE_TIME: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct Pacer {
    bits_per_second: f64,
    /// Streams sharing the rate.
    streams: usize,
    next: Mutex<Instant>,
}

impl Pacer {
    /// A pacer for one stream.
    pub fn new(bits_per_second: u64) -> Pacer {
        Pacer::shared(bits_per_second, 1)
    }

    /// A pacer whose rate `streams` streams share.
    pub(crate) fn shared(bits_per_second: u64, streams: usize) -> Pacer {
        Pacer {
            bits_per_second: bits_per_second as f64,
            streams: streams.max(1),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Chunk size for this rate (see [`CHUNK_TIME`], [`SHARE_TIME`]).
    pub(crate) fn chunk(&self) -> usize {
        let bytes = self.bits_per_second / 8.0;
        let whole = bytes * CHUNK_TIME.as_secs_f64();
        let share = bytes / self.streams as f64 * SHARE_TIME.as_secs_f64();
        (whole.min(share) as usize).clamp(MIN_PACED_CHUNK, PACED_CHUNK)
    }

    /// Reserves `bytes`; they may be sent from the returned instant on.
    pub fn reserve(&self, bytes: usize) -> Instant {
        let cost = Duration::from_secs_f64(bytes as f64 * 8.0 / self.bits_per_second);
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if *next + MAX_LAG < now {
            *next = now - MAX_LAG;
        }
        let slot = *next;
        *next += cost;
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_holds_the_rate() {
        // 80 Mb/s = 10 MB/s: 2 MB takes ~200 ms.
        let p = Pacer::new(80_000_000);
        let t = Instant::now();
        let mut last = t;
        for _ in 0..32 {
            last = p.reserve(64 << 10);
        }
        // The 32nd chunk's slot: 31 chunks of 6.5 ms after the first, which
        // may start up to MAX_LAG early.
        let s = last.saturating_duration_since(t).as_secs_f64();
        assert!(s > 0.19 && s < 0.21, "{s}");
    }

    #[test]
    fn chunks_shrink_at_low_rates() {
        assert_eq!(Pacer::new(10_000_000_000).chunk(), PACED_CHUNK);
        assert_eq!(Pacer::new(8_000_000).chunk(), 10_000);
        assert_eq!(Pacer::new(1_000).chunk(), MIN_PACED_CHUNK);
    }

    #[test]
    fn many_streams_sharing_a_rate_take_smaller_chunks() {
        // 35 streams sharing 200 Mb/s: 71 kB in 100 ms each, a full chunk.
        assert_eq!(Pacer::shared(200_000_000, 35).chunk(), PACED_CHUNK);
        // 128 streams sharing 200 Mb/s: 100 ms of a share is 19.5 kB.
        assert_eq!(Pacer::shared(200_000_000, 128).chunk(), 19_531);
        // 1024 streams sharing 90 Mb/s: 1.1 kB, so about a segment; the last
        // stream has its first chunk after 1024 x 1500 B = 137 ms.
        assert_eq!(Pacer::shared(90_000_000, 1024).chunk(), MIN_PACED_CHUNK);
        // Few streams: the 10 ms of the whole rate rule as before.
        assert_eq!(Pacer::shared(8_000_000, 2).chunk(), 10_000);
    }
}
