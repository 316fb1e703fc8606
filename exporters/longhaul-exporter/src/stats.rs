//! The engine's stats API as the exporter reads it: one request per
//! collection, its answer walked as it arrives ([`crate::json`]) into an
//! [`EngineView`] that holds only what the `engine` and `tcp` collectors
//! use: the engine's counters, each session's labels and its streams
//! already folded to the series they export, and the engine's socket
//! addresses. Both collectors, and every scrape waiting on the same
//! collection, share one view (scrape.rs), so the answer is read and parsed
//! once per collection.
//!
//! Nothing an engine URL answers can make the exporter hold more than the
//! bounds below: the answer is never buffered (a window of
//! [`crate::json::WINDOW`] bytes), strings and numbers are capped
//! ([`crate::json::MAX_TOKEN`]), and every list it keeps has a limit sized
//! for the largest real answer. Beyond a limit the answer is refused (the
//! collector fails, its cause logged), except for stream labels, which
//! past [`MAX_STREAM_LABELS`] in all fold into `stream="other"` as past
//! the per-session cap.
//!
//! The walk follows the wire types of longhaul-stats-api (field names and
//! meanings); `a_serialised_snapshot_reads_as_the_wire_types_say` checks it
//! against them, so a field renamed there fails here.

use std::collections::HashSet;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use longhaul_stats_api::{
    check_name, Admission, DeviceIo, EngineDirection, Mode, Protocol, ROWS_VIEW_QUERY,
    SERIES_VIEW_QUERY, SESSIONS_PATH,
};

use crate::httpclient::{self, Url};
use crate::json::{self, Reader};

/// Answers longer than this are refused. The largest real answer, an
/// engine at its default 16 sessions of 1,024 streams each way (both ends
/// listed, ~250 bytes each) plus the ended sessions it keeps for a minute,
/// is a few tens of MiB; reading is streamed, so this bounds the time a
/// broken engine can take, not memory.
pub const MAX_BODY: u64 = 64 << 20;
/// Sessions an answer may list: the engine's largest `--max-sessions`
/// (4,096) and the 128 ended sessions it keeps.
pub const MAX_SESSIONS: usize = 4096 + 128;
/// Stream entries one session may list: 1,024 streams each way
/// (`--bidir`), both ends of each, twice over.
pub const MAX_SESSION_STREAMS: usize = 8192;
/// Stream labels of all sessions together; sessions listed after the
/// budget is spent get `stream="other"` only. 50 sessions at the
/// per-session cap of 256 fit.
pub const MAX_STREAM_LABELS: usize = 16384;
/// Block devices of all sessions together (disk mode lists the devices a
/// session reads or writes; a 64-disk server running many sessions).
pub const MAX_DEVICES: usize = 4096;
/// Listening ports of the engine (it has two or three).
pub const MAX_LISTENERS: usize = 16;
/// Socket address pairs kept for the tcp collector; beyond, the engine's
/// listening addresses alone tell its sockets (they do for all but a
/// client on this host that bound another local address).
pub const MAX_CONNECTIONS: usize = 32768;

/// TCP_INFO of one socket as the exporter uses it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tcp {
    pub rtt_us: u32,
    pub cwnd_bytes: u64,
    pub retransmits: u64,
    pub segs_out: u64,
    pub pacing_rate_bps: u64,
}

/// TCP_INFO of the sending sockets behind a row: sums, and the RTT as a
/// mean ([`TcpSums::rtt_seconds`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TcpSums {
    pub retransmits: u64,
    pub cwnd_bytes: u64,
    pub segs_out: u64,
    pub pacing_bytes_per_second: u64,
    rtt_sum_us: f64,
    sockets: u32,
}

impl TcpSums {
    fn add(&mut self, t: &Tcp) {
        self.retransmits += t.retransmits;
        self.cwnd_bytes += t.cwnd_bytes;
        self.segs_out += t.segs_out;
        self.pacing_bytes_per_second += t.pacing_rate_bps / 8;
        self.rtt_sum_us += f64::from(t.rtt_us);
        self.sockets += 1;
    }

    pub fn rtt_seconds(&self) -> f64 {
        self.rtt_sum_us / f64::from(self.sockets.max(1)) / 1e6
    }
}

/// Which stream a row is: one id, or the streams beyond the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamLabel {
    Id(u32),
    Other,
}

/// One row of a session's streams, with what it exports (the series
/// budget, docs/visibility.md): the bytes delivered, read at the receiving
/// end (or at the sending end where no receiving end is listed), and the
/// TCP state of the sending end.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRow {
    pub stream: StreamLabel,
    /// Bytes received by the receiving ends of the row's streams.
    pub received: Option<u64>,
    /// Bytes sent by the sending ends of the row's streams that have no
    /// receiving end listed.
    pub sent_unpaired: Option<u64>,
    /// The sending ends' TCP_INFO.
    pub tcp: Option<TcpSums>,
}

/// One session, as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionView {
    pub id: String,
    pub peer: String,
    pub peer_host: Option<String>,
    /// The campaign and run the client named, when both are plain names
    /// ([`check_name`]): an engine that let another through, or a stranger's
    /// stats API, does not get it into a label.
    pub campaign: Option<String>,
    pub run: Option<String>,
    pub mode: Mode,
    pub direction: EngineDirection,
    pub protocol: Protocol,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Labelled streams in id order, then "other" if any stream is beyond.
    pub streams: Vec<StreamRow>,
    pub devices: Vec<DeviceIo>,
}

/// What a collection needs of one stats API answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineView {
    pub started_unix: f64,
    pub sessions_total: u64,
    pub sessions_failed_total: u64,
    pub admission: Vec<Admission>,
    pub sessions: Vec<SessionView>,
    /// The addresses the engine listens on (IPv4-mapped ones as IPv4).
    pub listening: Vec<SocketAddr>,
    /// Every socket the engine lists, as (its end, the remote end): the
    /// sessions' control connections, and each stream's socket in an
    /// answer that lists their addresses (the series view does not: the
    /// listening addresses tell those sockets).
    pub connections: HashSet<(SocketAddr, SocketAddr)>,
}

/// How long an engine that refused the rows view is asked for the series
/// view alone before the rows view is tried again.
pub const ROWS_RETRY: Duration = Duration::from_secs(600);

/// The engine's stats API at `--engine.url`, read with `--engine.timeout`.
pub struct EngineApi {
    url: Url,
    timeout: Duration,
    max_streams: usize,
    /// An engine that answered 400 to the rows view (one from before it):
    /// its start time (None until a series view has told it), and when it
    /// refused. It is asked for the series view, without a refused request
    /// each time, until an engine that started at another time answers, or
    /// for [`ROWS_RETRY`] (an engine replaced by a newer one between the
    /// two requests).
    without_rows: Mutex<Option<(Option<f64>, Instant)>>,
}

impl EngineApi {
    pub fn new(url: &str, timeout: Duration, max_streams: usize) -> anyhow::Result<EngineApi> {
        Ok(EngineApi {
            url: Url::parse(url).map_err(anyhow::Error::msg)?,
            timeout,
            max_streams,
            without_rows: Mutex::new(None),
        })
    }

    /// Reads one answer: the rows view, which leaves out what no series
    /// carries and writes no key per stream; from an engine that does not
    /// know it (400), the series view, within what is left of the timeout
    /// (an engine from before both answers the whole snapshot, which reads
    /// the same way).
    pub fn view(&self) -> anyhow::Result<EngineView> {
        let begun = Instant::now();
        let remember = |state| *self.without_rows.lock().unwrap_or_else(|p| p.into_inner()) = state;
        let mut older = *self.without_rows.lock().unwrap_or_else(|p| p.into_inner());
        if older.is_none_or(|(_, since)| since.elapsed() >= ROWS_RETRY) {
            match self.read_view(ROWS_VIEW_QUERY, self.timeout) {
                Err(e) if httpclient::status(&e) == Some(400) => {
                    if older.is_none() {
                        crate::log(&format!(
                            "{:#}: asking this engine for the series view instead",
                            e.context("the rows view refused")
                        ));
                    }
                    // Remembered now, whether or not the series view answers:
                    // its start time is learnt from the first one that does.
                    older = Some((None, Instant::now()));
                    remember(older);
                }
                answer => {
                    if answer.is_ok() {
                        remember(None);
                    }
                    return answer;
                }
            }
        }
        let left = self.timeout.saturating_sub(begun.elapsed());
        if left.is_zero() {
            anyhow::bail!("no complete answer within {:?}", self.timeout);
        }
        let view = self.read_view(SERIES_VIEW_QUERY, left)?;
        remember(match older {
            // The engine that refused (the first to answer since, when its
            // start time is not known yet), within ROWS_RETRY.
            Some((started, since)) if started.is_none_or(|s| s == view.started_unix) => {
                Some((Some(view.started_unix), since))
            }
            // Another engine: it is asked for the rows view next time.
            _ => None,
        });
        Ok(view)
    }

    fn read_view(&self, query: &str, timeout: Duration) -> anyhow::Result<EngineView> {
        let path = format!("{SESSIONS_PATH}?{query}");
        let where_ = || {
            format!(
                "engine stats API http://{}:{}{}{path}",
                self.url.host, self.url.port, self.url.prefix
            )
        };
        let body = httpclient::open(&self.url, &path, timeout).with_context(where_)?;
        read(body, self.max_streams)
            .map_err(|e| match e {
                json::Error::Io(io) if httpclient::timed_out(&io) => {
                    anyhow::anyhow!("no complete answer within {:?}", self.timeout)
                }
                e => anyhow::Error::new(e)
                    .context("engine stats API answered something that is not a v1 snapshot"),
            })
            .with_context(where_)
    }
}

/// Whether a failed [`EngineApi::view`] found no engine at all: its
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

/// Reads a whole answer from `src`; `max_streams` stream labels per session.
pub fn read<R: Read>(src: R, max_streams: usize) -> json::Result<EngineView> {
    let mut r = Reader::new(src, MAX_BODY);
    let mut walk = Walk {
        view: EngineView::default(),
        labels_left: MAX_STREAM_LABELS,
        max_streams,
        devices: 0,
        ends: 0,
        entries: Vec::new(),
    };
    let mut version = None;
    let mut sessions = false;
    let mut o = r.begin_object()?;
    while let Some(k) = o.key(&mut r)? {
        match k.as_str() {
            "version" => version = Some(r.u64()?),
            "engine" => walk.engine(&mut r)?,
            "sessions" => {
                walk.sessions(&mut r)?;
                sessions = true;
            }
            _ => r.skip()?,
        }
    }
    r.finish()?;
    if version != Some(u64::from(longhaul_stats_api::API_VERSION)) || !sessions {
        return r.error(format!(
            "a version {} snapshot with its sessions expected",
            longhaul_stats_api::API_VERSION
        ));
    }
    Ok(walk.view)
}

/// One stream entry of the session being read.
#[derive(Clone, Copy)]
struct Entry {
    id: u32,
    send: bool,
    bytes: u64,
    tcp: Option<Tcp>,
}

struct Walk {
    view: EngineView,
    labels_left: usize,
    max_streams: usize,
    devices: usize,
    /// Stream ends of the current session read so far, every direction.
    ends: usize,
    /// The current session's stream entries (reused).
    entries: Vec<Entry>,
}

fn too_many<T, R: Read>(r: &Reader<R>, what: &str, limit: usize) -> json::Result<T> {
    r.error(format!("more than {limit} {what}"))
}

/// `text` as a socket address, an IPv4-mapped IPv6 one as IPv4 (an engine
/// on `[::]` lists `[::ffff:10.0.0.1]:7400`, sock_diag the same socket as
/// `10.0.0.1:7400`).
pub fn address(text: &str) -> Option<SocketAddr> {
    let a: SocketAddr = text.parse().ok()?;
    Some(SocketAddr::new(a.ip().to_canonical(), a.port()))
}

fn opt_string<R: Read>(r: &mut Reader<R>) -> json::Result<Option<String>> {
    if r.null()? {
        return Ok(None);
    }
    Ok(Some(r.string()?.to_string()))
}

/// A campaign or run name, kept only when it is plain ([`check_name`]).
fn plain_name<R: Read>(r: &mut Reader<R>) -> json::Result<Option<String>> {
    Ok(opt_string(r)?.filter(|name| check_name(name).is_ok()))
}

fn direction<R: Read>(r: &mut Reader<R>) -> json::Result<EngineDirection> {
    let d = match r.raw_string()? {
        b"send" => Some(EngineDirection::Send),
        b"receive" => Some(EngineDirection::Receive),
        b"bidir" => Some(EngineDirection::Bidir),
        _ => None,
    };
    d.map_or_else(|| r.error("an unknown direction"), Ok)
}

impl Walk {
    fn engine<R: Read>(&mut self, r: &mut Reader<R>) -> json::Result<()> {
        let mut o = r.begin_object()?;
        while let Some(k) = o.key(r)? {
            match k.as_str() {
                "started_unix" => self.view.started_unix = r.f64()?,
                "sessions_total" => self.view.sessions_total = r.u64()?,
                "sessions_failed_total" => self.view.sessions_failed_total = r.u64()?,
                "admission" => {
                    let mut a = r.begin_array()?;
                    while a.next(r)? {
                        if self.view.admission.len() == MAX_LISTENERS {
                            return too_many(r, "listeners", MAX_LISTENERS);
                        }
                        let adm = admission(r)?;
                        if let Some(addr) = adm.address.as_deref().and_then(address) {
                            self.view.listening.push(addr);
                        }
                        self.view.admission.push(adm);
                    }
                }
                _ => r.skip()?,
            }
        }
        Ok(())
    }

    fn sessions<R: Read>(&mut self, r: &mut Reader<R>) -> json::Result<()> {
        let mut a = r.begin_array()?;
        while a.next(r)? {
            if self.view.sessions.len() == MAX_SESSIONS {
                return too_many(r, "sessions", MAX_SESSIONS);
            }
            let s = self.session(r)?;
            self.view.sessions.push(s);
        }
        Ok(())
    }

    fn connection(&mut self, local: Option<&str>, peer: Option<&str>) {
        if self.view.connections.len() >= MAX_CONNECTIONS {
            return;
        }
        if let (Some(l), Some(p)) = (local.and_then(address), peer.and_then(address)) {
            self.view.connections.insert((l, p));
        }
    }

    fn session<R: Read>(&mut self, r: &mut Reader<R>) -> json::Result<SessionView> {
        let (mut id, mut peer, mut peer_host, mut local) = (None, None, None, None);
        let (mut campaign, mut run) = (None, None);
        let (mut mode, mut dir, mut protocol) = (None, None, Protocol::Longhaul);
        let (mut sent, mut received) = (0, 0);
        let mut devices = Vec::new();
        let mut streams = false;
        self.entries.clear();
        self.ends = 0;
        let mut o = r.begin_object()?;
        while let Some(k) = o.key(r)? {
            match k.as_str() {
                "id" => id = Some(r.string()?.to_string()),
                "peer" => peer = Some(r.string()?.to_string()),
                "peer_host" => peer_host = opt_string(r)?,
                "campaign" => campaign = plain_name(r)?,
                "run" => run = plain_name(r)?,
                "local" => local = opt_string(r)?,
                "protocol" => {
                    protocol = match r.raw_string()? {
                        b"longhaul" => Some(Protocol::Longhaul),
                        b"iperf3" => Some(Protocol::Iperf3),
                        _ => None,
                    }
                    .map_or_else(|| r.error("an unknown protocol"), Ok)?
                }
                "mode" => {
                    let m = match r.raw_string()? {
                        b"memory" => Some(Mode::Memory),
                        b"disk" => Some(Mode::Disk),
                        _ => None,
                    };
                    mode = Some(m.map_or_else(|| r.error("an unknown mode"), Ok)?);
                }
                "direction" => dir = Some(direction(r)?),
                "bytes_sent" => sent = r.u64()?,
                "bytes_received" => received = r.u64()?,
                "streams" => {
                    self.streams(r)?;
                    streams = true;
                }
                "stream_rows" => self.stream_rows(r)?,
                "devices" => {
                    let mut a = r.begin_array()?;
                    while a.next(r)? {
                        if self.devices == MAX_DEVICES {
                            return too_many(r, "devices", MAX_DEVICES);
                        }
                        self.devices += 1;
                        devices.push(device(r)?);
                    }
                }
                _ => r.skip()?,
            }
        }
        let (Some(id), Some(peer), Some(mode), Some(direction), true) =
            (id, peer, mode, dir, streams)
        else {
            return r.error("a session without id, peer, mode, direction or streams");
        };
        self.connection(local.as_deref(), Some(&peer));
        let cap = self.max_streams.min(self.labels_left);
        let rows = fold(&mut self.entries, cap);
        self.labels_left -= rows
            .iter()
            .filter(|r| matches!(r.stream, StreamLabel::Id(_)))
            .count();
        Ok(SessionView {
            id,
            peer,
            peer_host,
            campaign,
            run,
            mode,
            direction,
            protocol,
            bytes_sent: sent,
            bytes_received: received,
            streams: rows,
            devices,
        })
    }

    fn streams<R: Read>(&mut self, r: &mut Reader<R>) -> json::Result<()> {
        let mut a = r.begin_array()?;
        while a.next(r)? {
            self.count_end(r)?;
            let (mut id, mut dir, mut bytes, mut tcp) = (None, None, None, None);
            let (mut local, mut peer) = (None, None);
            let mut o = r.begin_object()?;
            while let Some(k) = o.key(r)? {
                match k.as_str() {
                    "id" => id = Some(r.u32()?),
                    "direction" => dir = Some(direction(r)?),
                    "bytes" => bytes = Some(r.u64()?),
                    "tcp" => tcp = tcp_info(r)?,
                    // Only this engine's own ends carry addresses.
                    "local" => local = opt_address(r)?,
                    "peer" => peer = opt_address(r)?,
                    _ => r.skip()?,
                }
            }
            let (Some(id), Some(dir), Some(bytes)) = (id, dir, bytes) else {
                return r.error("a stream without id, direction or bytes");
            };
            if let (Some(l), Some(p)) = (local, peer) {
                if self.view.connections.len() < MAX_CONNECTIONS {
                    self.view.connections.insert((l, p));
                }
            }
            self.entry(id, dir, bytes, tcp);
        }
        Ok(())
    }

    /// The rows view's streams (`longhaul_stats_api::StreamRows`): each end
    /// `[id, direction, bytes]` or `[id, direction, bytes, tcp]`, `tcp` a
    /// sending end's `[rtt_us, cwnd_bytes, retransmits, segs_out,
    /// pacing_rate_bps]` or null; what a newer engine appends, to a row or
    /// to its `tcp`, is skipped.
    fn stream_rows<R: Read>(&mut self, r: &mut Reader<R>) -> json::Result<()> {
        const SHORT: &str = "a stream row without id, direction or bytes";
        let mut a = r.begin_array()?;
        while a.next(r)? {
            self.count_end(r)?;
            let mut row = r.begin_array()?;
            row.required(r, SHORT)?;
            let id = r.u32()?;
            row.required(r, SHORT)?;
            let dir = direction(r)?;
            row.required(r, SHORT)?;
            let bytes = r.u64()?;
            let mut tcp = None;
            if row.next(r)? {
                tcp = tcp_row(r)?;
                while row.next(r)? {
                    r.skip()?;
                }
            }
            self.entry(id, dir, bytes, tcp);
        }
        Ok(())
    }

    /// Counts one more stream end of the session being read, whatever its
    /// direction, against [`MAX_SESSION_STREAMS`].
    fn count_end<R: Read>(&mut self, r: &Reader<R>) -> json::Result<()> {
        if self.ends == MAX_SESSION_STREAMS {
            return too_many(r, "streams in a session", MAX_SESSION_STREAMS);
        }
        self.ends += 1;
        Ok(())
    }

    /// One stream end of the session being read.
    fn entry(&mut self, id: u32, dir: EngineDirection, bytes: u64, tcp: Option<Tcp>) {
        match dir {
            EngineDirection::Send | EngineDirection::Receive => self.entries.push(Entry {
                id,
                send: dir == EngineDirection::Send,
                bytes,
                tcp,
            }),
            // A data connection carries one direction; nothing to fold.
            EngineDirection::Bidir => {}
        }
    }
}

fn opt_address<R: Read>(r: &mut Reader<R>) -> json::Result<Option<SocketAddr>> {
    if r.null()? {
        return Ok(None);
    }
    Ok(address(r.string()?))
}

fn admission<R: Read>(r: &mut Reader<R>) -> json::Result<Admission> {
    let mut a = Admission::default();
    let mut listener = None;
    let mut o = r.begin_object()?;
    while let Some(k) = o.key(r)? {
        match k.as_str() {
            "listener" => listener = Some(r.string()?.to_string()),
            "address" => a.address = opt_string(r)?,
            "accepted" => a.accepted = r.u64()?,
            "admitted" => a.admitted = r.u64()?,
            "evicted" => a.evicted = r.u64()?,
            "expired" => a.expired = r.u64()?,
            "garbage" => a.garbage = r.u64()?,
            "refused" => {
                let mut o = r.begin_object()?;
                while let Some(k) = o.key(r)? {
                    match k.as_str() {
                        "busy" => a.refused.busy = r.u64()?,
                        "source_busy" => a.refused.source_busy = r.u64()?,
                        "attach_timeout" => a.refused.attach_timeout = r.u64()?,
                        _ => r.skip()?,
                    }
                }
            }
            "auth_failed" => {
                let mut o = r.begin_object()?;
                while let Some(k) = o.key(r)? {
                    match k.as_str() {
                        "bad_token" => a.auth_failed.bad_token = r.u64()?,
                        "bad_version" => a.auth_failed.bad_version = r.u64()?,
                        "bad_proof" => a.auth_failed.bad_proof = r.u64()?,
                        "timeout" => a.auth_failed.timeout = r.u64()?,
                        _ => r.skip()?,
                    }
                }
            }
            _ => r.skip()?,
        }
    }
    a.listener = match listener {
        Some(l) => l,
        None => return r.error("an admission entry without its listener"),
    };
    Ok(a)
}

fn device<R: Read>(r: &mut Reader<R>) -> json::Result<DeviceIo> {
    let (mut device, mut controller) = (None, None);
    let (mut read, mut written) = (0, 0);
    let mut o = r.begin_object()?;
    while let Some(k) = o.key(r)? {
        match k.as_str() {
            "device" => device = Some(r.string()?.to_string()),
            "controller" => controller = Some(r.string()?.to_string()),
            "read_bytes" => read = r.u64()?,
            "written_bytes" => written = r.u64()?,
            _ => r.skip()?,
        }
    }
    match (device, controller) {
        (Some(device), Some(controller)) => Ok(DeviceIo {
            device,
            controller,
            read_bytes: read,
            written_bytes: written,
        }),
        _ => r.error("a device without its name or controller"),
    }
}

/// A stream row's TCP_INFO: null, or `[rtt_us, cwnd_bytes, retransmits,
/// segs_out, pacing_rate_bps]` and whatever a newer engine appends.
fn tcp_row<R: Read>(r: &mut Reader<R>) -> json::Result<Option<Tcp>> {
    if r.null()? {
        return Ok(None);
    }
    let mut a = r.begin_array()?;
    let mut t = Tcp::default();
    let mut rtt = u64::from(t.rtt_us);
    for field in [
        &mut rtt,
        &mut t.cwnd_bytes,
        &mut t.retransmits,
        &mut t.segs_out,
        &mut t.pacing_rate_bps,
    ] {
        a.required(r, "a stream row with part of its TCP_INFO")?;
        *field = r.u64()?;
    }
    t.rtt_us = u32::try_from(rtt).or_else(|_| r.error("an RTT beyond 32 bits"))?;
    while a.next(r)? {
        r.skip()?;
    }
    Ok(Some(t))
}

fn tcp_info<R: Read>(r: &mut Reader<R>) -> json::Result<Option<Tcp>> {
    if r.null()? {
        return Ok(None);
    }
    let mut t = Tcp::default();
    let mut o = r.begin_object()?;
    while let Some(k) = o.key(r)? {
        match k.as_str() {
            "rtt_us" => t.rtt_us = r.u32()?,
            "cwnd_bytes" => t.cwnd_bytes = r.u64()?,
            "retransmits" => t.retransmits = r.u64()?,
            "segs_out" => t.segs_out = r.u64()?,
            "pacing_rate_bps" => t.pacing_rate_bps = r.u64()?,
            _ => r.skip()?,
        }
    }
    Ok(Some(t))
}

/// A session's stream entries as rows: the `cap` lowest stream ids each a
/// row of their own, the rest folded into one "other" row. Each row counts
/// the bytes its receiving ends received (a stream with no receiving end
/// listed, such as a reverse iperf3 test's, counts its sending end's) and
/// sums the TCP_INFO of its sending ends.
fn fold(entries: &mut [Entry], cap: usize) -> Vec<StreamRow> {
    // A stable sort: the engine lists its own ends in id order, then the
    // peer's, two runs it merges in one pass.
    entries.sort_by_key(|e| (e.id, e.send));
    let mut rows = Vec::new();
    let mut other = StreamRow {
        stream: StreamLabel::Other,
        received: None,
        sent_unpaired: None,
        tcp: None,
    };
    let mut labelled = 0;
    let mut i = 0;
    while i < entries.len() {
        let id = entries[i].id;
        let mut j = i;
        while j < entries.len() && entries[j].id == id {
            j += 1;
        }
        let ends = &entries[i..j];
        i = j;
        let row = if labelled < cap {
            labelled += 1;
            rows.push(StreamRow {
                stream: StreamLabel::Id(id),
                received: None,
                sent_unpaired: None,
                tcp: None,
            });
            rows.last_mut().expect("just pushed")
        } else {
            &mut other
        };
        let receiving = ends.iter().any(|e| !e.send);
        for e in ends {
            if !e.send {
                *row.received.get_or_insert(0) += e.bytes;
            } else {
                if !receiving {
                    *row.sent_unpaired.get_or_insert(0) += e.bytes;
                }
                if let Some(t) = &e.tcp {
                    row.tcp.get_or_insert_with(TcpSums::default).add(t);
                }
            }
        }
    }
    if other.received.is_some() || other.sent_unpaired.is_some() || other.tcp.is_some() {
        rows.push(other);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_stats_api::{EngineInfo, Session, Snapshot, State, Stream, TcpInfo};

    fn stream(id: u32, direction: EngineDirection, peer_end: bool) -> Stream {
        Stream {
            id,
            direction,
            bytes: 100 + u64::from(id),
            local: (!peer_end).then(|| "10.0.0.1:7400".to_string()),
            peer: (!peer_end).then(|| format!("10.0.0.2:{}", 40001 + id)),
            tcp: Some(TcpInfo {
                rtt_us: 1000 * (id + 1),
                rttvar_us: 7,
                cwnd_bytes: 100,
                retransmits: 1,
                pacing_rate_bps: 8000,
                delivery_rate_bps: 9,
                bytes_acked: 11,
                segs_out: 13,
            }),
            peer_end,
        }
    }

    fn snapshot() -> Snapshot {
        let mut streams: Vec<Stream> = (0..4)
            .map(|id| stream(id, EngineDirection::Receive, false))
            .collect();
        streams.extend((0..4).map(|id| stream(id, EngineDirection::Send, true)));
        Snapshot {
            version: 1,
            engine: EngineInfo {
                version: "0.1.0".into(),
                pid: 7,
                started_unix: 1.5,
                sessions_total: 3,
                sessions_failed_total: 1,
                admission: vec![Admission {
                    listener: "longhaul".into(),
                    address: Some("[::ffff:10.0.0.1]:7400".into()),
                    accepted: 5,
                    admitted: 4,
                    evicted: 3,
                    expired: 2,
                    garbage: 1,
                    refused: longhaul_stats_api::Refused {
                        busy: 6,
                        source_busy: 5,
                        attach_timeout: 4,
                    },
                    auth_failed: longhaul_stats_api::AuthFailed {
                        bad_token: 3,
                        bad_version: 2,
                        bad_proof: 1,
                        timeout: 7,
                    },
                }],
            },
            sessions: vec![Session {
                id: "s\"1".into(),
                peer: "10.0.0.2:40000".into(),
                peer_host: Some("xfer-a".into()),
                campaign: Some("fig5".into()),
                run: Some("a-to-b".into()),
                protocol: Protocol::Iperf3,
                local: Some("10.0.0.1:7400".into()),
                mode: Mode::Disk,
                direction: EngineDirection::Receive,
                state: State::Running,
                started_unix: 2.0,
                bytes_sent: 0,
                bytes_received: 1000,
                streams,
                stream_rows: None,
                devices: vec![DeviceIo {
                    device: "sdc".into(),
                    controller: "0000:03:00.0".into(),
                    read_bytes: 0,
                    written_bytes: 1000,
                }],
            }],
        }
    }

    /// The walk reads what serde writes from the wire types: a field
    /// renamed in longhaul-stats-api fails here.
    #[test]
    fn a_serialised_snapshot_reads_as_the_wire_types_say() {
        let snap = snapshot();
        let text = serde_json::to_vec_pretty(&snap).unwrap();
        let view = read(&text[..], 3).unwrap();
        assert_eq!(view.started_unix, 1.5);
        assert_eq!((view.sessions_total, view.sessions_failed_total), (3, 1));
        assert_eq!(view.admission, snap.engine.admission);
        assert_eq!(view.listening, ["10.0.0.1:7400".parse().unwrap()]);
        let s = &view.sessions[0];
        let want = &snap.sessions[0];
        assert_eq!(
            (
                &s.id,
                &s.peer,
                &s.peer_host,
                &s.campaign,
                &s.run,
                s.mode,
                s.direction,
                s.protocol
            ),
            (
                &want.id,
                &want.peer,
                &want.peer_host,
                &want.campaign,
                &want.run,
                want.mode,
                want.direction,
                want.protocol
            )
        );
        assert_eq!((s.bytes_sent, s.bytes_received), (0, 1000));
        assert_eq!(s.devices, want.devices);
        // Three stream labels and "other": each row's bytes from its
        // receiving end, its TCP state from its sending end.
        let labels: Vec<StreamLabel> = s.streams.iter().map(|r| r.stream).collect();
        use StreamLabel::*;
        assert_eq!(labels, [Id(0), Id(1), Id(2), Other]);
        assert_eq!(s.streams[1].received, Some(101));
        assert_eq!(s.streams[1].sent_unpaired, None);
        let tcp = s.streams[1].tcp.unwrap();
        assert_eq!(
            (tcp.retransmits, tcp.cwnd_bytes, tcp.segs_out),
            (1, 100, 13)
        );
        assert_eq!(tcp.pacing_bytes_per_second, 1000);
        assert!((tcp.rtt_seconds() - 0.002).abs() < 1e-12);
        assert_eq!(s.streams[3].received, Some(103));
        // The control connection and each of the engine's own stream sockets.
        assert_eq!(view.connections.len(), 5);
        assert!(view.connections.contains(&(
            "10.0.0.1:7400".parse().unwrap(),
            "10.0.0.2:40003".parse().unwrap()
        )));
    }

    #[test]
    fn the_rows_view_reads_as_the_series_view_does() {
        let snap = snapshot();
        let series = serde_json::to_vec(&snap.clone().series_view()).unwrap();
        let rows = serde_json::to_vec(&snap.rows_view()).unwrap();
        assert!(rows.len() < series.len());
        for cap in [1, 3, 256] {
            assert_eq!(
                read(&rows[..], cap).unwrap(),
                read(&series[..], cap).unwrap()
            );
        }
        // What a newer engine appends to a row is skipped; a row too short
        // for what it must hold is refused, naming it.
        let row = |rows: &str| {
            format!(
                r#"{{"version":1,"sessions":[{{"id":"x","peer":"p","mode":"memory","direction":"send","streams":[],"stream_rows":{rows}}}]}}"#
            )
        };
        let v = read(
            row(r#"[[0,"send",5,[2000,100,1,13,8000,{"later":[1]}],"x"],[0,"receive",4,null,7]]"#)
                .as_bytes(),
            4,
        )
        .unwrap();
        let r = &v.sessions[0].streams[0];
        assert_eq!(
            (
                r.received,
                r.tcp.unwrap().segs_out,
                r.tcp.unwrap().pacing_bytes_per_second
            ),
            (Some(4), 13, 1000)
        );
        for (rows, needle) in [
            (r#"[[0,"send"]]"#, "without id, direction or bytes"),
            (r#"[[]]"#, "without id, direction or bytes"),
            (r#"[[0,"send",5,[2000,100]]]"#, "part of its TCP_INFO"),
            (r#"[[0,"send",5,2000]]"#, "'[' belongs"),
            (r#"[[0,"sideways",5]]"#, "direction"),
            (r#"[{"id":0}]"#, "'[' belongs"),
        ] {
            let e = read(row(rows).as_bytes(), 4).unwrap_err().to_string();
            assert!(e.contains(needle), "{rows}: {e}");
        }
    }

    /// Every field the wire types write is read by the walk or knowingly
    /// left out: a field added to longhaul-stats-api fails here until the
    /// exporter reads it (a key in the walk, a field in the view) or says
    /// why not.
    #[test]
    fn every_wire_field_is_read_or_knowingly_left_out() {
        fn paths(v: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        let here = if at.is_empty() {
                            k.clone()
                        } else {
                            format!("{at}.{k}")
                        };
                        out.insert(here.clone());
                        paths(v, &here, out);
                    }
                }
                serde_json::Value::Array(a) => {
                    for v in a {
                        paths(v, &format!("{at}[]"), out);
                    }
                }
                _ => {}
            }
        }
        use std::collections::BTreeSet;
        let mut written = BTreeSet::new();
        paths(&serde_json::to_value(snapshot()).unwrap(), "", &mut written);
        let read = [
            "version",
            "engine",
            "engine.started_unix",
            "engine.sessions_total",
            "engine.sessions_failed_total",
            "engine.admission",
            "engine.admission[].listener",
            "engine.admission[].address",
            "engine.admission[].accepted",
            "engine.admission[].admitted",
            "engine.admission[].evicted",
            "engine.admission[].expired",
            "engine.admission[].garbage",
            "engine.admission[].refused",
            "engine.admission[].refused.busy",
            "engine.admission[].refused.source_busy",
            "engine.admission[].refused.attach_timeout",
            "engine.admission[].auth_failed",
            "engine.admission[].auth_failed.bad_token",
            "engine.admission[].auth_failed.bad_version",
            "engine.admission[].auth_failed.bad_proof",
            "engine.admission[].auth_failed.timeout",
            "sessions",
            "sessions[].id",
            "sessions[].peer",
            "sessions[].peer_host",
            "sessions[].campaign",
            "sessions[].run",
            "sessions[].protocol",
            "sessions[].local",
            "sessions[].mode",
            "sessions[].direction",
            "sessions[].bytes_sent",
            "sessions[].bytes_received",
            "sessions[].streams",
            "sessions[].streams[].id",
            "sessions[].streams[].direction",
            "sessions[].streams[].bytes",
            "sessions[].streams[].local",
            "sessions[].streams[].peer",
            "sessions[].streams[].tcp",
            "sessions[].streams[].tcp.rtt_us",
            "sessions[].streams[].tcp.cwnd_bytes",
            "sessions[].streams[].tcp.retransmits",
            "sessions[].streams[].tcp.segs_out",
            "sessions[].streams[].tcp.pacing_rate_bps",
            "sessions[].devices",
            "sessions[].devices[].device",
            "sessions[].devices[].controller",
            "sessions[].devices[].read_bytes",
            "sessions[].devices[].written_bytes",
        ];
        // Not exported: no series carries them (docs/visibility.md).
        let left_out = [
            "engine.version",
            "engine.pid",
            "sessions[].state",
            "sessions[].started_unix",
            "sessions[].streams[].peer_end",
            "sessions[].streams[].tcp.rttvar_us",
            "sessions[].streams[].tcp.delivery_rate_bps",
            "sessions[].streams[].tcp.bytes_acked",
        ];
        let known: BTreeSet<String> = read
            .iter()
            .chain(&left_out)
            .map(|k| k.to_string())
            .collect();
        let new: Vec<&String> = written.difference(&known).collect();
        assert!(
            new.is_empty(),
            "fields the exporter neither reads nor leaves out: {new:?}"
        );
    }

    #[test]
    fn a_stream_without_a_receiving_end_counts_its_sending_end() {
        let mut snap = snapshot();
        // A reverse iperf3 test: only the server's sending sockets.
        snap.sessions[0].streams = (0..3)
            .map(|id| stream(id, EngineDirection::Send, false))
            .collect();
        let text = serde_json::to_vec(&snap).unwrap();
        let view = read(&text[..], 1).unwrap();
        let rows = &view.sessions[0].streams;
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].received, rows[0].sent_unpaired), (None, Some(100)));
        assert_eq!(rows[1].sent_unpaired, Some(101 + 102));
        assert!((rows[1].tcp.unwrap().rtt_seconds() - 0.0025).abs() < 1e-12);
    }

    #[test]
    fn stream_labels_are_budgeted_across_sessions() {
        let mut snap = snapshot();
        let one = snap.sessions[0].clone();
        let per = 4;
        let sessions = MAX_STREAM_LABELS / per + 2;
        snap.sessions = (0..sessions)
            .map(|i| Session {
                id: format!("s{i}"),
                devices: Vec::new(),
                ..one.clone()
            })
            .collect();
        let text = serde_json::to_vec(&snap).unwrap();
        let view = read(&text[..], 256).unwrap();
        let labelled: usize = view
            .sessions
            .iter()
            .flat_map(|s| &s.streams)
            .filter(|r| matches!(r.stream, StreamLabel::Id(_)))
            .count();
        assert_eq!(labelled, MAX_STREAM_LABELS);
        let last = &view.sessions[sessions - 1].streams;
        assert_eq!(last.len(), 1, "only other: {last:?}");
        assert_eq!(last[0].received, Some(100 + 101 + 102 + 103));
    }

    /// No engine on the port is told from one that does not answer well:
    /// the tcp collector stops leaving the engine's ports to it only then.
    #[test]
    fn a_refused_connection_is_told_from_other_failures() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let api = |addr: SocketAddr| {
            EngineApi::new(&format!("http://{addr}"), Duration::from_millis(500), 256).unwrap()
        };
        let e = api(closed).view().unwrap_err();
        assert!(refused(&e), "{e:#}");
        // Something listens but never answers: a timeout, not a refusal.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = api(silent.local_addr().unwrap()).view().unwrap_err();
        assert!(!refused(&e), "{e:#}");
        assert!(format!("{e:#}").contains("within"), "{e:#}");
    }

    /// An engine on [::] lists IPv4 peers as mapped addresses; an older
    /// engine lists none, and garbage is skipped.
    #[test]
    fn connections_are_read_as_sock_diag_shows_them() {
        let mut snap = snapshot();
        snap.sessions[0].local = Some("[::ffff:10.0.0.1]:7400".into());
        snap.sessions[0].streams[1].peer = Some("[::ffff:10.0.0.2]:40009".into());
        snap.sessions[0].streams[2].peer = Some("not an address".into());
        let text = serde_json::to_vec(&snap).unwrap();
        let found = read(&text[..], 256).unwrap().connections;
        let pair = |l: &str, r: &str| (l.parse().unwrap(), r.parse().unwrap());
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40000")));
        assert!(found.contains(&pair("10.0.0.1:7400", "10.0.0.2:40009")));
        assert_eq!(found.len(), 4, "{found:?}");
        snap.sessions[0].local = None;
        for st in &mut snap.sessions[0].streams {
            st.local = None;
        }
        let text = serde_json::to_vec(&snap).unwrap();
        assert!(read(&text[..], 256).unwrap().connections.is_empty());
    }

    /// 2,000 damaged answers (bytes changed, cut short, spliced): each is
    /// read or refused, never a panic.
    #[test]
    fn damaged_answers_are_read_or_refused() {
        for good in [
            serde_json::to_vec(&snapshot()).unwrap(),
            serde_json::to_vec(&snapshot().rows_view()).unwrap(),
        ] {
            damaged_answers_of(good);
        }
    }

    fn damaged_answers_of(good: Vec<u8>) {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n.max(1) as u64) as usize
        };
        let alphabet = b"{}[]\",:0123456789-+.eEtrufalsn \\\x00\xff";
        let (mut read_ok, mut refused) = (0, 0);
        for _ in 0..2000 {
            let mut doc = good.clone();
            for _ in 0..1 + next(4) {
                match next(3) {
                    0 if !doc.is_empty() => {
                        let at = next(doc.len());
                        doc[at] = alphabet[next(alphabet.len())];
                    }
                    1 => doc.truncate(next(doc.len())),
                    _ => {
                        let (a, b) = (next(doc.len()), next(good.len()));
                        doc.splice(a..a, good[b..].iter().take(next(64)).copied());
                    }
                }
            }
            match read(&doc[..], 2) {
                Ok(_) => read_ok += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(
            read_ok > 0 && refused > 0,
            "{read_ok} read, {refused} refused"
        );
    }

    #[test]
    fn answers_beyond_the_limits_are_refused() {
        let mut snap = snapshot();
        snap.sessions[0].streams = (0..MAX_SESSION_STREAMS as u32 + 1)
            .map(|id| Stream {
                tcp: None,
                local: None,
                peer: None,
                ..stream(id, EngineDirection::Receive, false)
            })
            .collect();
        let text = serde_json::to_vec(&snap).unwrap();
        let e = read(&text[..], 256).unwrap_err().to_string();
        assert!(e.contains("more than 8192 streams"), "{e}");
        // Rows of any direction count, bidir ones (never folded) too.
        for s in &mut snap.sessions[0].streams {
            s.direction = EngineDirection::Bidir;
        }
        for answer in [snap.clone(), snap.rows_view()] {
            let text = serde_json::to_vec(&answer).unwrap();
            let e = read(&text[..], 256).unwrap_err().to_string();
            assert!(e.contains("more than 8192 streams"), "{e}");
        }
        for (doc, needle) in [
            (r#"{"version":2,"engine":{},"sessions":[]}"#, "version 1"),
            (r#"{"version":1,"engine":{}}"#, "version 1"),
            (
                r#"{"version":1,"sessions":[{"id":"x","peer":"p","mode":"tape","direction":"send","streams":[]}]}"#,
                "unknown mode",
            ),
            (
                r#"{"version":1,"sessions":[{"id":"x","mode":"memory","direction":"send","streams":[]}]}"#,
                "without id, peer",
            ),
        ] {
            let e = read(doc.as_bytes(), 256).unwrap_err().to_string();
            assert!(e.contains(needle), "{doc}: {e}");
        }
    }
}
