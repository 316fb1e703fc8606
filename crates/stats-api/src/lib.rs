//! Wire types of the engine's stats API, version 1.
//!
//! `longhaul serve --stats-listen ADDR:PORT` answers `GET /v1/sessions` with a
//! [`Snapshot`] as JSON. The exporter's `engine` collector reads the same
//! types, so the two ends cannot drift apart: a field renamed here breaks both
//! builds, not a dashboard at 3 a.m.
//!
//! Compatibility rule: within version 1, fields may be added (consumers ignore
//! unknown fields) but never renamed, removed or given another meaning.
//! Counters are cumulative since the session started and never go down.

use serde::{Deserialize, Serialize};

/// Version carried in the path and in [`Snapshot::version`].
pub const API_VERSION: u32 = 1;

/// Path of the sessions snapshot.
pub const SESSIONS_PATH: &str = "/v1/sessions";

/// The query that asks [`SESSIONS_PATH`] for the series view
/// ([`Snapshot::series_view`]): `GET /v1/sessions?view=series`. An engine
/// from before it answers the whole snapshot, which reads the same way.
pub const SERIES_VIEW_QUERY: &str = "view=series";

/// The query that asks [`SESSIONS_PATH`] for the rows view
/// ([`Snapshot::rows_view`]): `GET /v1/sessions?view=rows`. An engine from
/// before it and after the series view answers 400 (unknown view): ask it
/// for the series view then; one from before both answers the whole
/// snapshot, which reads the same way.
pub const ROWS_VIEW_QUERY: &str = "view=rows";

/// Default address of the stats API (DESIGN.md).
pub const DEFAULT_STATS_LISTEN: &str = "127.0.0.1:7401";

/// Longest campaign or run name ([`Session::campaign`], [`Session::run`]):
/// they become label values of every scrape and names in the dashboards'
/// campaign menu, so they stay short.
pub const MAX_NAME_LEN: usize = 64;

/// Checks a campaign or run name (`longhaul send --campaign NAME --run
/// NAME`): 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `.`, `_` and `-`,
/// not starting with `.` or `-`. The engine refuses a session that names
/// anything else, so a stranger cannot put arbitrary text into label values.
/// The error says what is wrong, for a message that names the flag.
pub fn check_name(name: &str) -> Result<(), String> {
    const RULE: &str = "a name is letters, digits, '.', '_' and '-'";
    if name.is_empty() {
        return Err(format!("empty ({RULE})"));
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_LEN {
        return Err(format!(
            "{chars} characters long, at most {MAX_NAME_LEN} ({RULE})"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("contains {c:?} ({RULE})"));
    }
    if name.starts_with(['.', '-']) {
        return Err(format!("starts with {:?} ({RULE})", &name[..1]));
    }
    Ok(())
}

/// The whole answer of `GET /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub engine: EngineInfo,
    /// Running sessions, plus finished ones for a short while (see
    /// [`Session::state`]) so that a scrape after the end still sees the
    /// final counters.
    pub sessions: Vec<Session>,
}

impl Snapshot {
    /// What the exporter's series carry, and no more (a real 1,000-stream
    /// session: 301 KB against 503 KB whole): every stream's addresses are
    /// left out, and so is the TCP_INFO of receiving ends (a receiving
    /// socket's cwnd, retransmits and pacing are its initial values; its
    /// bytes are what the stream delivered). Sessions, their control
    /// connection's addresses and the engine's listening addresses stay.
    pub fn series_view(mut self) -> Snapshot {
        for s in &mut self.sessions {
            for st in &mut s.streams {
                st.local = None;
                st.peer = None;
                if st.direction == EngineDirection::Receive {
                    st.tcp = None;
                }
            }
        }
        self
    }

    /// The series view with each session's streams as rows
    /// ([`Session::stream_rows`], [`StreamRows`]) and its `streams` empty: no
    /// key is written per stream, so the answer is about a quarter of the
    /// series view's bytes (a real 1,000-stream session: ~68 KB against 301 KB)
    /// and cheaper to read. The exporter asks for it.
    pub fn rows_view(self) -> Snapshot {
        let mut view = self.series_view();
        for s in &mut view.sessions {
            s.stream_rows = Some(StreamRows(std::mem::take(&mut s.streams)));
        }
        view
    }
}

/// A session's streams as the rows view writes them: each stream end an
/// array, `[id, direction, bytes]`, and a sending end with its TCP_INFO
/// `[id, direction, bytes, tcp]`, `tcp` being `[rtt_us, cwnd_bytes,
/// retransmits, segs_out, pacing_rate_bps]` (the fields of [`Stream`] and
/// [`TcpInfo`] of those names). Within version 1, fields are only ever
/// appended, to a row (after `tcp`, which is then `null` where a stream
/// end has none) or to `tcp`; a reader skips those it does not know.
/// Written, never read, by this crate (the exporter reads it as it streams
/// in).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamRows(pub Vec<Stream>);

impl Serialize for StreamRows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        struct Row<'a>(&'a Stream);
        impl Serialize for Row<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let st = self.0;
                let tcp = st.tcp.filter(|_| st.direction == EngineDirection::Send);
                let mut row = s.serialize_tuple(if tcp.is_some() { 4 } else { 3 })?;
                row.serialize_element(&st.id)?;
                row.serialize_element(&st.direction)?;
                row.serialize_element(&st.bytes)?;
                if let Some(t) = tcp {
                    row.serialize_element(&(
                        t.rtt_us,
                        t.cwnd_bytes,
                        t.retransmits,
                        t.segs_out,
                        t.pacing_rate_bps,
                    ))?;
                }
                row.end()
            }
        }
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for st in &self.0 {
            seq.serialize_element(&Row(st))?;
        }
        seq.end()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// longhaul version, e.g. "0.1.0".
    pub version: String,
    pub pid: u32,
    /// Unix time (seconds) the engine started.
    pub started_unix: f64,
    pub sessions_total: u64,
    pub sessions_failed_total: u64,
    /// What each listening port did with the connections it accepted,
    /// before any of them became a session (an engine from before this
    /// field lists none).
    #[serde(default)]
    pub admission: Vec<Admission>,
}

/// One listening port's admission counters, cumulative since the engine
/// started. Every connection is accepted; a control connection that proves
/// itself (a session, an iperf3 test, `longhaul advise`) is admitted; the
/// three kinds of drop are counted here, and so are the refusals after the
/// first message ([`Refused`]) and the failed logins ([`AuthFailed`]).
/// The rest are data connections, connections still pending, and
/// connections closed before their first message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// "longhaul" (the control and data port) or "iperf3".
    pub listener: String,
    /// The listening socket's address (`0.0.0.0:7400`): every socket on it
    /// is the engine's, admitted yet or not (an engine from before this
    /// field lists none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub accepted: u64,
    pub admitted: u64,
    /// Pushed out of a full pre-authentication pool by newer connections.
    pub evicted: u64,
    /// Not admitted within the admission deadline.
    pub expired: u64,
    /// Not the protocol (or too long a first message).
    pub garbage: u64,
    /// Connections the port refused after their first message, by reason
    /// (added in v1; absent from older engines).
    #[serde(default)]
    pub refused: Refused,
    /// Peers that failed to prove who they are, by reason (added in v1;
    /// absent from older engines).
    #[serde(default)]
    pub auth_failed: AuthFailed,
}

/// Why a listening port refused connections after their first message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Every session or test slot was taken (`--max-sessions`,
    /// `--iperf3-max-tests`).
    pub busy: u64,
    /// The connection's source held its whole share of the slots
    /// (`--max-sessions-per-source`, `--iperf3-max-tests-per-source`).
    pub source_busy: u64,
    /// A session's or test's data connections did not all attach in time.
    pub attach_timeout: u64,
}

/// Why peers failed to authenticate at a listening port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthFailed {
    /// A proof of the wrong secret: a wrong token (or none where one is
    /// required), iperf3 credentials of no authorized user.
    pub bad_token: u64,
    /// A handshake of another protocol version.
    pub bad_version: u64,
    /// A proof that is no proof: a malformed handshake or iperf3 token, a
    /// data connection whose attach proof does not verify.
    pub bad_proof: u64,
    /// Began the handshake and did not finish it within the admission
    /// deadline.
    pub timeout: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Memory,
    Disk,
}

/// Direction as seen from the engine that serves the API: its own end's. A
/// session a client pushes to it (the client's `Direction::Send` in the
/// engine's messages) is `Receive` here; the serde names are the API's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineDirection {
    Send,
    Receive,
    Bidir,
}

/// The protocol a session speaks: longhaul's own, or iperf3's (`longhaul
/// serve --iperf3-listen`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Longhaul,
    Iperf3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Handshake,
    Running,
    Finished,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// Stable id for the session's lifetime; used as the `session` label.
    pub id: String,
    /// Remote control-connection address, "IP:PORT".
    pub peer: String,
    /// The peer's host name as it reported it (`longhaul send` sends its
    /// own); absent when the peer did not say.
    #[serde(default)]
    pub peer_host: Option<String>,
    /// `longhaul` or `iperf3`; absent (older engines) means `longhaul`.
    #[serde(default)]
    pub protocol: Protocol,
    /// The campaign the session is a run of, as the client named it
    /// (`--campaign`; [`check_name`]); absent when it named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<String>,
    /// The run of that campaign (`--run`; [`check_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// This engine's end of the control connection, "IP:PORT" (added in
    /// v1; absent from older engines). With each stream's `local`/`peer`
    /// it lists every socket of the session, so the exporter's `tcp`
    /// collector can leave longhaul's own sockets to the `engine` collector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    pub mode: Mode,
    pub direction: EngineDirection,
    pub state: State,
    pub started_unix: f64,
    /// Payload bytes this engine sent in the session.
    pub bytes_sent: u64,
    /// Payload bytes this engine received in the session.
    pub bytes_received: u64,
    pub streams: Vec<Stream>,
    /// The rows view's streams ([`Snapshot::rows_view`]; `streams` is then
    /// empty); absent from every other view (added in v1).
    #[serde(default, skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub stream_rows: Option<StreamRows>,
    /// Disk mode: IO per block device; empty in memory mode.
    #[serde(default)]
    pub devices: Vec<DeviceIo>,
}

/// One end of a data stream. A session lists its streams once for this
/// engine's own sockets and, while the peer reports them, once more for the
/// peer's end of the same connections ([`Stream::peer_end`]): the two ends of a
/// stream have opposite directions, so (`id`, `direction`) is unique.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stream {
    pub id: u32,
    /// `send` or `receive`: what this end does on the stream (a single data
    /// connection carries one direction).
    pub direction: EngineDirection,
    /// Payload bytes this end sent or received on the stream.
    pub bytes: u64,
    /// This engine's end of the stream's socket, "IP:PORT" (added in v1);
    /// absent on a [`Stream::peer_end`] entry (that socket is on the peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// The remote end of the stream's socket, "IP:PORT" (added in v1);
    /// absent on a [`Stream::peer_end`] entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Latest TCP_INFO sample of this end's socket; absent before the first
    /// sample or after the socket closed, and from a receiving end in the
    /// series view.
    #[serde(default)]
    pub tcp: Option<TcpInfo>,
    /// The peer's end of the stream, as the peer (`longhaul send`) reported
    /// it over the control connection during the data phase; `false` for
    /// this engine's own socket.
    #[serde(default)]
    pub peer_end: bool,
}

/// The TCP_INFO fields longhaul reports. Units are in the field names:
/// microseconds, bytes, and bits per second for rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TcpInfo {
    /// tcpi_rtt, microseconds.
    pub rtt_us: u32,
    /// tcpi_rttvar, microseconds.
    pub rttvar_us: u32,
    /// tcpi_snd_cwnd * tcpi_snd_mss, bytes.
    pub cwnd_bytes: u64,
    /// tcpi_total_retrans: segments retransmitted over the socket's life.
    pub retransmits: u64,
    /// tcpi_pacing_rate in bits per second (the kernel reports bytes/s;
    /// longhaul multiplies by 8).
    pub pacing_rate_bps: u64,
    /// tcpi_delivery_rate in bits per second (kernel bytes/s * 8).
    pub delivery_rate_bps: u64,
    /// tcpi_bytes_acked: bytes the peer acknowledged (a sender's delivered
    /// bytes).
    #[serde(default)]
    pub bytes_acked: u64,
    /// tcpi_data_segs_out: data segments sent, retransmissions included
    /// (the denominator of a retransmit ratio).
    #[serde(default)]
    pub segs_out: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceIo {
    /// Whole-disk kernel name, e.g. "sda", "nvme0n1".
    pub device: String,
    /// Controller id as in DESIGN.md: PCI address, "nvme0", or "virtual".
    pub controller: String,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_ignores_unknown_fields() {
        let text = r#"{"version":1,"engine":{"version":"0.1.0","pid":7,"started_unix":1.5,
            "sessions_total":2,"sessions_failed_total":0,"future_field":true},
            "sessions":[{"id":"s1","peer":"127.0.0.1:5","mode":"memory","direction":"receive",
            "state":"running","started_unix":2.0,"bytes_sent":0,"bytes_received":10,
            "streams":[{"id":0,"direction":"receive","bytes":10,"tcp":{"rtt_us":40,
            "rttvar_us":5,"cwnd_bytes":14480,"retransmits":0,"pacing_rate_bps":1,
            "delivery_rate_bps":2}}]}]}"#;
        let snap: Snapshot = serde_json::from_str(text).unwrap();
        assert!(
            snap.engine.admission.is_empty(),
            "an older engine lists no admission counters"
        );
        let older: Admission = serde_json::from_str(
            r#"{"listener":"iperf3","accepted":3,"admitted":1,"evicted":0,"expired":2,"garbage":0}"#,
        )
        .unwrap();
        assert_eq!(
            (older.refused, older.auth_failed),
            (Refused::default(), AuthFailed::default()),
            "an older engine counts no refusals or failed logins"
        );
        assert_eq!(snap.sessions[0].streams[0].tcp.unwrap().cwnd_bytes, 14480);
        assert!(snap.sessions[0].devices.is_empty());
        assert_eq!(snap.sessions[0].protocol, Protocol::Longhaul);
        assert_eq!(
            snap.sessions[0].local, None,
            "an older engine lists no addresses"
        );
        let again: Snapshot = serde_json::from_str(&serde_json::to_string(&snap).unwrap()).unwrap();
        assert_eq!(snap, again);
    }

    #[test]
    fn the_rows_view_is_the_series_view_with_its_streams_as_rows() {
        let tcp = TcpInfo {
            rtt_us: 40,
            rttvar_us: 5,
            cwnd_bytes: 14480,
            retransmits: 3,
            pacing_rate_bps: 7,
            delivery_rate_bps: 2,
            bytes_acked: 9,
            segs_out: 11,
        };
        let end = |id, direction, tcp: Option<TcpInfo>, peer_end| Stream {
            id,
            direction,
            bytes: 100 + u64::from(id),
            local: Some("10.0.0.1:7400".into()),
            peer: Some("10.0.0.2:40001".into()),
            tcp,
            peer_end,
        };
        let snap = Snapshot {
            version: 1,
            engine: EngineInfo::default(),
            sessions: vec![Session {
                id: "s1".into(),
                peer: "10.0.0.2:40000".into(),
                peer_host: Some("xfer-a".into()),
                protocol: Protocol::Longhaul,
                campaign: Some("c".into()),
                run: Some("r".into()),
                local: Some("10.0.0.1:7400".into()),
                mode: Mode::Memory,
                direction: EngineDirection::Receive,
                state: State::Running,
                started_unix: 2.0,
                bytes_sent: 0,
                bytes_received: 201,
                streams: vec![
                    end(0, EngineDirection::Receive, Some(tcp), false),
                    end(0, EngineDirection::Send, Some(tcp), true),
                    end(1, EngineDirection::Send, None, true),
                ],
                stream_rows: None,
                devices: Vec::new(),
            }],
        };
        let rows = serde_json::to_value(snap.clone().rows_view()).unwrap();
        let mut series = serde_json::to_value(snap.series_view()).unwrap();
        // Everything but the streams is the series view's, field for field.
        let mut without = rows.clone();
        let s = without["sessions"][0].as_object_mut().unwrap();
        let got = s.remove("stream_rows").unwrap();
        assert_eq!(
            s.insert("streams".into(), serde_json::json!([])),
            Some(serde_json::json!([]))
        );
        series["sessions"][0]["streams"] = serde_json::json!([]);
        assert_eq!(without, series);
        // A receiving end is [id, direction, bytes] (its TCP_INFO says
        // nothing); a sending end adds what the exporter reads of TCP_INFO.
        assert_eq!(
            got,
            serde_json::json!([
                [0, "receive", 100],
                [0, "send", 100, [40, 14480, 3, 11, 7]],
                [1, "send", 101]
            ])
        );
        // Every other answer has no rows, and reading one ignores them.
        let back: Snapshot = serde_json::from_value(rows).unwrap();
        assert!(back.sessions[0].stream_rows.is_none() && back.sessions[0].streams.is_empty());
    }

    #[test]
    fn campaign_and_run_are_optional_and_round_trip() {
        let text = r#"{"id":"s","peer":"p","mode":"memory","direction":"send","state":"running",
            "started_unix":0,"bytes_sent":0,"bytes_received":0,"streams":[]}"#;
        let mut session: Session = serde_json::from_str(text).unwrap();
        assert_eq!(
            (session.campaign.as_deref(), session.run.as_deref()),
            (None, None)
        );
        session.campaign = Some("fig5".into());
        session.run = Some("a-to-b".into());
        let text = serde_json::to_string(&session).unwrap();
        assert!(
            text.contains(r#""campaign":"fig5","run":"a-to-b""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Session>(&text).unwrap(), session);
    }

    #[test]
    fn plain_names_pass_and_others_are_told_why() {
        for good in [
            "fig5",
            "a-to-b",
            "mem_35x2M",
            "v1.2",
            &"x".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("a b", "contains ' '"),
            ("a/b", "contains '/'"),
            ("r\u{e9}sum\u{e9}", "contains 'é'"),
            ("a\nb", "contains '\\n'"),
            ("{x=\"y\"}", "contains '{'"),
            (".hidden", "starts with \".\""),
            ("-rf", "starts with \"-\""),
        ] {
            let err = check_name(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let long = "x".repeat(200);
        assert!(check_name(&long)
            .unwrap_err()
            .starts_with("200 characters long, at most 64"));
    }

    #[test]
    fn unknown_mode_is_an_error() {
        let text = r#"{"id":"s","peer":"p","mode":"tape","direction":"send","state":"running",
            "started_unix":0,"bytes_sent":0,"bytes_received":0,"streams":[]}"#;
        assert!(serde_json::from_str::<Session>(text).is_err());
    }
}
