//! `engine` collector: sessions, streams and device IO from the longhaul
//! engine's stats API (`GET <engine.url>/v1/sessions`, types from
//! longhaul-stats-api).
//!
//! No engine running is the normal state between campaigns: the collector
//! then reports no session series and `collector_success 0`; the scrape is
//! served as always. Stream labels are capped per session (DESIGN.md): the
//! first `max_streams` stream ids get their own series, the rest are summed
//! into `stream="other"` (bytes, retransmits and cwnd summed, RTT averaged).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use longhaul_stats_api::{Direction, Mode, Session, Snapshot, SESSIONS_PATH};

use crate::cli::Config;
use crate::collector::{Collector, CollectorSpec};
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
/// sessions) as (this end, remote end). Engines older than the `local` /
/// `peer` fields list none.
pub fn connections(snap: &Snapshot) -> HashSet<(SocketAddr, SocketAddr)> {
    let pair = |local: &Option<String>, peer: Option<&str>| {
        Some((local.as_deref()?.parse().ok()?, peer?.parse().ok()?))
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

fn dir_str(d: Direction) -> &'static str {
    match d {
        Direction::Send => "send",
        Direction::Receive => "receive",
        Direction::Bidir => "bidir",
    }
}

/// Per-stream figures after the cap.
#[derive(Default)]
struct StreamRow {
    bytes: BTreeMap<&'static str, u64>,
    retransmits: Option<u64>,
    cwnd: Option<u64>,
    rtt_sum_us: f64,
    rtt_n: u32,
}

/// Builds the engine families from a snapshot (separate from IO for tests).
pub fn families(snap: &Snapshot, max_streams: usize) -> Vec<Family> {
    let mut info = Family::gauge(
        "longhaul_session_info",
        "A longhaul session known to the engine (running, or finished moments ago); always 1.",
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
        "Smoothed TCP round-trip time of the stream's socket (mean for stream=\"other\").",
    );
    let mut cwnd = Family::gauge(
        "longhaul_stream_cwnd_bytes",
        "TCP congestion window of the stream's socket in bytes (sum for stream=\"other\").",
    );
    let mut retrans = Family::counter(
        "longhaul_stream_retransmits_total",
        "TCP segments retransmitted by the stream's socket.",
    );
    let mut device_io = Family::counter(
        "longhaul_device_io_bytes_total",
        "Disk-mode bytes read from or written to a block device by the session.",
    );
    for s in &snap.sessions {
        let id = s.id.as_str();
        info.push(
            &[
                ("session", id),
                ("peer", &s.peer),
                ("mode", mode_str(s.mode)),
                ("direction", dir_str(s.direction)),
            ],
            1.0,
        );
        session_bytes.push_u64(&[("session", id), ("direction", "send")], s.bytes_sent);
        session_bytes.push_u64(
            &[("session", id), ("direction", "receive")],
            s.bytes_received,
        );
        for (stream, row) in capped_streams(s, max_streams) {
            for (dir, bytes) in &row.bytes {
                stream_bytes.push_u64(
                    &[("session", id), ("stream", &stream), ("direction", dir)],
                    *bytes,
                );
            }
            let labels = [("session", id), ("stream", stream.as_str())];
            if row.rtt_n > 0 {
                rtt.push(&labels, row.rtt_sum_us / f64::from(row.rtt_n) / 1e6);
            }
            if let Some(c) = row.cwnd {
                cwnd.push_u64(&labels, c);
            }
            if let Some(r) = row.retransmits {
                retrans.push_u64(&labels, r);
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
        device_io,
    ]
}

/// Streams keyed by label value: the `max_streams` lowest ids as themselves,
/// the rest folded into "other".
fn capped_streams(s: &Session, max_streams: usize) -> Vec<(String, StreamRow)> {
    let mut streams: Vec<_> = s.streams.iter().collect();
    streams.sort_by_key(|st| st.id);
    let mut rows: Vec<(String, StreamRow)> = Vec::new();
    let mut other: Option<StreamRow> = None;
    for (i, st) in streams.into_iter().enumerate() {
        let row = if i < max_streams {
            rows.push((st.id.to_string(), StreamRow::default()));
            &mut rows.last_mut().expect("just pushed").1
        } else {
            other.get_or_insert_with(StreamRow::default)
        };
        *row.bytes.entry(dir_str(st.direction)).or_default() += st.bytes;
        if let Some(tcp) = &st.tcp {
            row.rtt_sum_us += f64::from(tcp.rtt_us);
            row.rtt_n += 1;
            *row.cwnd.get_or_insert(0) += tcp.cwnd_bytes;
            *row.retransmits.get_or_insert(0) += tcp.retransmits;
        }
    }
    if let Some(o) = other {
        rows.push((OTHER_STREAM.to_string(), o));
    }
    rows
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
                local: Some("10.0.0.1:7400".into()),
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
    fn connections_list_the_control_and_every_stream_socket() {
        let mut snap = snapshot(2);
        let found = connections(&snap);
        let pair = |l: &str, r: &str| (l.parse().unwrap(), r.parse().unwrap());
        assert_eq!(found.len(), 3);
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40000")));
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40002")));
        // An older engine without addresses lists nothing, and garbage is skipped.
        snap.sessions[0].local = None;
        snap.sessions[0].streams[0].peer = Some("not an address".into());
        assert_eq!(connections(&snap).len(), 1);
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
