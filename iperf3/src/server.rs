//! `longhaul serve --iperf3-listen`: an iperf3 server that runs many tests
//! at once, each a session of the engine's registry (stats API, exporter,
//! dashboards, alerts) with `protocol: iperf3`.
//!
//! Admission is the engine's ([`longhaul_admission`], the same pools and
//! total deadline as the control port): every connection's first message
//! is a 37-byte cookie. A cookie that belongs to a test waiting for its
//! data connections attaches a stream on the admission thread; any other
//! cookie opens a test: we answer `PARAM_EXCHANGE`, read the parameter
//! block (at most [`MAX_PARAMS_LEN`]), check the credentials when the
//! server asks for them, and only then does the connection leave the
//! admission pools and take one of the `--iperf3-max-tests` slots (a full
//! server answers `ACCESS_DENIED`, iperf3's "busy"). Tests beyond the
//! server's duration and rate limits are refused with iperf3's own error
//! codes.
//!
//! A test then runs as iperf3 runs it ([`run_test`]): `CREATE_STREAMS`,
//! the data connections (TCP through the admission lobby, UDP through the
//! [`UdpPort`]), `TEST_START` and `TEST_RUNNING`, until the client says
//! `TEST_END`; then `EXCHANGE_RESULTS` (the client's block first, then
//! ours), `DISPLAY_RESULTS`, and the client's `IPERF_DONE`. Before
//! answering with our results we let every receiving stream take in what
//! the client says it sent, so sender and receiver agree to the byte.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_admission::{
    Arrival, FirstMessage, Lobby, Protocol, Refusal, Reporter, Slots, Ticket,
};
use longhaul_units::{format_bps, format_bytes};

use crate::cpu::CpuSnapshot;
use crate::error::{Error, Result};
use crate::limits::{
    admission_settings, ADMISSION_DEADLINE, DATA_IDLE_TIMEOUT, HANDSHAKING_CAPACITY,
    SHUTDOWN_TIMEOUT, WATCHDOG_PERIOD,
};
use crate::logline;
use crate::memory_plane::MemoryPlane;
use crate::messages::Role;
use crate::registry::{Registry, SessionEntry};
use crate::session::{self, Side};
use crate::sockopt;
use longhaul_core::auth::{random_bytes, to_hex};

use super::auth::ServerAuth;
use super::control::{self, Heard};
use super::params::{Params, ServerLimits, Transport};
use super::results::{stream_index, Results};
use super::streams::{CpuUse, Plan, Sockets, StreamEnd, TestSeconds, TestStreams};
use super::udp::{self, UdpPort};
use super::wire::{self, Cookie, CookieCheck, ErrorCode, JsonError, State, COOKIE_LEN};

/// Default `--iperf3-max-tests`: tests running at once.
pub const DEFAULT_MAX_TESTS: usize = 16;

/// Without `--iperf3-max-tests-per-source`, one source may hold this part
/// of the test slots (a quarter: 4 of the default 16). The port takes no
/// token, so a stranger holding tests that never start must not take them
/// all: one source with 16 connections stopped after their parameters
/// served 0 of 70 real clients over 70 s. Four tests at once from one
/// host is more than a campus's test schedule runs (perfSONAR runs one).
pub(crate) const SOURCE_SHARE_DIVISOR: usize = 4;

/// The default `--iperf3-max-tests-per-source` for `max_tests` slots.
pub fn default_tests_per_source(max_tests: usize) -> usize {
    (max_tests / SOURCE_SHARE_DIVISOR).max(1)
}

/// Least default `--iperf3-max-pending-per-source`: connections of one
/// source between their cookie and the end of their parameter exchange
/// (each a thread of ours), the oldest pushed out by a newer one. A client
/// has one there for a round trip per test; 8 covers a host starting its
/// default 4 tests together, and a stranger's crowd holds 8 threads, not 64.
pub(crate) const DEFAULT_MAX_PENDING_PER_SOURCE: usize = 8;

/// The default `--iperf3-max-pending-per-source` for a source that may hold
/// `tests_per_source` tests: a host allowed 32 tests may start 32 together,
/// and on a loaded machine their parameter exchanges overlap; with 8, the
/// ninth pushed the first out and its client saw "control socket has closed
/// unexpectedly" (CI, 16 clients from one address).
pub fn default_pending_per_source(tests_per_source: usize) -> usize {
    tests_per_source.clamp(DEFAULT_MAX_PENDING_PER_SOURCE, HANDSHAKING_CAPACITY)
}

/// From `CREATE_STREAMS` to the test's last data connection (TCP or UDP).
/// An iperf3 client opens them all at once, a round trip each: 5 s covers
/// 128 streams over a 1 s RTT path. A test whose streams do not come gives
/// its slot back then (it kept it 30 s, the engine's own sessions' attach
/// time for 1,024 streams).
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// The iperf3 port's name among the stats API's admission counters.
pub(crate) const LISTENER_NAME: &str = "iperf3";

/// Default `--iperf3-max-duration`: an hour is far beyond any scheduled
/// test (perfSONAR runs 10 to 60 s) and still stops a forgotten `-t 0`.
pub(crate) const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(3600);

/// Largest parameter block we read. A client's block is ~300 bytes; a
/// title or extra data may add a little. A larger length is refused
/// before anything is read.
pub(crate) const MAX_PARAMS_LEN: usize = 64 << 10;

/// A sending stream of ours stops this long after the client's `-t` (and
/// `-O`) if the client's `TEST_END` has not stopped it first; the client's
/// clock starts a round trip before ours.
const SEND_GRACE: Duration = Duration::from_secs(5);

/// After `TEST_END`, a receiving stream waits for the bytes the client
/// says it sent while they keep arriving; it gives up when nothing arrived
/// for [`DRAIN_QUIET`] or after [`DRAIN_MAX`] in all.
const DRAIN_QUIET: Duration = Duration::from_millis(250);
const DRAIN_MAX: Duration = Duration::from_secs(10);

/// The rate limit is checked over this window, as iperf3's
/// `--server-bitrate-limit` averages over 5 s by default.
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// How long a test the server ends keeps its data connections open for
/// the client to read why ([`tell_while_running`]).
const TELL_GRACE: Duration = Duration::from_secs(2);

/// What `--iperf3-listen` and its companions say.
#[derive(Debug, Clone)]
pub struct Iperf3Options {
    pub listen: String,
    pub max_tests: usize,
    /// Tests one source may hold at once, starting or running
    /// (`--iperf3-max-tests-per-source`).
    pub max_tests_per_source: usize,
    /// Connections of one source still in their parameter exchange
    /// (`--iperf3-max-pending-per-source`).
    pub max_pending_per_source: usize,
    pub limits: ServerLimits,
    /// `--iperf3-rsa-private-key-path` and `--iperf3-authorized-users-path`.
    pub auth: Option<ServerAuth>,
}

impl Iperf3Options {
    /// Refuses limits that do not hold together, naming the flag.
    pub fn check(&self) -> Result<()> {
        if self.max_tests == 0 {
            return Err(Error::Usage("--iperf3-max-tests must be at least 1".into()));
        }
        if self.max_tests_per_source == 0 || self.max_tests_per_source > self.max_tests {
            return Err(Error::Usage(format!(
                "--iperf3-max-tests-per-source must be 1..{} (--iperf3-max-tests)",
                self.max_tests
            )));
        }
        if self.max_pending_per_source == 0 || self.max_pending_per_source > HANDSHAKING_CAPACITY {
            return Err(Error::Usage(format!(
                "--iperf3-max-pending-per-source must be 1..{HANDSHAKING_CAPACITY}"
            )));
        }
        Ok(())
    }

    /// iperf3 on `listen` with the default limits and no authentication.
    pub fn new(listen: impl Into<String>) -> Iperf3Options {
        Iperf3Options {
            listen: listen.into(),
            max_tests: DEFAULT_MAX_TESTS,
            max_tests_per_source: default_tests_per_source(DEFAULT_MAX_TESTS),
            max_pending_per_source: default_pending_per_source(default_tests_per_source(
                DEFAULT_MAX_TESTS,
            )),
            limits: ServerLimits {
                max_duration: DEFAULT_MAX_DURATION,
                max_rate_bps: 0,
            },
            auth: None,
        }
    }
}

/// A test waiting for its TCP data connections.
struct Attaching {
    wanted: usize,
    got: usize,
    events: Sender<Event>,
}

struct Context {
    opts: Iperf3Options,
    registry: Arc<Registry>,
    /// One memory plane for every test: its pattern is shared, so a test
    /// costs no pattern of its own.
    plane: MemoryPlane,
    /// The `--iperf3-max-tests` slots, shared out per source.
    tests: Arc<Slots>,
    attaching: Mutex<HashMap<Cookie, Attaching>>,
    udp: Arc<UdpPort>,
}

/// Everything that happens to a test, on one channel.
enum Event {
    Control(Heard),
    Attached(TcpStream),
    Ended(StreamEnd),
}

/// A bound iperf3 port (TCP and UDP), ready to [`Iperf3Server::spawn`].
pub struct Iperf3Server {
    listener: TcpListener,
    ctx: Arc<Context>,
}

fn log(msg: impl std::fmt::Display) {
    logline::server(msg);
}

impl Iperf3Server {
    /// Binds the TCP and UDP port of `opts.listen`.
    pub fn bind(opts: Iperf3Options, registry: Arc<Registry>) -> Result<Iperf3Server> {
        opts.check()?;
        let bad = |e: std::io::Error| {
            Error::Usage(format!(
                "cannot listen on {} (--iperf3-listen): {e}",
                opts.listen
            ))
        };
        let listener = TcpListener::bind(&opts.listen).map_err(bad)?;
        if let Some(warning) = sockopt::start_accepted_as_neutral(&listener) {
            log(warning);
        }
        let addr = listener.local_addr().map_err(bad)?;
        let udp = Arc::new(UdpPort::bind(addr).map_err(bad)?);
        Ok(Iperf3Server {
            listener,
            ctx: Arc::new(Context {
                plane: MemoryPlane::from_env()?,
                tests: Slots::new(opts.max_tests, opts.max_tests_per_source),
                opts,
                registry,
                attaching: Mutex::new(HashMap::new()),
                udp,
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves the port on threads of its own (admission, UDP) for the
    /// process's life.
    pub fn spawn(self) -> Result<()> {
        let udp = self.ctx.udp.clone();
        std::thread::Builder::new()
            .name("iperf3-udp".into())
            .spawn(move || udp.run(&|line| log(line)))
            .map_err(|e| Error::io("starting the iperf3 UDP port", e))?;
        let registry = self.ctx.registry.clone();
        let address = self.listener.local_addr().ok();
        let mut settings = admission_settings();
        settings.handshaking.per_source = self.ctx.opts.max_pending_per_source;
        let lobby = Lobby::new(
            self.listener,
            Arc::new(Iperf3Protocol { ctx: self.ctx }),
            settings,
        );
        registry.watch_admission(LISTENER_NAME, address, lobby.counters());
        std::thread::Builder::new()
            .name("iperf3-admission".into())
            .spawn(move || {
                if let Err(e) = lobby.run() {
                    log(format!("iperf3 port: accepting connections failed: {e}"));
                }
            })
            .map(drop)
            .map_err(|e| Error::io("starting the iperf3 port", e))
    }
}

struct Iperf3Protocol {
    ctx: Arc<Context>,
}

impl Protocol for Iperf3Protocol {
    fn max_first_message(&self) -> usize {
        COOKIE_LEN
    }

    fn first_message(&self, received: &[u8]) -> FirstMessage {
        match Cookie::check(received) {
            CookieCheck::Incomplete => FirstMessage::NeedMore,
            CookieCheck::Invalid(why) => FirstMessage::Garbage(why),
            CookieCheck::Valid(c) => {
                let attaching = self.ctx.attaching.lock().unwrap_or_else(|e| e.into_inner());
                if attaching.contains_key(&c) {
                    FirstMessage::Quick
                } else {
                    FirstMessage::Handshake
                }
            }
        }
    }

    /// A data connection of a test that is opening its streams: handed to
    /// the test (which configures it); one too many is denied.
    fn quick(&self, arrival: Arrival) {
        let CookieCheck::Valid(cookie) = Cookie::check(&arrival.received) else {
            return;
        };
        let mut attaching = self.ctx.attaching.lock().unwrap_or_else(|e| e.into_inner());
        match attaching.get_mut(&cookie) {
            Some(a) if a.got < a.wanted && arrival.received.len() == COOKIE_LEN => {
                a.got += 1;
                let _ = a.events.send(Event::Attached(arrival.stream));
            }
            _ => {
                drop(attaching);
                let _ = (&arrival.stream).write_all(&[State::AccessDenied.byte()]);
                arrival
                    .reporter
                    .report("iperf3 data connection beyond its test's streams");
            }
        }
    }

    fn handshake(&self, arrival: Arrival, ticket: Ticket) {
        handle_control(arrival, ticket, &self.ctx);
    }

    fn log(&self, line: &str) {
        log(format!("iperf3 port: {line}"));
    }
}

/// Why a test found no slot free, in the log.
fn slot_refused(why: Refusal, peer: SocketAddr, ctx: &Context) -> String {
    match why {
        Refusal::SourceBusy => format!(
            "iperf3 test refused: {} already holds {} tests (--iperf3-max-tests-per-source)",
            peer.ip(),
            ctx.tests.per_source()
        ),
        _ => format!(
            "iperf3 test refused: already running {} tests (--iperf3-max-tests)",
            ctx.opts.max_tests
        ),
    }
}

/// A new test's control connection, from its cookie on: parameters,
/// credentials, limits, admission, a slot, the test.
fn handle_control(arrival: Arrival, ticket: Ticket, ctx: &Arc<Context>) {
    let reporter = arrival.reporter.clone();
    let peer = arrival.peer;
    let CookieCheck::Valid(cookie) = Cookie::check(&arrival.received) else {
        return;
    };
    let stream = arrival.stream;
    if arrival.received.len() > COOKIE_LEN {
        // iperf3 clients wait for PARAM_EXCHANGE before they say more.
        return reporter.report("iperf3: bytes after the cookie before PARAM_EXCHANGE");
    }
    let left = ADMISSION_DEADLINE
        .saturating_sub(arrival.accepted.elapsed())
        .max(Duration::from_millis(1));
    let setup = stream
        .set_nodelay(true)
        .and_then(|_| stream.set_read_timeout(Some(left)))
        .and_then(|_| stream.set_write_timeout(Some(left)));
    if let Err(e) = setup {
        return reporter.report(&format!("iperf3 control connection: {e}"));
    }
    let mut w = &stream;
    if control::send_state(&mut w, State::ParamExchange).is_err() {
        return reporter.report("iperf3: gone before PARAM_EXCHANGE");
    }
    let refuse = |code: ErrorCode, why: String| {
        control::send_server_error(&mut &stream, code);
        reporter.report(&format!("iperf3 test refused: {} ({why})", code.text()));
    };
    let block = match wire::read_json(&mut &stream, MAX_PARAMS_LEN) {
        Ok(b) => b,
        Err(JsonError::Io(e)) => {
            return reporter.report(&format!("iperf3: no parameters ({e})"));
        }
        Err(e) => return refuse(ErrorCode::RecvParams, e.to_string()),
    };
    let params = match Params::from_json(&block) {
        Ok(p) => p,
        Err(why) => return refuse(ErrorCode::RecvParams, why),
    };
    let user = match &ctx.opts.auth {
        Some(auth) => {
            // In the source's turn: a guesser is slowed down, and each try
            // costs an RSA decryption.
            let Some(turn) = reporter.proof_turn() else {
                return reporter.report(
                    "iperf3: too many failed logins from this address: slowed down past the admission deadline",
                );
            };
            match auth.check(params.authtoken.as_deref()) {
                Ok(user) => {
                    turn.passed();
                    Some(user)
                }
                Err(denied) => {
                    reporter.auth_failed(denied.kind);
                    return refuse(ErrorCode::AuthTest, denied.why);
                }
            }
        }
        None => None,
    };
    if let Err(r) = params.check(&ctx.opts.limits) {
        return refuse(r.code, r.why);
    }
    if let Err(e) = ticket.admit() {
        return reporter.report(&format!("iperf3: {e}"));
    }
    let _slot = match ctx.tests.take(peer.ip()) {
        Ok(slot) => slot,
        Err(why) => {
            reporter.refused(why);
            let _ = w.write_all(&[State::AccessDenied.byte()]);
            // Through the port's rate limit: refused clients come back
            // at once, in a loop.
            return reporter.report(&slot_refused(why, peer, ctx));
        }
    };
    let who = match &user {
        Some(u) => format!("iperf3 test from {peer} (user {u})"),
        None => format!("iperf3 test from {peer}"),
    };
    let id = to_hex(&random_bytes::<8>());
    let entry = ctx.registry.add(
        id.clone(),
        peer.to_string(),
        stream.local_addr().ok().map(|a| a.to_string()),
    );
    entry.set_request(&params.shape());
    entry.set_protocol(longhaul_stats_api::Protocol::Iperf3);
    let result = run_test(&stream, &params, cookie, &entry, &reporter, ctx);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    ctx.registry.finish(&entry, result.is_ok());
    match result {
        Ok(summary) => log(format!("{who}: finished: test {id}: {summary}")),
        Err(e) => log(format!("{who}: failed: test {id}: {e}")),
    }
    crate::memory::return_freed_memory();
}

/// A test that failed: what the client is told (nothing if it is the one
/// that went away) and what the log says.
struct Failure {
    tell: Option<ErrorCode>,
    error: Error,
    /// The test's data connections did not all come within
    /// [`ATTACH_TIMEOUT`] (a refusal the port counts).
    attach_timeout: bool,
}

impl Failure {
    fn tell(code: ErrorCode, error: Error) -> Failure {
        Failure {
            tell: Some(code),
            error,
            attach_timeout: false,
        }
    }

    fn silent(error: Error) -> Failure {
        Failure {
            tell: None,
            error,
            attach_timeout: false,
        }
    }

    fn attach_timeout(error: Error) -> Failure {
        Failure {
            attach_timeout: true,
            ..Failure::silent(error)
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure::silent(error)
    }
}

/// Runs one admitted test; returns the log's summary.
fn run_test(
    stream: &TcpStream,
    params: &Params,
    cookie: Cookie,
    entry: &Arc<SessionEntry>,
    reporter: &Reporter,
    ctx: &Arc<Context>,
) -> Result<String> {
    let (tx, events) = mpsc::channel();
    let phases = test_phases(stream, params, cookie, entry, ctx, &tx, &events);
    if let Err(Failure {
        attach_timeout: true,
        ..
    }) = &phases
    {
        reporter.refused(Refusal::AttachTimeout);
    }
    match phases {
        Ok(summary) => Ok(summary),
        Err(f) => {
            if let Some(code) = f.tell {
                control::send_server_error(&mut &*stream, code);
            }
            Err(f.error)
        }
    }
}

fn test_phases(
    stream: &TcpStream,
    params: &Params,
    cookie: Cookie,
    entry: &Arc<SessionEntry>,
    ctx: &Arc<Context>,
    tx: &Sender<Event>,
    events: &Receiver<Event>,
) -> std::result::Result<String, Failure> {
    let io = |what: &str, e: std::io::Error| Failure::silent(Error::io(what.to_string(), e));
    stream
        .set_read_timeout(None)
        .and_then(|_| stream.set_write_timeout(Some(SHUTDOWN_TIMEOUT)))
        .map_err(|e| io("iperf3 control connection", e))?;
    let reader = stream
        .try_clone()
        .map_err(|e| io("iperf3 control connection", e))?;
    let heard = tx.clone();
    control::spawn_reader(
        reader,
        State::TestEnd,
        Arc::new(move |h| {
            let _ = heard.send(Event::Control(h));
        }),
    )?;
    // The listener started the control connection as NEUTRAL_CC too: it
    // runs the machine's default from here on, as the client's end does.
    let default_cc = sockopt::default_cc()?;
    sockopt::set_cc(stream, &default_cc)?;
    let shape = params.shape();
    let total = session::total_streams(&shape) as usize;
    let mut w = stream;
    let sockets = match params.transport {
        Transport::Udp => Sockets::Udp(open_udp(stream, params, total, ctx, events)?),
        _ => Sockets::Tcp(open_tcp(stream, cookie, total, ctx, tx, events)?),
    };
    let congestion_used = configure(&sockets, params, &shape, &default_cc)?;
    // `-t 0` runs until the client's TEST_END, within the server's longest
    // test (as [`run_until_test_end`] bounds it).
    let send_for = match params.time {
        0 => ctx.opts.limits.max_duration,
        t => Duration::from_secs(t + params.omit),
    };
    let plan = Plan {
        shape: shape.clone(),
        side: Side::Server,
        send_for: send_for + SEND_GRACE,
        stream_rate_bps: params.bandwidth,
        block: params.block() as usize,
        wide: params.udp_counters_64bit,
    };
    let ended = tx.clone();
    let test = TestStreams::prepare(
        &plan,
        sockets,
        &ctx.plane,
        Arc::new(move |end| {
            let _ = ended.send(Event::Ended(end));
        }),
    )?;
    test.register(entry);
    control::send_state(&mut w, State::TestStart)?;
    control::send_state(&mut w, State::TestRunning)?;
    let start = test.go()?;
    let cpu_start = CpuSnapshot::now();
    let ended_at = run_until_test_end(&test, params, start, &ctx.opts.limits, events)
        .map_err(|f| tell_while_running(stream, f, events))?;
    test.stop_counting();
    test.take_what_arrives();
    let received_at_end = test.total(Role::Receive);
    let stopped = test.stop_sending(SHUTDOWN_TIMEOUT);
    let wall = ended_at.duration_since(start).as_secs_f64();
    let seconds = (wall - params.omit as f64).max(0.0);
    let cpu = CpuUse::from_report(&cpu_start.report_until(&CpuSnapshot::now()), wall);
    if !stopped {
        return Err(Failure::tell(
            ErrorCode::StreamWrite,
            Error::Timeout("our sending streams did not stop after TEST_END".into()),
        ));
    }
    control::send_state(&mut w, State::ExchangeResults)?;
    let theirs = client_results(events, total)?;
    let counted = TestSeconds::new(
        seconds,
        start,
        params.omit,
        drain(&test, &theirs, received_at_end),
    );
    let mut ours = test.results(counted, cpu, congestion_used);
    let summary = summary(&test, params, counted);
    if params.get_server_output {
        ours.server_output_text = Some(format!(
            "longhaul {} (iperf3 protocol): {summary}\n",
            longhaul_core::SOFTWARE_VERSION
        ));
    }
    control::send_json(&mut w, &ours.to_json())?;
    control::send_state(&mut w, State::DisplayResults)?;
    wait_for_done(events);
    Ok(summary)
}

/// Registers the cookie, announces `CREATE_STREAMS` and collects the TCP
/// data connections (in arrival order, as iperf3 numbers them).
fn open_tcp(
    stream: &TcpStream,
    cookie: Cookie,
    total: usize,
    ctx: &Arc<Context>,
    tx: &Sender<Event>,
    events: &Receiver<Event>,
) -> std::result::Result<Vec<TcpStream>, Failure> {
    ctx.attaching
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            cookie,
            Attaching {
                wanted: total,
                got: 0,
                events: tx.clone(),
            },
        );
    // However this ends, the cookie opens no more streams.
    struct Unregister<'a>(&'a Context, Cookie);
    impl Drop for Unregister<'_> {
        fn drop(&mut self) {
            self.0
                .attaching
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.1);
        }
    }
    let _unregister = Unregister(ctx, cookie);
    control::send_state(&mut &*stream, State::CreateStreams)?;
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let mut sockets = Vec::with_capacity(total);
    while sockets.len() < total {
        match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Event::Attached(s)) => sockets.push(s),
            Ok(Event::Control(h)) => return Err(unexpected(h, "while opening the streams")),
            Ok(Event::Ended(_)) => {}
            Err(_) => {
                return Err(Failure::attach_timeout(Error::Timeout(format!(
                    "only {} of {total} data connections arrived within {} s",
                    sockets.len(),
                    ATTACH_TIMEOUT.as_secs()
                ))))
            }
        }
    }
    Ok(sockets)
}

/// Waits for this client's turn on the UDP port, announces
/// `CREATE_STREAMS` and collects the UDP streams.
fn open_udp(
    stream: &TcpStream,
    params: &Params,
    total: usize,
    ctx: &Arc<Context>,
    events: &Receiver<Event>,
) -> std::result::Result<Vec<UdpSocket>, Failure> {
    let peer = stream
        .peer_addr()
        .map_err(|e| Error::io("iperf3 control", e))?;
    let local = stream
        .local_addr()
        .map_err(|e| Error::io("iperf3 control", e))?;
    let expected = ctx
        .udp
        .expect(udp::canonical(peer.ip()), local_ip(local), total)
        .map_err(|why| Failure::silent(Error::Timeout(why)))?;
    control::send_state(&mut &*stream, State::CreateStreams)?;
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let mut sockets = Vec::with_capacity(total);
    while sockets.len() < total {
        if Instant::now() >= deadline {
            return Err(Failure::attach_timeout(Error::Timeout(format!(
                "only {} of {total} UDP streams connected within {} s",
                sockets.len(),
                ATTACH_TIMEOUT.as_secs()
            ))));
        }
        match expected.streams.recv_timeout(Duration::from_millis(50)) {
            Ok(s) => sockets.push(s),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Failure::silent(Error::PeerAborted(
                    "UDP port closed".into(),
                )))
            }
        }
        if let Ok(Event::Control(h)) = events.try_recv() {
            return Err(unexpected(h, "while opening the UDP streams"));
        }
    }
    let _ = params;
    Ok(sockets)
}

/// The address a stream socket answers from: the one the client reached
/// (IPv4-mapped addresses as IPv4, for an IPv4 socket).
fn local_ip(local: SocketAddr) -> IpAddr {
    udp::canonical(local.ip())
}

/// Sets the test's options on every data socket; returns the congestion
/// control in use (for the results).
fn configure(
    sockets: &Sockets,
    params: &Params,
    shape: &crate::messages::SessionRequest,
    default_cc: &str,
) -> std::result::Result<Option<String>, Failure> {
    match sockets {
        Sockets::Tcp(socks) => {
            let mut cc_warned = false;
            for (i, s) in socks.iter().enumerate() {
                let sends = session::role(shape, Side::Server, i as u32) == Role::Send;
                if let Some(w) = configure_tcp(s, params, sends, default_cc)? {
                    if !cc_warned {
                        log(format!("iperf3 test: {w}"));
                        cc_warned = true;
                    }
                }
            }
            Ok(socks.first().and_then(sockopt::get_cc))
        }
        Sockets::Udp(socks) => {
            for s in socks {
                let set = udp::set_buffers(s, params.window).and_then(|_| {
                    if params.dont_fragment && s.local_addr()?.is_ipv4() {
                        udp::set_dont_fragment(s)?;
                    }
                    Ok(())
                });
                set.map_err(|e| Error::io("configuring a UDP stream", e))?;
                if params.tos > 0 {
                    let v6 = s.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
                    sockopt::set_tos(s, v6, params.tos as u8)?;
                }
            }
            Ok(None)
        }
    }
}

/// One TCP data socket: window, congestion control (a warning, as iperf3
/// gives, if ours lacks the client's, and then `default_cc`), MSS,
/// no-delay, TOS, pacing.
fn configure_tcp(
    s: &TcpStream,
    p: &Params,
    sends: bool,
    default_cc: &str,
) -> Result<Option<String>> {
    let mut warning = None;
    if p.window > 0 {
        warning = sockopt::set_buffers(s, p.window)?;
    }
    // The listener started the socket as NEUTRAL_CC: the client's -C, or
    // the machine's default when it names none or one this host lacks.
    let asked = p.congestion.as_deref();
    if let Err(e) = sockopt::set_cc(s, asked.unwrap_or(default_cc)) {
        let Some(cc) = asked else { return Err(e) };
        warning = Some(format!("congestion control {cc} not used: {e}"));
        sockopt::set_cc(s, default_cc)?;
    }
    if p.mss > 0 {
        sockopt::set_mss(s, p.mss as u32)?;
    }
    if p.nodelay {
        s.set_nodelay(true)
            .map_err(|e| Error::io("setting TCP_NODELAY", e))?;
    }
    if p.tos > 0 {
        let v6 = s.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
        sockopt::set_tos(s, v6, p.tos as u8)?;
    }
    let pace = match (p.fqrate, p.bandwidth) {
        (0, 0) => 0,
        (0, b) => b,
        (f, _) => f,
    };
    if sends && pace > 0 {
        sockopt::set_max_pacing_rate(s, (pace / 8).max(1))?;
    }
    session::set_data_timeouts(s)?;
    Ok(warning)
}

/// The client's control events that end a test early, as a failure.
fn unexpected(h: Heard, when: &str) -> Failure {
    match h {
        Heard::State(State::ClientTerminate) => Failure::silent(Error::PeerAborted(format!(
            "the client terminated the test {when}"
        ))),
        Heard::Closed => Failure::silent(Error::PeerAborted(format!(
            "the client closed the control connection {when}"
        ))),
        Heard::Failed(e) => Failure::silent(Error::PeerAborted(format!(
            "the control connection failed {when}: {e}"
        ))),
        Heard::State(s) => Failure::tell(
            ErrorCode::Message,
            Error::Protocol(format!("unexpected iperf3 state {s:?} {when}")),
        ),
        Heard::Unknown(b) => Failure::tell(
            ErrorCode::Message,
            Error::Protocol(format!("unknown iperf3 state byte {b} {when}")),
        ),
        Heard::ServerError(c) => Failure::tell(
            ErrorCode::Message,
            Error::Protocol(format!(
                "a client sent SERVER_ERROR ({}) {when}",
                c.number()
            )),
        ),
        Heard::Json(_) => Failure::tell(
            ErrorCode::Message,
            Error::Protocol(format!("a JSON block {when}")),
        ),
    }
}

/// The running test until the client's `TEST_END`; returns when it came.
/// Fails on a client that leaves, a stream that fails or stalls, the
/// server's duration or rate limit, or a client that lets its `-t` pass
/// without ending the test.
fn run_until_test_end(
    test: &TestStreams,
    params: &Params,
    start: Instant,
    limits: &ServerLimits,
    events: &Receiver<Event>,
) -> std::result::Result<Instant, Failure> {
    let omit_end = (params.omit > 0).then(|| start + Duration::from_secs(params.omit));
    let mut omitted = false;
    // A timed test must end within its time plus the shutdown grace; any
    // test within the server's longest plus [`SEND_GRACE`] (the client's
    // clock starts a round trip before ours: a `-t` of exactly the
    // server's longest must not be cut off at its last instant).
    let limit_end = start + limits.max_duration + SEND_GRACE;
    let mut hard_end = limit_end;
    if params.time > 0 && params.byte_limit().is_none() {
        hard_end =
            hard_end.min(start + Duration::from_secs(params.time + params.omit) + SHUTDOWN_TIMEOUT);
    }
    let mut progress = (test.progress(), start);
    let mut rate = RateWindow::new(start);
    let mut next_check = start + WATCHDOG_PERIOD;
    loop {
        let now = Instant::now();
        let mut wake = next_check.min(hard_end);
        if let (Some(t), false) = (omit_end, omitted) {
            wake = wake.min(t);
        }
        match events.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(Event::Control(Heard::State(State::TestEnd))) => return Ok(Instant::now()),
            Ok(Event::Control(h)) => return Err(unexpected(h, "during the test")),
            Ok(Event::Ended(StreamEnd {
                index,
                result: Err(e),
            })) => {
                let code = match test.role(index as usize) {
                    Role::Send => ErrorCode::StreamWrite,
                    Role::Receive => ErrorCode::StreamRead,
                };
                return Err(Failure::tell(code, e));
            }
            Ok(Event::Ended(_)) | Ok(Event::Attached(_)) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Failure::silent(Error::PeerAborted(
                    "the test's channel closed".into(),
                )))
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if let (Some(t), false) = (omit_end, omitted) {
            if now >= t {
                test.end_omitted();
                omitted = true;
            }
        }
        if now >= hard_end {
            let code = if now >= limit_end {
                ErrorCode::Duration
            } else {
                ErrorCode::NoMessage
            };
            return Err(Failure::tell(
                code,
                Error::Timeout(format!(
                    "the test ran {} s without the client's TEST_END (its -t is {} s, this server allows {} s)",
                    now.duration_since(start).as_secs(),
                    params.time,
                    limits.max_duration.as_secs()
                )),
            ));
        }
        if now >= next_check {
            next_check = now + WATCHDOG_PERIOD;
            let p = test.progress();
            if p != progress.0 {
                progress = (p, now);
            } else if now.duration_since(progress.1) >= DATA_IDLE_TIMEOUT {
                return Err(Failure::tell(
                    ErrorCode::NoMessage,
                    Error::Timeout(format!(
                        "no data moved for {} s (the data idle timeout)",
                        DATA_IDLE_TIMEOUT.as_secs()
                    )),
                ));
            }
            let moved = test.total(Role::Send) + test.total(Role::Receive);
            if let Some(bps) = rate.add(now, moved) {
                if limits.max_rate_bps > 0 && bps > limits.max_rate_bps as f64 {
                    return Err(Failure::tell(
                        ErrorCode::TotalRate,
                        Error::Refused(format!(
                            "the test moved {} over {} s; this server allows {}",
                            format_bps(bps),
                            RATE_WINDOW.as_secs(),
                            format_bps(limits.max_rate_bps as f64)
                        )),
                    ));
                }
            }
        }
    }
}

/// Tells the client why its running test ends while the test's data
/// connections are still open (they close when the test is dropped), and
/// waits up to [`TELL_GRACE`] for the client to read it and leave. A
/// client writing as fast as it can would otherwise find its data
/// connection closed ("Broken pipe") before it reads the reason.
fn tell_while_running(stream: &TcpStream, mut f: Failure, events: &Receiver<Event>) -> Failure {
    if let Some(code) = f.tell.take() {
        control::send_server_error(&mut &*stream, code);
        let deadline = Instant::now() + TELL_GRACE;
        while let Ok(event) =
            events.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if matches!(event, Event::Control(Heard::Closed | Heard::Failed(_))) {
                break;
            }
        }
    }
    f
}

/// The average rate over the last [`RATE_WINDOW`], once a whole window
/// has passed.
struct RateWindow {
    samples: std::collections::VecDeque<(Instant, u64)>,
}

impl RateWindow {
    fn new(start: Instant) -> RateWindow {
        RateWindow {
            samples: std::collections::VecDeque::from([(start, 0)]),
        }
    }

    /// Adds a sample of the bytes moved so far; the window's rate in
    /// bits/s, if the window is full.
    fn add(&mut self, now: Instant, total: u64) -> Option<f64> {
        self.samples.push_back((now, total));
        while self
            .samples
            .get(1)
            .is_some_and(|(t, _)| now.duration_since(*t) >= RATE_WINDOW)
        {
            self.samples.pop_front();
        }
        let (t0, b0) = *self.samples.front()?;
        let span = now.duration_since(t0);
        (span >= RATE_WINDOW).then(|| (total - b0) as f64 * 8.0 / span.as_secs_f64())
    }
}

/// The client's results block, checked: every stream it names is one of
/// ours.
fn client_results(events: &Receiver<Event>, total: usize) -> std::result::Result<Results, Failure> {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(wait) {
            Ok(Event::Control(Heard::Json(Ok(v)))) => {
                let r = Results::from_json(&v)
                    .map_err(|why| Failure::tell(ErrorCode::RecvResults, Error::Protocol(why)))?;
                if let Some(bad) = r
                    .streams
                    .iter()
                    .find(|s| stream_index(s.id as u64).is_none_or(|i| i as usize >= total))
                {
                    return Err(Failure::tell(
                        ErrorCode::StreamId,
                        Error::Protocol(format!("the client's results name stream id {}", bad.id)),
                    ));
                }
                return Ok(r);
            }
            Ok(Event::Control(Heard::Json(Err(why)))) => {
                return Err(Failure::tell(
                    ErrorCode::RecvResults,
                    Error::Protocol(format!("the client's results: {why}")),
                ))
            }
            Ok(Event::Control(h)) => return Err(unexpected(h, "instead of its results")),
            Ok(_) => {}
            Err(_) => {
                return Err(Failure::silent(Error::Timeout(format!(
                    "the client sent no results within {} s",
                    SHUTDOWN_TIMEOUT.as_secs()
                ))))
            }
        }
    }
}

/// Lets the receiving streams take in what the client says it sent (see
/// [`DRAIN_QUIET`]).
///
/// Returns when the last of those bytes was seen arriving (to 5 ms), or
/// None when nothing arrived after the test's end (when the receiving
/// streams had counted `at_end` bytes).
fn drain(test: &TestStreams, theirs: &Results, at_end: u64) -> Option<Instant> {
    let want: Vec<(usize, u64)> = (0..test.len())
        .filter(|&i| test.role(i) == Role::Receive)
        .filter_map(|i| theirs.stream(i as u32).map(|s| (i, s.bytes)))
        .collect();
    let started = Instant::now();
    let mut last = (test.total(Role::Receive), Instant::now());
    let mut arrived = (last.0 != at_end).then_some(last.1);
    while started.elapsed() < DRAIN_MAX {
        if want.iter().all(|&(i, b)| test.counted_bytes(i) >= b) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        let now = test.total(Role::Receive);
        if now != last.0 {
            last = (now, Instant::now());
            arrived = Some(last.1);
        } else if last.1.elapsed() >= DRAIN_QUIET {
            break;
        }
    }
    arrived
}

/// Waits (bounded) for the client's `IPERF_DONE` or its close. Whatever
/// the client says after its results is the last the control reader hands
/// on (it ends then), so any word ends the wait: junk after the results
/// is not waited out for the whole timeout.
fn wait_for_done(events: &Receiver<Event>) {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    while let Ok(e) = events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Event::Control(_) = e {
            return;
        }
    }
}

/// The log's line about a finished test.
fn summary(test: &TestStreams, params: &Params, counted: TestSeconds) -> String {
    let part = |role: Role, what: &str| {
        let secs = match role {
            Role::Send => counted.sending,
            Role::Receive => counted.receiving,
        }
        .max(1e-9);
        let b: u64 = (0..test.len())
            .filter(|&i| test.role(i) == role)
            .map(|i| test.counted_bytes(i))
            .sum();
        (b > 0 || (0..test.len()).any(|i| test.role(i) == role)).then(|| {
            format!(
                "{what} {} ({})",
                format_bytes(b),
                format_bps(b as f64 * 8.0 / secs)
            )
        })
    };
    let moved: Vec<String> = [part(Role::Receive, "received"), part(Role::Send, "sent")]
        .into_iter()
        .flatten()
        .collect();
    format!(
        "{}, {} streams, {} in {:.2} s",
        match params.transport {
            Transport::Udp => "udp",
            _ => "tcp",
        },
        test.len(),
        moved.join(", "),
        counted.overall()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{stream_id, StreamResult};

    #[test]
    fn a_test_s_sockets_run_its_congestion_control_or_the_machine_s() {
        let (listener, default, other) = sockopt::neutral::listener();
        // (-C, the socket's algorithm, whether the test is warned)
        for (asked, runs, warned) in [
            (None, default.as_str(), false),
            (Some(other), other, false),
            (Some("no-such-cc"), default.as_str(), true),
        ] {
            let (_client, accepted) = sockopt::neutral::accept(&listener);
            let params = Params {
                congestion: asked.map(str::to_string),
                ..Params::default()
            };
            let warning = configure_tcp(&accepted, &params, true, &default).unwrap();
            assert_eq!(
                sockopt::get_cc(&accepted).as_deref(),
                Some(runs),
                "{asked:?}"
            );
            assert_eq!(warning.is_some(), warned, "{asked:?}: {warning:?}");
        }
    }

    #[test]
    fn the_rate_window_averages_a_whole_window() {
        let t0 = Instant::now();
        let mut w = RateWindow::new(t0);
        assert_eq!(w.add(t0 + Duration::from_secs(1), 1_000_000), None);
        let r = w.add(t0 + Duration::from_secs(5), 5_000_000).unwrap();
        assert!((r - 8_000_000.0).abs() < 1.0, "{r}");
        // Old samples leave the window: only the last 5 s count.
        let r = w.add(t0 + Duration::from_secs(10), 5_000_000).unwrap();
        assert!(r < 1.0, "{r}");
    }

    fn read_state(s: &TcpStream) -> State {
        let mut b = [0u8; 1];
        std::io::Read::read_exact(&mut &*s, &mut b).unwrap();
        State::from_byte(b[0]).unwrap()
    }

    /// A reverse test (`iperf3 -c -R -t time -b 8M`) step by step, up to
    /// the server's DISPLAY_RESULTS: reads the data for `read_for`, then
    /// says TEST_END and exchanges results. Returns the control connection,
    /// and the bytes that arrived in all and after `late_from`.
    fn reverse_test_to_display_results(
        time: u64,
        read_for: Duration,
        late_from: Duration,
    ) -> (TcpStream, u64, u64) {
        let params = Params {
            time,
            reverse: true,
            bandwidth: 8_000_000,
            ..Params::default()
        };
        let server =
            Iperf3Server::bind(Iperf3Options::new("127.0.0.1:0"), Arc::new(Registry::new()))
                .unwrap();
        let addr = server.local_addr();
        server.spawn().unwrap();
        let ctrl = TcpStream::connect(addr).unwrap();
        ctrl.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let cookie = Cookie::random();
        (&ctrl).write_all(&cookie.to_wire()).unwrap();
        assert_eq!(read_state(&ctrl), State::ParamExchange);
        control::send_json(&mut &ctrl, &params.to_json()).unwrap();
        assert_eq!(read_state(&ctrl), State::CreateStreams);
        let data = TcpStream::connect(addr).unwrap();
        (&data).write_all(&cookie.to_wire()).unwrap();
        assert_eq!(read_state(&ctrl), State::TestStart);
        assert_eq!(read_state(&ctrl), State::TestRunning);
        data.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let start = Instant::now();
        let (mut total, mut late) = (0u64, 0u64);
        let mut buf = vec![0u8; 1 << 16];
        while start.elapsed() < read_for {
            match std::io::Read::read(&mut &data, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    if start.elapsed() >= late_from {
                        late += n as u64;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("reading the data: {e}"),
            }
        }
        // The client ends the test; the results are exchanged as usual.
        control::send_state(&mut &ctrl, State::TestEnd).unwrap();
        assert_eq!(read_state(&ctrl), State::ExchangeResults);
        let ours = Results {
            sender_has_retransmits: -1,
            streams: vec![StreamResult {
                id: stream_id(0),
                bytes: total,
                end_time: start.elapsed().as_secs_f64(),
                ..Default::default()
            }],
            ..Results::default()
        };
        control::send_json(&mut &ctrl, &ours.to_json()).unwrap();
        let theirs = wire::read_json(&mut &ctrl, control::MAX_RESULTS_LEN).unwrap();
        let theirs = Results::from_json(&theirs).unwrap();
        assert!(theirs.streams[0].bytes >= total, "{theirs:?}");
        assert_eq!(read_state(&ctrl), State::DisplayResults);
        (ctrl, total, late)
    }

    #[test]
    fn a_reverse_test_of_time_0_sends_until_the_client_ends_it() {
        // -t 0: past the server's SEND_GRACE (5 s), data still arrives.
        let (ctrl, total, late) = reverse_test_to_display_results(
            0,
            Duration::from_secs(7),
            SEND_GRACE + Duration::from_secs(1),
        );
        assert!(late > 0, "nothing arrived after 6 s ({total} bytes before)");
        control::send_state(&mut &ctrl, State::IperfDone).unwrap();
        // The test is over: the server closes the control connection.
        assert_eq!(std::io::Read::read(&mut &ctrl, &mut [0u8; 16]).unwrap(), 0);
    }

    #[test]
    fn junk_after_the_results_ends_the_test_at_once() {
        let (ctrl, total, _) =
            reverse_test_to_display_results(1, Duration::from_secs(1), Duration::ZERO);
        assert!(total > 0);
        // No IPERF_DONE: a byte that is no iperf3 state, and then nothing.
        let said = Instant::now();
        (&ctrl).write_all(&[0x7f]).unwrap();
        assert_eq!(std::io::Read::read(&mut &ctrl, &mut [0u8; 16]).unwrap(), 0);
        assert!(
            said.elapsed() < Duration::from_secs(5),
            "the server waited {:?} after the junk",
            said.elapsed()
        );
    }

    #[test]
    fn a_source_s_default_pending_connections_cover_its_tests() {
        assert_eq!(default_pending_per_source(4), 8);
        assert_eq!(default_pending_per_source(32), 32);
        assert_eq!(default_pending_per_source(1024), HANDSHAKING_CAPACITY);
    }

    #[test]
    fn a_source_s_default_share_is_a_quarter_of_the_slots() {
        assert_eq!(default_tests_per_source(DEFAULT_MAX_TESTS), 4);
        assert_eq!(default_tests_per_source(2), 1);
        assert_eq!(default_tests_per_source(1024), 256);
    }
}
