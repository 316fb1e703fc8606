//! `longhaul send --protocol iperf3`: longhaul as an iperf3 client against
//! any iperf3 server (a perfSONAR node, a public server, `iperf3 -s`, or
//! `longhaul serve --iperf3-listen`), memory to memory over TCP, or UDP
//! (`--udp`, paced at `--rate`, as `iperf3 -u -b`).
//!
//! It speaks as iperf3 3.12 does: cookie, parameters, data connections
//! one after the other (a bidirectional test's client-to-server streams
//! first), `TEST_END` when the time is up or the bytes are sent (or, when
//! receiving, arrived), results exchanged, `IPERF_DONE`. The streams are
//! the engine's, with their TCP_INFO; the final report is longhaul's
//! (DESIGN.md's fields) plus both results blocks under `iperf3`, so the
//! server's own figures are in the JSON. Each stream's `bytes` is what its
//! receiver counted: the server's figure for streams we send, ours for
//! streams we receive.

use std::io::Read;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::connection;
use crate::cpu::CpuSnapshot;
use crate::datapath::ModeReport;
use crate::error::{Error, Result};
use crate::limits::{DEFAULT_SECONDS, HANDSHAKE_TIMEOUT, SHUTDOWN_TIMEOUT};
use crate::memory_plane::MemoryPlane;
use crate::messages::{CpuReport, Direction, Mode, Role, SessionRequest};
use crate::send_report::{FinalReport, Measured, StreamResult as ReportStream};
use crate::sending::{check_start_at, sleep_until, Amount, Live, Watch};
use crate::session::{self, Side};
use crate::sockopt;

use super::control::{self, Heard};
use super::params::{Params, Transport, MAX_PARALLEL};
use super::results::Results;
use super::streams::{CpuUse, Plan, Sockets, StreamEnd, TestSeconds, TestStreams};
use super::udp;
use super::wire::{Cookie, ErrorCode, State};

/// How often TCP_INFO is sampled when nobody watches.
const DEFAULT_SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// After `TEST_END`, our receiving streams wait this long at most for the
/// server to close them (an iperf3 server closes its streams at once).
const DRAIN_MAX: Duration = Duration::from_secs(10);

/// ... or until our receiving streams moved nothing for this long.
const DRAIN_QUIET: Duration = Duration::from_millis(500);

/// How often the drain looks at the counters.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// What an iperf3 test sends where, memory to memory: the server, when to
/// connect, and the test as longhaul's own session request (streams,
/// direction, buffer, congestion control, rate, time or bytes, campaign and
/// run), which the engine's `SendOptions::iperf3_test` makes from
/// `longhaul send --protocol iperf3`'s flags.
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// `HOST:PORT` of the iperf3 server.
    pub to: String,
    /// `--start-at`: connect at this instant.
    pub start_at: Option<SystemTime>,
    pub request: SessionRequest,
}

impl TestOptions {
    /// How much each stream moves: `--bytes`, or else `--time`.
    fn amount(&self) -> Amount {
        match (self.request.bytes, self.request.seconds) {
            (Some(b), _) => Amount::Bytes(b),
            (None, s) => Amount::Seconds(s.unwrap_or(DEFAULT_SECONDS)),
        }
    }
}

enum Event {
    Control(Heard),
    Ended(StreamEnd),
}

/// The engine's error for an iperf3 server's refusal.
fn refusal(code: ErrorCode) -> Error {
    let text = format!("the iperf3 server says: {}", code.text());
    match code {
        ErrorCode::AuthTest => Error::Auth(text),
        ErrorCode::AccessDenied => Error::Busy(text),
        _ => Error::Refused(text),
    }
}

/// Checks that the options make an iperf3 test over `transport`.
fn check(opts: &TestOptions, transport: Transport) -> Result<u64> {
    if opts.request.streams == 0 || opts.request.streams > MAX_PARALLEL {
        return Err(Error::Usage(format!(
            "--protocol iperf3 allows 1 to {MAX_PARALLEL} streams (iperf3's limit), got {}",
            opts.request.streams
        )));
    }
    if let Some(cc) = &opts.request.cc {
        sockopt::check_cc(cc)?;
    }
    match transport {
        Transport::Tcp => {}
        Transport::Udp if opts.request.rate_bps.is_some() => {}
        Transport::Udp => {
            return Err(Error::Usage(
                "an iperf3 UDP test needs a rate (--rate): UDP has no congestion control".into(),
            ))
        }
        Transport::Sctp => {
            return Err(Error::Usage("iperf3's SCTP tests are not supported".into()))
        }
    }
    Ok(match opts.amount() {
        Amount::Bytes(b) => b,
        Amount::Seconds(_) => 0,
    })
}

/// The parameter block of these options over `transport`.
fn params(opts: &TestOptions, transport: Transport) -> Params {
    let (time, bytes) = match opts.amount() {
        Amount::Bytes(b) => (0, b),
        Amount::Seconds(s) => (s.ceil().max(1.0) as u64, 0),
    };
    let mut p = Params {
        transport,
        time,
        bytes,
        parallel: opts.request.streams,
        reverse: opts.request.direction == Direction::Receive,
        bidirectional: opts.request.direction == Direction::Bidir,
        window: opts.request.buffer,
        bandwidth: opts
            .request
            .rate_bps
            .map_or(0, |r| (r / opts.request.streams as u64).max(1)),
        congestion: opts.request.cc.clone(),
        extra_data: Params::extra_data_of(
            opts.request.campaign.as_deref(),
            opts.request.run.as_deref(),
        ),
        ..Params::default()
    };
    p.len = p.block();
    p
}

/// Reads a state byte before the reader thread runs; iperf3's refusals
/// become errors.
fn read_state(ctrl: &TcpStream) -> Result<State> {
    let mut b = [0u8; 1];
    (&*ctrl)
        .read_exact(&mut b)
        .map_err(|e| Error::io("reading the iperf3 server's state", e))?;
    match State::from_byte(b[0]) {
        Some(State::AccessDenied) => Err(refusal(ErrorCode::AccessDenied)),
        Some(State::ServerError) => {
            let mut codes = [0u8; 8];
            (&*ctrl)
                .read_exact(&mut codes)
                .map_err(|e| Error::io("reading the iperf3 server's error", e))?;
            let code = i32::from_be_bytes([codes[0], codes[1], codes[2], codes[3]]);
            Err(refusal(ErrorCode::from_number(code)))
        }
        Some(s) => Ok(s),
        None => Err(Error::Protocol(format!(
            "the iperf3 server sent state byte {}",
            b[0]
        ))),
    }
}

/// Connects the test's data streams one after the other, as iperf3 does
/// (the server tells their roles apart by arrival order).
fn connect_streams(
    addr: SocketAddr,
    cookie: Cookie,
    opts: &TestOptions,
    total: u32,
) -> Result<Vec<TcpStream>> {
    use std::io::Write;
    let mut warned = false;
    (0..total)
        .map(|_| {
            let (mut s, w) = connection::connect_prepared(addr, |s| {
                let w = sockopt::set_buffers(&s, opts.request.buffer)?;
                if let Some(cc) = &opts.request.cc {
                    sockopt::set_cc(&s, cc)?;
                }
                Ok(w)
            })?;
            if let (Some(w), false) = (w, warned) {
                eprintln!("longhaul: {w}");
                warned = true;
            }
            session::set_data_timeouts(&s)?;
            s.write_all(&cookie.to_wire())
                .map_err(|e| Error::io("opening an iperf3 data connection", e))?;
            Ok(s)
        })
        .collect()
}

/// What an iperf3 server's event means for a running test.
fn server_event(h: Heard, when: &str) -> Error {
    match h {
        Heard::ServerError(code) => refusal(code),
        Heard::State(State::AccessDenied) => refusal(ErrorCode::AccessDenied),
        Heard::State(State::ServerTerminate) => {
            Error::PeerAborted(format!("the iperf3 server terminated the test {when}"))
        }
        Heard::Closed => Error::PeerAborted(format!(
            "the iperf3 server closed the control connection {when}"
        )),
        Heard::Failed(e) => {
            Error::PeerAborted(format!("the control connection failed {when}: {e}"))
        }
        Heard::State(s) => Error::Protocol(format!("unexpected iperf3 state {s:?} {when}")),
        Heard::Unknown(b) => Error::Protocol(format!("unknown iperf3 state byte {b} {when}")),
        Heard::Json(Err(e)) => Error::Protocol(format!("the server's results: {e}")),
        Heard::Json(Ok(_)) => Error::Protocol(format!("an unexpected JSON block {when}")),
    }
}

/// Opens the test's UDP streams one after the other, as iperf3 does.
fn connect_udp_streams(addr: SocketAddr, opts: &TestOptions, total: u32) -> Result<Vec<UdpSocket>> {
    (0..total)
        .map(|_| {
            udp::connect_stream(addr, opts.request.buffer, HANDSHAKE_TIMEOUT)
                .map_err(|e| Error::io("opening an iperf3 UDP stream", e))
        })
        .collect()
}

/// A test's control connection after the parameter exchange, with its
/// streams connected.
struct Connected {
    ctrl: TcpStream,
    cookie: Cookie,
    addr: SocketAddr,
    shape: SessionRequest,
    sockets: Sockets,
}

/// Connects to the server at `opts.to`, sends our cookie and parameters,
/// and connects the test's streams when the server asks for them.
fn connect(opts: &TestOptions, transport: Transport, p: &Params) -> Result<Connected> {
    let addr = connection::resolve(&opts.to)?;
    // iperf3's server starts the test as soon as the streams are attached,
    // so `--start-at` is when we connect: a round trip or two before the
    // data flows.
    check_start_at(opts.start_at)?;
    if let Some(at) = opts.start_at {
        sleep_until(at);
    }
    let ctrl = connection::connect(addr)?;
    let cookie = Cookie::random();
    ctrl.set_nodelay(true)
        .and_then(|_| ctrl.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|_| ctrl.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(|e| Error::io("iperf3 control connection", e))?;
    {
        use std::io::Write;
        (&ctrl)
            .write_all(&cookie.to_wire())
            .map_err(|e| Error::io("sending the iperf3 cookie", e))?;
    }
    match read_state(&ctrl)? {
        State::ParamExchange => control::send_json(&mut &ctrl, &p.to_json())?,
        s => {
            return Err(Error::Protocol(format!(
                "expected PARAM_EXCHANGE, got {s:?}"
            )))
        }
    }
    match read_state(&ctrl)? {
        State::CreateStreams => {}
        s => {
            return Err(Error::Protocol(format!(
                "expected CREATE_STREAMS, got {s:?}"
            )))
        }
    }
    let shape = p.shape();
    let total = session::total_streams(&shape);
    let sockets = match transport {
        Transport::Udp => Sockets::Udp(connect_udp_streams(addr, opts, total)?),
        _ => Sockets::Tcp(connect_streams(addr, cookie, opts, total)?),
    };
    Ok(Connected {
        ctrl,
        cookie,
        addr,
        shape,
        sockets,
    })
}

/// Runs an iperf3 test over `transport` (TCP or UDP) against the server
/// at `opts.to` and returns longhaul's final report; `watch`, if any,
/// follows the data phase.
pub fn run_client(
    opts: &TestOptions,
    transport: Transport,
    watch: Option<Watch<'_>>,
) -> Result<FinalReport> {
    let byte_limit = check(opts, transport)?;
    let p = params(opts, transport);
    let Connected {
        ctrl,
        cookie,
        addr,
        shape,
        sockets,
    } = connect(opts, transport, &p)?;
    let mut w = &ctrl;
    let (tx, events) = mpsc::channel();
    ctrl.set_read_timeout(None)
        .map_err(|e| Error::io("iperf3 control connection", e))?;
    let reader = ctrl
        .try_clone()
        .map_err(|e| Error::io("iperf3 control connection", e))?;
    let heard = tx.clone();
    control::spawn_reader(
        reader,
        State::ExchangeResults,
        Arc::new(move |h| {
            let _ = heard.send(Event::Control(h));
        }),
    )?;
    let plan = Plan {
        shape: shape.clone(),
        side: Side::Client,
        send_for: match opts.amount() {
            Amount::Seconds(s) => Duration::from_secs_f64(s),
            Amount::Bytes(_) => Duration::from_secs(p.time),
        },
        stream_rate_bps: p.bandwidth,
        block: p.block() as usize,
        wide: false,
    };
    wait_for(&events, State::TestStart, "before the test")?;
    let plane = MemoryPlane::from_env()?;
    let ended = tx.clone();
    let test = TestStreams::prepare(
        &plan,
        sockets,
        &plane,
        Arc::new(move |end| {
            let _ = ended.send(Event::Ended(end));
        }),
    )?;
    wait_for(&events, State::TestRunning, "before the test")?;
    let start = test.go()?;
    let started = std::time::SystemTime::now();
    let cpu_start = CpuSnapshot::now();
    run_test(&test, &plan, byte_limit, start, &events, watch)?;
    let stopped = test.stop_sending(SHUTDOWN_TIMEOUT);
    let seconds = start.elapsed().as_secs_f64();
    let received_at_end = test.total(Role::Receive);
    let cpu_report = cpu_start.report_until(&CpuSnapshot::now());
    if !stopped {
        return Err(Error::Timeout(
            "our sending streams did not stop at the end of the test".into(),
        ));
    }
    // Datagrams after the end do not count (iperf3's receivers stop too).
    test.stop_counting();
    control::send_state(&mut w, State::TestEnd)?;
    test.take_what_arrives();
    wait_for(&events, State::ExchangeResults, "after TEST_END")?;
    let counted = TestSeconds::new(
        seconds,
        start,
        p.omit,
        drain(&test, &events, received_at_end),
    );
    let congestion_used = test.tcp.first().and_then(|s| sockopt::get_cc(&*s.socket));
    let ours = test.results(
        counted,
        CpuUse::from_report(&cpu_report, seconds),
        congestion_used,
    );
    control::send_json(&mut w, &ours.to_json())?;
    let theirs = server_results(&events)?;
    wait_for(&events, State::DisplayResults, "after the results")?;
    test.abort();
    let _ = control::send_state(&mut w, State::IperfDone);
    let _ = ctrl.shutdown(std::net::Shutdown::Both);
    Ok(report(
        opts,
        &Ended {
            test: &test,
            ours: &ours,
            theirs: &theirs,
            cpu: cpu_report,
            counted,
            started,
            cookie,
            addr,
        },
    ))
}

/// Waits for `state` from the server (reader thread), failing on anything
/// that ends the test.
fn wait_for(events: &Receiver<Event>, state: State, when: &str) -> Result<()> {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    loop {
        match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Event::Control(Heard::State(s))) if s == state => return Ok(()),
            Ok(Event::Control(Heard::State(State::TestRunning | State::TestStart))) => {}
            Ok(Event::Control(h)) => return Err(server_event(h, when)),
            Ok(Event::Ended(_)) => {}
            Err(_) => {
                return Err(Error::Timeout(format!(
                    "the iperf3 server did not say {state:?} within {} s",
                    SHUTDOWN_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

/// Runs the data phase until the test is over: the time is up, or the
/// bytes are sent (or, for streams we receive, arrived).
fn run_test(
    test: &TestStreams,
    plan: &Plan,
    byte_limit: u64,
    start: Instant,
    events: &Receiver<Event>,
    mut watch: Option<Watch<'_>>,
) -> Result<()> {
    let every = watch.as_ref().map_or(DEFAULT_SAMPLE_PERIOD, |w| w.every);
    let mut next_tick = start + every;
    let end = (byte_limit == 0).then(|| start + plan.send_for);
    let check = Duration::from_millis(20);
    loop {
        let now = Instant::now();
        let over = match end {
            Some(t) => now >= t,
            None => {
                let sends = (0..test.len()).any(|i| test.role(i) == Role::Send);
                (sends && test.senders_done()) || test.total(Role::Receive) >= byte_limit
            }
        };
        if over {
            return Ok(());
        }
        if now >= next_tick {
            test.sample();
            if let Some(w) = watch.as_mut() {
                (w.tick)(&Live {
                    streams: &test.tcp,
                    elapsed: start.elapsed(),
                    plane: None,
                });
            }
            next_tick = crate::ticks::next_tick(next_tick, every, Instant::now());
        }
        let mut wake = next_tick.min(now + check);
        if let Some(t) = end {
            wake = wake.min(t);
        }
        match events.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(Event::Control(h)) => return Err(server_event(h, "during the test")),
            Ok(Event::Ended(StreamEnd { result: Err(e), .. })) => return Err(e),
            Ok(Event::Ended(_)) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::PeerAborted("the test's channel closed".into()))
            }
        }
    }
}

/// After `EXCHANGE_RESULTS`: lets our receiving streams take in what the
/// server sent before it closed them (bounded). Returns when the last of it
/// arrived, or None when nothing arrived after the test's end (when our
/// receiving streams had counted `at_end` bytes).
fn drain(test: &TestStreams, events: &Receiver<Event>, at_end: u64) -> Option<Instant> {
    let receiving = (0..test.len())
        .filter(|&i| test.role(i) == Role::Receive)
        .count();
    let mut ended = 0;
    let deadline = Instant::now() + DRAIN_MAX;
    // An iperf3 server may keep its streams open until IPERF_DONE: once
    // the server stopped, what it sent has arrived when our counters stop
    // growing.
    let mut last = test.total(Role::Receive);
    let mut quiet_since = Instant::now();
    let mut arrived = (last != at_end).then_some(quiet_since);
    while ended < receiving {
        let now = Instant::now();
        if now >= deadline || now.duration_since(quiet_since) >= DRAIN_QUIET {
            break;
        }
        match events.recv_timeout(DRAIN_POLL.min(deadline.saturating_duration_since(now))) {
            Ok(Event::Ended(e)) if test.role(e.index as usize) == Role::Receive => ended += 1,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        let total = test.total(Role::Receive);
        if total != last {
            last = total;
            quiet_since = Instant::now();
            arrived = Some(quiet_since);
        }
    }
    arrived
}

/// The server's results block (the JSON after `EXCHANGE_RESULTS`).
fn server_results(events: &Receiver<Event>) -> Result<Results> {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    loop {
        match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Event::Control(Heard::Json(Ok(v)))) => {
                return Results::from_json(&v)
                    .map_err(|e| Error::Protocol(format!("the iperf3 server's results: {e}")))
            }
            Ok(Event::Control(h)) => return Err(server_event(h, "instead of its results")),
            Ok(Event::Ended(_)) => {}
            Err(_) => {
                return Err(Error::Timeout(format!(
                    "the iperf3 server sent no results within {} s",
                    SHUTDOWN_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

/// CPU of the server as its results say (process CPU, percent of a core).
fn server_cpu(r: &Results) -> CpuReport {
    CpuReport {
        user_pct: r.cpu_util_user,
        system_pct: r.cpu_util_system,
        ..CpuReport::default()
    }
}

/// What an ended test leaves for its report: its streams, both ends'
/// results, our CPU, the seconds counted, when it started, its cookie and
/// the server's address.
struct Ended<'a> {
    test: &'a TestStreams,
    ours: &'a Results,
    theirs: &'a Results,
    cpu: CpuReport,
    counted: TestSeconds,
    started: std::time::SystemTime,
    cookie: Cookie,
    addr: SocketAddr,
}

/// Longhaul's final report of an iperf3 test.
fn report(opts: &TestOptions, ended: &Ended<'_>) -> FinalReport {
    let &Ended {
        test,
        ours,
        theirs,
        cpu,
        counted,
        started,
        cookie,
        addr,
    } = ended;
    // The test lasted until the last byte arrived at whichever end received
    // it: our receiving streams (counted), the server's (its end_time for
    // the streams we sent, bounded against a server's odd clock).
    let server_receiving = (0..test.len())
        .filter(|&i| test.role(i) == Role::Send)
        .filter_map(|i| theirs.stream(i as u32).map(|s| s.end_time))
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max)
        .min(counted.overall() + DRAIN_MAX.as_secs_f64());
    let seconds = counted.overall().max(server_receiving);
    let (mut sent, mut received) = (0u64, 0u64);
    // TCP streams carry their TCP_INFO; UDP streams (no `tcp` entries)
    // have none, and the server's figures hold their loss and jitter.
    let streams: Vec<ReportStream> = (0..test.len())
        .map(|index| {
            let i = index as u32;
            let server = theirs.stream(i);
            let tcp = test
                .tcp
                .get(index)
                .and_then(|s| s.last_tcp())
                .unwrap_or_default();
            let role = test.role(index);
            let (bytes, retransmits) = match role {
                Role::Send => {
                    let b = server.map_or(0, |r| r.bytes);
                    sent += b;
                    (b, tcp.retransmits)
                }
                Role::Receive => {
                    let b = test.counted_bytes(index);
                    received += b;
                    (b, server.map_or(0, |r| r.retransmits.max(0) as u64))
                }
            };
            ReportStream {
                id: i,
                direction: match role {
                    Role::Send => "send",
                    Role::Receive => "receive",
                },
                bytes,
                retransmits,
                rtt_us: tcp.rtt_us,
                rttvar_us: tcp.rttvar_us,
                cwnd_bytes: tcp.cwnd_bytes,
                pacing_rate_bps: tcp.pacing_rate_bps,
                delivery_rate_bps: tcp.delivery_rate_bps,
            }
        })
        .collect();
    let server_sent: u64 = (0..test.len())
        .filter(|&i| test.role(i) == Role::Receive)
        .filter_map(|i| theirs.stream(i as u32).map(|s| s.bytes))
        .sum();
    let server_received: u64 = (0..test.len())
        .filter(|&i| test.role(i) == Role::Send)
        .filter_map(|i| theirs.stream(i as u32).map(|s| s.bytes))
        .sum();
    let mode_report = ModeReport {
        iperf3: Some(json!({
            "cookie": cookie.as_str(),
            "client": ours.to_json(),
            "server": theirs.to_json(),
            "bytes_sent_here": test.total(Role::Send),
            "bytes_received_here": test.total(Role::Receive),
        })),
        human: format!(
            "\n  iperf3 server {addr}: received {}, sent {}, CPU {:.1}%",
            longhaul_units::format_bytes(server_received),
            longhaul_units::format_bytes(server_sent),
            theirs.cpu_util_total
        ),
        ..ModeReport::default()
    };
    FinalReport::new(Measured {
        mode: Mode::Memory,
        direction: opts.request.direction,
        streams,
        sent,
        received,
        seconds,
        local_cpu: cpu,
        remote_cpu: server_cpu(theirs),
        session: cookie.as_str().to_string(),
        peer: addr.to_string(),
        started,
        requested_seconds: match opts.amount() {
            Amount::Seconds(s) => Some(s),
            Amount::Bytes(_) => None,
        },
        mode_report,
    })
}

#[cfg(test)]
mod tests {
    use super::super::params::{DEFAULT_TCP_BLOCK, DEFAULT_UDP_BLOCK};
    use super::*;

    /// A test of one stream of 1 MiB buffers, client to server.
    fn test_of(amount: Amount) -> TestOptions {
        let (bytes, seconds) = match amount {
            Amount::Bytes(b) => (Some(b), None),
            Amount::Seconds(s) => (None, Some(s)),
        };
        TestOptions {
            to: "h:5201".into(),
            start_at: None,
            request: SessionRequest {
                mode: Mode::Memory,
                direction: Direction::Send,
                streams: 1,
                bytes,
                seconds,
                buffer: 1 << 20,
                cc: None,
                rate_bps: None,
                mode_params: None,
                client_host: None,
                campaign: None,
                run: None,
            },
        }
    }

    #[test]
    fn options_become_iperf3_parameters() {
        let mut o = test_of(Amount::Seconds(2.5));
        o.request.streams = 4;
        o.request.direction = Direction::Bidir;
        o.request.rate_bps = Some(4_000_000_000);
        o.request.cc = Some("cubic".into());
        let p = params(&o, Transport::Tcp);
        assert_eq!((p.time, p.bytes, p.parallel), (3, 0, 4));
        assert!(p.bidirectional && !p.reverse);
        assert_eq!(p.bandwidth, 1_000_000_000);
        assert_eq!(p.window, o.request.buffer);
        let o = test_of(Amount::Bytes(1 << 30));
        let p = params(&o, Transport::Tcp);
        assert_eq!((p.time, p.bytes), (0, 1 << 30));
    }

    #[test]
    fn options_iperf3_cannot_carry_are_usage_errors() {
        let mut o = test_of(Amount::Seconds(1.0));
        o.request.streams = 129;
        assert!(matches!(check(&o, Transport::Tcp), Err(Error::Usage(m)) if m.contains("128")));
    }

    #[test]
    fn udp_tests_are_paced_datagrams() {
        let mut o = test_of(Amount::Seconds(2.0));
        o.request.streams = 2;
        assert!(matches!(check(&o, Transport::Udp), Err(Error::Usage(m)) if m.contains("--rate")));
        o.request.rate_bps = Some(100_000_000);
        assert!(check(&o, Transport::Udp).is_ok());
        let p = params(&o, Transport::Udp);
        assert_eq!(p.transport, Transport::Udp);
        assert_eq!((p.bandwidth, p.len), (50_000_000, DEFAULT_UDP_BLOCK));
        assert_eq!(params(&o, Transport::Tcp).len, DEFAULT_TCP_BLOCK);
    }

    #[test]
    fn refusals_map_to_the_engines_errors() {
        assert!(
            matches!(refusal(ErrorCode::AuthTest), Error::Auth(m) if m.contains("authorization"))
        );
        assert!(matches!(refusal(ErrorCode::AccessDenied), Error::Busy(_)));
        assert!(matches!(refusal(ErrorCode::TotalRate), Error::Refused(_)));
    }
}
