//! `longhaul serve`: admits control and data connections on one port
//! (`longhaul-admission` with the protocol of [`crate::handshake`]) and runs
//! many sessions at once.
//!
//! Until a control connection has proven the token it lives in the
//! admission pools, under one total deadline ([`crate::limits::ADMISSION_DEADLINE`]);
//! only then does it take one of the `--max-sessions` slots. Data
//! connections attach to a session on the admission thread. A silent,
//! trickling or garbage-sending stranger therefore costs a descriptor and a
//! few bytes for a bounded time, and can push out only other pending
//! connections, never a session (docs/threat-model.md).

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_admission::{Arrival, AuthFailure, Lobby, Protocol, Refusal, Reporter, Slots, Ticket};
use longhaul_units::{format_bps, format_bytes};

use crate::attach::{AttachHeader, ATTACH_LEN, ATTACH_OK, ATTACH_REJECTED, SESSION_ID_LEN};
use crate::auth::{random_bytes, to_hex, Token};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::handshake::{self, AuthPolicy, Proven, MAX_FIRST_MESSAGE};
use crate::limits::{admission_settings, ATTACH_TIMEOUT};
use crate::logline;
use crate::messages::{AuthOk, Message, SessionAccepted, SessionRequest};
use crate::planes::disk::{Claimant, Claims, RootLock};
use crate::planes::{self, ServerPlanes};
use crate::probe;
use crate::registry::{Registry, SessionEntry};
use crate::session::{self, Event, Side};
use crate::sockopt;

/// Default control/data port (DESIGN.md).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:7400";

/// Default `--max-sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 16;

/// The control and data port's name among the stats API's admission
/// counters.
pub(crate) const LISTENER_NAME: &str = "longhaul";

/// How often the server refreshes TCP_INFO for the stats API.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// `longhaul serve` options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: String,
    pub root: Option<PathBuf>,
    pub token: Option<Token>,
    pub allow_unauthenticated: bool,
    pub stats_listen: String,
    pub max_sessions: usize,
    /// Sessions one source may run at once (`--max-sessions-per-source`);
    /// None: all of `max_sessions` (every session holder proved the token).
    pub max_sessions_per_source: Option<usize>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: DEFAULT_LISTEN.into(),
            root: None,
            token: None,
            allow_unauthenticated: false,
            stats_listen: longhaul_stats_api::DEFAULT_STATS_LISTEN.into(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_source: None,
        }
    }
}

/// A session waiting for its data connections.
struct AttachSlot {
    key: Vec<u8>,
    request: SessionRequest,
    /// What its data sockets run: the session's `--cc`, or the machine's
    /// default read once when the session was admitted.
    cc: String,
    attached: Mutex<Vec<bool>>,
    events: Sender<Event>,
}

struct Context {
    opts: ServeOptions,
    registry: Arc<Registry>,
    /// The `--max-sessions` slots, shared out per source.
    sessions: Arc<Slots>,
    slots: Mutex<HashMap<[u8; SESSION_ID_LEN], Arc<AttachSlot>>>,
    warned_buffers: AtomicBool,
    /// Destination paths live disk sessions are writing.
    claims: Arc<Claims>,
}

/// A bound server, ready to [`Server::run`].
pub struct Server {
    listener: TcpListener,
    stats: longhaul_http_serve::Server,
    ctx: Arc<Context>,
    /// Held for the server's life: one `longhaul serve` per `--root`.
    _root_lock: Option<RootLock>,
}

fn log(msg: impl std::fmt::Display) {
    logline::server(msg);
}

fn bind(addr: &str, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .map_err(|e| Error::Usage(format!("cannot listen on {addr} ({what}): {e}")))
}

impl Server {
    /// Binds the data/control port and the stats API port, and starts the
    /// stats API.
    pub fn bind(opts: ServeOptions) -> Result<Server> {
        if opts.max_sessions == 0 {
            return Err(Error::Usage("--max-sessions must be at least 1".into()));
        }
        let per_source = opts.max_sessions_per_source.unwrap_or(opts.max_sessions);
        if per_source == 0 || per_source > opts.max_sessions {
            return Err(Error::Usage(format!(
                "--max-sessions-per-source must be 1..{} (--max-sessions)",
                opts.max_sessions
            )));
        }
        let root_lock = match &opts.root {
            Some(root) => Some(RootLock::take(root)?),
            None => None,
        };
        let listener = bind(&opts.listen, "--listen")?;
        if let Some(warning) = sockopt::start_accepted_as_neutral(&listener) {
            log(warning);
        }
        let stats = bind(&opts.stats_listen, "--stats-listen")?;
        let registry = Arc::new(Registry::new());
        let stats = crate::stats_http::spawn(stats, registry.clone())
            .map_err(|e| Error::io("starting the stats API", e))?;
        let sampler = registry.clone();
        std::thread::Builder::new()
            .name("tcp-sampler".into())
            .spawn(move || loop {
                std::thread::sleep(SAMPLE_INTERVAL);
                sampler.sample_running();
            })
            .map_err(|e| Error::io("starting the sampler", e))?;
        Ok(Server {
            listener,
            stats,
            ctx: Arc::new(Context {
                sessions: Slots::new(opts.max_sessions, per_source),
                opts,
                registry,
                slots: Mutex::new(HashMap::new()),
                warned_buffers: AtomicBool::new(false),
                claims: Arc::new(Claims::default()),
            }),
            _root_lock: root_lock,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn stats_addr(&self) -> SocketAddr {
        self.stats.local_addr()
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.ctx.registry.clone()
    }

    /// Admits connections and serves sessions forever.
    pub fn run(self) -> Result<()> {
        let settings = admission_settings();
        let protocol = Arc::new(EngineProtocol {
            ctx: self.ctx.clone(),
        });
        let address = self.listener.local_addr().ok();
        let lobby = Lobby::new(self.listener, protocol, settings);
        self.ctx
            .registry
            .watch_admission(LISTENER_NAME, address, lobby.counters());
        lobby
            .run()
            .map_err(|e| Error::io("accepting connections", e))
    }
}

/// The engine's protocol on the admission lobby.
struct EngineProtocol {
    ctx: Arc<Context>,
}

impl Protocol for EngineProtocol {
    fn max_first_message(&self) -> usize {
        MAX_FIRST_MESSAGE
    }

    fn first_message(&self, received: &[u8]) -> longhaul_admission::FirstMessage {
        handshake::classify(received)
    }

    fn quick(&self, arrival: Arrival) {
        let reporter = arrival.reporter.clone();
        if let Err(e) = handle_attach(arrival, &self.ctx) {
            // An attach header that is not one, or whose proof does not
            // verify (unknown session, wrong key, a stream taken).
            if matches!(e, Error::Auth(_) | Error::Protocol(_)) {
                reporter.auth_failed(AuthFailure::BadProof);
            }
            reporter.report(&format!("rejected data connection: {e}"));
        }
    }

    fn handshake(&self, arrival: Arrival, ticket: Ticket) {
        handle_control(arrival, ticket, &self.ctx);
    }

    fn log(&self, line: &str) {
        log(line);
    }
}

fn handle_attach(arrival: Arrival, ctx: &Context) -> Result<()> {
    let mut conn = arrival.stream;
    let bytes: [u8; ATTACH_LEN] = arrival
        .received
        .get(..ATTACH_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::Protocol("short attach header".into()))?;
    if arrival.received.len() != ATTACH_LEN {
        return Err(Error::Protocol(
            "bytes after the attach header before the server's answer".into(),
        ));
    }
    let header = AttachHeader::decode(&bytes)?;
    let slot = ctx
        .slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&header.session_id)
        .cloned();
    let reject = |conn: &mut TcpStream, why: String| {
        let _ = conn.write_all(&[ATTACH_REJECTED]);
        Err(Error::Auth(why))
    };
    let Some(slot) = slot else {
        return reject(&mut conn, "unknown session".into());
    };
    if !header.verify(&slot.key) {
        return reject(&mut conn, "bad attach proof".into());
    }
    let id = header.stream_id;
    {
        let mut attached = slot.attached.lock().unwrap_or_else(|e| e.into_inner());
        match attached.get_mut(id as usize) {
            Some(seen) if !*seen => *seen = true,
            _ => {
                return reject(
                    &mut conn,
                    format!("stream {id} is out of range or already attached"),
                )
            }
        }
    }
    let sends = !session::client_sends(&slot.request, id);
    if let Some(w) = session::configure_accepted_data_socket(&conn, &slot.request, sends, &slot.cc)?
    {
        if !ctx.warned_buffers.swap(true, Ordering::Relaxed) {
            log(w);
        }
    }
    let ack = conn
        .try_clone()
        .map_err(|e| Error::io("data connection", e))?;
    // Hand the socket over before acknowledging, so the session has it
    // before the client can say Start.
    if slot
        .events
        .send(Event::Attached {
            stream_id: id,
            socket: conn,
        })
        .is_err()
    {
        return Err(Error::PeerAborted(
            "session ended before the stream attached".into(),
        ));
    }
    (&ack)
        .write_all(&[ATTACH_OK])
        .map_err(|e| Error::io("acknowledging the attach", e))
}

/// Removes a session's attach slot when it ends.
struct SlotGuard<'a>(&'a Context, [u8; SESSION_ID_LEN]);

impl<'a> SlotGuard<'a> {
    /// Opens `slot` to the data connections of session `id` until dropped.
    fn open(ctx: &'a Context, id: [u8; SESSION_ID_LEN], slot: AttachSlot) -> SlotGuard<'a> {
        ctx.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::new(slot));
        SlotGuard(ctx, id)
    }
}

/// The server's proof that it holds the token too, for `AuthOk`.
fn server_proof(token: &Token, proven: &Proven) -> String {
    to_hex(&token.server_proof(&proven.server_nonce, &proven.client_nonce))
}

/// The key a session's data connections prove themselves with: derived from
/// the token and both nonces, or (no token) a random one, sent to the client
/// in `SessionAccepted` (the second of the pair).
fn attach_key(token: Option<&Token>, proven: &Proven) -> (Vec<u8>, Option<String>) {
    match token {
        Some(t) => (
            t.attach_key(&proven.server_nonce, &proven.client_nonce)
                .to_vec(),
            None,
        ),
        None => {
            let k = random_bytes::<32>().to_vec();
            (k.clone(), Some(to_hex(&k)))
        }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// A control connection from its Hello on: authenticate, leave the
/// admission pools, take a session slot, serve the session.
fn handle_control(arrival: Arrival, ticket: Ticket, ctx: &Arc<Context>) {
    let reporter = arrival.reporter.clone();
    let peer = arrival.peer;
    let mut conn = match Connection::with_prefix(arrival.stream, arrival.received) {
        Ok(c) => c,
        Err(e) => return reporter.report(&format!("control connection: {e}")),
    };
    let policy = AuthPolicy {
        token: ctx.opts.token.clone(),
        allow_unauthenticated: ctx.opts.allow_unauthenticated,
    };
    let gate = || reporter.proof_turn();
    let proven = match handshake::authenticate(&mut conn, &policy, &gate) {
        Ok(p) => p,
        Err(e) => {
            if let Some(why) = handshake::auth_failure(&e) {
                reporter.auth_failed(why);
            }
            return reporter.report(&format!("handshake failed: {e}"));
        }
    };
    if let Err(e) = ticket.admit() {
        return reporter.report(&format!("handshake failed: {e}"));
    }
    let _slot = match ctx.sessions.take(peer.ip()) {
        Ok(slot) => slot,
        Err(why) => {
            reporter.refused(why);
            let e = Error::Busy(match why {
                Refusal::SourceBusy => format!(
                    "{} already runs {} sessions (--max-sessions-per-source)",
                    peer.ip(),
                    ctx.sessions.per_source()
                ),
                _ => format!(
                    "already running {} sessions (--max-sessions)",
                    ctx.opts.max_sessions
                ),
            });
            conn.send_error(&e);
            // Through the port's rate limit: a client retrying in a loop
            // must not fill the log.
            return reporter.report(&format!("session refused: {e}"));
        }
    };
    let mut entry: Option<Arc<SessionEntry>> = None;
    let result = unless_it_panics(|| serve_session(&mut conn, ctx, &proven, &reporter, &mut entry));
    // Wake the control reader thread, if any, and tell the client we are done.
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
    if let Some(e) = &entry {
        ctx.registry.finish(e, result.is_ok());
    }
    match result {
        Ok(summary) => log(format!("session from {peer}: finished: {summary}")),
        Err(err) => log(format!("session from {peer}: failed: {err}")),
    }
    crate::memory::return_freed_memory();
}

/// `f`'s result, or an error naming its panic: a bug in one session must
/// not leave that session's registry entry running and its slot taken.
/// The panic itself is printed by the default hook, with its location.
fn unless_it_panics<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(Error::Io {
            context: "the session's thread".into(),
            source: std::io::Error::other(format!(
                "internal error (a bug; please report it): {what}"
            )),
        })
    })
}

/// What the client asked for after the login: a session, or (`longhaul
/// advise`) only pings, answered as they came, until it hung up.
enum Asked {
    Session(SessionRequest),
    Probe(u64),
}

/// Reads the client's request, answering its pings first; a message out of
/// turn is refused (the client is told why).
fn read_request(conn: &mut Connection) -> Result<Asked> {
    let refuse = |conn: &mut Connection, why: String| {
        let e = Error::Protocol(why);
        conn.send_error(&e);
        Err(e)
    };
    let mut pings = 0u64;
    loop {
        match conn.recv() {
            Ok(Message::SessionRequest(r)) => return Ok(Asked::Session(r)),
            // A ping follows the answer to the last one: the segment that
            // carries it acknowledges that answer. A client that pings on
            // without taking the answers in would fill our send buffer and
            // hold this session slot while we wait to write.
            Ok(Message::Ping(_)) if !sockopt::drained(conn.socket()) => {
                return refuse(
                    conn,
                    "Ping before the answer to the previous one was received".into(),
                )
            }
            Ok(Message::Ping(p)) if pings < probe::MAX_PINGS => {
                conn.send(&Message::Pong(probe::answer(&p)))?;
                pings += 1;
            }
            Err(Error::PeerAborted(_)) if pings > 0 => return Ok(Asked::Probe(pings)),
            Ok(other) => {
                return refuse(
                    conn,
                    format!("expected SessionRequest, got {:?}", other.kind()),
                )
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs one authenticated session on the server, from `AuthOk` on; returns
/// a summary line.
fn serve_session(
    conn: &mut Connection,
    ctx: &Arc<Context>,
    proven: &Proven,
    reporter: &Reporter,
    entry_out: &mut Option<Arc<SessionEntry>>,
) -> Result<String> {
    let fail = |conn: &mut Connection, e: Error| -> Result<String> {
        conn.send_error(&e);
        Err(e)
    };
    let peer = conn.peer();
    conn.set_max_frame(crate::frame::MAX_FRAME_LEN);
    let token = ctx.opts.token.clone();
    conn.send(&Message::AuthOk(AuthOk {
        proof: token.as_ref().map(|t| server_proof(t, proven)),
    }))?;
    let req = match read_request(conn)? {
        Asked::Session(req) => req,
        Asked::Probe(pings) => return Ok(format!("probe: answered {pings} pings")),
    };
    if let Err(e) = session::validate(&req) {
        return fail(conn, e);
    }
    let default_cc = match sockopt::default_cc() {
        Ok(cc) => cc,
        Err(e) => return fail(conn, e),
    };
    // The listener started this connection as NEUTRAL_CC too: from here on
    // it runs what the client's end of it runs, the machine's default.
    if let Err(e) = sockopt::set_cc(conn.socket(), &default_cc) {
        log(format!("session from {peer}: control connection: {e}"));
    }
    let cc = req.cc.clone().unwrap_or(default_cc);
    let session_id = random_bytes::<SESSION_ID_LEN>();
    let session_hex = to_hex(&session_id);
    // Listed from here on (state handshake): a disk session may spend long
    // planning (the receiver checks its files, a pull's server walks and
    // hashes its tree), and one that fails there counts as failed.
    let entry = ctx.registry.add(
        session_hex.clone(),
        peer.to_string(),
        conn.local().map(|a| a.to_string()),
    );
    entry.set_request(&req);
    *entry_out = Some(entry.clone());
    let claimant = Claimant {
        claims: ctx.claims.clone(),
        session: session_hex.clone(),
        peer,
    };
    let offer = ServerPlanes {
        root: ctx.opts.root.as_deref(),
        claimant: &claimant,
    };
    let plane = match planes::server_plane(&req, &offer, conn) {
        Ok(p) => p,
        Err(e) => return fail(conn, e),
    };

    let (key, sent_key) = attach_key(token.as_ref(), proven);
    let total = session::total_streams(&req);
    let (events_tx, events) = mpsc::channel();
    let slot_guard = SlotGuard::open(
        ctx,
        session_id,
        AttachSlot {
            key,
            request: req.clone(),
            cc,
            attached: Mutex::new(vec![false; total as usize]),
            events: events_tx.clone(),
        },
    );
    conn.send(&Message::SessionAccepted(SessionAccepted {
        session_id: session_hex.clone(),
        attach_key: sent_key,
    }))?;

    // From here on the control connection may stay quiet for the whole data
    // phase; a dead peer shows up as EOF/RST or as stalled data streams.
    conn.set_timeout(None)?;
    let reader = take_reader(conn)?;
    session::spawn_control_reader(reader, events_tx.clone())?;
    let writer = conn;

    let sockets = match wait_for_attach(&events, total) {
        Ok(s) => s,
        Err(e) => {
            if matches!(e, Error::Timeout(_)) {
                reporter.refused(Refusal::AttachTimeout);
            }
            return fail(writer, e);
        }
    };
    drop(slot_guard);
    let streams = session::stream_stats(&req, Side::Server, sockets);
    entry.set_running(streams.clone());
    entry.set_devices(plane.devices());
    let outcome = session::DataPhase {
        req: &req,
        plane: plane.as_ref(),
        streams: &streams,
        control: writer,
        events: &events,
        events_tx: &events_tx,
        tick_every: SAMPLE_INTERVAL,
        tick: &mut |_, _| {},
        peer: session::PeerStreams::Collect(&|reported| entry.set_peer_streams(reported)),
    }
    .run()?;
    plane.check(
        outcome.local.mode_summary.as_ref(),
        outcome.remote.mode_summary.as_ref(),
    )?;
    let empty = session::idle_streams(&req, plane.as_ref(), &outcome).len();
    Ok(summary(&session_hex, total, &outcome, empty))
}

/// The server's log line of a session that ended well.
fn summary(session_hex: &str, total: u32, outcome: &session::PhaseOutcome, empty: usize) -> String {
    let bytes: u64 = outcome.local.streams.iter().map(|s| s.bytes).sum();
    let secs = outcome.local.seconds.max(1e-9);
    let warning = match empty {
        0 => String::new(),
        n => format!("; warning: {n} streams moved no bytes"),
    };
    format!(
        "session {session_hex}: {total} streams, {} in {secs:.2} s ({}){warning}",
        format_bytes(bytes),
        format_bps(bytes as f64 * 8.0 / secs)
    )
}

/// Takes the handshake connection's reader, with anything it has already
/// buffered, for the reader thread, and leaves a fresh handle on the same
/// socket in its place for writing (and for the final shutdown).
fn take_reader(conn: &mut Connection) -> Result<Connection> {
    let fresh = conn.try_clone_writer()?;
    Ok(std::mem::replace(conn, fresh))
}

/// Waits until all `total` data connections attached and the client said
/// Start. Returns the sockets indexed by stream id.
fn wait_for_attach(events: &Receiver<Event>, total: u32) -> Result<Vec<TcpStream>> {
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let mut sockets: Vec<Option<TcpStream>> = (0..total).map(|_| None).collect();
    let mut attached = 0;
    let mut started = false;
    while attached < total || !started {
        let wait = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(wait) {
            Ok(Event::Attached { stream_id, socket }) => {
                sockets[stream_id as usize] = Some(socket);
                attached += 1;
            }
            Ok(Event::Control(Ok(Message::Start))) => started = true,
            Ok(Event::Control(Ok(other))) => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} before Start",
                    other.kind()
                )))
            }
            Ok(Event::Control(Err(e))) => return Err(e),
            Ok(Event::Worker { .. }) => {}
            Err(RecvTimeoutError::Timeout) => {
                return Err(Error::Timeout(format!(
                    "only {attached} of {total} data connections attached within {} s",
                    ATTACH_TIMEOUT.as_secs()
                )))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::PeerAborted("session channel closed".into()))
            }
        }
    }
    Ok(sockets
        .into_iter()
        .map(|s| s.expect("all attached"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_session_becomes_an_error_naming_it() {
        let r: Result<()> = unless_it_panics(|| panic!("limit {} crossed", 7));
        let e = r.unwrap_err().to_string();
        assert!(e.contains("the session's thread"), "{e}");
        assert!(e.contains("limit 7 crossed"), "{e}");
        assert_eq!(unless_it_panics(|| Ok(5)).unwrap(), 5);
        assert!(matches!(
            unless_it_panics::<()>(|| Err(Error::Busy("x".into()))),
            Err(Error::Busy(_))
        ));
    }
}
