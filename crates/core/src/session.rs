//! What both ends of a session share: the stream layout (which stream
//! carries which direction, how many bytes), the data phase loop (including
//! the client's periodic `StreamsReport`, see [`PeerStreams`]), and the
//! end-of-session checks (both ends agree on every stream's byte count; no
//! stream sat idle that should have moved data).
//!
//! The session starts its streams through [`stream::start`] and learns of
//! each one's end through a callback: how streams are driven (tasks of the
//! process's data workers) is the stream layer's business. The mode's data plane is only
//! seen through [`DataPlane`].

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connection::Connection;
use crate::cpu::CpuSnapshot;
use crate::datapath::{DataPlane, Limit, SendBudget};
use crate::error::{Error, Result};
use crate::limits::{
    DATA_IDLE_TIMEOUT, DATA_SOCKET_TIMEOUT, MAX_BUFFER, MAX_SECONDS, MAX_STREAMS, SHUTDOWN_TIMEOUT,
    WATCHDOG_PERIOD,
};
use crate::messages::{
    Direction, Done, Message, Role, SessionRequest, StreamReport, StreamsReport,
};
use crate::pacer::Pacer;
use crate::sockopt;
use crate::stream::{self, Finished, StreamStats, Work};

/// The other end's view of the streams during the data phase. `longhaul
/// send` has no stats API, so the client reports its sockets (bytes and
/// TCP_INFO) to the server, whose stats API lists them next to its own:
/// both ends of every stream are visible, whichever end sends.
pub enum PeerStreams<'a> {
    /// Client: send our streams to the server every period, until our
    /// `Done` (which carries the final figures).
    Report(Duration),
    /// Server: every report of the client, and finally the streams of its
    /// `Done`, go here.
    Collect(&'a dyn Fn(Vec<StreamReport>)),
}

/// Which end of the session we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// Everything that happens to a session, delivered over one channel so the
/// session thread waits in one place.
pub enum Event {
    /// A message (or failure) from the control connection's reader thread.
    Control(Result<Message>),
    /// A data connection passed its attach check (server only).
    Attached { stream_id: u32, socket: TcpStream },
    /// A stream worker finished.
    Worker { id: u32, result: Result<u64> },
}

/// Number of data connections of a session.
pub fn total_streams(req: &SessionRequest) -> u32 {
    match req.direction {
        Direction::Bidir => req.streams * 2,
        _ => req.streams,
    }
}

/// Whether the client sends on `stream_id`. In bidir sessions streams
/// 0..N carry client -> server and N..2N server -> client.
pub fn client_sends(req: &SessionRequest, stream_id: u32) -> bool {
    match req.direction {
        Direction::Send => true,
        Direction::Receive => false,
        Direction::Bidir => stream_id < req.streams,
    }
}

/// What `side` does on `stream_id`.
pub fn role(req: &SessionRequest, side: Side, stream_id: u32) -> Role {
    match (side, client_sends(req, stream_id)) {
        (Side::Client, true) | (Side::Server, false) => Role::Send,
        _ => Role::Receive,
    }
}

/// Exact bytes of `stream_id` with `--bytes`: the per-direction total split
/// evenly, the remainder going to the first streams.
pub fn stream_bytes(req: &SessionRequest, stream_id: u32) -> Option<u64> {
    let total = req.bytes?;
    let n = req.streams as u64;
    let j = (stream_id % req.streams) as u64;
    Some(total / n + u64::from(j < total % n))
}

/// Checks a request on either end; usage errors name the problem.
pub fn validate(req: &SessionRequest) -> Result<()> {
    if req.streams == 0 || req.streams > MAX_STREAMS {
        return Err(Error::Usage(format!(
            "--streams must be between 1 and {MAX_STREAMS}, got {}",
            req.streams
        )));
    }
    if req.buffer == 0 || req.buffer > MAX_BUFFER {
        return Err(Error::Usage(format!(
            "--buffer must be between 1 and {MAX_BUFFER} bytes, got {}",
            req.buffer
        )));
    }
    match (req.bytes, req.seconds) {
        (Some(_), None) => {}
        (None, Some(s)) if s > 0.0 && s <= MAX_SECONDS => {}
        (None, Some(s)) => {
            return Err(Error::Usage(format!(
                "--time must be more than 0 and at most {} days, got {s} s",
                MAX_SECONDS / 86_400.0
            )))
        }
        _ => {
            return Err(Error::Usage(
                "exactly one of --bytes or --time must be given".into(),
            ))
        }
    }
    if req.rate_bps == Some(0) {
        return Err(Error::Usage("--rate must be more than 0".into()));
    }
    if let Some(cc) = &req.cc {
        sockopt::check_cc(cc)?;
    }
    for (flag, name) in [("--campaign", &req.campaign), ("--run", &req.run)] {
        if let Some(name) = name {
            longhaul_stats_api::check_name(name).map_err(|why| {
                // A stranger's name may be a megabyte: the error (and the
                // log line) quotes its start only.
                let shown: String = name
                    .chars()
                    .take(longhaul_stats_api::MAX_NAME_LEN)
                    .collect();
                Error::Usage(format!("{flag} {shown:?}: {why}"))
            })?;
        }
    }
    Ok(())
}

/// Applies the session's socket options to a data socket: the client's
/// before it connects ([`crate::connection::connect_prepared`]), so the
/// handshake already runs the congestion control and buffers asked for; the
/// server's once accepted. Returns the kernel's warning about capped
/// buffers, if any.
pub fn configure_data_socket(
    sock: &impl AsRawFd,
    req: &SessionRequest,
    sends: bool,
) -> Result<Option<String>> {
    let warning = sockopt::set_buffers(sock, req.buffer)?;
    if let Some(cc) = &req.cc {
        sockopt::set_cc(sock, cc)?;
    }
    if let (Some(rate), true) = (req.rate_bps, sends) {
        let per_stream = (rate / 8 / req.streams as u64).max(1);
        sockopt::set_max_pacing_rate(sock, per_stream)?;
    }
    Ok(warning)
}

/// A data socket the server accepted: the session's options as
/// [`configure_data_socket`] sets them, `cc` (the machine's default, read
/// once per session) when the session names none (the listener started the
/// socket as [`sockopt::NEUTRAL_CC`], [`sockopt::start_accepted_as_neutral`]),
/// and the timeouts.
pub fn configure_accepted_data_socket(
    sock: &TcpStream,
    req: &SessionRequest,
    sends: bool,
    cc: &str,
) -> Result<Option<String>> {
    let warning = configure_data_socket(sock, req, sends)?;
    if req.cc.is_none() {
        sockopt::set_cc(sock, cc)?;
    }
    set_data_timeouts(sock)?;
    Ok(warning)
}

/// The read and write timeouts of a connected data socket.
pub fn set_data_timeouts(sock: &TcpStream) -> Result<()> {
    sock.set_read_timeout(Some(DATA_SOCKET_TIMEOUT))
        .and_then(|_| sock.set_write_timeout(Some(DATA_SOCKET_TIMEOUT)))
        .map_err(|e| Error::io("setting data socket timeouts", e))
}

/// Builds the stats of this end's streams from the attached sockets
/// (indexed by stream id).
pub fn stream_stats(
    req: &SessionRequest,
    side: Side,
    sockets: Vec<TcpStream>,
) -> Vec<Arc<StreamStats>> {
    sockets
        .into_iter()
        .enumerate()
        .map(|(i, s)| Arc::new(StreamStats::new(i as u32, role(req, side, i as u32), s)))
        .collect()
}

/// Both ends' `Done` plus this end's view of the data phase.
#[derive(Debug)]
pub struct PhaseOutcome {
    pub local: Done,
    pub remote: Done,
}

/// One end's data phase: the session it runs, the streams and the mode's
/// data plane it runs them on, the control connection to the peer and the
/// session's event channel (workers' ends, the control reader's messages).
///
/// [`DataPhase::run`] starts every stream, samples TCP_INFO every
/// `tick_every` (calling `tick` with the elapsed time), reports to or
/// collects from the peer its view of the streams (`peer`), sends our `Done`
/// once our workers are finished, waits for the peer's, and checks that both
/// ends agree. On any failure every stream is aborted and the peer is told
/// why.
pub struct DataPhase<'a> {
    pub req: &'a SessionRequest,
    pub plane: &'a dyn DataPlane,
    pub streams: &'a [Arc<StreamStats>],
    pub control: &'a mut Connection,
    pub events: &'a Receiver<Event>,
    pub events_tx: &'a Sender<Event>,
    pub tick_every: Duration,
    pub tick: &'a mut dyn FnMut(&[Arc<StreamStats>], Duration),
    pub peer: PeerStreams<'a>,
}

/// Where a running data phase stands: its clock, what each end has said, and
/// when the next sample, report and give-up are due.
struct Progress {
    start: Instant,
    cpu_start: CpuSnapshot,
    watchdog: Watchdog,
    /// Our streams whose workers have not finished.
    pending: usize,
    local: Option<Done>,
    remote: Option<Done>,
    next_tick: Instant,
    /// The client's reports to the server: when the next is due, how often.
    next_report: Option<(Instant, Duration)>,
    /// Once our workers are done the peer has SHUTDOWN_TIMEOUT to report.
    give_up: Option<Instant>,
}

impl DataPhase<'_> {
    pub fn run(mut self) -> Result<PhaseOutcome> {
        let stop = Arc::new(AtomicBool::new(false));
        let result = self.drive(&stop);
        if let Err(e) = &result {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for s in self.streams {
                s.abort();
            }
            // Harmless if the peer is the one that failed: it is gone already.
            self.control.send_error(e);
        }
        result
    }

    fn drive(&mut self, stop: &Arc<AtomicBool>) -> Result<PhaseOutcome> {
        let mut at = self.start_streams(stop)?;
        while at.local.is_none() || at.remote.is_none() {
            let now = Instant::now();
            if at.give_up.is_some_and(|t| now >= t) {
                return Err(Error::Timeout(
                    "the peer did not report its totals after the data phase".into(),
                ));
            }
            if self.report_if_due(&mut at, now)? {
                continue;
            }
            let mut wake = at.next_tick.min(at.watchdog.next);
            if let (Some((due, _)), None) = (at.next_report, &at.local) {
                wake = wake.min(due);
            }
            match self
                .events
                .recv_timeout(wake.saturating_duration_since(now))
            {
                Ok(event) => self.handle(&mut at, event)?,
                Err(RecvTimeoutError::Timeout) => self.on_time(&mut at)?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::PeerAborted("session channel closed".into()))
                }
            }
        }
        let (local, remote) = (
            at.local.expect("loop ends with both"),
            at.remote.expect("loop ends with both"),
        );
        verify_totals(self.req, &local.streams, &remote.streams)?;
        Ok(PhaseOutcome { local, remote })
    }

    /// Makes every stream's work, then starts the clock and hands them all to
    /// the workers at once.
    fn start_streams(&self, stop: &Arc<AtomicBool>) -> Result<Progress> {
        let req = self.req;
        let limit_for = |id: u32| match stream_bytes(req, id) {
            Some(b) => Limit::Bytes(b),
            None => Limit::For(Duration::from_secs_f64(req.seconds.unwrap_or(0.0))),
        };
        let senders = self.streams.iter().filter(|s| s.role == Role::Send).count();
        let pacer = req.rate_bps.map(|r| Arc::new(Pacer::shared(r, senders)));
        let mut works = Vec::with_capacity(self.streams.len());
        for s in self.streams {
            works.push(match s.role {
                Role::Send => Work::Send(
                    self.plane.source(s.id)?,
                    SendBudget::new(limit_for(s.id), pacer.clone(), stop.clone()),
                ),
                Role::Receive => Work::Receive(self.plane.sink(s.id)?),
            });
        }
        let cpu_start = CpuSnapshot::now();
        let start = Instant::now();
        let started = self
            .streams
            .iter()
            .zip(works)
            .map(|(s, mut work)| {
                if let Work::Send(_, budget) = &mut work {
                    budget.started_at(start);
                }
                let events = self.events_tx.clone();
                let id = s.id;
                let finished: Finished = Box::new(move |result| {
                    let _ = events.send(Event::Worker { id, result });
                });
                (s.clone(), work, finished)
            })
            .collect();
        stream::start(started)?;
        let next_report = match self.peer {
            PeerStreams::Report(period) => Some((start + period, period)),
            PeerStreams::Collect(_) => None,
        };
        Ok(Progress {
            start,
            cpu_start,
            watchdog: Watchdog::new(self.streams.len(), start),
            pending: self.streams.len(),
            local: None,
            remote: None,
            next_tick: start + self.tick_every,
            next_report,
            give_up: None,
        })
    }

    /// The client, until its `Done`: sends the server its streams when a
    /// report is due. True when it was due.
    fn report_if_due(&mut self, at: &mut Progress, now: Instant) -> Result<bool> {
        let (Some((due, period)), None) = (at.next_report, &at.local) else {
            return Ok(false);
        };
        if now < due {
            return Ok(false);
        }
        for s in self.streams {
            s.sample();
        }
        // A report is the latest state: while the peer has not taken in the
        // last one (the control connection's share of a crowded path), this
        // one is skipped rather than queued behind it, so the loop never
        // waits to write.
        if sockopt::drained(self.control.socket()) {
            let report = StreamsReport {
                streams: self.streams.iter().map(|s| s.report()).collect(),
            };
            self.control.send(&Message::StreamsReport(report))?;
        }
        // Never a burst of catch-up reports after a slow moment.
        at.next_report = Some(((due + period).max(Instant::now()), period));
        Ok(true)
    }

    fn handle(&mut self, at: &mut Progress, event: Event) -> Result<()> {
        match event {
            Event::Worker { result: Ok(_), id } => {
                at.watchdog.finished(id);
                at.pending -= 1;
                if at.pending == 0 {
                    let done = Done {
                        streams: self.streams.iter().map(|s| s.report()).collect(),
                        cpu: at.cpu_start.report_until(&CpuSnapshot::now()),
                        seconds: at.start.elapsed().as_secs_f64(),
                        mode_summary: self.plane.summary()?,
                    };
                    self.control.send(&Message::Done(Box::new(done.clone())))?;
                    at.local = Some(done);
                    at.give_up = Some(Instant::now() + SHUTDOWN_TIMEOUT);
                }
            }
            Event::Worker { result: Err(e), .. } => return Err(e),
            Event::Control(Ok(Message::Done(d))) => {
                if let PeerStreams::Collect(collect) = self.peer {
                    collect(check_report(self.req, d.streams.clone())?);
                }
                at.remote = Some(*d);
            }
            Event::Control(Ok(Message::StreamsReport(r))) => match self.peer {
                PeerStreams::Collect(collect) => collect(check_report(self.req, r.streams)?),
                PeerStreams::Report(_) => {
                    return Err(Error::Protocol(
                        "unexpected StreamsReport from the server: only the client reports".into(),
                    ))
                }
            },
            Event::Control(Ok(Message::ModeData(_))) => {}
            Event::Control(Ok(other)) => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} message during the data phase",
                    other.kind()
                )))
            }
            Event::Control(Err(e)) => return Err(e),
            Event::Attached { .. } => {} // a late duplicate; dropping it closes it
        }
        Ok(())
    }

    /// Nothing came before the next wake-up: samples and ticks, and checks
    /// the streams' progress, when due.
    fn on_time(&mut self, at: &mut Progress) -> Result<()> {
        let now = Instant::now();
        if now >= at.next_tick {
            for s in self.streams {
                s.sample();
            }
            (self.tick)(self.streams, at.start.elapsed());
            at.next_tick = crate::ticks::next_tick(at.next_tick, self.tick_every, Instant::now());
        }
        if now >= at.watchdog.next {
            at.watchdog.check(self.streams, now)?;
        }
        Ok(())
    }
}

/// Fails the session when a stream makes no progress for
/// [`DATA_IDLE_TIMEOUT`].
struct Watchdog {
    next: Instant,
    /// Per stream: last progress value and when it changed; `None` once
    /// the stream's worker finished.
    seen: Vec<Option<(u64, Instant)>>,
}

impl Watchdog {
    fn new(streams: usize, start: Instant) -> Watchdog {
        Watchdog {
            next: start + WATCHDOG_PERIOD,
            seen: vec![Some((0, start)); streams],
        }
    }

    fn finished(&mut self, id: u32) {
        if let Some(s) = self.seen.get_mut(id as usize) {
            *s = None;
        }
    }

    fn check(&mut self, streams: &[Arc<StreamStats>], now: Instant) -> Result<()> {
        self.next = now + WATCHDOG_PERIOD;
        let mut idle = None;
        for (s, seen) in streams.iter().zip(self.seen.iter_mut()) {
            let Some((last, since)) = seen else {
                continue;
            };
            let p = s.progress();
            if p != *last {
                *seen = Some((p, now));
            } else if idle.is_none() && now.duration_since(*since) >= DATA_IDLE_TIMEOUT {
                idle = Some(s);
            }
        }
        let Some(s) = idle else {
            return Ok(());
        };
        // Running streams that moved data within the timeout: the peer and
        // the path are alive, and this stream is starved.
        let moving = self
            .seen
            .iter()
            .filter(|seen| {
                matches!(seen, Some((_, since)) if now.duration_since(*since) < DATA_IDLE_TIMEOUT)
            })
            .count();
        let why = if moving == 0 {
            format!(
                "the peer stopped {}",
                match s.role {
                    Role::Send => "reading",
                    Role::Receive => "sending",
                }
            )
        } else {
            format!(
                "{moving} other stream(s) of the session moved data meanwhile, so the path \
                 starves this one: too many streams for the bottleneck's queue (use fewer \
                 streams, or --rate at or below the bottleneck's rate)"
            )
        };
        Err(Error::Timeout(format!(
            "stream {}: no data moved for {} s (the data idle timeout): {why}",
            s.id,
            DATA_IDLE_TIMEOUT.as_secs(),
        )))
    }
}

/// Streams that should have moved bytes (every stream has time or a share
/// of `--bytes`) but moved none. Planes that may leave streams idle (disk
/// mode with fewer files than streams) report none.
pub fn idle_streams(
    req: &SessionRequest,
    plane: &dyn DataPlane,
    outcome: &PhaseOutcome,
) -> Vec<u32> {
    if plane.idle_streams_are_normal() {
        return Vec::new();
    }
    outcome
        .local
        .streams
        .iter()
        .zip(&outcome.remote.streams)
        .filter(|(l, r)| l.bytes == 0 && r.bytes == 0)
        .map(|(l, _)| l.id)
        .filter(|&id| stream_bytes(req, id) != Some(0))
        .collect()
}

/// Forwards control messages to the session's event channel until the
/// connection fails or closes.
pub fn spawn_control_reader(mut reader: Connection, events: Sender<Event>) -> Result<()> {
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

/// Checks a client's `StreamsReport`: one entry per stream of the session
/// at most, each with the client's role on it (the stats API lists what it
/// gets, so a confused peer must not invent streams).
fn check_report(req: &SessionRequest, streams: Vec<StreamReport>) -> Result<Vec<StreamReport>> {
    let total = total_streams(req);
    let mut seen = vec![false; total as usize];
    for s in &streams {
        let fresh = seen
            .get_mut(s.id as usize)
            .map(|seen| !std::mem::replace(seen, true))
            .unwrap_or(false);
        if !fresh || s.role != role(req, Side::Client, s.id) {
            return Err(Error::Protocol(format!(
                "StreamsReport: stream {} ({:?}) is not a stream of the client in this {total}-stream session, or appears twice",
                s.id, s.role
            )));
        }
    }
    Ok(streams)
}

/// Checks that for every stream the receiver got exactly what the sender
/// sent (and, with `--bytes`, exactly the stream's share).
pub(crate) fn verify_totals(
    req: &SessionRequest,
    local: &[StreamReport],
    remote: &[StreamReport],
) -> Result<()> {
    let n = total_streams(req) as usize;
    if local.len() != n || remote.len() != n {
        return Err(Error::Protocol(format!(
            "expected {n} stream reports, got {} here and {} from the peer",
            local.len(),
            remote.len()
        )));
    }
    for (a, b) in local.iter().zip(remote) {
        let (sent, received) = match a.role {
            Role::Send => (a.bytes, b.bytes),
            Role::Receive => (b.bytes, a.bytes),
        };
        if sent != received {
            return Err(Error::PeerAborted(format!(
                "stream {}: {sent} bytes sent but {received} received",
                a.id
            )));
        }
        if let Some(want) = stream_bytes(req, a.id) {
            if received != want {
                return Err(Error::PeerAborted(format!(
                    "stream {}: moved {received} bytes, expected {want}",
                    a.id
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::DEFAULT_BUFFER;
    use crate::messages::Mode;

    fn req(direction: Direction, streams: u32, bytes: Option<u64>) -> SessionRequest {
        SessionRequest {
            mode: Mode::Memory,
            direction,
            streams,
            bytes,
            seconds: bytes.is_none().then_some(1.0),
            buffer: DEFAULT_BUFFER,
            cc: None,
            rate_bps: None,
            mode_params: None,
            client_host: None,
            campaign: None,
            run: None,
        }
    }

    #[test]
    fn accepted_data_sockets_run_only_the_session_s_congestion_control() {
        let (listener, default, other) = sockopt::neutral::listener();
        for (asked, expected) in [(None, default.as_str()), (Some(other), other)] {
            let (_client, accepted) = sockopt::neutral::accept(&listener);
            let mut r = req(Direction::Receive, 1, Some(1));
            r.cc = asked.map(str::to_string);
            configure_accepted_data_socket(&accepted, &r, true, &default).unwrap();
            assert_eq!(
                sockopt::get_cc(&accepted).as_deref(),
                Some(expected),
                "{asked:?}"
            );
            assert_eq!(accepted.read_timeout().unwrap(), Some(DATA_SOCKET_TIMEOUT));
        }
    }

    /// A receiving stream on a connected loopback socket (its peer end
    /// kept open), as the watchdog sees it.
    fn watched(id: u32) -> (Arc<StreamStats>, TcpStream) {
        let (sock, peer) = longhaul_testkit::loopback_pair();
        (Arc::new(StreamStats::new(id, Role::Receive, sock)), peer)
    }

    #[test]
    fn the_watchdog_tells_a_stopped_peer_from_a_starved_stream() {
        use std::sync::atomic::Ordering;
        let (a, _pa) = watched(0);
        let (b, _pb) = watched(1);
        let streams = vec![a.clone(), b.clone()];
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // Both silent for the whole timeout: the peer stopped.
        let mut dog = Watchdog::new(2, start);
        dog.check(&streams, at(1)).unwrap();
        let err = dog.check(&streams, at(31)).unwrap_err().to_string();
        assert!(err.contains("stream 0: no data moved for 30 s"), "{err}");
        assert!(err.contains("the peer stopped sending"), "{err}");
        // Stream 0 keeps moving, stream 1 never does: starved, said so.
        let mut dog = Watchdog::new(2, start);
        for t in [1, 10, 20, 30] {
            a.bytes.fetch_add(1000, Ordering::Relaxed);
            dog.check(&streams, at(t)).unwrap();
        }
        a.bytes.fetch_add(1000, Ordering::Relaxed);
        let err = dog.check(&streams, at(31)).unwrap_err().to_string();
        assert!(err.contains("stream 1: no data moved for 30 s"), "{err}");
        assert!(
            err.contains("1 other stream(s) of the session moved data"),
            "{err}"
        );
        assert!(err.contains("--rate"), "{err}");
        // A finished stream is no evidence that the path still works.
        let mut dog = Watchdog::new(2, start);
        a.bytes.fetch_add(1000, Ordering::Relaxed);
        dog.check(&streams, at(1)).unwrap();
        dog.finished(0);
        let err = dog.check(&streams, at(31)).unwrap_err().to_string();
        assert!(
            err.contains("stream 1") && err.contains("the peer stopped"),
            "{err}"
        );
    }

    #[test]
    fn bytes_split_exactly() {
        let r = req(Direction::Send, 35, Some(10_000_001));
        let sum: u64 = (0..35).map(|i| stream_bytes(&r, i).unwrap()).sum();
        assert_eq!(sum, 10_000_001);
        let b = req(Direction::Bidir, 4, Some(10));
        let sum: u64 = (0..8).map(|i| stream_bytes(&b, i).unwrap()).sum();
        assert_eq!(sum, 20);
    }

    #[test]
    fn bidir_layout() {
        let b = req(Direction::Bidir, 3, None);
        assert_eq!(total_streams(&b), 6);
        assert_eq!(role(&b, Side::Client, 0), Role::Send);
        assert_eq!(role(&b, Side::Client, 3), Role::Receive);
        assert_eq!(role(&b, Side::Server, 3), Role::Send);
    }

    #[test]
    fn stream_reports_must_match_the_clients_streams() {
        let b = req(Direction::Bidir, 2, None);
        let report = |id, role| StreamReport {
            id,
            role,
            bytes: 1,
            tcp: None,
        };
        let good = vec![report(0, Role::Send), report(3, Role::Receive)];
        assert_eq!(check_report(&b, good.clone()).unwrap(), good);
        for bad in [
            vec![report(4, Role::Receive)],                     // no such stream
            vec![report(0, Role::Receive)],                     // the server's role
            vec![report(1, Role::Send), report(1, Role::Send)], // twice
        ] {
            assert!(
                matches!(check_report(&b, bad.clone()), Err(Error::Protocol(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn limits_are_checked() {
        assert!(validate(&req(Direction::Send, 0, None)).is_err());
        assert!(validate(&req(Direction::Send, 1025, None)).is_err());
        assert!(validate(&req(Direction::Send, 1024, None)).is_ok());
        // A peer's request must not reach Instant or Duration arithmetic that panics.
        let with = |seconds: f64, rate_bps: Option<u64>| SessionRequest {
            seconds: Some(seconds),
            rate_bps,
            ..req(Direction::Bidir, 4, None)
        };
        assert!(validate(&with(MAX_SECONDS, Some(1))).is_ok());
        for (seconds, rate) in [
            (MAX_SECONDS * 1.01, None),
            (1e19, None),
            (f64::MAX, None),
            (f64::INFINITY, None),
            (f64::NAN, None),
            (0.0, None),
            (-1.0, None),
            (1.0, Some(0)),
        ] {
            let err = validate(&with(seconds, rate)).unwrap_err();
            assert!(matches!(err, Error::Usage(_)), "{seconds} {rate:?}: {err}");
        }
    }
}
