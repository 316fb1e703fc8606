//! `tcp` collector: kernel TCP_INFO, via sock_diag, for the sockets of other
//! tools (FDT, iperf3, xrootd) whose local or remote port is in
//! `--collector.tcp.ports`, whichever process owns them.
//!
//! Series carry stable identities, never ephemeral ports: the peer's address
//! (`remote`) and the configured port range that matched (`ports`), with
//! per-connection detail on reused `flow` slots, capped (see [`crate::flows`]).
//!
//! longhaul's own sockets are left to the `engine` collector, which already
//! reports every stream: while `engine` is enabled, this collector asks the
//! engine's stats API for the addresses it listens on and its sessions'
//! connections (each session's control socket and each stream's socket, as
//! this-end/remote-end addresses). It skips every socket whose own end is a
//! listening address of the engine (so a stream that attached before its
//! session listed it, and a connection still waiting for admission, are
//! the engine's from the start: the admission counters report those), and
//! the sockets with a listed connection's addresses, in either orientation,
//! so on one host both ends of a loopback transfer are skipped. A socket
//! once counted stays counted until it closes, so a counter never goes
//! down; a socket once recognised as the engine's stays skipped while it
//! lives, and the listening addresses are remembered, even if a later stats
//! API request fails. Sockets of a `longhaul send` whose receiving engine
//! runs on another host are not known to this host's engine: they are
//! reported here, by that host's engine collector as the receiver's.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use crate::collector::{Collector, CollectorSpec, Round};
use crate::config::Config;
use crate::flows::{FlowBook, FlowKey, GroupKey, Observed};
use crate::metrics::Family;
use crate::ports::PortRanges;
use crate::sock_diag::{self, TcpSocket};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "tcp",
    default_enabled: true,
    help: "kernel TCP_INFO for other tools' sockets on the configured ports (any process)",
    new,
};

fn new(cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(TcpCollector {
        ports: cfg.tcp_ports.clone(),
        state: Mutex::new(State {
            book: FlowBook::new(cfg.max_flows),
            engine_sockets: HashSet::new(),
            engine_listening: Vec::new(),
        }),
    }))
}

pub struct TcpCollector {
    ports: PortRanges,
    state: Mutex<State>,
}

struct State {
    book: FlowBook,
    /// Live sockets known to be the engine's.
    engine_sockets: HashSet<FlowKey>,
    /// The addresses the engine listens on, as it last said.
    engine_listening: Vec<SocketAddr>,
}

impl Collector for TcpCollector {
    fn update(&self, round: &Round, out: &mut Vec<Family>) -> anyhow::Result<()> {
        let socks =
            sock_diag::tcp_sockets().map_err(|e| anyhow::anyhow!("sock_diag dump failed: {e}"))?;
        // The engine's answer of this collection, shared with the engine
        // collector (None: that collector is off, so nothing else reports
        // longhaul's sockets). No engine running is the normal state
        // between campaigns.
        let view = round.engine();
        let none = HashSet::new();
        let engine = match view {
            Some(Ok(v)) => &v.connections,
            _ => &none,
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match view {
            Some(Ok(v)) => state.engine_listening.clone_from(&v.listening),
            // Nothing listens at the stats API: the engine stopped, and
            // its ports are free for other tools (a stock iperf3 -s).
            Some(Err(e)) if e.refused => state.engine_listening.clear(),
            // Slow or hung: its ports are still its own.
            _ => {}
        }
        let observed = classify(&socks, &self.ports, engine, &mut state);
        state.book.update(observed, Instant::now());
        out.extend(state.book.families());
        Ok(())
    }
}

/// This scrape's sockets on the watched ports that belong to other tools,
/// grouped by stable identity; updates the set of the engine's sockets.
fn classify(
    socks: &[TcpSocket],
    ports: &PortRanges,
    engine: &HashSet<(SocketAddr, SocketAddr)>,
    state: &mut State,
) -> Vec<Observed> {
    let mut engine_now = HashSet::new();
    let mut observed = Vec::new();
    for s in socks {
        let Some(info) = s.info else { continue };
        let Some(range) = ports
            .matching(s.local.port())
            .or_else(|| ports.matching(s.remote.port()))
        else {
            continue;
        };
        let flow = FlowKey {
            local: s.local,
            remote: s.remote,
            cookie: s.cookie,
        };
        let on_engine_port = |end: SocketAddr| {
            state.engine_listening.iter().any(|l| {
                l.port() == end.port()
                    && (l.ip() == end.ip()
                        // 0.0.0.0 takes IPv4 only; [::] both (IPv4 as mapped).
                        || (l.ip().is_unspecified() && (l.is_ipv6() || end.is_ipv4())))
            })
        };
        // The engine's end of a connection, or on one host (loopback, or the
        // host's own address) the client's end of one to the engine.
        let local_client = s.remote.ip().is_loopback() || s.remote.ip() == s.local.ip();
        let listed = engine.contains(&(s.local, s.remote))
            || engine.contains(&(s.remote, s.local))
            || on_engine_port(s.local)
            || (local_client && on_engine_port(s.remote));
        if !state.book.knows(&flow) && (listed || state.engine_sockets.contains(&flow)) {
            engine_now.insert(flow);
            continue;
        }
        observed.push(Observed {
            group: GroupKey {
                remote: s.remote.ip().to_string(),
                ports: range,
            },
            flow,
            info,
        });
    }
    state.engine_sockets = engine_now;
    observed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock_diag::TcpInfo;

    fn sock(local: &str, remote: &str, cookie: u64) -> TcpSocket {
        TcpSocket {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            state: 1,
            inode: cookie as u32,
            cookie,
            info: Some(TcpInfo {
                snd_mss: 1000,
                rtt_us: 2000,
                snd_cwnd: 10,
                total_retrans: 0,
                pacing_rate: None,
                bytes_acked: Some(5),
                bytes_received: Some(7),
                ..TcpInfo::default()
            }),
        }
    }

    fn fresh_state(engine_listening: Vec<SocketAddr>) -> State {
        State {
            book: FlowBook::new(64),
            engine_sockets: HashSet::new(),
            engine_listening,
        }
    }

    #[test]
    fn engine_sockets_are_skipped_in_both_orientations_and_while_they_live() {
        let ports: PortRanges = "7400-7499,5201".parse().unwrap();
        let mut state = fresh_state(Vec::new());
        let socks = [
            // The engine's end and, on loopback, the sender's end of one stream.
            sock("127.0.0.1:7400", "127.0.0.1:50000", 1),
            sock("127.0.0.1:50000", "127.0.0.1:7400", 2),
            // iperf3, and a socket on no watched port.
            sock("127.0.0.1:5201", "10.0.0.9:41000", 3),
            sock("127.0.0.1:22", "10.0.0.9:41001", 4),
        ];
        let listed: HashSet<_> = [(
            "127.0.0.1:7400".parse().unwrap(),
            "127.0.0.1:50000".parse().unwrap(),
        )]
        .into();
        let seen = classify(&socks, &ports, &listed, &mut state);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].group.remote, "10.0.0.9");
        assert_eq!(seen[0].group.ports, "5201");
        assert_eq!(state.engine_sockets.len(), 2);
        // The stats API fails once: the known engine sockets stay skipped.
        let seen = classify(&socks, &ports, &HashSet::new(), &mut state);
        assert_eq!(seen.len(), 1, "{seen:?}");
    }

    /// A stream that attached before its session listed it (the server
    /// lists a session's streams once all have attached), and a stranger
    /// waiting for admission, sit on the engine's listening address: they
    /// are the engine's from their first scrape. Before, such a socket was
    /// counted here and stayed counted, every byte twice in the link
    /// roll-ups. Another tool's socket on a watched port is still counted.
    #[test]
    fn sockets_on_the_engines_listening_addresses_are_the_engines() {
        let ports: PortRanges = "7400-7499,5201".parse().unwrap();
        let mut state = fresh_state(vec![
            "0.0.0.0:7400".parse().unwrap(),
            "10.0.0.1:5201".parse().unwrap(),
        ]);
        let socks = [
            // Not listed in any session yet: on the wildcard listener.
            sock("10.0.0.1:7400", "10.0.0.2:50000", 1),
            sock("127.0.0.1:7400", "127.0.0.1:50001", 2),
            // On the iperf3 listener's address, and on the same port of
            // another address (some other process's iperf3 -s -B).
            sock("10.0.0.1:5201", "10.0.0.9:41000", 3),
            sock("10.0.0.3:5201", "10.0.0.9:41001", 4),
            // A `longhaul send` of this host to a remote engine, and FDT.
            sock("10.0.0.1:50002", "10.0.0.7:7400", 5),
            sock("10.0.0.1:7450", "10.0.0.8:41002", 6),
            // The client's end of a stream to this host's engine, on
            // loopback and to the host's own address.
            sock("127.0.0.1:50003", "127.0.0.1:7400", 7),
            sock("10.0.0.1:50004", "10.0.0.1:7400", 8),
            // IPv6 on port 7400: 0.0.0.0 does not take it.
            sock("[2001:db8::1]:7400", "[2001:db8::2]:41003", 9),
        ];
        let seen = classify(&socks, &ports, &HashSet::new(), &mut state);
        let mut counted: Vec<u64> = seen.iter().map(|o| o.flow.cookie).collect();
        counted.sort_unstable();
        assert_eq!(counted, [4, 5, 6, 9], "{seen:?}");
        assert_eq!(state.engine_sockets.len(), 5);
        // An engine on [::] takes both families.
        let mut state = fresh_state(vec!["[::]:7400".parse().unwrap()]);
        let seen = classify(&socks[8..], &ports, &HashSet::new(), &mut state);
        assert!(seen.is_empty(), "{seen:?}");
    }
}
