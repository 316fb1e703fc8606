//! The server's list of sessions, as the stats API shows them.
//!
//! Sessions register once authenticated and stay visible for
//! [`FINISHED_RETENTION`] after they end, so a scrape right after a session
//! still sees its final counters. While a session runs, stream counters are
//! the workers' own atomics ([`StreamStats`]), so the API always reads live
//! values; when it ends they are frozen into plain numbers, so a finished
//! session holds no socket and no worker state. The client's end of the
//! streams is what it last reported over the control connection
//! (`StreamsReport`, then its `Done`): listed with `peer_end: true`.
//!
//! iperf3 tests (`--iperf3-listen`) are sessions too, with `protocol:
//! iperf3`; their UDP streams have no TCP socket and are listed from their
//! counters alone ([`DatagramStream`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use longhaul_stats_api as api;

use crate::datapath::DeviceCounters;
use crate::messages::{Direction, Mode, Role, SessionRequest, StreamReport};
use crate::stream::StreamStats;

/// How long finished and failed sessions stay in the snapshot: longer than
/// any sane scrape interval (Prometheus defaults to 15 s, we allow 4 scrapes).
pub(crate) const FINISHED_RETENTION: Duration = Duration::from_secs(60);

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How many ended sessions the snapshot keeps at most, the latest to end:
/// a stranger may start and drop iperf3 tests (no token there) hundreds a
/// second, and each one kept for [`FINISHED_RETENTION`] used to cost every
/// scrape a session, and Prometheus its series (15,000 in 20 s). Honest
/// runs end far fewer a minute; their counts stay in `sessions_total` and
/// `sessions_failed_total` either way.
pub(crate) const MAX_ENDED_KEPT: usize = 128;

/// Drops sessions that ended more than [`FINISHED_RETENTION`] ago, and the
/// earliest to end past [`MAX_ENDED_KEPT`]. Running sessions stay.
fn prune(sessions: &mut Vec<Arc<SessionEntry>>) {
    let mut ended = Vec::new();
    sessions.retain(|e| match e.lock().ended {
        Some(t) if t.elapsed() >= FINISHED_RETENTION => false,
        Some(t) => {
            ended.push(t);
            true
        }
        None => true,
    });
    if ended.len() > MAX_ENDED_KEPT {
        ended.sort_unstable();
        let keep_from = ended[ended.len() - MAX_ENDED_KEPT];
        sessions.retain(|e| !matches!(e.lock().ended, Some(t) if t < keep_from));
    }
}

/// A stream without a TCP socket (an iperf3 UDP stream): its live
/// counters, which the stats API lists without TCP_INFO.
#[derive(Debug)]
pub struct DatagramStream {
    pub id: u32,
    /// What this end does on the stream.
    pub role: Role,
    pub bytes: AtomicU64,
    pub datagrams: AtomicU64,
}

impl DatagramStream {
    pub fn new(id: u32, role: Role) -> DatagramStream {
        DatagramStream {
            id,
            role,
            bytes: AtomicU64::new(0),
            datagrams: AtomicU64::new(0),
        }
    }

    fn to_api(&self) -> api::Stream {
        api::Stream {
            id: self.id,
            direction: api_direction(self.role),
            bytes: self.bytes.load(Ordering::Relaxed),
            tcp: None,
            local: None,
            peer: None,
            peer_end: false,
        }
    }
}

/// One session as the stats API sees it.
#[derive(Debug)]
pub struct SessionEntry {
    pub(crate) id: String,
    pub(crate) peer: String,
    /// This end of the control connection.
    pub(crate) local: Option<String>,
    pub(crate) started_unix: f64,
    inner: Mutex<EntryState>,
}

#[derive(Debug)]
struct EntryState {
    protocol: api::Protocol,
    mode: api::Mode,
    direction: api::EngineDirection,
    state: api::State,
    ended: Option<Instant>,
    streams: Vec<Arc<StreamStats>>,
    /// Streams without a TCP socket (iperf3 UDP).
    datagrams: Vec<Arc<DatagramStream>>,
    /// The streams' final counters, once the session ended.
    frozen: Option<Vec<api::Stream>>,
    /// The client's end of the streams, as it last reported them.
    peer_streams: Vec<StreamReport>,
    /// The client's host name, as it gave it in its request.
    peer_host: Option<String>,
    /// The campaign and run the client named (checked plain names).
    campaign: Option<String>,
    run: Option<String>,
    /// Disk mode: the session's device groups and their live counters.
    devices: Vec<Arc<dyn DeviceCounters>>,
}

impl SessionEntry {
    fn lock(&self) -> std::sync::MutexGuard<'_, EntryState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client asked for a session: record mode, direction (server's
    /// view: a client that sends makes the server receive), the client's
    /// host name, and the campaign and run it named.
    pub fn set_request(&self, req: &SessionRequest) {
        let mut s = self.lock();
        s.peer_host = req.client_host.clone();
        s.campaign = req.campaign.clone();
        s.run = req.run.clone();
        s.mode = match req.mode {
            // Messages sessions are memory to memory too.
            Mode::Memory | Mode::Messages => api::Mode::Memory,
            Mode::Disk => api::Mode::Disk,
        };
        s.direction = match req.direction {
            Direction::Send => api::EngineDirection::Receive,
            Direction::Receive => api::EngineDirection::Send,
            Direction::Bidir => api::EngineDirection::Bidir,
        };
    }

    pub fn set_running(&self, streams: Vec<Arc<StreamStats>>) {
        let mut s = self.lock();
        s.state = api::State::Running;
        s.streams = streams;
    }

    /// Like [`SessionEntry::set_running`], for streams without a TCP socket.
    pub fn set_running_datagrams(&self, streams: Vec<Arc<DatagramStream>>) {
        let mut s = self.lock();
        s.state = api::State::Running;
        s.datagrams = streams;
    }

    /// The session speaks iperf3's protocol.
    pub fn set_protocol(&self, protocol: api::Protocol) {
        self.lock().protocol = protocol;
    }

    /// The client's latest report of its streams replaces the previous one.
    pub fn set_peer_streams(&self, streams: Vec<StreamReport>) {
        self.lock().peer_streams = streams;
    }

    pub fn set_devices(&self, devices: Vec<Arc<dyn DeviceCounters>>) {
        self.lock().devices = devices;
    }

    fn to_api(&self) -> api::Session {
        let s = self.lock();
        let mut streams: Vec<api::Stream> = match &s.frozen {
            Some(f) => f.clone(),
            None => s
                .streams
                .iter()
                .map(|st| live_stream(st))
                .chain(s.datagrams.iter().map(|d| d.to_api()))
                .collect(),
        };
        // This end's totals: the client's own report is listed, not summed.
        let (mut sent, mut received) = (0, 0);
        for st in &streams {
            match st.direction {
                api::EngineDirection::Send => sent += st.bytes,
                _ => received += st.bytes,
            }
        }
        streams.extend(s.peer_streams.iter().map(|st| api::Stream {
            id: st.id,
            direction: api_direction(st.role),
            bytes: st.bytes,
            // The peer's sockets are not on this host.
            local: None,
            peer: None,
            tcp: st.tcp,
            peer_end: true,
        }));
        api::Session {
            id: self.id.clone(),
            peer: self.peer.clone(),
            peer_host: s.peer_host.clone(),
            protocol: s.protocol,
            campaign: s.campaign.clone(),
            run: s.run.clone(),
            local: self.local.clone(),
            mode: s.mode,
            direction: s.direction,
            state: s.state,
            started_unix: self.started_unix,
            bytes_sent: sent,
            bytes_received: received,
            streams,
            stream_rows: None,
            devices: s.devices.iter().map(|g| g.snapshot()).collect(),
        }
    }
}

fn live_stream(st: &StreamStats) -> api::Stream {
    api::Stream {
        id: st.id,
        direction: api_direction(st.role),
        bytes: st.bytes(),
        local: st.local.map(|a| a.to_string()),
        peer: st.peer.map(|a| a.to_string()),
        tcp: st.last_tcp(),
        peer_end: false,
    }
}

fn api_direction(role: Role) -> api::EngineDirection {
    match role {
        Role::Send => api::EngineDirection::Send,
        Role::Receive => api::EngineDirection::Receive,
    }
}

/// A listening port of the engine, as the stats API lists it.
#[derive(Debug)]
struct Listening {
    name: &'static str,
    address: Option<std::net::SocketAddr>,
    counters: Arc<longhaul_admission::Counters>,
}

/// All sessions of one server.
#[derive(Debug)]
pub struct Registry {
    started_unix: f64,
    sessions: Mutex<Vec<Arc<SessionEntry>>>,
    total: AtomicU64,
    failed: AtomicU64,
    /// The listening ports' admission counters, by listener name, with the
    /// port's address.
    admission: Mutex<Vec<Listening>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            started_unix: unix_now(),
            sessions: Mutex::new(Vec::new()),
            total: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            admission: Mutex::new(Vec::new()),
        }
    }

    /// Publishes a listening port's admission counters on the stats API
    /// as `listener`, with the address it listens on.
    pub fn watch_admission(
        &self,
        listener: &'static str,
        address: Option<std::net::SocketAddr>,
        counters: Arc<longhaul_admission::Counters>,
    ) {
        self.admission
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Listening {
                name: listener,
                address,
                counters,
            });
    }

    /// Registers a session in the handshake state; `peer` and `local` are
    /// the two ends of its control connection.
    pub fn add(&self, id: String, peer: String, local: Option<String>) -> Arc<SessionEntry> {
        let entry = Arc::new(SessionEntry {
            id,
            peer,
            local,
            started_unix: unix_now(),
            inner: Mutex::new(EntryState {
                protocol: api::Protocol::Longhaul,
                mode: api::Mode::Memory,
                direction: api::EngineDirection::Receive,
                state: api::State::Handshake,
                ended: None,
                streams: Vec::new(),
                datagrams: Vec::new(),
                frozen: None,
                peer_streams: Vec::new(),
                peer_host: None,
                campaign: None,
                run: None,
                devices: Vec::new(),
            }),
        });
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // Also here, not only in `snapshot`: with nobody scraping, ended
        // sessions must not pile up.
        prune(&mut sessions);
        sessions.push(entry.clone());
        entry
    }

    /// Marks a session finished or failed; it stays visible for a while.
    pub fn finish(&self, entry: &SessionEntry, ok: bool) {
        let mut s = entry.lock();
        s.state = if ok {
            api::State::Finished
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
            api::State::Failed
        };
        s.ended = Some(Instant::now());
        for st in &s.streams {
            st.sample();
        }
        // Freeze the counters and let go of the sockets and worker state.
        let frozen = s
            .streams
            .iter()
            .map(|st| live_stream(st))
            .chain(s.datagrams.iter().map(|d| d.to_api()))
            .collect();
        s.frozen = Some(frozen);
        s.streams = Vec::new();
        s.datagrams = Vec::new();
    }

    /// Samples TCP_INFO of every running session's streams.
    pub fn sample_running(&self) {
        for e in self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let s = e.lock();
            if s.state == api::State::Running {
                for st in &s.streams {
                    st.sample();
                }
            }
        }
    }

    /// The stats API answer; drops sessions past their retention.
    pub(crate) fn snapshot(&self) -> api::Snapshot {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut sessions);
        api::Snapshot {
            version: api::API_VERSION,
            engine: api::EngineInfo {
                version: crate::SOFTWARE_VERSION.to_string(),
                pid: std::process::id(),
                started_unix: self.started_unix,
                sessions_total: self.total.load(Ordering::Relaxed),
                sessions_failed_total: self.failed.load(Ordering::Relaxed),
                admission: self
                    .admission
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|l| api::Admission {
                        listener: l.name.to_string(),
                        address: l.address.map(|a| a.to_string()),
                        accepted: l.counters.accepted.load(Ordering::Relaxed),
                        admitted: l.counters.admitted.load(Ordering::Relaxed),
                        evicted: l.counters.evicted.load(Ordering::Relaxed),
                        expired: l.counters.expired.load(Ordering::Relaxed),
                        garbage: l.counters.garbage.load(Ordering::Relaxed),
                        refused: api::Refused {
                            busy: l.counters.refused_busy.load(Ordering::Relaxed),
                            source_busy: l.counters.refused_source_busy.load(Ordering::Relaxed),
                            attach_timeout: l
                                .counters
                                .refused_attach_timeout
                                .load(Ordering::Relaxed),
                        },
                        auth_failed: api::AuthFailed {
                            bad_token: l.counters.auth_bad_token.load(Ordering::Relaxed),
                            bad_version: l.counters.auth_bad_version.load(Ordering::Relaxed),
                            bad_proof: l.counters.auth_bad_proof.load(Ordering::Relaxed),
                            timeout: l.counters.auth_timeout.load(Ordering::Relaxed),
                        },
                    })
                    .collect(),
            },
            sessions: sessions.iter().map(|e| e.to_api()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of sessions that end at once (iperf3 tests dropped after
    /// their parameters) keeps only the latest MAX_ENDED_KEPT to end, all
    /// running sessions, and every one in the totals.
    #[test]
    fn ended_sessions_are_kept_up_to_a_bound_the_latest_first() {
        let r = Registry::new();
        let running = r.add("running".into(), "p".into(), None);
        let flood = 3 * MAX_ENDED_KEPT;
        for i in 0..flood {
            let e = r.add(format!("s{i}"), "p".into(), None);
            r.finish(&e, i % 2 == 0);
        }
        let snap = r.snapshot();
        assert_eq!(snap.engine.sessions_total, flood as u64 + 1);
        assert_eq!(snap.engine.sessions_failed_total, flood as u64 / 2);
        let ids: Vec<&str> = snap.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids.len(), MAX_ENDED_KEPT + 1, "{ids:?}");
        assert!(ids.contains(&"running"), "{ids:?}");
        let latest = format!("s{}", flood - 1);
        let earliest_kept = format!("s{}", flood - MAX_ENDED_KEPT);
        let dropped = format!("s{}", flood - MAX_ENDED_KEPT - 1);
        assert!(
            ids.contains(&latest.as_str()) && ids.contains(&earliest_kept.as_str()),
            "{ids:?}"
        );
        assert!(!ids.contains(&dropped.as_str()), "{ids:?}");
        // Below the bound nothing ended recently is dropped.
        r.finish(&running, true);
        assert_eq!(r.snapshot().sessions.len(), MAX_ENDED_KEPT);
    }
}
