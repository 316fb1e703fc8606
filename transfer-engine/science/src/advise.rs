//! `longhaul advise`: how many streams of which buffer fill a path.
//!
//! The engine's probe ([`probe::measure`]) times pings over an authenticated
//! control connection (no data connections) and brings both ends' socket
//! buffer limits (ours from /proc/sys, the server's in the first `Pong`);
//! for the target rate this module computes the bandwidth-delay product
//! BDP = rate x RTT. A single
//! stream needs a window of BDP; a socket buffer can be at most the limit
//! (sender's `net.core.wmem_max`, receiver's `net.core.rmem_max`), so:
//!
//! ```text
//! streams = ceil(BDP / min(BDP, limit))
//! buffer  = ceil(BDP / streams)        (<= limit; buffer x streams ~ BDP)
//! ```
//!
//! When a limit is below the BDP, the advice names the sysctl, the host it
//! is on, and a value (the next power of two above the BDP) that would let
//! one stream fill the path. The RTT used is the median of the timed pings:
//! the path's RTT including the queueing it typically has.

use crate::Result;
use longhaul_engine::auth::Token;
use longhaul_engine::limits::{MAX_BUFFER, MAX_STREAMS};
use longhaul_engine::messages::SocketLimits;
use longhaul_engine::probe::{self, RMEM_MAX, TCP_RMEM, TCP_WMEM, WMEM_MAX};
use longhaul_units::{format_bps, format_bytes, size_arg};
use serde::Serialize;

/// Default target rate of `advise`: the reference campaigns' 10G links.
pub const DEFAULT_RATE_BPS: u64 = 10_000_000_000;

/// Default number of timed pings. Ten samples give a stable median on a
/// quiet path and take ten RTTs (under two seconds at 170 ms).
pub const DEFAULT_PINGS: u32 = 10;

/// `longhaul advise` options.
#[derive(Debug, Clone)]
pub struct AdviseOptions {
    pub to: String,
    pub rate_bps: u64,
    pub pings: u32,
    pub token: Option<Token>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RttStats {
    pub samples: usize,
    pub min_us: f64,
    pub median_us: f64,
    pub max_us: f64,
}

/// One sysctl to raise.
#[derive(Debug, Clone, Serialize)]
pub struct SysctlAdvice {
    /// `local` (this host, the sender) or `remote` (the server, the receiver).
    pub host: &'static str,
    pub name: &'static str,
    pub current: String,
    pub set: String,
    pub command: String,
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    pub streams: u32,
    pub buffer_bytes: u64,
    /// `--buffer` as the CLI takes it.
    pub buffer: String,
    pub product_bytes: u64,
    /// buffer x streams / BDP.
    pub product_vs_bdp: f64,
    pub command: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub to: String,
    pub target_rate_bps: u64,
    pub rtt: RttStats,
    /// The RTT the advice uses (median), microseconds.
    pub rtt_us: f64,
    pub bdp_bytes: u64,
    pub local_limits: SocketLimits,
    pub remote_limits: SocketLimits,
    /// Largest useful socket buffer: min(local wmem_max, remote rmem_max).
    pub buffer_limit_bytes: u64,
    pub recommendation: Recommendation,
    pub sysctl: Vec<SysctlAdvice>,
}

/// Buffer x streams for a BDP under a buffer limit (both bytes).
pub fn recommend(bdp: u64, limit: u64) -> (u32, u64) {
    let bdp = bdp.max(1);
    let per = bdp.min(limit.max(1));
    let streams = bdp.div_ceil(per).clamp(1, MAX_STREAMS as u64);
    let mut buffer = bdp.div_ceil(streams);
    // Round to whole KiB when that moves the product by under 2% and stays
    // within the limit.
    let rounded = buffer.div_ceil(1024) * 1024;
    if buffer >= 64 << 10 && rounded <= limit {
        buffer = rounded;
    }
    (streams as u32, buffer.min(MAX_BUFFER))
}

fn next_pow2(v: u64) -> u64 {
    v.max(1).next_power_of_two()
}

/// The sysctls that keep one stream from reaching the BDP.
pub fn sysctl_advice(bdp: u64, local: &SocketLimits, remote: &SocketLimits) -> Vec<SysctlAdvice> {
    let want = next_pow2(bdp);
    let mut out = Vec::new();
    let mut single = |host: &'static str, name: &'static str, current: Option<u64>, why: &str| {
        if let Some(cur) = current {
            if cur < bdp {
                out.push(SysctlAdvice {
                    host,
                    name,
                    current: cur.to_string(),
                    set: want.to_string(),
                    command: format!("sysctl -w {name}={want}"),
                    why: why.to_string(),
                });
            }
        }
    };
    single(
        "local",
        WMEM_MAX,
        local.wmem_max,
        "caps the sender's SO_SNDBUF (--buffer)",
    );
    single(
        "remote",
        RMEM_MAX,
        remote.rmem_max,
        "caps the receiver's SO_RCVBUF (--buffer)",
    );
    let mut triple =
        |host: &'static str, name: &'static str, current: Option<[u64; 3]>, why: &str| {
            if let Some([min, def, max]) = current {
                if max < bdp {
                    out.push(SysctlAdvice {
                        host,
                        name,
                        current: format!("{min} {def} {max}"),
                        set: format!("{min} {def} {want}"),
                        command: format!("sysctl -w {name}=\"{min} {def} {want}\""),
                        why: why.to_string(),
                    });
                }
            }
        };
    triple(
        "local",
        TCP_WMEM,
        local.tcp_wmem,
        "caps send-buffer autotuning (tools that set no buffer)",
    );
    triple(
        "remote",
        TCP_RMEM,
        remote.tcp_rmem,
        "caps receive-window autotuning (tools that set no buffer)",
    );
    out
}

/// Probes the path and computes the advice.
pub fn run(opts: &AdviseOptions) -> Result<Advice> {
    let probe = probe::measure(&opts.to, opts.token.as_ref(), opts.pings)?;
    Ok(advise(
        &opts.to,
        opts.rate_bps,
        &probe.samples_us,
        probe::local_limits(),
        probe.remote,
    ))
}

/// The advice for RTT samples (microseconds) and both ends' limits.
pub fn advise(
    to: &str,
    rate_bps: u64,
    samples_us: &[f64],
    local: SocketLimits,
    remote: SocketLimits,
) -> Advice {
    let mut s = samples_us.to_vec();
    s.sort_by(f64::total_cmp);
    let median = if s.is_empty() { 0.0 } else { s[s.len() / 2] };
    let rtt = RttStats {
        samples: s.len(),
        min_us: round2(s.first().copied().unwrap_or(0.0)),
        median_us: round2(median),
        max_us: round2(s.last().copied().unwrap_or(0.0)),
    };
    let bdp = ((rate_bps as f64 / 8.0) * (median / 1e6)).ceil().max(1.0) as u64;
    let limit = local
        .wmem_max
        .unwrap_or(MAX_BUFFER)
        .min(remote.rmem_max.unwrap_or(MAX_BUFFER));
    let (streams, buffer) = recommend(bdp, limit);
    let product = buffer * streams as u64;
    Advice {
        kind: "advice",
        to: to.to_string(),
        target_rate_bps: rate_bps,
        rtt_us: round2(median),
        rtt,
        bdp_bytes: bdp,
        local_limits: local,
        remote_limits: remote,
        buffer_limit_bytes: limit,
        recommendation: Recommendation {
            streams,
            buffer_bytes: buffer,
            buffer: size_arg(buffer),
            product_bytes: product,
            product_vs_bdp: (product as f64 / bdp as f64 * 1000.0).round() / 1000.0,
            command: format!(
                "longhaul send --to {to} --streams {streams} --buffer {}",
                size_arg(buffer)
            ),
        },
        sysctl: sysctl_advice(bdp, &local, &remote),
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

impl Advice {
    /// Human-readable advice, a few lines.
    pub fn human(&self) -> String {
        let r = &self.recommendation;
        let mut out = format!(
            "path to {}: RTT median {:.0} us (min {:.0}, max {:.0}, {} pings)\n\
             target {}: bandwidth-delay product {}\n\
             socket buffer limit {} (local wmem_max {}, remote rmem_max {})\n\
             recommended: {} stream(s) x {} buffer = {} ({:.0}% of the BDP)\n  {}",
            self.to,
            self.rtt.median_us,
            self.rtt.min_us,
            self.rtt.max_us,
            self.rtt.samples,
            format_bps(self.target_rate_bps as f64),
            format_bytes(self.bdp_bytes),
            format_bytes(self.buffer_limit_bytes),
            opt_bytes(self.local_limits.wmem_max),
            opt_bytes(self.remote_limits.rmem_max),
            r.streams,
            format_bytes(r.buffer_bytes),
            format_bytes(r.product_bytes),
            r.product_vs_bdp * 100.0,
            r.command
        );
        if self.sysctl.is_empty() {
            out.push_str("\nbuffer limits allow one stream to fill the path");
        } else {
            out.push_str("\nlimits below the BDP (raise them to need fewer streams):");
            for s in &self.sysctl {
                let host = if s.host == "local" {
                    "on this host (sender)"
                } else {
                    "on the server (receiver)"
                };
                out.push_str(&format!(
                    "\n  {host}: {}  (now {}; {})",
                    s.command, s.current, s.why
                ));
            }
        }
        out
    }
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map(format_bytes).unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recommendation_stays_within_20_percent_of_the_bdp() {
        // 1 Gb/s x 93 ms = 11.6 MB; limits from 64 KiB to 64 MiB.
        let bdp = 1_000_000_000 / 8 * 93 / 1000;
        for limit in [64 << 10, 212992, 2 << 20, 4 << 20, 6 << 20, 64 << 20] {
            let (streams, buffer) = recommend(bdp, limit);
            assert!(buffer <= limit, "{limit}");
            let ratio = (streams as u64 * buffer) as f64 / bdp as f64;
            assert!((0.8..=1.2).contains(&ratio), "limit {limit}: {ratio}");
        }
        assert_eq!(recommend(bdp, 64 << 20).0, 1);
        assert_eq!(recommend(bdp, 2 << 20).0, 6);
    }

    #[test]
    fn low_limits_name_the_sysctl_and_a_value() {
        let low = SocketLimits {
            rmem_max: Some(212992),
            wmem_max: Some(212992),
            tcp_rmem: Some([4096, 131072, 6291456]),
            tcp_wmem: Some([4096, 16384, 4194304]),
        };
        let a = advise("h:1", 1_000_000_000, &[93_000.0; 5], low, low);
        let names: Vec<_> = a.sysctl.iter().map(|s| (s.host, s.name)).collect();
        assert!(names.contains(&("local", "net.core.wmem_max")), "{names:?}");
        assert!(
            names.contains(&("remote", "net.core.rmem_max")),
            "{names:?}"
        );
        assert!(a.sysctl[0].command.ends_with("=16777216"), "{:?}", a.sysctl);
        assert!(a.human().contains("sysctl -w net.core.wmem_max=16777216"));
    }
}
