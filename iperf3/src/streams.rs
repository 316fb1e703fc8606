//! The data streams of one iperf3 test at one end, client or server.
//!
//! TCP streams are the engine's streams: a [`StreamStats`] per socket and
//! a memory plane's source or sink, started through [`stream::start`] like
//! any session's, so they are tasks of the same data workers (no thread of
//! their own) and get the same TCP_INFO and stats API.
//! What iperf3 adds is how a test ends: not by the sender closing its
//! streams but by `TEST_END` on the control connection, after which the
//! results are exchanged while the sockets are still open. So a sending
//! stream here also stops on the test's stop flag, and its end is told
//! apart from the end of its worker (which waits for the peer to close):
//! [`TestStreams::stop_sending`] returns once every source has stopped,
//! and the byte counters are final.
//!
//! UDP streams have no engine counterpart; each runs [`udp::send_loop`] or
//! [`udp::receive_loop`] on a thread of its own, bounded by the test's
//! stream count (128 per direction).

use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::datapath::{DataPlane, Limit, Progress, SendBudget, Source, StreamIo};
use crate::error::{Error, Result};
use crate::messages::{Role, SessionRequest};
use crate::pacer::Pacer;
use crate::registry::{DatagramStream, SessionEntry};
use crate::session::{self, Side};
use crate::sockopt;
use crate::stream::{self, Finished, StreamStats, Work};

use super::results::{stream_id, Results, StreamResult};
use super::udp::{self, ReceiveStats, SendPlan};

/// A test's connected data sockets, in connection order.
pub(crate) enum Sockets {
    Tcp(Vec<TcpStream>),
    Udp(Vec<UdpSocket>),
}

/// How one end runs its streams.
pub(crate) struct Plan {
    /// Stream layout and `-n` split ([`super::params::Params::shape`]).
    pub(crate) shape: SessionRequest,
    pub(crate) side: Side,
    /// How long a sending stream sends when the test has no byte limit
    /// (the client's `-t`; the server adds a grace, the client's
    /// `TEST_END` ends it first).
    pub(crate) send_for: Duration,
    /// Per-stream rate of sending streams, bits/s; 0 for unpaced.
    pub(crate) stream_rate_bps: u64,
    /// UDP: datagram payload size and 64-bit sequence numbers.
    pub(crate) block: usize,
    pub(crate) wide: bool,
}

/// One UDP stream: its socket, counters and, when receiving, iperf3's
/// loss and jitter figures.
pub(crate) struct UdpStream {
    pub(crate) counters: Arc<DatagramStream>,
    pub(crate) received: Mutex<ReceiveStats>,
    socket: UdpSocket,
}

/// A stream's worker finished (index in connection order).
pub(crate) struct StreamEnd {
    pub(crate) index: u32,
    pub(crate) result: Result<u64>,
}

/// Told of every stream's end, on the stream's thread.
pub(crate) type OnEnd = Arc<dyn Fn(StreamEnd) + Send + Sync>;

/// The running (or ready) streams of one end of a test.
pub(crate) struct TestStreams {
    pub(crate) tcp: Vec<Arc<StreamStats>>,
    pub(crate) udp: Vec<Arc<UdpStream>>,
    /// Each TCP stream's work, handed to the data workers by
    /// [`TestStreams::go`].
    pending: Mutex<Vec<(Arc<StreamStats>, Work, Finished)>>,
    /// UDP streams' threads wait on it until [`TestStreams::go`] (the
    /// instant the test started).
    gate: Arc<Gate>,
    /// Sources and UDP senders stop at their next chunk.
    stop: Arc<AtomicBool>,
    /// UDP receivers count datagrams while set (iperf3: while running).
    counting: Arc<AtomicBool>,
    /// Sending streams whose source has not returned yet.
    senders_left: Arc<AtomicUsize>,
    /// Bytes of each stream when the omitted seconds ended.
    omitted: Mutex<Vec<u64>>,
}

/// Tells the test when a sending stream's source finished (its byte
/// counter is final from then on).
struct Counted {
    inner: Box<dyn Source>,
    left: Arc<AtomicUsize>,
    counted: bool,
}

impl Counted {
    fn done(&mut self) {
        if !self.counted {
            self.counted = true;
            self.left.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Source for Counted {
    fn send(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress> {
        let r = self.inner.send(io, budget);
        if !matches!(r, Ok(Progress::Wait { .. }) | Ok(Progress::Yield)) {
            self.done();
        }
        r
    }
}

impl Drop for Counted {
    /// A stream aborted before its source said Done stops sending too.
    fn drop(&mut self) {
        self.done();
    }
}

/// Opened once: the UDP streams' start line.
#[derive(Default)]
struct Gate {
    start: Mutex<Option<Instant>>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) -> Instant {
        let mut start = self.start.lock().unwrap_or_else(|e| e.into_inner());
        let at = *start.get_or_insert_with(Instant::now);
        self.opened.notify_all();
        at
    }

    fn wait(&self) -> Instant {
        let mut start = self.start.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(at) = *start {
                return at;
            }
            start = self.opened.wait(start).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl TestStreams {
    /// Prepares every stream; they start at [`TestStreams::go`]. `on_end`
    /// hears of each stream's end.
    pub(crate) fn prepare(
        plan: &Plan,
        sockets: Sockets,
        plane: &dyn DataPlane,
        on_end: OnEnd,
    ) -> Result<TestStreams> {
        let stop = Arc::new(AtomicBool::new(false));
        let counting = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::default());
        let roles = |n: usize| -> Vec<Role> {
            (0..n as u32)
                .map(|i| session::role(&plan.shape, plan.side, i))
                .collect()
        };
        let limit = |i: u32| match session::stream_bytes(&plan.shape, i) {
            Some(b) => Limit::Bytes(b),
            None => Limit::For(plan.send_for),
        };
        let pacer =
            || (plan.stream_rate_bps > 0).then(|| Arc::new(Pacer::new(plan.stream_rate_bps)));
        let (count, tcp, udp) = match sockets {
            Sockets::Tcp(socks) => {
                let n = socks.len();
                (
                    n,
                    session::stream_stats(&plan.shape, plan.side, socks),
                    Vec::new(),
                )
            }
            Sockets::Udp(socks) => {
                let n = socks.len();
                let streams = socks
                    .into_iter()
                    .zip(roles(n))
                    .enumerate()
                    .map(|(i, (socket, role))| {
                        Arc::new(UdpStream {
                            counters: Arc::new(DatagramStream::new(i as u32, role)),
                            received: Mutex::new(ReceiveStats::default()),
                            socket,
                        })
                    })
                    .collect();
                (n, Vec::new(), streams)
            }
        };
        let senders = roles(count).iter().filter(|r| **r == Role::Send).count();
        let test = TestStreams {
            tcp,
            udp,
            pending: Mutex::new(Vec::new()),
            gate,
            stop,
            counting,
            senders_left: Arc::new(AtomicUsize::new(senders)),
            omitted: Mutex::new(vec![0; count]),
        };
        let mut pending = Vec::with_capacity(test.tcp.len());
        for s in &test.tcp {
            let work = match s.role {
                Role::Send => Work::Send(
                    Box::new(Counted {
                        inner: plane.source(s.id)?,
                        left: test.senders_left.clone(),
                        counted: false,
                    }),
                    SendBudget::new(limit(s.id), pacer(), test.stop.clone()),
                ),
                Role::Receive => Work::Receive(plane.sink(s.id)?),
            };
            let index = s.id;
            let on_end = on_end.clone();
            let finished: Finished = Box::new(move |result| on_end(StreamEnd { index, result }));
            pending.push((s.clone(), work, finished));
        }
        *test.pending.lock().unwrap_or_else(|e| e.into_inner()) = pending;
        for u in &test.udp {
            test.start_udp(u.clone(), plan, limit(u.counters.id), on_end.clone())?;
        }
        Ok(test)
    }

    fn start_udp(&self, u: Arc<UdpStream>, plan: &Plan, limit: Limit, on_end: OnEnd) -> Result<()> {
        let gate = self.gate.clone();
        let (stop, counting, left) = (
            self.stop.clone(),
            self.counting.clone(),
            self.senders_left.clone(),
        );
        let (block, wide, rate) = (plan.block, plan.wide, plan.stream_rate_bps);
        let index = u.counters.id;
        std::thread::Builder::new()
            .name(format!("udp-stream-{index}"))
            .spawn(move || {
                let start = gate.wait();
                let result = match u.counters.role {
                    Role::Send => {
                        let plan = SendPlan {
                            block,
                            wide,
                            rate_bps: rate,
                            limit: match limit {
                                Limit::For(d) => Limit::Until(start + d),
                                other => other,
                            },
                            stop,
                        };
                        let r = udp::send_loop(&u.socket, &plan, &u.counters);
                        left.fetch_sub(1, Ordering::AcqRel);
                        r
                    }
                    Role::Receive => udp::receive_loop(
                        &u.socket,
                        block,
                        wide,
                        &counting,
                        &stop,
                        &u.received,
                        &u.counters,
                    ),
                };
                let result = result
                    .map(|_| u.counters.bytes.load(Ordering::Relaxed))
                    .map_err(|e| Error::io(format!("UDP stream {index}"), e));
                on_end(StreamEnd { index, result });
            })
            .map(drop)
            .map_err(|e| Error::io("starting a UDP stream", e))
    }

    /// Lets every stream go; returns the instant they started.
    pub(crate) fn go(&self) -> Result<Instant> {
        self.counting.store(true, Ordering::Relaxed);
        let start = self.gate.open();
        let mut pending =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, work, _) in &mut pending {
            if let Work::Send(_, budget) = work {
                budget.started_at(start);
            }
        }
        stream::start(pending)?;
        Ok(start)
    }

    pub(crate) fn len(&self) -> usize {
        self.tcp.len() + self.udp.len()
    }

    pub(crate) fn role(&self, index: usize) -> Role {
        match self.udp.get(index) {
            Some(u) => u.counters.role,
            None => self.tcp[index].role,
        }
    }

    /// Payload bytes stream `index` moved so far.
    pub(crate) fn bytes(&self, index: usize) -> u64 {
        match self.udp.get(index) {
            Some(u) => u.counters.bytes.load(Ordering::Relaxed),
            None => self.tcp[index].bytes(),
        }
    }

    /// Bytes this end moved in `role`, all streams.
    pub(crate) fn total(&self, role: Role) -> u64 {
        (0..self.len())
            .filter(|&i| self.role(i) == role)
            .map(|i| self.bytes(i))
            .sum()
    }

    /// Anything TCP moved on any socket, or UDP bytes: grows while the test
    /// makes any progress at all (the server's idle watchdog).
    pub(crate) fn progress(&self) -> u64 {
        let tcp: u64 = self
            .tcp
            .iter()
            .map(|s| s.progress())
            .fold(0, u64::wrapping_add);
        (0..self.udp.len())
            .map(|i| self.bytes(i))
            .fold(tcp, u64::wrapping_add)
    }

    /// The omitted seconds are over: later results count from here.
    pub(crate) fn end_omitted(&self) {
        let now: Vec<u64> = (0..self.len()).map(|i| self.bytes(i)).collect();
        *self.omitted.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// Bytes of stream `index` after the omitted seconds.
    pub(crate) fn counted_bytes(&self, index: usize) -> u64 {
        let omitted = self.omitted.lock().unwrap_or_else(|e| e.into_inner())[index];
        self.bytes(index).saturating_sub(omitted)
    }

    /// Stops the senders and waits (up to `within`) until every one has
    /// stopped, so their counters are final. False if some did not.
    pub(crate) fn stop_sending(&self, within: Duration) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        // A sender waiting for its socket (a receiver that stopped reading)
        // looks at the stop flag now.
        for s in &self.tcp {
            s.wake();
        }
        let deadline = Instant::now() + within;
        while self.senders_left.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Whether every sending stream's source has returned.
    pub(crate) fn senders_done(&self) -> bool {
        self.senders_left.load(Ordering::Acquire) == 0
    }

    /// UDP receivers stop counting (the test ended; late datagrams do not
    /// count, as in iperf3).
    pub(crate) fn stop_counting(&self) {
        self.counting.store(false, Ordering::Relaxed);
    }

    /// The test ended: receiving TCP streams read what arrives at once
    /// instead of waiting for a batch (SO_RCVLOWAT back to 1, see
    /// `RecvBatching`), so the drain sees the last bytes
    /// when they arrive and the receiving end_time is theirs, not up to
    /// `RecvBatching::LATEST` later.
    pub(crate) fn take_what_arrives(&self) {
        for s in self.tcp.iter().filter(|s| s.role == Role::Receive) {
            // A socket already closed has nothing left to wait for.
            let _ = sockopt::set_rcvlowat(&*s.socket, 1);
        }
    }

    /// Samples TCP_INFO of every TCP stream.
    pub(crate) fn sample(&self) {
        for s in &self.tcp {
            s.sample();
        }
    }

    /// Ends every stream: sockets shut down, loops stopped, workers let go.
    pub(crate) fn abort(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.counting.store(false, Ordering::Relaxed);
        self.gate.open();
        // Streams never started end with the test (their `on_end` is not
        // called).
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        for s in &self.tcp {
            s.abort();
        }
    }

    /// Lists the streams in the stats API.
    pub(crate) fn register(&self, entry: &SessionEntry) {
        if self.udp.is_empty() {
            entry.set_running(self.tcp.clone());
        } else {
            entry.set_running_datagrams(self.udp.iter().map(|u| u.counters.clone()).collect());
        }
    }

    /// This end's results block: every stream's figures after the omitted
    /// seconds, how long each role counted (`end_time`), and process CPU.
    pub(crate) fn results(
        &self,
        counted: TestSeconds,
        cpu: CpuUse,
        congestion_used: Option<String>,
    ) -> Results {
        self.sample();
        let sends = (0..self.len()).any(|i| self.role(i) == Role::Send);
        let retransmits_known = sends && self.udp.is_empty();
        let streams = (0..self.len())
            .map(|i| {
                let mut r = StreamResult {
                    id: stream_id(i as u32),
                    bytes: self.counted_bytes(i),
                    retransmits: -1,
                    end_time: match self.role(i) {
                        Role::Send => counted.sending,
                        Role::Receive => counted.receiving,
                    },
                    ..StreamResult::default()
                };
                if let Some(s) = self.tcp.get(i) {
                    if s.role == Role::Send {
                        r.retransmits = s.last_tcp().map_or(0, |t| t.retransmits as i64);
                    }
                }
                if let Some(u) = self.udp.get(i) {
                    if u.counters.role == Role::Send {
                        r.packets = u.counters.datagrams.load(Ordering::Relaxed) as i64;
                    } else {
                        let got = u.received.lock().unwrap_or_else(|e| e.into_inner());
                        r.packets = got.highest as i64;
                        r.errors = got.lost;
                        r.jitter = got.jitter;
                    }
                }
                r
            })
            .collect();
        Results {
            cpu_util_total: cpu.user_pct + cpu.system_pct,
            cpu_util_user: cpu.user_pct,
            cpu_util_system: cpu.system_pct,
            sender_has_retransmits: match (sends, retransmits_known) {
                (false, _) => -1,
                (true, known) => i64::from(known),
            },
            congestion_used,
            streams,
            server_output_text: None,
        }
    }
}

/// Seconds of counted test time (after the omitted ones) at one end, by
/// role: sending streams count until the test ends; receiving streams until
/// the last byte the sender wrote has arrived, which through a bottleneck's
/// queue and full socket buffers is later. Bytes over these times are the
/// rates each end really saw, never above what the path carried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TestSeconds {
    pub(crate) sending: f64,
    pub(crate) receiving: f64,
}

impl TestSeconds {
    /// `seconds` of test time, and receiving until `last_arrival` when
    /// bytes still arrived after the test's end; `start` and `omit` place
    /// that instant on the test's clock.
    pub(crate) fn new(
        seconds: f64,
        start: std::time::Instant,
        omit: u64,
        last_arrival: Option<std::time::Instant>,
    ) -> TestSeconds {
        let receiving = last_arrival.map_or(seconds, |t| {
            (t.duration_since(start).as_secs_f64() - omit as f64).max(seconds)
        });
        TestSeconds {
            sending: seconds,
            receiving,
        }
    }

    /// The longer of the two: the test as a whole.
    pub(crate) fn overall(&self) -> f64 {
        self.sending.max(self.receiving)
    }
}

/// Process CPU over a test, percent of one core (iperf3's measure).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CpuUse {
    pub(crate) user_pct: f64,
    pub(crate) system_pct: f64,
}

impl CpuUse {
    /// From a CPU report of the engine and the wall seconds it covers.
    pub(crate) fn from_report(r: &crate::messages::CpuReport, seconds: f64) -> CpuUse {
        let pct = |s: f64| {
            if seconds > 0.0 {
                s / seconds * 100.0
            } else {
                0.0
            }
        };
        CpuUse {
            user_pct: pct(r.process_user_seconds),
            system_pct: pct(r.process_system_seconds),
        }
    }
}

impl Drop for TestStreams {
    fn drop(&mut self) {
        // No worker waits at the gate or pumps on after the test is gone.
        self.abort();
    }
}
