//! `engine` collector: sessions, streams and device IO from the longhaul
//! engine's stats API (`GET <engine.url>/v1/sessions`, read once per
//! collection into a [`crate::stats::EngineView`], shared with the `tcp`
//! collector).
//!
//! No engine running is the normal state between campaigns: the collector
//! then reports no session series and `collector_success 0`; the scrape is
//! served as always. Stream labels are capped per session (DESIGN.md): the
//! first `max_streams` stream ids get their own series, the rest are summed
//! into `stream="other"` (counters, cwnd and pacing rate summed, RTT
//! averaged).
//!
//! Each stream exports what is true of it, once (the series budget,
//! docs/visibility.md): the engine lists both ends of a stream, its own
//! socket and the client's (reported during the run), and the bytes the
//! stream delivered are read at the receiving end
//! (`longhaul_stream_bytes_total{direction="receive"}`; at the sending end
//! where no receiving end is listed, as for an iperf3 client's reverse
//! test), the TCP state (RTT, cwnd, retransmits, segments sent, pacing rate)
//! at the sending end (`direction="send"`): a receiving socket's cwnd and
//! retransmits are its initial values. At most 6 series per stream.
//!
//! `longhaul_session_info` carries the session's `protocol`: `longhaul`, or
//! `iperf3` for an iperf3 client's test (`longhaul serve --iperf3-listen`),
//! so rules and dashboards that join on it can tell the two apart; and the
//! `campaign` and `run` the client named (`longhaul send --campaign NAME
//! --run NAME`), so a campaign's runs are series that outlive any
//! dashboard. Those two are on the info series only: per-stream series join
//! on `session`, and their label sets stay as they were.

use longhaul_stats_api::{EngineDirection, Mode, Protocol};

use crate::collector::{Collector, CollectorSpec, Round};
use crate::config::Config;
use crate::metrics::Family;
use crate::stats::{EngineView, SessionView, StreamLabel};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "engine",
    default_enabled: true,
    help: "sessions and streams from the longhaul engine's stats API",
    new,
};

/// Label value of the summed streams beyond the cap.
pub const OTHER_STREAM: &str = "other";

fn new(_cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(EngineCollector))
}

/// Families from the collection's stats API answer (the round reads it).
pub struct EngineCollector;

impl Collector for EngineCollector {
    fn update(&self, round: &Round, out: &mut Vec<Family>) -> anyhow::Result<()> {
        match round.engine() {
            Some(Ok(view)) => {
                out.extend(families(view));
                Ok(())
            }
            Some(Err(e)) => Err(anyhow::anyhow!("{}", e.message)),
            None => Err(anyhow::anyhow!("no engine stats API configured")),
        }
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

fn dir_str(d: EngineDirection) -> &'static str {
    match d {
        EngineDirection::Send => "send",
        EngineDirection::Receive => "receive",
        EngineDirection::Bidir => "bidir",
    }
}

/// Builds the engine families from a view (separate from IO for tests):
/// the sessions', the engine's own, the listening ports'.
pub fn families(view: &EngineView) -> Vec<Family> {
    let mut all = session_families(view);
    all.extend(engine_families(view));
    all.extend(admission_families(view));
    all
}

/// The labels of a session's info series: who, which campaign and run,
/// what mode, direction and protocol.
fn info_labels(s: &SessionView) -> Vec<(&'static str, &str)> {
    let mut labels = vec![("session", s.id.as_str()), ("peer", s.peer.as_str())];
    if let Some(host) = &s.peer_host {
        labels.push(("peer_host", host));
    }
    for (name, value) in [("campaign", &s.campaign), ("run", &s.run)] {
        if let Some(value) = value {
            labels.push((name, value));
        }
    }
    labels.extend([
        ("mode", mode_str(s.mode)),
        ("direction", dir_str(s.direction)),
        ("protocol", protocol_str(s.protocol)),
    ]);
    labels
}

/// A disk session's bytes read and written, by device.
fn push_devices(device_io: &mut Family, s: &SessionView) {
    for d in &s.devices {
        for (dir, bytes) in [("read", d.read_bytes), ("write", d.written_bytes)] {
            device_io.push_u64(
                &[
                    ("session", s.id.as_str()),
                    ("device", &d.device),
                    ("controller", &d.controller),
                    ("direction", dir),
                ],
                bytes,
            );
        }
    }
}

/// The sessions', their streams' and their devices' families.
fn session_families(view: &EngineView) -> Vec<Family> {
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
        "Payload bytes one data stream of a session delivered, counted at its receiving end (direction=\"receive\"), or at its sending end where no receiving end is listed.",
    );
    let mut rtt = Family::gauge(
        "longhaul_stream_rtt_seconds",
        "Smoothed TCP round-trip time of the stream's sending socket (mean for stream=\"other\").",
    );
    let mut cwnd = Family::gauge(
        "longhaul_stream_cwnd_bytes",
        "TCP congestion window of the stream's sending socket in bytes (sum for stream=\"other\").",
    );
    let mut retrans = Family::counter(
        "longhaul_stream_retransmits_total",
        "TCP segments retransmitted by the stream's sending socket (tcpi_total_retrans).",
    );
    let mut segments = Family::counter(
        "longhaul_stream_segments_sent_total",
        "TCP data segments sent by the stream's sending socket, retransmissions included (tcpi_data_segs_out).",
    );
    let mut pacing = Family::gauge(
        "longhaul_stream_pacing_rate_bytes_per_second",
        "TCP pacing rate of the stream's sending socket in bytes per second (sum for stream=\"other\").",
    );
    let mut device_io = Family::counter(
        "longhaul_device_io_bytes_total",
        "Disk-mode bytes read from or written to a block device by the session.",
    );
    // The stream families hold nearly every sample: each grows once.
    let rows: usize = view.sessions.iter().map(|s| s.streams.len()).sum();
    for f in [
        &mut stream_bytes,
        &mut rtt,
        &mut cwnd,
        &mut retrans,
        &mut segments,
        &mut pacing,
    ] {
        f.reserve(rows, 3);
    }
    for s in &view.sessions {
        let id = s.id.as_str();
        info.push(&info_labels(s), 1.0);
        session_bytes.push_u64(&[("session", id), ("direction", "send")], s.bytes_sent);
        session_bytes.push_u64(
            &[("session", id), ("direction", "receive")],
            s.bytes_received,
        );
        for row in &s.streams {
            let stream = match row.stream {
                StreamLabel::Id(n) => n.to_string(),
                StreamLabel::Other => OTHER_STREAM.to_string(),
            };
            let end = |dir| {
                [
                    ("session", id),
                    ("stream", stream.as_str()),
                    ("direction", dir),
                ]
            };
            if let Some(b) = row.received {
                stream_bytes.push_u64(&end("receive"), b);
            }
            if let Some(b) = row.sent_unpaired {
                stream_bytes.push_u64(&end("send"), b);
            }
            if let Some(tcp) = &row.tcp {
                let labels = end("send");
                rtt.push(&labels, tcp.rtt_seconds());
                cwnd.push_u64(&labels, tcp.cwnd_bytes);
                retrans.push_u64(&labels, tcp.retransmits);
                segments.push_u64(&labels, tcp.segs_out);
                pacing.push_u64(&labels, tcp.pacing_bytes_per_second);
            }
        }
        push_devices(&mut device_io, s);
    }
    vec![
        info,
        session_bytes,
        stream_bytes,
        rtt,
        cwnd,
        retrans,
        segments,
        pacing,
        device_io,
    ]
}

/// The engine's start time and its session counts.
fn engine_families(view: &EngineView) -> Vec<Family> {
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
    started.push(&[], view.started_unix);
    sessions.push_u64(&[], view.sessions_total);
    sessions_failed.push_u64(&[], view.sessions_failed_total);
    vec![started, sessions, sessions_failed]
}

/// What each listening port accepted, admitted, dropped and refused.
fn admission_families(view: &EngineView) -> Vec<Family> {
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
    for a in &view.admission {
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
    vec![accepted, admitted, dropped, refused, auth_failed]
}

#[cfg(test)]
// A test reads as one scenario, top to bottom (see clippy.toml).
#[allow(clippy::too_many_lines)]
mod tests {
    use super::*;
    use longhaul_stats_api::{DeviceIo, EngineInfo, Session, Snapshot, State, Stream, TcpInfo};

    /// The families of a snapshot as the engine would serialise it.
    fn families_of(snap: &Snapshot, max_streams: usize) -> Vec<Family> {
        let text = serde_json::to_vec(snap).unwrap();
        families(&crate::stats::read(&text[..], max_streams).unwrap())
    }

    fn snapshot(streams: u32) -> Snapshot {
        Snapshot {
            version: 1,
            engine: EngineInfo::default(),
            sessions: vec![Session {
                id: "s1".into(),
                peer: "10.0.0.2:40000".into(),
                peer_host: Some("xfer-a".into()),
                campaign: None,
                run: None,
                local: Some("10.0.0.1:7400".into()),
                protocol: longhaul_stats_api::Protocol::Longhaul,
                mode: Mode::Disk,
                direction: EngineDirection::Receive,
                state: State::Running,
                started_unix: 0.0,
                bytes_sent: 0,
                bytes_received: 1000,
                stream_rows: None,
                streams: (0..streams)
                    .map(|id| Stream {
                        id,
                        direction: EngineDirection::Send,
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
        let fams = families_of(&snapshot(5), 3);
        let bytes = fams
            .iter()
            .find(|f| f.name == "longhaul_stream_bytes_total")
            .unwrap();
        let samples = bytes.samples();
        let labels: Vec<&str> = samples.iter().map(|s| s.labels[1].1.as_str()).collect();
        assert_eq!(labels, ["0", "1", "2", "other"]);
        assert_eq!(bytes.samples()[3].value, 20.0);
        let rtt = fams
            .iter()
            .find(|f| f.name == "longhaul_stream_rtt_seconds")
            .unwrap();
        // streams 3 and 4: 4 ms and 5 ms -> mean 4.5 ms
        assert!((rtt.samples()[3].value - 0.0045).abs() < 1e-12);
        let total: f64 = bytes.samples().iter().map(|s| s.value).sum();
        assert_eq!(total, 50.0, "the cap never loses bytes");
    }

    #[test]
    fn the_engine_s_own_counters_and_start_time_are_unlabelled_series() {
        let mut snap = snapshot(1);
        snap.engine.started_unix = 1_790_000_000.5;
        snap.engine.sessions_total = 12;
        snap.engine.sessions_failed_total = 2;
        let fams = families_of(&snap, 8);
        let only = |name: &str| {
            let f = fams.iter().find(|f| f.name == name).unwrap();
            assert_eq!(f.samples().len(), 1, "{name}");
            assert!(f.samples()[0].labels.is_empty(), "{name}");
            f.samples()[0].value
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
        let fams = families_of(&snap, 8);
        let series = |name: &str| -> Vec<(Vec<(&str, String)>, f64)> {
            fams.iter()
                .find(|f| f.name == name)
                .unwrap()
                .samples()
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
        let fams = families_of(&snapshot(1), 8);
        let empty = fams
            .iter()
            .find(|f| f.name == "longhaul_admission_dropped_total")
            .unwrap();
        assert!(empty.samples().is_empty());
    }

    /// The engine lists both ends of each stream (the client reports its
    /// own): a stream exports the bytes it delivered at its receiving end
    /// and its TCP state at its sending end, nothing twice, at most 6
    /// series; the cap counts stream ids, not ends.
    #[test]
    fn each_stream_exports_what_is_true_of_it_once() {
        let mut snap = snapshot(3);
        let session = &mut snap.sessions[0];
        for st in &mut session.streams {
            st.direction = EngineDirection::Receive;
        }
        let peer_ends: Vec<Stream> = session
            .streams
            .iter()
            .map(|st| Stream {
                direction: EngineDirection::Send,
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
        let fams = families_of(&snap, 2);
        let family = |name: &str| fams.iter().find(|f| f.name == name).unwrap();
        let keys = |name: &str| -> Vec<(String, String)> {
            family(name)
                .samples()
                .iter()
                .map(|s| (s.labels[1].1.clone(), s.labels[2].1.clone()))
                .collect()
        };
        let rows = |dir: &str| -> Vec<(String, String)> {
            ["0", "1", "other"]
                .iter()
                .map(|s| (s.to_string(), dir.to_string()))
                .collect()
        };
        assert_eq!(keys("longhaul_stream_bytes_total"), rows("receive"));
        for name in [
            "longhaul_stream_rtt_seconds",
            "longhaul_stream_cwnd_bytes",
            "longhaul_stream_retransmits_total",
            "longhaul_stream_segments_sent_total",
            "longhaul_stream_pacing_rate_bytes_per_second",
        ] {
            assert_eq!(keys(name), rows("send"), "{name}");
        }
        let per_stream: usize = fams
            .iter()
            .flat_map(|f| f.samples())
            .filter(|s| s.labels.iter().any(|(k, v)| *k == "stream" && v == "0"))
            .count();
        assert_eq!(per_stream, 6);
        let value = |name: &str, stream: &str, dir: &str| {
            family(name)
                .samples()
                .iter()
                .find(|s| s.labels[1].1 == stream && s.labels[2].1 == dir)
                .unwrap()
                .value
        };
        assert_eq!(value("longhaul_stream_retransmits_total", "0", "send"), 7.0);
        assert_eq!(
            value("longhaul_stream_segments_sent_total", "1", "send"),
            700.0
        );
        assert_eq!(
            value("longhaul_stream_pacing_rate_bytes_per_second", "0", "send"),
            1000.0
        );
        assert_eq!(
            value("longhaul_stream_bytes_total", "other", "receive"),
            10.0
        );
        let info = &family("longhaul_session_info").samples()[0];
        assert_eq!(info.labels[2], ("peer_host", "xfer-a".to_string()));
    }

    /// A session's campaign and run are labels of its info series, and of
    /// no per-stream or per-session counter; names that are not plain (an
    /// older or foreign engine's) are left out, the series kept.
    #[test]
    fn campaign_and_run_label_the_info_series_only() {
        let mut snap = snapshot(2);
        snap.sessions[0].campaign = Some("fig5".into());
        snap.sessions[0].run = Some("a-to-b".into());
        let mut stranger = snap.sessions[0].clone();
        stranger.id = "s2".into();
        stranger.campaign = Some("x\"} 1\nfake_metric{a=\"".into());
        stranger.run = Some("y".repeat(200));
        snap.sessions.push(stranger);
        let fams = families_of(&snap, 256);
        let info: Vec<_> = fams
            .iter()
            .find(|f| f.name == "longhaul_session_info")
            .unwrap()
            .samples()
            .iter()
            .map(|s| s.labels.clone())
            .collect();
        let get = |labels: &[(&'static str, String)], key: &str| {
            labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get(&info[0], "campaign").as_deref(), Some("fig5"));
        assert_eq!(get(&info[0], "run").as_deref(), Some("a-to-b"));
        assert_eq!(get(&info[1], "session").as_deref(), Some("s2"));
        assert_eq!(
            (get(&info[1], "campaign"), get(&info[1], "run")),
            (None, None)
        );
        for family in fams.iter().filter(|f| f.name != "longhaul_session_info") {
            for sample in &family.samples() {
                assert!(
                    get(&sample.labels, "campaign").is_none()
                        && get(&sample.labels, "run").is_none(),
                    "{}: {:?}",
                    family.name,
                    sample.labels
                );
            }
        }
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
        let fams = families_of(&snap, 256);
        let family = |name: &str| fams.iter().find(|f| f.name == name).unwrap();
        let label = |labels: &[(&'static str, String)], key: &str| {
            labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        let protocols: Vec<(String, Option<String>)> = family("longhaul_session_info")
            .samples()
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
            .samples()
            .iter()
            .filter(|s| s.labels[0].1 == "i1")
            .count();
        assert_eq!(iperf3_streams, 2);
        // The per-stream series keep their labels: protocol is on the info
        // series only, for joins.
        assert!(family("longhaul_stream_retransmits_total")
            .samples()
            .iter()
            .all(|s| label(&s.labels, "protocol").is_none()));
    }

    #[test]
    fn device_io_by_direction() {
        let fams = families_of(&snapshot(1), 256);
        let dev = fams
            .iter()
            .find(|f| f.name == "longhaul_device_io_bytes_total")
            .unwrap();
        assert_eq!(dev.samples().len(), 2);
        assert_eq!(
            dev.samples()[1].labels[3],
            ("direction", "write".to_string())
        );
        assert_eq!(dev.samples()[1].value, 1000.0);
    }
}
