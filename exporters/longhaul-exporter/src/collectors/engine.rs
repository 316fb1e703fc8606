//! `engine` collector: sessions, streams and device IO from the longhaul
//! engine's stats API (`GET <engine.url>/v1/sessions`, types from
//! longhaul-stats-api).
//!
//! No engine running is the normal state between campaigns: the collector
//! then reports no session series and `collector_success 0`; the scrape is
//! served as always. Stream labels are capped per session (DESIGN.md): the
//! first `max_streams` stream ids get their own series, the rest are summed
//! into `stream="other"` (counters, cwnd and pacing rate summed, RTT
//! averaged).
//!
//! The engine lists both ends of each stream: its own socket and the peer's
//! (the client reports its sockets to the server during the run). The two
//! ends of a stream have opposite directions, so every per-stream series
//! carries `direction`: `direction="send"` is the sending socket, whose
//! cwnd, retransmits and pacing rate are the ones that matter.
//!
//! `longhaul_session_info` carries the session's `protocol`: `longhaul`, or
//! `iperf3` for an iperf3 client's test (`longhaul serve --iperf3-listen`),
//! so rules and dashboards that join on it can tell the two apart.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use longhaul_stats_api::{Direction, Mode, Protocol, Session, Snapshot, SESSIONS_PATH};

use crate::collector::{Collector, CollectorSpec};
use crate::config::Config;
use crate::httpclient::{self, Url};
use crate::metrics::Family;

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "engine",
    default_enabled: true,
    help: "sessions and streams from the longhaul engine's stats API",
    new,
};

/// Label value of the summed streams beyond the cap.
pub const OTHER_STREAM: &str = "other";

fn new(cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(EngineCollector {
        api: EngineApi::new(cfg)?,
        max_streams: cfg.max_streams,
    }))
}

/// The engine's stats API at `--engine.url`, read with `--engine.timeout`.
/// Shared with the `tcp` collector, which asks it which sockets are
/// longhaul's.
pub struct EngineApi {
    url: Url,
    timeout: Duration,
}

impl EngineApi {
    pub fn new(cfg: &Config) -> anyhow::Result<EngineApi> {
        Ok(EngineApi {
            url: Url::parse(&cfg.engine_url).map_err(anyhow::Error::msg)?,
            timeout: cfg.engine_timeout,
        })
    }

    /// One snapshot of the engine's sessions.
    pub fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let body = httpclient::get(&self.url, SESSIONS_PATH, self.timeout).with_context(|| {
            format!(
                "engine stats API http://{}:{}{}{SESSIONS_PATH}",
                self.url.host, self.url.port, self.url.prefix
            )
        })?;
        serde_json::from_slice(&body)
            .context("engine stats API answered something that is not a v1 snapshot")
    }
}

/// Every socket the engine lists (control and data connections of its
/// sessions) as (this end, remote end), IPv4-mapped addresses as IPv4 (an
/// engine on `[::]` lists `[::ffff:10.0.0.1]:7400`, sock_diag the same
/// socket as `10.0.0.1:7400`). Engines older than the `local` / `peer`
/// fields list none.
pub fn connections(snap: &Snapshot) -> HashSet<(SocketAddr, SocketAddr)> {
    let pair = |local: &Option<String>, peer: Option<&str>| {
        Some((address(local.as_deref()?)?, address(peer?)?))
    };
    let mut found = HashSet::new();
    for s in &snap.sessions {
        found.extend(pair(&s.local, Some(&s.peer)));
        for st in &s.streams {
            found.extend(pair(&st.local, st.peer.as_deref()));
        }
    }
    found
}

/// The addresses the engine listens on (its control and data port, its
/// iperf3 port): every socket whose own end is one of them is the
/// engine's, listed in a session yet or not. Engines older than the
/// `address` field list none.
pub fn listening(snap: &Snapshot) -> Vec<SocketAddr> {
    snap.engine
        .admission
        .iter()
        .filter_map(|a| address(a.address.as_deref()?))
        .collect()
}

/// Whether a failed [`EngineApi::snapshot`] found no engine at all: its
/// address refused the connection (nothing listens there), as opposed to an
/// engine that is slow, hung or answered something else.
pub fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let io = match c.downcast_ref::<ureq::Error>() {
            Some(ureq::Error::Io(io)) => Some(io),
            _ => c.downcast_ref::<std::io::Error>(),
        };
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// `text` as a socket address, an IPv4-mapped IPv6 one as IPv4.
fn address(text: &str) -> Option<SocketAddr> {
    let a: SocketAddr = text.parse().ok()?;
    Some(SocketAddr::new(a.ip().to_canonical(), a.port()))
}

pub struct EngineCollector {
    api: EngineApi,
    max_streams: usize,
}

impl Collector for EngineCollector {
    fn update(&self, out: &mut Vec<Family>) -> anyhow::Result<()> {
        let snap = self.api.snapshot()?;
        out.extend(families(&snap, self.max_streams));
        Ok(())
    }
}

fn mode_str(m: Mode) -> &'static str {
    match m {
        Mode::Memory => "memory",
        Mode::Disk => "disk",
    }
}

fn protocol_str(p: Protocol) -> &'static str {
    match p {
        Protocol::Longhaul => "longhaul",
        Protocol::Iperf3 => "iperf3",
    }
}

fn dir_str(d: Direction) -> &'static str {
    match d {
        Direction::Send => "send",
        Direction::Receive => "receive",
        Direction::Bidir => "bidir",
    }
}

/// Figures of one end (direction) of a stream, or of the streams summed
/// into "other", after the cap.
#[derive(Default)]
struct StreamRow {
    bytes: u64,
    tcp: Option<TcpSums>,
}

/// TCP_INFO of the sockets behind a row: sums, and the RTT as a mean.
#[derive(Default)]
struct TcpSums {
    retransmits: u64,
    cwnd: u64,
    pacing_bytes_per_s: u64,
    bytes_acked: u64,
    segs_out: u64,
    rtt_sum_us: f64,
    sockets: u32,
}

/// Builds the engine families from a snapshot (separate from IO for tests).
pub fn families(snap: &Snapshot, max_streams: usize) -> Vec<Family> {
    let mut info = Family::gauge(
        "longhaul_session_info",
        "A session known to the engine (running, or finished moments ago), with the protocol it speaks (longhaul or iperf3); always 1.",
    );
    let mut session_bytes = Family::counter(
        "longhaul_session_bytes_total",
        "Payload bytes moved by the session, by direction as seen from this engine.",
    );
    let mut stream_bytes = Family::counter(
        "longhaul_stream_bytes_total",
        "Payload bytes moved by one data stream of a session.",
    );
    let mut rtt = Family::gauge(
        "longhaul_stream_rtt_seconds",
        "Smoothed TCP round-trip time of the stream's socket at this end (direction) (mean for stream=\"other\").",
    );
    let mut cwnd = Family::gauge(
        "longhaul_stream_cwnd_bytes",
        "TCP congestion window of the stream's socket at this end in bytes (sum for stream=\"other\").",
    );
    let mut retrans = Family::counter(
        "longhaul_stream_retransmits_total",
        "TCP segments retransmitted by the stream's socket at this end (tcpi_total_retrans).",
    );
    let mut segments = Family::counter(
        "longhaul_stream_segments_sent_total",
        "TCP data segments sent by the stream's socket at this end, retransmissions included (tcpi_data_segs_out).",
    );
    let mut acked = Family::counter(
        "longhaul_stream_bytes_acked_total",
        "Bytes the other end acknowledged on the stream's socket (tcpi_bytes_acked).",
    );
    let mut pacing = Family::gauge(
        "longhaul_stream_pacing_rate_bytes_per_second",
        "TCP pacing rate of the stream's socket at this end in bytes per second (sum for stream=\"other\").",
    );
    let mut device_io = Family::counter(
        "longhaul_device_io_bytes_total",
        "Disk-mode bytes read from or written to a block device by the session.",
    );
    let mut started = Family::gauge(
        "longhaul_engine_start_time_seconds",
        "Unix time the engine (longhaul serve) started: a change is a restart, after which its counters start again from 0.",
    );
    let mut sessions = Family::counter(
        "longhaul_sessions_total",
        "Sessions the engine has begun since it started (longhaul sessions and iperf3 tests), finished, failed or running.",
    );
    let mut sessions_failed = Family::counter(
        "longhaul_sessions_failed_total",
        "Sessions the engine has ended as failed since it started (a peer gone or silent, a short transfer, a verification mismatch, a disk error; the server's log says which).",
    );
    started.push(&[], snap.engine.started_unix);
    sessions.push_u64(&[], snap.engine.sessions_total);
    sessions_failed.push_u64(&[], snap.engine.sessions_failed_total);
    let mut accepted = Family::counter(
        "longhaul_admission_accepted_total",
        "Connections a listening port of the engine accepted (listener: longhaul, the control and data port, or iperf3).",
    );
    let mut admitted = Family::counter(
        "longhaul_admission_admitted_total",
        "Control connections that proved themselves at a listening port of the engine and became a session, an iperf3 test or a probe.",
    );
    let mut dropped = Family::counter(
        "longhaul_admission_dropped_total",
        "Connections a listening port of the engine dropped before admission, by reason: evicted (pushed out of a full pre-authentication pool by newer ones), expired (past the admission deadline), garbage (not the protocol).",
    );
    let mut refused = Family::counter(
        "longhaul_admission_refused_total",
        "Connections a listening port of the engine refused after their first message, by reason: busy (every session or test slot taken), source_busy (the client's address held its share of the slots), attach_timeout (a session's or test's data connections did not all attach in time).",
    );
    let mut auth_failed = Family::counter(
        "longhaul_auth_failures_total",
        "Peers that failed to prove who they are at a listening port of the engine, by reason: bad_token (a wrong token or iperf3 credentials, or none where required), bad_version (another protocol version), bad_proof (a malformed handshake or iperf3 token, a data connection's attach proof that does not verify), timeout (a handshake begun and not finished within the admission deadline).",
    );
    for a in &snap.engine.admission {
        let listener = [("listener", a.listener.as_str())];
        accepted.push_u64(&listener, a.accepted);
        admitted.push_u64(&listener, a.admitted);
        for (reason, n) in [
            ("evicted", a.evicted),
            ("expired", a.expired),
            ("garbage", a.garbage),
        ] {
            dropped.push_u64(&[("listener", a.listener.as_str()), ("reason", reason)], n);
        }
        for (reason, n) in [
            ("busy", a.refused.busy),
            ("source_busy", a.refused.source_busy),
            ("attach_timeout", a.refused.attach_timeout),
        ] {
            refused.push_u64(&[("listener", a.listener.as_str()), ("reason", reason)], n);
        }
        for (reason, n) in [
            ("bad_token", a.auth_failed.bad_token),
            ("bad_version", a.auth_failed.bad_version),
            ("bad_proof", a.auth_failed.bad_proof),
            ("timeout", a.auth_failed.timeout),
        ] {
            auth_failed.push_u64(&[("listener", a.listener.as_str()), ("reason", reason)], n);
        }
    }
    for s in &snap.sessions {
        let id = s.id.as_str();
        let mut labels = vec![("session", id), ("peer", s.peer.as_str())];
        if let Some(host) = &s.peer_host {
            labels.push(("peer_host", host));
        }
        labels.extend([
            ("mode", mode_str(s.mode)),
            ("direction", dir_str(s.direction)),
            ("protocol", protocol_str(s.protocol)),
        ]);
        info.push(&labels, 1.0);
        session_bytes.push_u64(&[("session", id), ("direction", "send")], s.bytes_sent);
        session_bytes.push_u64(
            &[("session", id), ("direction", "receive")],
            s.bytes_received,
        );
        for ((stream, dir), row) in capped_streams(s, max_streams) {
            let labels = [("session", id), ("stream", &stream), ("direction", dir)];
            stream_bytes.push_u64(&labels, row.bytes);
            if let Some(tcp) = row.tcp {
                rtt.push(&labels, tcp.rtt_sum_us / f64::from(tcp.sockets) / 1e6);
                cwnd.push_u64(&labels, tcp.cwnd);
                retrans.push_u64(&labels, tcp.retransmits);
                segments.push_u64(&labels, tcp.segs_out);
                acked.push_u64(&labels, tcp.bytes_acked);
                pacing.push_u64(&labels, tcp.pacing_bytes_per_s);
            }
        }
        for d in &s.devices {
            for (dir, bytes) in [("read", d.read_bytes), ("write", d.written_bytes)] {
                device_io.push_u64(
                    &[
                        ("session", id),
                        ("device", &d.device),
                        ("controller", &d.controller),
                        ("direction", dir),
                    ],
                    bytes,
                );
            }
        }
    }
    vec![
        info,
        session_bytes,
        stream_bytes,
        rtt,
        cwnd,
        retrans,
        segments,
        acked,
        pacing,
        device_io,
        started,
        sessions,
        sessions_failed,
        accepted,
        admitted,
        dropped,
        refused,
        auth_failed,
    ]
}

/// Rows keyed by (stream label, direction), in stream id order: the
/// `max_streams` lowest ids as themselves (each end of a stream its own
/// row), the rest folded into "other" per direction.
fn capped_streams(s: &Session, max_streams: usize) -> Vec<((String, &'static str), StreamRow)> {
    let mut ids: Vec<u32> = s.streams.iter().map(|st| st.id).collect();
    ids.sort_unstable();
    ids.dedup();
    let rank: BTreeMap<u32, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    // Sort key: the id's rank (usize::MAX for "other"), then the direction.
    let mut rows: BTreeMap<(usize, &'static str), (String, StreamRow)> = BTreeMap::new();
    for st in &s.streams {
        let r = rank[&st.id];
        let (key, label) = if r < max_streams {
            (r, st.id.to_string())
        } else {
            (usize::MAX, OTHER_STREAM.to_string())
        };
        let dir = dir_str(st.direction);
        let row = &mut rows
            .entry((key, dir))
            .or_insert_with(|| (label, StreamRow::default()))
            .1;
        row.bytes += st.bytes;
        if let Some(tcp) = &st.tcp {
            let sums = row.tcp.get_or_insert_with(TcpSums::default);
            sums.rtt_sum_us += f64::from(tcp.rtt_us);
            sums.sockets += 1;
            sums.cwnd += tcp.cwnd_bytes;
            sums.retransmits += tcp.retransmits;
            sums.segs_out += tcp.segs_out;
            sums.bytes_acked += tcp.bytes_acked;
            sums.pacing_bytes_per_s += tcp.pacing_rate_bps / 8;
        }
    }
    rows.into_iter()
        .map(|((_, dir), (label, row))| ((label, dir), row))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_stats_api::{DeviceIo, EngineInfo, State, Stream, TcpInfo};

    fn snapshot(streams: u32) -> Snapshot {
        Snapshot {
            version: 1,
            engine: EngineInfo::default(),
            sessions: vec![Session {
                id: "s1".into(),
                peer: "10.0.0.2:40000".into(),
                peer_host: Some("xfer-a".into()),
                local: Some("10.0.0.1:7400".into()),
                protocol: longhaul_stats_api::Protocol::Longhaul,
                mode: Mode::Disk,
                direction: Direction::Receive,
                state: State::Running,
                started_unix: 0.0,
                bytes_sent: 0,
                bytes_received: 1000,
                streams: (0..streams)
                    .map(|id| Stream {
                        id,
                        direction: Direction::Receive,
                        bytes: 10,
                        local: Some("10.0.0.1:7400".into()),
                        peer: Some(format!("10.0.0.2:{}", 40001 + id)),
                        tcp: Some(TcpInfo {
                            rtt_us: 1000 * (id + 1),
                            cwnd_bytes: 100,
                            retransmits: 1,
                            ..Default::default()
                        }),
                        peer_end: false,
                    })
                    .collect(),
                devices: vec![DeviceIo {
                    device: "sdc".into(),
                    controller: "0000:03:00.0".into(),
                    read_bytes: 0,
                    written_bytes: 1000,
                }],
            }],
        }
    }

    #[test]
    fn streams_beyond_the_cap_are_summed_into_other() {
        let fams = families(&snapshot(5), 3);
        let bytes = fams
            .iter()
            .find(|f| f.name == "longhaul_stream_bytes_total")
            .unwrap();
        let labels: Vec<&str> = bytes
            .samples
            .iter()
            .map(|s| s.labels[1].1.as_str())
            .collect();
        assert_eq!(labels, ["0", "1", "2", "other"]);
        assert_eq!(bytes.samples[3].value, 20.0);
        let rtt = fams
            .iter()
            .find(|f| f.name == "longhaul_stream_rtt_seconds")
            .unwrap();
        // streams 3 and 4: 4 ms and 5 ms -> mean 4.5 ms
        assert!((rtt.samples[3].value - 0.0045).abs() < 1e-12);
        let total: f64 = bytes.samples.iter().map(|s| s.value).sum();
        assert_eq!(total, 50.0, "the cap never loses bytes");
    }

    #[test]
    fn the_engine_s_own_counters_and_start_time_are_unlabelled_series() {
        let mut snap = snapshot(1);
        snap.engine.started_unix = 1_790_000_000.5;
        snap.engine.sessions_total = 12;
        snap.engine.sessions_failed_total = 2;
        let fams = families(&snap, 8);
        let only = |name: &str| {
            let f = fams.iter().find(|f| f.name == name).unwrap();
            assert_eq!(f.samples.len(), 1, "{name}");
            assert!(f.samples[0].labels.is_empty(), "{name}");
            f.samples[0].value
        };
        assert_eq!(only("longhaul_engine_start_time_seconds"), 1_790_000_000.5);
        assert_eq!(only("longhaul_sessions_total"), 12.0);
        assert_eq!(only("longhaul_sessions_failed_total"), 2.0);
    }

    #[test]
    fn each_listener_s_admission_counters_are_series_of_their_own() {
        let mut snap = snapshot(1);
        snap.engine.admission = vec![
            longhaul_stats_api::Admission {
                listener: "longhaul".into(),
                address: Some("0.0.0.0:7400".into()),
                accepted: 40,
                admitted: 3,
                evicted: 20,
                expired: 5,
                garbage: 2,
                refused: longhaul_stats_api::Refused {
                    busy: 4,
                    source_busy: 30,
                    attach_timeout: 1,
                },
                auth_failed: longhaul_stats_api::AuthFailed {
                    bad_token: 100,
                    bad_version: 7,
                    bad_proof: 3,
                    timeout: 40,
                },
            },
            longhaul_stats_api::Admission {
                listener: "iperf3".into(),
                accepted: 1,
                ..Default::default()
            },
        ];
        let fams = families(&snap, 8);
        let series = |name: &str| -> Vec<(Vec<(&str, String)>, f64)> {
            fams.iter()
                .find(|f| f.name == name)
                .unwrap()
                .samples
                .iter()
                .map(|s| (s.labels.clone(), s.value))
                .collect()
        };
        let l = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
        };
        assert_eq!(
            series("longhaul_admission_accepted_total"),
            vec![
                (l(&[("listener", "longhaul")]), 40.0),
                (l(&[("listener", "iperf3")]), 1.0)
            ]
        );
        assert_eq!(
            series("longhaul_admission_admitted_total")[0],
            (l(&[("listener", "longhaul")]), 3.0)
        );
        let dropped = series("longhaul_admission_dropped_total");
        assert_eq!(dropped.len(), 6, "three reasons per listener: {dropped:?}");
        assert_eq!(
            dropped[..3],
            [
                (l(&[("listener", "longhaul"), ("reason", "evicted")]), 20.0),
                (l(&[("listener", "longhaul"), ("reason", "expired")]), 5.0),
                (l(&[("listener", "longhaul"), ("reason", "garbage")]), 2.0),
            ]
        );
        let refused = series("longhaul_admission_refused_total");
        assert_eq!(refused.len(), 6, "three reasons per listener: {refused:?}");
        assert_eq!(
            refused[..3],
            [
                (l(&[("listener", "longhaul"), ("reason", "busy")]), 4.0),
                (
                    l(&[("listener", "longhaul"), ("reason", "source_busy")]),
                    30.0
                ),
                (
                    l(&[("listener", "longhaul"), ("reason", "attach_timeout")]),
                    1.0
                ),
            ]
        );
        let auth = series("longhaul_auth_failures_total");
        assert_eq!(auth.len(), 8, "four reasons per listener: {auth:?}");
        assert_eq!(
            auth[..4],
            [
                (
                    l(&[("listener", "longhaul"), ("reason", "bad_token")]),
                    100.0
                ),
                (
                    l(&[("listener", "longhaul"), ("reason", "bad_version")]),
                    7.0
                ),
                (l(&[("listener", "longhaul"), ("reason", "bad_proof")]), 3.0),
                (l(&[("listener", "longhaul"), ("reason", "timeout")]), 40.0),
            ]
        );
        // An older engine lists no admission: the families stay empty.
        let fams = families(&snapshot(1), 8);
        let empty = fams
            .iter()
            .find(|f| f.name == "longhaul_admission_dropped_total")
            .unwrap();
        assert!(empty.samples.is_empty());
    }

    /// The client's end of each stream (reported to the server) is listed
    /// next to the server's: one series per end, told apart by direction,
    /// and the cap counts stream ids, not ends.
    #[test]
    fn both_ends_of_a_stream_are_series_of_their_own() {
        let mut snap = snapshot(3);
        let session = &mut snap.sessions[0];
        let peer_ends: Vec<Stream> = session
            .streams
            .iter()
            .map(|st| Stream {
                direction: Direction::Send,
                peer_end: true,
                local: None,
                peer: None,
                bytes: st.bytes + 5,
                tcp: Some(TcpInfo {
                    rtt_us: 93_000,
                    cwnd_bytes: 1 << 20,
                    retransmits: 7,
                    segs_out: 700,
                    bytes_acked: 10,
                    pacing_rate_bps: 8_000,
                    ..Default::default()
                }),
                ..st.clone()
            })
            .collect();
        session.streams.extend(peer_ends);
        let fams = families(&snap, 2);
        let family = |name: &str| fams.iter().find(|f| f.name == name).unwrap();
        let keys = |name: &str| -> Vec<(String, String)> {
            family(name)
                .samples
                .iter()
                .map(|s| (s.labels[1].1.clone(), s.labels[2].1.clone()))
                .collect()
        };
        let both = |stream: &str| {
            [
                (stream.to_string(), "receive".to_string()),
                (stream.to_string(), "send".to_string()),
            ]
        };
        let want: Vec<(String, String)> =
            ["0", "1", "other"].iter().flat_map(|s| both(s)).collect();
        assert_eq!(keys("longhaul_stream_bytes_total"), want);
        assert_eq!(keys("longhaul_stream_retransmits_total"), want);
        let value = |name: &str, stream: &str, dir: &str| {
            family(name)
                .samples
                .iter()
                .find(|s| s.labels[1].1 == stream && s.labels[2].1 == dir)
                .unwrap()
                .value
        };
        assert_eq!(value("longhaul_stream_retransmits_total", "0", "send"), 7.0);
        assert_eq!(
            value("longhaul_stream_retransmits_total", "0", "receive"),
            1.0
        );
        assert_eq!(
            value("longhaul_stream_segments_sent_total", "1", "send"),
            700.0
        );
        assert_eq!(
            value("longhaul_stream_pacing_rate_bytes_per_second", "0", "send"),
            1000.0
        );
        assert_eq!(value("longhaul_stream_bytes_total", "other", "send"), 15.0);
        let info = &family("longhaul_session_info").samples[0];
        assert_eq!(info.labels[2], ("peer_host", "xfer-a".to_string()));
    }

    /// Every session's info series names its protocol; an iperf3 test's
    /// streams are exported like any session's.
    #[test]
    fn session_info_names_the_protocol() {
        let mut snap = snapshot(2);
        let mut iperf3 = snap.sessions[0].clone();
        iperf3.id = "i1".into();
        iperf3.protocol = Protocol::Iperf3;
        iperf3.mode = Mode::Memory;
        iperf3.devices.clear();
        snap.sessions.push(iperf3);
        let fams = families(&snap, 256);
        let family = |name: &str| fams.iter().find(|f| f.name == name).unwrap();
        let label = |labels: &[(&'static str, String)], key: &str| {
            labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        let protocols: Vec<(String, Option<String>)> = family("longhaul_session_info")
            .samples
            .iter()
            .map(|s| (s.labels[0].1.clone(), label(&s.labels, "protocol")))
            .collect();
        assert_eq!(
            protocols,
            [
                ("s1".to_string(), Some("longhaul".to_string())),
                ("i1".to_string(), Some("iperf3".to_string())),
            ]
        );
        let iperf3_streams = family("longhaul_stream_bytes_total")
            .samples
            .iter()
            .filter(|s| s.labels[0].1 == "i1")
            .count();
        assert_eq!(iperf3_streams, 2);
        // The per-stream series keep their labels: protocol is on the info
        // series only, for joins.
        assert!(family("longhaul_stream_retransmits_total")
            .samples
            .iter()
            .all(|s| label(&s.labels, "protocol").is_none()));
    }

    #[test]
    fn connections_list_the_control_and_every_stream_socket() {
        let mut snap = snapshot(2);
        let found = connections(&snap);
        let pair = |l: &str, r: &str| (l.parse().unwrap(), r.parse().unwrap());
        assert_eq!(found.len(), 3);
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40000")));
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40002")));
        // An engine on [::] lists IPv4 peers as mapped addresses
        // (before, none of them matched the sockets sock_diag reports).
        let mut mapped = snap.clone();
        mapped.sessions[0].local = Some("[::ffff:10.0.0.1]:7400".into());
        mapped.sessions[0].streams[1].peer = Some("[::ffff:10.0.0.2]:40009".into());
        let found = connections(&mapped);
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40000")));
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40009")));
        // An older engine without addresses lists nothing, and garbage is skipped.
        snap.sessions[0].local = None;
        snap.sessions[0].streams[0].peer = Some("not an address".into());
        assert_eq!(connections(&snap).len(), 1);
    }

    /// No engine on the port is told from one that does not answer well:
    /// the tcp collector stops leaving the engine's ports to it only then.
    #[test]
    fn a_refused_connection_is_told_from_other_failures() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let api = |addr: std::net::SocketAddr| EngineApi {
            url: Url::parse(&format!("http://{addr}")).unwrap(),
            timeout: Duration::from_millis(500),
        };
        let e = api(closed).snapshot().unwrap_err();
        assert!(refused(&e), "{e:#}");
        // Something listens but never answers: a timeout, not a refusal.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = api(silent.local_addr().unwrap()).snapshot().unwrap_err();
        assert!(!refused(&e), "{e:#}");
    }

    #[test]
    fn device_io_by_direction() {
        let fams = families(&snapshot(1), 256);
        let dev = fams
            .iter()
            .find(|f| f.name == "longhaul_device_io_bytes_total")
            .unwrap();
        assert_eq!(dev.samples.len(), 2);
        assert_eq!(dev.samples[1].labels[3], ("direction", "write".to_string()));
        assert_eq!(dev.samples[1].value, 1000.0);
    }
}
