//! `longhaul send` as a library call: opens a session, attaches the data
//! connections, runs the data phase and returns the final report.
//!
//! [`SendOptions`] says what to send where; its [`Payload`] picks the mode
//! and carries that mode's options. A caller that wants to follow the run
//! (interval lines, a progress bar) passes a [`Watch`].

use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

use crate::attach::{AttachHeader, SESSION_ID_LEN};
use crate::auth::{from_hex, to_hex, Token};
use crate::connection::{self, Connection};
use crate::datapath::DataPlane;
use crate::error::{Error, Result};
use crate::handshake::{self, Nonces};
use crate::iperf3::TestOptions;
use crate::limits::{DEFAULT_BUFFER, DEFAULT_SECONDS, REPORT_PERIOD};
use crate::messages::{Direction, Message, SessionRequest};
use crate::planes::{self, Amount, Payload};
use crate::send_report::FinalReport;
use crate::sending::{check_start_at, sleep_until};
pub use crate::sending::{Live, Watch};
use crate::session::{self, Side};
use crate::stream::StreamStats;

/// Data connections opened in parallel while attaching: enough to hide a
/// long RTT, few enough not to flood the server's accept queue.
const PARALLEL_CONNECTS: usize = 16;

/// TCP_INFO sampling period when nobody watches the run.
const DEFAULT_SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// With `--start-at`, how long before the instant the client connects and
/// attaches. The server gives a session [`crate::limits::ATTACH_TIMEOUT`]
/// (30 s) from its request to its Start, so a client must not wait for a
/// far instant while attached; 10 s covers the handshake and attaching 1,024
/// streams over a long path.
pub(crate) const START_AT_CONNECT_AHEAD: Duration = Duration::from_secs(10);

/// Idle streams named in the warning; the rest are counted.
const IDLE_STREAMS_SHOWN: usize = 10;

/// What to send where (`longhaul send`'s flags, parsed).
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// `HOST:PORT` of the server.
    pub to: String,
    /// Streams per direction.
    pub streams: u32,
    /// SO_SNDBUF/SO_RCVBUF of every data socket, bytes.
    pub buffer: u64,
    /// TCP congestion control of the data sockets.
    pub cc: Option<String>,
    /// Total rate per direction, bits per second.
    pub rate_bps: Option<u64>,
    pub direction: Direction,
    /// `--strict`: a stream that moved no bytes fails the run.
    pub strict: bool,
    pub token: Option<Token>,
    /// `--start-at`: connect and attach shortly before, start the data phase at
    /// this instant (a campaign phase hands one to all its senders).
    pub start_at: Option<SystemTime>,
    /// The mode and what it moves.
    pub payload: Payload,
    /// `--campaign` and `--run`: the campaign this transfer is a run of, and
    /// the run, carried in the session request to the server's stats API.
    pub campaign: Option<String>,
    pub run: Option<String>,
}

impl SendOptions {
    /// One stream of the default buffer, client to server, no token.
    pub fn new(to: impl Into<String>, payload: Payload) -> SendOptions {
        SendOptions {
            to: to.into(),
            streams: 1,
            buffer: DEFAULT_BUFFER,
            cc: None,
            rate_bps: None,
            direction: Direction::Send,
            strict: false,
            token: None,
            start_at: None,
            payload,
            campaign: None,
            run: None,
        }
    }

    /// The session request these options describe (without the mode's
    /// parameters, which its plane adds).
    pub(crate) fn request(&self) -> SessionRequest {
        let (bytes, seconds) = match self.payload.amount() {
            Some(Amount::Bytes(b)) => (Some(b), None),
            Some(Amount::Seconds(s)) => (None, Some(s)),
            // Disk mode sends the files; the time is a formality.
            None => (None, Some(DEFAULT_SECONDS)),
        };
        SessionRequest {
            mode: self.payload.mode(),
            direction: self.direction,
            streams: self.streams,
            bytes,
            seconds,
            buffer: self.buffer,
            cc: self.cc.clone(),
            rate_bps: self.rate_bps,
            mode_params: None,
            client_host: host_name(),
            campaign: self.campaign.clone(),
            run: self.run.clone(),
        }
    }

    /// These options as an iperf3 test (`--protocol iperf3`): memory to
    /// memory, without longhaul's own token.
    pub fn iperf3_test(&self) -> Result<TestOptions> {
        if !matches!(self.payload, Payload::Memory(_)) {
            return Err(Error::Usage(
                "--protocol iperf3 runs memory to memory: no PATHs or messages".into(),
            ));
        }
        if self.token.is_some() {
            return Err(Error::Usage(
                "--token-file is longhaul's own authentication; iperf3 servers take none here"
                    .into(),
            ));
        }
        Ok(TestOptions {
            to: self.to.clone(),
            start_at: self.start_at,
            request: self.request(),
        })
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

/// Handshake result: the session and the key its data connections prove.
struct Accepted {
    session_id: [u8; SESSION_ID_LEN],
    attach_key: Vec<u8>,
}

fn handshake(
    conn: &mut Connection,
    req: &SessionRequest,
    token: Option<&Token>,
    plane: &dyn DataPlane,
) -> Result<Accepted> {
    let Nonces {
        client: client_nonce,
        server: server_nonce,
    } = handshake::client_authenticate(conn, token)?;
    conn.send(&Message::SessionRequest(req.clone()))?;
    plane.negotiate(conn)?;
    let accepted = match conn.recv()? {
        Message::SessionAccepted(a) => a,
        other => {
            return Err(Error::Protocol(format!(
                "expected SessionAccepted, got {:?}",
                other.kind()
            )))
        }
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
                        let sends = session::client_sends(req, id);
                        let (mut sock, w) = connection::connect_prepared(addr, |s| {
                            session::configure_data_socket(&s, req, sends)
                        })?;
                        session::set_data_timeouts(&sock)?;
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

/// Warns about streams that moved nothing; with `--strict` they fail the
/// run.
fn check_idle_streams(
    req: &SessionRequest,
    plane: &dyn DataPlane,
    outcome: &session::PhaseOutcome,
    strict: bool,
) -> Result<()> {
    let idle = session::idle_streams(req, plane, outcome);
    if idle.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = idle
        .iter()
        .take(IDLE_STREAMS_SHOWN)
        .map(u32::to_string)
        .collect();
    let more = if idle.len() > IDLE_STREAMS_SHOWN {
        ", ..."
    } else {
        ""
    };
    let text = format!(
        "{} of {} streams moved no bytes (streams {}{more}); the machine or the path could not keep them all busy",
        idle.len(),
        outcome.local.streams.len(),
        ids.join(", ")
    );
    if strict {
        return Err(Error::IdleStreams(text));
    }
    eprintln!("longhaul: warning: {text} (--strict makes this an error)");
    Ok(())
}

/// A send that failed: why, and the final report when the data phase ran
/// to its end (files that failed, idle streams with `--strict`), which
/// then says `"ok": false` and what moved and was verified.
#[derive(Debug)]
pub struct Failure {
    pub error: Error,
    pub report: Option<Box<FinalReport>>,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure {
            error,
            report: None,
        }
    }
}

/// Runs a whole `send` and returns the final report; `watch`, if any, is
/// called while the data moves.
pub fn run(opts: &SendOptions, watch: Option<Watch<'_>>) -> Result<FinalReport> {
    run_reporting(opts, watch).map_err(|f| f.error)
}

/// [`run`], keeping the final report of a run that failed after its data
/// phase.
pub fn run_reporting(
    opts: &SendOptions,
    watch: Option<Watch<'_>>,
) -> std::result::Result<FinalReport, Failure> {
    let mut req = opts.request();
    session::validate(&req)?;
    check_start_at(opts.start_at)?;
    let plane = planes::client_plane(&req, &opts.payload)?;
    req.mode_params = plane.mode_params();
    // The plane is ready (a disk tree walked and hashed); connect shortly
    // before the instant.
    if let Some(at) = opts.start_at {
        sleep_until(at.checked_sub(START_AT_CONNECT_AHEAD).unwrap_or(at));
    }
    let addr = connection::resolve(&opts.to)?;
    let mut conn = Connection::new(connection::connect(addr)?)?;
    let accepted = handshake(&mut conn, &req, opts.token.as_ref(), plane.as_ref())?;
    let (sockets, warning) = attach_all(addr, &req, &accepted)?;
    if let Some(w) = warning {
        eprintln!("longhaul: {w}");
    }
    conn.set_timeout(None)?;
    // The reader keeps whatever the handshake already buffered.
    let (reader, mut conn) = conn.split()?;
    let (events_tx, events) = mpsc::channel();
    session::spawn_control_reader(reader, events_tx.clone())?;
    let streams = session::stream_stats(&req, Side::Client, sockets);
    if let Some(at) = opts.start_at {
        // Everything is attached: only the Start message is left.
        sleep_until(at);
    }
    let started = SystemTime::now();
    conn.send(&Message::Start)?;

    let mut unwatched = |_: &Live<'_>| {};
    let (every, watcher): (Duration, &mut dyn FnMut(&Live<'_>)) = match watch {
        Some(w) => (w.every, w.tick),
        None => (DEFAULT_SAMPLE_PERIOD, &mut unwatched),
    };
    let mut tick = |s: &[Arc<StreamStats>], elapsed: Duration| {
        watcher(&Live {
            streams: s,
            elapsed,
            plane: plane.progress(),
        })
    };
    let result = session::DataPhase {
        req: &req,
        plane: plane.as_ref(),
        streams: &streams,
        control: &mut conn,
        events: &events,
        events_tx: &events_tx,
        tick_every: every,
        tick: &mut tick,
        peer: session::PeerStreams::Report(REPORT_PERIOD),
    }
    .run();
    let _ = conn.socket().shutdown(std::net::Shutdown::Both);
    let outcome = result?;
    let (local, remote) = (
        outcome.local.mode_summary.as_ref(),
        outcome.remote.mode_summary.as_ref(),
    );
    let mut report = FinalReport::from_outcome(
        req.mode,
        req.direction,
        &outcome,
        plane.report(local, remote),
        to_hex(&accepted.session_id),
        addr.to_string(),
        started,
    );
    if let Some(Amount::Seconds(s)) = opts.payload.amount() {
        report.requested_seconds = Some(s);
    }
    let verdict = plane
        .check(local, remote)
        .and_then(|()| check_idle_streams(&req, plane.as_ref(), &outcome, opts.strict));
    match verdict {
        Ok(()) => Ok(report),
        Err(error) => Err(Failure {
            report: Some(Box::new(report.failed(&error))),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iperf3_test_is_memory_to_memory_without_a_token() {
        let mut o = SendOptions::new("h:5201", Payload::Memory(Amount::Bytes(1 << 30)));
        o.streams = 3;
        let t = o.iperf3_test().unwrap();
        assert_eq!((t.request.streams, t.request.bytes), (3, Some(1 << 30)));
        o.token = Some(Token::from_bytes(b"t"));
        assert!(matches!(o.iperf3_test(), Err(Error::Usage(m)) if m.contains("--token-file")));
        let files = Payload::Files {
            paths: vec!["x".into()],
            dest: "d".into(),
            disk: Default::default(),
        };
        let o = SendOptions::new("h:5201", files);
        assert!(matches!(o.iperf3_test(), Err(Error::Usage(m)) if m.contains("memory to memory")));
    }
}
