//! Probing a path over the control connection: `Ping` / `Pong` after the
//! handshake, without data connections. The client times the round trips
//! ([`measure`]); the server answers each ping ([`answer`]), the first one
//! with its socket buffer limits. `longhaul advise` builds its advice on
//! this.
//!
//! A host's socket buffer limits come from /proc/sys: `net.core.wmem_max` /
//! `rmem_max` cap what SO_SNDBUF / SO_RCVBUF (the engine's `--buffer`) can
//! get; `net.ipv4.tcp_wmem` / `tcp_rmem` bound TCP's autotuning, which tools
//! that set no buffer (iperf3 without `-w`) live with.

use std::path::Path;
use std::time::Instant;

use crate::auth::Token;
use crate::connection::{self, Connection};
use crate::error::{Error, Result};
use crate::handshake;
use crate::messages::{Message, Ping, Pong, SocketLimits};

/// Pings a server answers on one connection before it hangs up: a client's
/// timed pings at most plus the untimed first one. Bounds how long a
/// pinging client can hold one of the server's session slots.
pub const MAX_PINGS: u64 = 10_001;

/// What a probe measured.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    /// Round-trip times of the timed pings, microseconds, in order.
    pub samples_us: Vec<f64>,
    /// The server's socket buffer limits.
    pub remote: SocketLimits,
}

/// The server's answer to a ping.
pub(crate) fn answer(ping: &Ping) -> Pong {
    Pong {
        seq: ping.seq,
        limits: ping.limits.then(local_limits),
    }
}

fn ping(conn: &mut Connection, seq: u64, want_limits: bool) -> Result<Pong> {
    conn.send(&Message::Ping(Ping {
        seq,
        limits: want_limits,
    }))?;
    match conn.recv()? {
        Message::Pong(p) if p.seq == seq => Ok(p),
        Message::Pong(p) => Err(Error::Protocol(format!(
            "pong {} answers no ping of ours (sent {seq})",
            p.seq
        ))),
        other => Err(Error::Protocol(format!(
            "expected Pong, got {:?} (does the server predate advise?)",
            other.kind()
        ))),
    }
}

/// Authenticates to the server at `to` and times `pings` round trips
/// (1 ..= [`MAX_PINGS`] - 1).
pub fn measure(to: &str, token: Option<&Token>, pings: u32) -> Result<ProbeResult> {
    if pings == 0 || u64::from(pings) >= MAX_PINGS {
        return Err(Error::Usage(format!(
            "--pings must be between 1 and {}",
            MAX_PINGS - 1
        )));
    }
    let addr = connection::resolve(to)?;
    let mut conn = Connection::new(connection::connect(addr)?)?;
    handshake::client_authenticate(&mut conn, token)?;
    // The first ping carries the limits (reading /proc costs the server a
    // little time) and warms the path; it is not timed.
    let remote = ping(&mut conn, 0, true)?.limits.unwrap_or_default();
    let mut samples_us = Vec::with_capacity(pings as usize);
    for seq in 1..=u64::from(pings) {
        let t = Instant::now();
        ping(&mut conn, seq, false)?;
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
    Ok(ProbeResult { samples_us, remote })
}

/// The four sysctls, by their `sysctl` names.
pub const RMEM_MAX: &str = "net.core.rmem_max";
pub const WMEM_MAX: &str = "net.core.wmem_max";
pub const TCP_RMEM: &str = "net.ipv4.tcp_rmem";
pub const TCP_WMEM: &str = "net.ipv4.tcp_wmem";

fn read_values(root: &Path, name: &str) -> Option<Vec<u64>> {
    let path = root.join(name.replace('.', "/"));
    let text = std::fs::read_to_string(path).ok()?;
    let v: Option<Vec<u64>> = text.split_whitespace().map(|w| w.parse().ok()).collect();
    v.filter(|v| !v.is_empty())
}

fn triple(v: Option<Vec<u64>>) -> Option<[u64; 3]> {
    v.and_then(|v| v.try_into().ok())
}

/// Reads the limits under `root` (normally `/proc/sys`).
pub(crate) fn read_limits(root: &Path) -> SocketLimits {
    SocketLimits {
        rmem_max: read_values(root, RMEM_MAX).map(|v| v[0]),
        wmem_max: read_values(root, WMEM_MAX).map(|v| v[0]),
        tcp_rmem: triple(read_values(root, TCP_RMEM)),
        tcp_wmem: triple(read_values(root, TCP_WMEM)),
    }
}

/// This host's limits.
pub fn local_limits() -> SocketLimits {
    read_limits(Path::new("/proc/sys"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fake_proc_sys() {
        let dir = std::env::temp_dir().join(format!("longhaul-limits-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/core")).unwrap();
        std::fs::create_dir_all(dir.join("net/ipv4")).unwrap();
        std::fs::write(dir.join("net/core/rmem_max"), "4194304\n").unwrap();
        std::fs::write(dir.join("net/ipv4/tcp_wmem"), "4096\t16384\t4194304\n").unwrap();
        let l = read_limits(&dir);
        assert_eq!(l.rmem_max, Some(4 << 20));
        assert_eq!(l.wmem_max, None);
        assert_eq!(l.tcp_wmem, Some([4096, 16384, 4 << 20]));
        assert_eq!(l.tcp_rmem, None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
