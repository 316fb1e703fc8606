//! `longhaul send`: opens a session, attaches the data connections, runs
//! the data phase and reports.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use crate::attach::{AttachHeader, SESSION_ID_LEN};
use crate::auth::{from_hex, proofs_equal, random_bytes, to_hex, Token, NONCE_LEN};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::messages::{Auth, Direction, Hello, Message, Mode, SessionRequest};
use crate::modes;
use crate::report::{FinalReport, IntervalTracker};
use crate::session::{self, Side, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT};
use crate::{PROTOCOL_VERSION, SOFTWARE_VERSION};

/// Data connections opened in parallel while attaching: enough to hide a
/// long RTT, few enough not to flood the server's accept queue.
const PARALLEL_CONNECTS: usize = 16;

/// TCP_INFO sampling period when no interval output is asked for.
const DEFAULT_SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// `longhaul send` options.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub to: String,
    pub streams: u32,
    pub buffer: u64,
    pub cc: Option<String>,
    pub rate_bps: Option<u64>,
    pub seconds: Option<f64>,
    pub bytes: Option<u64>,
    pub direction: Direction,
    /// Seconds between interval reports; `None` = no interval output.
    pub interval: Option<f64>,
    pub json: bool,
    /// `--strict`: a stream that moved no bytes fails the run.
    pub strict: bool,
    pub token: Option<Token>,
    pub paths: Vec<PathBuf>,
    pub dest: Option<String>,
    /// Disk mode: `--io-workers-per-device`, `--direct`, `--follow-symlinks`, `--no-resume`.
    pub disk: crate::disk::DiskOptions,
}

impl SendOptions {
    /// The session request these options describe.
    pub fn request(&self) -> SessionRequest {
        let mode = if self.paths.is_empty() {
            Mode::Memory
        } else {
            Mode::Disk
        };
        SessionRequest {
            mode,
            direction: self.direction,
            streams: self.streams,
            bytes: self.bytes,
            seconds: if self.bytes.is_some() {
                None
            } else {
                Some(self.seconds.unwrap_or(session::DEFAULT_SECONDS))
            },
            buffer: self.buffer,
            cc: self.cc.clone(),
            rate_bps: self.rate_bps,
            mode_params: None,
            client_host: host_name(),
        }
    }
}

/// This machine's host name (gethostname), for the server's stats API.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf/len describe a local buffer; the kernel NUL-terminates
    // names shorter than it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..len]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

fn resolve(to: &str) -> Result<SocketAddr> {
    let mut addrs = to
        .to_socket_addrs()
        .map_err(|e| Error::Refused(format!("cannot resolve '{to}': {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Error::Refused(format!("'{to}' resolves to no address")))
}

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| Error::io(format!("connecting to {addr}"), e))
}

/// Handshake result: the session and the key its data connections prove.
struct Accepted {
    session_id: [u8; SESSION_ID_LEN],
    attach_key: Vec<u8>,
}

fn expect_kind(got: Message, want: &str) -> Error {
    Error::Protocol(format!("expected {want}, got {:?}", got.kind()))
}

/// Nonces of an authenticated control connection (the attach key derives
/// from them).
pub(crate) struct Nonces {
    pub client: [u8; NONCE_LEN],
    pub server: Vec<u8>,
}

/// Hello -> Challenge -> Auth -> AuthOk on a fresh control connection.
/// After it the client may send `SessionRequest` (or `Ping`).
pub(crate) fn authenticate(conn: &mut Connection, token: Option<&Token>) -> Result<Nonces> {
    conn.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let client_nonce = random_bytes::<NONCE_LEN>();
    conn.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        client_nonce: to_hex(&client_nonce),
        software: format!("longhaul {SOFTWARE_VERSION}"),
    }))?;
    let challenge = match conn.recv()? {
        Message::Challenge(c) => c,
        other => return Err(expect_kind(other, "Challenge")),
    };
    if challenge.version != PROTOCOL_VERSION {
        return Err(Error::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: challenge.version,
        });
    }
    let server_nonce = from_hex(&challenge.server_nonce)?;
    if challenge.token_required && token.is_none() {
        return Err(Error::Auth(
            "the server requires a token: pass --token-file".into(),
        ));
    }
    conn.send(&Message::Auth(Auth {
        proof: token.map(|t| to_hex(&t.client_proof(&server_nonce, &client_nonce))),
    }))?;
    let ok = match conn.recv()? {
        Message::AuthOk(a) => a,
        other => return Err(expect_kind(other, "AuthOk")),
    };
    if let Some(t) = token {
        let Some(proof) = ok.proof else {
            return Err(Error::Auth(
                "the server runs without a token and cannot prove it knows ours".into(),
            ));
        };
        if !proofs_equal(
            &from_hex(&proof)?,
            &t.server_proof(&server_nonce, &client_nonce),
        ) {
            return Err(Error::Auth(
                "the server's proof is wrong: different token".into(),
            ));
        }
    }
    Ok(Nonces {
        client: client_nonce,
        server: server_nonce,
    })
}

fn handshake(
    conn: &mut Connection,
    req: &SessionRequest,
    token: Option<&Token>,
    plane: &dyn crate::datapath::DataPlane,
) -> Result<Accepted> {
    let Nonces {
        client: client_nonce,
        server: server_nonce,
    } = authenticate(conn, token)?;
    conn.send(&Message::SessionRequest(req.clone()))?;
    plane.negotiate(conn)?;
    let accepted = match conn.recv()? {
        Message::SessionAccepted(a) => a,
        other => return Err(expect_kind(other, "SessionAccepted")),
    };
    let id = from_hex(&accepted.session_id)?;
    let session_id: [u8; SESSION_ID_LEN] = id
        .try_into()
        .map_err(|_| Error::Protocol("session id has the wrong length".into()))?;
    let attach_key = match (token, accepted.attach_key) {
        (Some(t), _) => t.attach_key(&server_nonce, &client_nonce).to_vec(),
        (None, Some(k)) => from_hex(&k)?,
        (None, None) => {
            return Err(Error::Protocol(
                "no attach key for an unauthenticated session".into(),
            ))
        }
    };
    Ok(Accepted {
        session_id,
        attach_key,
    })
}

/// Opens and attaches every data connection, in parallel batches. Returns
/// the sockets indexed by stream id and the first buffer warning.
fn attach_all(
    addr: SocketAddr,
    req: &SessionRequest,
    accepted: &Accepted,
) -> Result<(Vec<TcpStream>, Option<String>)> {
    let total = session::total_streams(req);
    let mut sockets: Vec<TcpStream> = Vec::with_capacity(total as usize);
    let mut warning = None;
    let ids: Vec<u32> = (0..total).collect();
    for batch in ids.chunks(PARALLEL_CONNECTS) {
        let results: Vec<Result<(TcpStream, Option<String>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&id| {
                    scope.spawn(move || -> Result<(TcpStream, Option<String>)> {
                        let mut sock = connect(addr)?;
                        let w = session::configure_data_socket(
                            &sock,
                            req,
                            session::client_sends(req, id),
                        )?;
                        AttachHeader::new(&accepted.attach_key, accepted.session_id, id)
                            .send_and_confirm(&mut sock)?;
                        Ok((sock, w))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Protocol("attach thread panicked".into())))
                })
                .collect()
        });
        for r in results {
            let (sock, w) = r?;
            warning = warning.or(w);
            sockets.push(sock);
        }
    }
    Ok((sockets, warning))
}

/// Streams that should have moved bytes (memory and messages modes: every
/// stream has time or a share of `--bytes`) but moved none. Disk mode is
/// left out: with fewer files than streams, idle streams are normal.
pub fn empty_streams(req: &SessionRequest, outcome: &session::PhaseOutcome) -> Vec<u32> {
    if req.mode == Mode::Disk {
        return Vec::new();
    }
    outcome
        .local
        .streams
        .iter()
        .zip(&outcome.remote.streams)
        .filter(|(l, r)| l.bytes == 0 && r.bytes == 0)
        .map(|(l, _)| l.id)
        .filter(|&id| session::stream_bytes(req, id) != Some(0))
        .collect()
}

/// Warns about streams that moved nothing; with `--strict` they fail the
/// run.
fn check_empty_streams(
    req: &SessionRequest,
    outcome: &session::PhaseOutcome,
    strict: bool,
) -> Result<()> {
    let empty = empty_streams(req, outcome);
    if empty.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 10;
    let ids: Vec<String> = empty.iter().take(SHOWN).map(u32::to_string).collect();
    let more = if empty.len() > SHOWN { ", ..." } else { "" };
    let text = format!(
        "{} of {} streams moved no bytes (streams {}{more}); the machine or the path could not keep them all busy",
        empty.len(),
        outcome.local.streams.len(),
        ids.join(", ")
    );
    if strict {
        return Err(Error::IdleStreams(text));
    }
    eprintln!("longhaul: warning: {text} (--strict makes this an error)");
    Ok(())
}

/// Runs a whole `send`: prints interval lines to `out` as it goes and
/// returns the final report (the caller prints it).
pub fn run(opts: &SendOptions, out: &mut dyn Write) -> Result<FinalReport> {
    run_request(opts, opts.request(), out)
}

/// [`run`] with a request built by the caller (`longhaul sweep` asks for
/// messages mode this way; `opts` still gives address, token and output).
pub fn run_request(
    opts: &SendOptions,
    mut req: SessionRequest,
    out: &mut dyn Write,
) -> Result<FinalReport> {
    session::validate(&req)?;
    let plane = modes::client_plane(&req, opts)?;
    req.mode_params = plane.mode_params();
    let addr = resolve(&opts.to)?;
    let mut conn = Connection::new(connect(addr)?)?;
    let accepted = handshake(&mut conn, &req, opts.token.as_ref(), plane.as_ref())?;
    let (sockets, warning) = attach_all(addr, &req, &accepted)?;
    if let Some(w) = warning {
        eprintln!("longhaul: {w}");
    }
    conn.set_timeout(None)?;
    // The reader keeps whatever the handshake already buffered.
    let (reader, mut conn) = conn.split()?;
    let (events_tx, events) = mpsc::channel();
    crate::server::spawn_control_reader(reader, events_tx.clone())?;
    let streams = session::stream_stats(&req, Side::Client, sockets);
    conn.send(&Message::Start)?;

    let tick_every = opts
        .interval
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_SAMPLE_PERIOD);
    let print = opts.interval.is_some();
    let json = opts.json;
    let mut tracker = IntervalTracker::default();
    let mut tick = |s: &[std::sync::Arc<crate::stream::StreamStats>], elapsed: Duration| {
        if !print {
            return;
        }
        let r = tracker.next(s, elapsed);
        let line = if json {
            serde_json::to_string(&r).unwrap_or_default()
        } else {
            r.human()
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let result = session::run_data_phase(
        &req,
        plane.as_ref(),
        &streams,
        &mut conn,
        &events,
        &events_tx,
        tick_every,
        &mut tick,
        session::PeerStreams::Report(session::REPORT_PERIOD),
    );
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
    let outcome = result?;
    modes::check_outcome(&req, Side::Client, &outcome)?;
    check_empty_streams(&req, &outcome, opts.strict)?;
    Ok(FinalReport::from_outcome(
        req.mode,
        req.direction,
        &outcome,
        to_hex(&accepted.session_id),
        addr.to_string(),
    ))
}
