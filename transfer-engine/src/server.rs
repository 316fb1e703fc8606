//! `longhaul serve`: accepts control and data connections on one port and
//! runs many sessions at once.
//!
//! Every accepted connection gets its own short-lived thread that reads the
//! first four bytes: the control magic starts a session, the attach magic
//! hands a data connection to its session, anything else is dropped. A
//! silent or misbehaving connection therefore only ever costs its own
//! thread, for at most [`HANDSHAKE_TIMEOUT`], and never stalls the others.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::attach::{
    AttachHeader, ATTACH_LEN, ATTACH_MAGIC, ATTACH_OK, ATTACH_REJECTED, SESSION_ID_LEN,
};
use crate::auth::{from_hex, proofs_equal, random_bytes, to_hex, Token, NONCE_LEN};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::frame::FRAME_MAGIC;
use crate::messages::{AuthOk, Challenge, Message, SessionAccepted, SessionRequest};
use crate::modes;
use crate::registry::{Registry, SessionEntry};
use crate::session::{self, Event, Side, ATTACH_TIMEOUT, HANDSHAKE_TIMEOUT};
use crate::units::{format_bps, format_bytes};
use crate::PROTOCOL_VERSION;

/// Default control/data port (DESIGN.md).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:7400";

/// Default `--max-sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 16;

/// Connections still being identified (first bytes not read yet). Bounds the
/// threads a flood of silent connections can tie up; beyond this, new
/// connections are closed at once.
const MAX_PENDING_CONNECTIONS: usize = 256;

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
        }
    }
}

/// A session waiting for its data connections.
struct AttachSlot {
    key: Vec<u8>,
    request: SessionRequest,
    attached: Mutex<Vec<bool>>,
    events: Sender<Event>,
}

struct Context {
    opts: ServeOptions,
    registry: Arc<Registry>,
    active: AtomicUsize,
    pending: AtomicUsize,
    slots: Mutex<HashMap<[u8; SESSION_ID_LEN], Arc<AttachSlot>>>,
    warned_buffers: AtomicBool,
}

/// A bound server, ready to [`Server::run`].
pub struct Server {
    listener: TcpListener,
    stats_addr: SocketAddr,
    ctx: Arc<Context>,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("longhaul serve: {msg}");
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
        let listener = bind(&opts.listen, "--listen")?;
        let stats = bind(&opts.stats_listen, "--stats-listen")?;
        let stats_addr = stats
            .local_addr()
            .map_err(|e| Error::io("stats listener", e))?;
        let registry = Arc::new(Registry::new());
        crate::stats_http::spawn(stats, registry.clone())
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
            stats_addr,
            ctx: Arc::new(Context {
                opts,
                registry,
                active: AtomicUsize::new(0),
                pending: AtomicUsize::new(0),
                slots: Mutex::new(HashMap::new()),
                warned_buffers: AtomicBool::new(false),
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn stats_addr(&self) -> SocketAddr {
        self.stats_addr
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.ctx.registry.clone()
    }

    /// Accepts connections forever.
    pub fn run(self) -> Result<()> {
        for conn in self.listener.incoming() {
            let conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log(format!("accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.ctx.pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_CONNECTIONS {
                self.ctx.pending.fetch_sub(1, Ordering::SeqCst);
                continue; // dropping closes it
            }
            let ctx = self.ctx.clone();
            let spawned = std::thread::Builder::new()
                .name("conn".into())
                .spawn(move || handle_connection(conn, &ctx));
            if spawned.is_err() {
                self.ctx.pending.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

fn handle_connection(mut conn: TcpStream, ctx: &Arc<Context>) {
    let peer = conn
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let mut magic = [0u8; 4];
    let first = conn
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|_| conn.read_exact(&mut magic));
    ctx.pending.fetch_sub(1, Ordering::SeqCst);
    if let Err(e) = first {
        log(format!(
            "dropped connection from {peer}: nothing sensible received ({e})"
        ));
        return;
    }
    if magic == FRAME_MAGIC {
        let conn = match Connection::with_prefix(conn, magic.to_vec()) {
            Ok(c) => c,
            Err(e) => return log(format!("control connection from {peer}: {e}")),
        };
        handle_control(conn, ctx);
    } else if magic == ATTACH_MAGIC {
        if let Err(e) = handle_attach(conn, ctx) {
            log(format!("rejected data connection from {peer}: {e}"));
        }
    } else {
        log(format!(
            "dropped connection from {peer}: garbage (first bytes {magic:02x?}), not a longhaul peer"
        ));
    }
}

fn handle_attach(mut conn: TcpStream, ctx: &Context) -> Result<()> {
    let mut bytes = [0u8; ATTACH_LEN];
    bytes[..4].copy_from_slice(&ATTACH_MAGIC);
    conn.read_exact(&mut bytes[4..])
        .map_err(|e| Error::io("reading the attach header", e))?;
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
    if let Some(w) = session::configure_data_socket(&conn, &slot.request, sends)? {
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

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Decrements the active session count when a session ends, however it ends.
struct ActiveGuard<'a>(&'a AtomicUsize);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Removes a session's attach slot when it ends.
struct SlotGuard<'a>(&'a Context, [u8; SESSION_ID_LEN]);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

fn handle_control(mut conn: Connection, ctx: &Arc<Context>) {
    let peer = conn.peer();
    let _active = ActiveGuard(&ctx.active);
    let busy = ctx.active.fetch_add(1, Ordering::SeqCst) >= ctx.opts.max_sessions;
    let mut entry: Option<Arc<SessionEntry>> = None;
    let result = serve_session(&mut conn, ctx, busy, &mut entry);
    // Wake the control reader thread, if any, and tell the client we are done.
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
    match result {
        Ok(summary) => {
            if let Some(e) = &entry {
                ctx.registry.finish(e, true);
            }
            log(format!("session from {peer}: finished: {summary}"));
        }
        Err(err) => {
            if let Some(e) = &entry {
                ctx.registry.finish(e, false);
            }
            log(format!("session from {peer}: failed: {err}"));
        }
    }
}

/// Runs one session on the server; returns a summary line.
fn serve_session(
    conn: &mut Connection,
    ctx: &Arc<Context>,
    busy: bool,
    entry_out: &mut Option<Arc<SessionEntry>>,
) -> Result<String> {
    let fail = |conn: &mut Connection, e: Error| -> Result<String> {
        conn.send_error(&e);
        Err(e)
    };
    let peer = conn.peer();
    conn.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let hello = match conn.recv()? {
        Message::Hello(h) => h,
        other => {
            return fail(
                conn,
                Error::Protocol(format!("expected Hello, got {:?}", other.kind())),
            )
        }
    };
    if hello.version != PROTOCOL_VERSION {
        return fail(
            conn,
            Error::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: hello.version,
            },
        );
    }
    if busy {
        return fail(
            conn,
            Error::Busy(format!(
                "already running {} sessions (--max-sessions)",
                ctx.opts.max_sessions
            )),
        );
    }
    let token = ctx.opts.token.clone();
    if token.is_none() && !ctx.opts.allow_unauthenticated && !is_loopback(peer.ip()) {
        return fail(
            conn,
            Error::Auth(format!(
                "{} is not a loopback peer and the server has no --token-file (or --allow-unauthenticated)",
                peer.ip()
            )),
        );
    }
    let client_nonce = from_hex(&hello.client_nonce)?;
    if client_nonce.len() != NONCE_LEN {
        return fail(
            conn,
            Error::Protocol("client nonce has the wrong length".into()),
        );
    }
    let server_nonce = random_bytes::<NONCE_LEN>();
    conn.send(&Message::Challenge(Challenge {
        version: PROTOCOL_VERSION,
        server_nonce: to_hex(&server_nonce),
        token_required: token.is_some(),
    }))?;
    let auth = match conn.recv()? {
        Message::Auth(a) => a,
        other => {
            return fail(
                conn,
                Error::Protocol(format!("expected Auth, got {:?}", other.kind())),
            )
        }
    };
    if let Some(t) = &token {
        let Some(proof) = auth.proof else {
            return fail(
                conn,
                Error::Auth("the server requires a token: pass --token-file".into()),
            );
        };
        let expected = t.client_proof(&server_nonce, &client_nonce);
        if !proofs_equal(&from_hex(&proof)?, &expected) {
            return fail(conn, Error::Auth("wrong token".into()));
        }
    }
    conn.send(&Message::AuthOk(AuthOk {
        proof: token
            .as_ref()
            .map(|t| to_hex(&t.server_proof(&server_nonce, &client_nonce))),
    }))?;
    // `longhaul advise` pings instead of asking for a session.
    let mut pings = 0u64;
    let req = loop {
        match conn.recv() {
            Ok(Message::SessionRequest(r)) => break r,
            Ok(Message::Ping(p)) if pings < crate::science::advise::MAX_PINGS => {
                conn.send(&Message::Pong(crate::science::advise::answer(&p)))?;
                pings += 1;
            }
            Err(Error::PeerAborted(_)) if pings > 0 => {
                return Ok(format!("probe: answered {pings} pings"))
            }
            Ok(other) => {
                return fail(
                    conn,
                    Error::Protocol(format!("expected SessionRequest, got {:?}", other.kind())),
                )
            }
            Err(e) => return Err(e),
        }
    };
    if let Err(e) = session::validate(&req) {
        return fail(conn, e);
    }
    let plane = match modes::server_plane(&req, &ctx.opts.root, conn) {
        Ok(p) => p,
        Err(e) => return fail(conn, e),
    };

    let session_id = random_bytes::<SESSION_ID_LEN>();
    let (key, sent_key) = match &token {
        Some(t) => (t.attach_key(&server_nonce, &client_nonce).to_vec(), None),
        None => {
            let k = random_bytes::<32>().to_vec();
            (k.clone(), Some(to_hex(&k)))
        }
    };
    let entry = ctx.registry.add(
        to_hex(&session_id),
        peer.to_string(),
        conn.local().map(|a| a.to_string()),
    );
    entry.set_request(req.mode, req.direction);
    *entry_out = Some(entry.clone());
    let total = session::total_streams(&req);
    let (events_tx, events) = mpsc::channel();
    ctx.slots.lock().unwrap_or_else(|e| e.into_inner()).insert(
        session_id,
        Arc::new(AttachSlot {
            key,
            request: req.clone(),
            attached: Mutex::new(vec![false; total as usize]),
            events: events_tx.clone(),
        }),
    );
    let slot_guard = SlotGuard(ctx, session_id);
    conn.send(&Message::SessionAccepted(SessionAccepted {
        session_id: to_hex(&session_id),
        attach_key: sent_key,
    }))?;

    // From here on the control connection may stay quiet for the whole data
    // phase; a dead peer shows up as EOF/RST or as stalled data streams.
    conn.set_timeout(None)?;
    let reader = take_reader(conn)?;
    spawn_control_reader(reader, events_tx.clone())?;
    let writer = conn;

    let sockets = match wait_for_attach(&events, total) {
        Ok(s) => s,
        Err(e) => return fail(writer, e),
    };
    drop(slot_guard);
    let streams = session::stream_stats(&req, Side::Server, sockets);
    entry.set_running(streams.clone());
    entry.set_devices(plane.devices());
    let outcome = session::run_data_phase(
        &req,
        plane.as_ref(),
        &streams,
        writer,
        &events,
        &events_tx,
        SAMPLE_INTERVAL,
        &mut |_, _| {},
    )?;
    let bytes: u64 = outcome.local.streams.iter().map(|s| s.bytes).sum();
    let secs = outcome.local.seconds.max(1e-9);
    Ok(format!(
        "session {}: {} streams, {} in {:.2} s ({})",
        to_hex(&session_id),
        total,
        format_bytes(bytes),
        secs,
        format_bps(bytes as f64 * 8.0 / secs)
    ))
}

/// Takes the handshake connection's reader, with anything it has already
/// buffered, for the reader thread, and leaves a fresh handle on the same
/// socket in its place for writing (and for the final shutdown).
fn take_reader(conn: &mut Connection) -> Result<Connection> {
    let fresh = Connection::new(
        conn.socket()
            .try_clone()
            .map_err(|e| Error::io("control connection", e))?,
    )?;
    Ok(std::mem::replace(conn, fresh))
}

/// Forwards control messages to the session's event channel until the
/// connection fails or closes.
pub(crate) fn spawn_control_reader(mut reader: Connection, events: Sender<Event>) -> Result<()> {
    std::thread::Builder::new()
        .name("control-reader".into())
        .spawn(move || loop {
            let msg = reader.recv();
            let stop = msg.is_err();
            if events.send(Event::Control(msg)).is_err() || stop {
                return;
            }
        })
        .map_err(|e| Error::io("starting the control reader", e))?;
    Ok(())
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
    use super::is_loopback;

    #[test]
    fn loopback_peers_include_v4_mapped() {
        assert!(is_loopback("127.0.0.1".parse().unwrap()));
        assert!(is_loopback("127.1.2.3".parse().unwrap()));
        assert!(is_loopback("::1".parse().unwrap()));
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
        assert!(!is_loopback("::ffff:10.0.0.1".parse().unwrap()));
    }
}
