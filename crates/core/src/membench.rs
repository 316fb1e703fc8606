//! Single-core memory copy bandwidth, the yardstick of `scripts/bench-memory`:
//! a memory-to-memory transfer cannot beat copying the bytes once, so
//! "throughput / memcpy bandwidth" says how close to the machine's limit we
//! are. Run with `longhaul memcpy-bench` (hidden subcommand).

use std::time::Instant;

/// Size of each buffer: far beyond any cache, as the bench spec asks.
pub const BUFFER_LEN: usize = 256 << 20;

/// Copies between two `len`-byte non-zero buffers `rounds` times and returns
/// the best bandwidth seen, in bytes per second.
pub fn memcpy_bandwidth(len: usize, rounds: usize) -> f64 {
    let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
    // Non-zero and touched, so no page is faulted in during the timing.
    let mut dst = vec![0xa5u8; len];
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&dst);
        best = best.max(len as f64 / secs);
    }
    best
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_copy_reports_a_positive_bandwidth() {
        assert!(super::memcpy_bandwidth(1 << 20, 2) > 0.0);
    }
}
