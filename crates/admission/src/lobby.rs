//! The admission path of a TCP port: accept -> waiting room -> handshake ->
//! authenticated hand-off, for any protocol that implements [`Protocol`].
//!
//! Two stages, each a [`PendingSet`] with its own limits:
//!
//! 1. **Waiting**: a new connection is non-blocking and watched by one epoll
//!    thread until it delivered its protocol's *first message* (the protocol
//!    says how long that is). Holding a silent or trickling connection here
//!    costs a descriptor and at most [`Protocol::max_first_message`] bytes,
//!    so the pool can be large. Garbage is dropped on the spot.
//! 2. **Handshaking**: a connection whose first message is complete either
//!    finishes on the epoll thread ([`FirstMessage::Quick`], for exchanges
//!    that cannot block, like a data connection's attach header) or gets a
//!    thread of its own ([`FirstMessage::Handshake`]) for the rest of its
//!    handshake. That pool is smaller (threads), and its entries keep the
//!    deadline they got on arrival.
//!
//! Both pools evict rather than refuse (see [`crate::pending`]), and one
//! deadline, counted from `accept`, covers both stages: a peer that trickles
//! one byte every few seconds gets no more time than a silent one. The
//! epoll thread enforces it, for handshake threads too, by shutting their
//! socket down. A handshake that succeeds calls [`Ticket::admit`], which takes
//! the connection out of the pools for good; only then may the protocol give
//! it anything scarce (a session slot).
//!
//! Dropped connections are logged through a rate limit: a flood must not
//! turn into a flood of log lines.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use polling::{Event, Events, PollMode, Poller};

use crate::budget::{ProofBudget, ProofLimits, ProofTurn};
use crate::pending::{EntryId, Limits, PendingSet};
use crate::slots::Refusal;

/// What a protocol makes of the bytes a connection sent so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstMessage {
    /// Not complete yet; keep waiting (within the deadline).
    NeedMore,
    /// Complete; finish with [`Protocol::quick`] on the epoll thread.
    Quick,
    /// Complete; finish with [`Protocol::handshake`] on a thread of its own.
    Handshake,
    /// Not this protocol; drop it, naming why.
    Garbage(String),
}

/// A connection whose first message is complete, in blocking mode.
pub struct Arrival {
    pub stream: TcpStream,
    /// Every byte received so far (the first message, maybe more).
    pub received: Vec<u8>,
    pub peer: SocketAddr,
    /// When it was accepted.
    pub accepted: Instant,
    /// Logs why the connection was dropped, through the port's rate limit.
    pub reporter: Reporter,
}

/// Logs lines about one connection through its port's rate limit, and
/// counts what became of it.
#[derive(Clone)]
pub struct Reporter {
    peer: SocketAddr,
    /// The connection's admission deadline.
    deadline: Instant,
    shared: Arc<dyn TicketPool>,
}

impl Reporter {
    /// Logs "dropped connection from PEER: WHY".
    pub fn report(&self, why: &str) {
        self.shared
            .note(&format!("dropped connection from {}: {why}", self.peer));
    }

    /// Counts a refusal of the port's (its slots, an attach too late).
    pub fn refused(&self, why: Refusal) {
        self.shared.counters().refused(why);
    }

    /// Counts a failed authentication.
    pub fn auth_failed(&self, why: AuthFailure) {
        self.shared.counters().auth_failed(why);
    }

    /// Waits for the source's turn to have a proof checked (its failed
    /// proofs budget, [`crate::budget`]); None when the admission deadline
    /// passed meanwhile. Call [`ProofTurn::passed`] when the proof holds.
    pub fn proof_turn(&self) -> Option<ProofTurn> {
        self.shared.budget().turn(self.peer.ip(), self.deadline)
    }
}

/// Why a peer failed to prove who it is, counted per port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// A proof of the wrong secret: a wrong token, wrong credentials, or
    /// none where one is required.
    BadToken,
    /// A handshake of another protocol version.
    BadVersion,
    /// A proof that is no proof: malformed, or a data connection's attach
    /// proof that does not verify.
    BadProof,
    /// Began the handshake and did not finish it within the admission
    /// deadline.
    Timeout,
}

/// One protocol on one port.
pub trait Protocol: Send + Sync + 'static {
    /// Bytes a first message may take at most; a connection that sent this
    /// many without completing one is garbage.
    fn max_first_message(&self) -> usize;
    /// Classifies the bytes received so far.
    fn first_message(&self, received: &[u8]) -> FirstMessage;
    /// Finishes a [`FirstMessage::Quick`] connection on the epoll thread.
    /// Must not block: every other pending connection waits meanwhile.
    fn quick(&self, arrival: Arrival);
    /// Runs the rest of a [`FirstMessage::Handshake`] connection's handshake
    /// on a thread of its own, and whatever follows it. Call
    /// [`Ticket::admit`] once the peer proved who it is.
    fn handshake(&self, arrival: Arrival, ticket: Ticket);
    /// Writes one line to the log.
    fn log(&self, line: &str);
}

/// The limits of a port's admission.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Connections waiting for their first message.
    pub waiting: Limits,
    /// Connections in a handshake thread, not yet admitted.
    pub handshaking: Limits,
    /// From accept to [`Ticket::admit`], in total.
    pub deadline: Duration,
    /// Failed proofs a source may have ([`crate::budget`]).
    pub proofs: ProofLimits,
}

/// Counters of one port's admission, for logs, tests and the engine's stats API.
#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub admitted: AtomicU64,
    /// Pushed out of a full pool by newer connections.
    pub evicted: AtomicU64,
    /// Past the deadline.
    pub expired: AtomicU64,
    /// Not the protocol.
    pub garbage: AtomicU64,
    /// Refused after the first message: every slot taken, the source's
    /// share taken, data connections that did not attach in time.
    pub refused_busy: AtomicU64,
    pub refused_source_busy: AtomicU64,
    pub refused_attach_timeout: AtomicU64,
    /// Failed authentications, by [`AuthFailure`].
    pub auth_bad_token: AtomicU64,
    pub auth_bad_version: AtomicU64,
    pub auth_bad_proof: AtomicU64,
    pub auth_timeout: AtomicU64,
}

impl Counters {
    pub fn refused(&self, why: Refusal) {
        match why {
            Refusal::Busy => &self.refused_busy,
            Refusal::SourceBusy => &self.refused_source_busy,
            Refusal::AttachTimeout => &self.refused_attach_timeout,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn auth_failed(&self, why: AuthFailure) {
        match why {
            AuthFailure::BadToken => &self.auth_bad_token,
            AuthFailure::BadVersion => &self.auth_bad_version,
            AuthFailure::BadProof => &self.auth_bad_proof,
            AuthFailure::Timeout => &self.auth_timeout,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// A connection began its handshake and did not prove itself by the
    /// admission deadline: expired, and a failed login (timeout).
    fn handshake_expired(&self) {
        self.expired.fetch_add(1, Ordering::Relaxed);
        self.auth_failed(AuthFailure::Timeout);
    }
}

/// How often the epoll thread looks for connections past their deadline.
const SWEEP_PERIOD: Duration = Duration::from_millis(100);

/// Log lines about dropped connections per [`LOG_WINDOW`]; beyond that they
/// are counted and summed up in one line.
const LOG_LINES_PER_WINDOW: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(10);

/// Events taken from the poller per wait.
const EVENTS_PER_WAIT: NonZeroUsize = NonZeroUsize::new(256).expect("not zero");

/// Key of the listening socket (entry ids count up from 0; the poller keeps
/// `usize::MAX` for itself).
const LISTENER_KEY: usize = usize::MAX - 1;

struct RateLimitedLog {
    window_start: Instant,
    lines: u32,
    suppressed: u64,
}

/// What the epoll thread and the handshake threads share.
struct Shared<P> {
    protocol: Arc<P>,
    handshaking: Mutex<PendingSet<TcpStream>>,
    log: Mutex<RateLimitedLog>,
    counters: Arc<Counters>,
    budget: Arc<ProofBudget>,
}

impl<P: Protocol> Shared<P> {
    fn note(&self, line: &str) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.window_start.elapsed() >= LOG_WINDOW {
            if log.suppressed > 0 {
                self.protocol.log(&format!(
                    "admission: {} more dropped connections in the last {} s (not logged one by one)",
                    log.suppressed,
                    LOG_WINDOW.as_secs()
                ));
            }
            *log = RateLimitedLog {
                window_start: Instant::now(),
                lines: 0,
                suppressed: 0,
            };
        }
        if log.lines < LOG_LINES_PER_WINDOW {
            log.lines += 1;
            self.protocol.log(line);
        } else {
            log.suppressed += 1;
        }
    }
}

/// A connection in the handshaking pool. Dropping it takes the connection
/// out of the pool (the handshake ended without admission).
pub struct Ticket {
    id: EntryId,
    shared: Arc<dyn TicketPool>,
    deadline: Instant,
}

/// The parts of [`Shared`] a ticket needs, without its protocol type.
trait TicketPool: Send + Sync {
    fn leave(&self, id: EntryId) -> bool;
    fn admitted(&self);
    fn note(&self, line: &str);
    fn counters(&self) -> &Counters;
    fn budget(&self) -> &Arc<ProofBudget>;
}

impl<P: Protocol> TicketPool for Shared<P> {
    fn leave(&self, id: EntryId) -> bool {
        self.handshaking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
            .is_some()
    }

    fn admitted(&self) {
        self.counters.admitted.fetch_add(1, Ordering::Relaxed);
    }

    fn note(&self, line: &str) {
        Shared::note(self, line)
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn budget(&self) -> &Arc<ProofBudget> {
        &self.budget
    }
}

/// The connection was pushed out or ran past the deadline before it was
/// admitted (its socket is shut down already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLate;

impl std::fmt::Display for TooLate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the handshake ran past its deadline or was pushed out by newer connections")
    }
}

impl std::error::Error for TooLate {}

impl Ticket {
    /// The peer proved itself: the connection leaves the pre-authentication
    /// pools and their deadline for good.
    pub fn admit(self) -> Result<(), TooLate> {
        let still_pending = self.shared.leave(self.id);
        // Already removed: Drop has nothing left to do.
        let shared = self.shared.clone();
        std::mem::forget(self);
        if still_pending {
            shared.admitted();
            Ok(())
        } else {
            Err(TooLate)
        }
    }
}

impl Drop for Ticket {
    /// A handshake that ends unadmitted past its deadline, before the sweep
    /// took it (its own read timed out first: the two timers race on a
    /// loaded machine), counts as the sweep would have counted it.
    fn drop(&mut self) {
        if self.shared.leave(self.id) && Instant::now() >= self.deadline {
            self.shared.counters().handshake_expired();
        }
    }
}

/// A connection waiting for its first message.
struct Waiting {
    stream: TcpStream,
    peer: SocketAddr,
    received: Vec<u8>,
    accepted: Instant,
    deadline: Instant,
}

/// Runs admission on `listener` for `protocol`, forever.
pub struct Lobby<P: Protocol> {
    listener: TcpListener,
    settings: Settings,
    shared: Arc<Shared<P>>,
}

/// The waiting room's sockets and the listener, watched for input
/// (level-triggered: a socket with unread bytes is reported again).
struct Readiness(Poller);

impl Readiness {
    fn new() -> io::Result<Readiness> {
        Ok(Readiness(Poller::new()?))
    }

    /// Watches `fd` for input (or the peer's close) under `key`. The caller
    /// unwatches it before closing it.
    fn watch(&self, fd: RawFd, key: usize) -> io::Result<()> {
        // SAFETY: every waiting socket is unwatched before it is dropped
        // (close_waiting, readable); the listener outlives the poller.
        unsafe {
            self.0
                .add_with_mode(fd, Event::readable(key), PollMode::Level)
        }
    }

    fn unwatch(&self, fd: RawFd) {
        // SAFETY: fd is a waiting socket still open (its owner is dropped
        // after this call).
        let _ = self.0.delete(unsafe { BorrowedFd::borrow_raw(fd) });
    }

    /// The keys of the sockets with input, after at most `timeout` (the
    /// poller itself waits again when a signal interrupts it).
    fn wait(&self, events: &mut Events, timeout: Duration) -> io::Result<()> {
        events.clear();
        self.0.wait(events, Some(timeout)).map(drop)
    }
}

impl<P: Protocol> Lobby<P> {
    pub fn new(listener: TcpListener, protocol: Arc<P>, settings: Settings) -> Lobby<P> {
        Lobby {
            listener,
            shared: Arc::new(Shared {
                protocol,
                handshaking: Mutex::new(PendingSet::new(settings.handshaking)),
                log: Mutex::new(RateLimitedLog {
                    window_start: Instant::now(),
                    lines: 0,
                    suppressed: 0,
                }),
                counters: Arc::new(Counters::default()),
                budget: ProofBudget::new(settings.proofs),
            }),
            settings,
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters.clone()
    }

    /// Accepts and admits connections until an unrecoverable error.
    pub fn run(self) -> io::Result<()> {
        self.listener.set_nonblocking(true)?;
        let ready = Readiness::new()?;
        ready.watch(self.listener.as_raw_fd(), LISTENER_KEY)?;
        let mut waiting: PendingSet<Waiting> = PendingSet::new(self.settings.waiting);
        let mut events = Events::with_capacity(EVENTS_PER_WAIT);
        let mut next_sweep = Instant::now() + SWEEP_PERIOD;
        loop {
            let wait = next_sweep.saturating_duration_since(Instant::now());
            ready.wait(&mut events, wait)?;
            for ev in events.iter() {
                if ev.key == LISTENER_KEY {
                    self.accept_all(&ready, &mut waiting);
                } else {
                    self.readable(&ready, &mut waiting, ev.key as EntryId);
                }
            }
            let now = Instant::now();
            if now >= next_sweep {
                next_sweep = now + SWEEP_PERIOD;
                self.sweep(&ready, &mut waiting, now);
            }
        }
    }

    fn reporter(&self, peer: SocketAddr, accepted: Instant) -> Reporter {
        Reporter {
            peer,
            deadline: accepted + self.settings.deadline,
            shared: self.shared.clone(),
        }
    }

    fn close_waiting(&self, ready: &Readiness, w: Waiting, why: &str) {
        ready.unwatch(w.stream.as_raw_fd());
        self.shared
            .note(&format!("dropped connection from {}: {why}", w.peer));
    }

    fn accept_all(&self, ready: &Readiness, waiting: &mut PendingSet<Waiting>) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; the
                    // sweep frees descriptors as deadlines pass.
                    self.shared.note(&format!("accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            self.shared
                .counters
                .accepted
                .fetch_add(1, Ordering::Relaxed);
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let now = Instant::now();
            let fd = stream.as_raw_fd();
            let (id, evicted) = waiting.insert(
                peer.ip(),
                now + self.settings.deadline,
                Waiting {
                    stream,
                    peer,
                    received: Vec::new(),
                    accepted: now,
                    deadline: now + self.settings.deadline,
                },
            );
            for w in evicted {
                self.shared.counters.evicted.fetch_add(1, Ordering::Relaxed);
                self.close_waiting(
                    ready,
                    w,
                    "no first message yet, pushed out by newer connections (waiting pool full)",
                );
            }
            if ready.watch(fd, id as usize).is_err() {
                waiting.remove(id);
            }
        }
    }

    fn readable(&self, ready: &Readiness, waiting: &mut PendingSet<Waiting>, id: EntryId) {
        let max = self.shared.protocol.max_first_message();
        let Some(w) = waiting.get_mut(id) else {
            return;
        };
        let mut buf = [0u8; 4096];
        let mut closed = None;
        loop {
            let room = max.saturating_sub(w.received.len()).clamp(1, buf.len());
            match (&w.stream).read(&mut buf[..room]) {
                Ok(0) => {
                    closed = Some("closed before its first message".to_string());
                    break;
                }
                Ok(n) => {
                    w.received.extend_from_slice(&buf[..n]);
                    if w.received.len() >= max {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    closed = Some(format!("failed before its first message: {e}"));
                    break;
                }
            }
        }
        let verdict = self.shared.protocol.first_message(&w.received);
        let verdict = match verdict {
            FirstMessage::NeedMore if closed.is_some() => {
                let w = waiting.remove(id).expect("looked up above");
                // A bare connect-and-close (a port probe) is not worth a line.
                if !w.received.is_empty() {
                    self.close_waiting(ready, w, &closed.unwrap_or_default());
                } else {
                    ready.unwatch(w.stream.as_raw_fd());
                }
                return;
            }
            FirstMessage::NeedMore if w.received.len() >= max => FirstMessage::Garbage(format!(
                "{} bytes without a complete first message",
                w.received.len()
            )),
            FirstMessage::NeedMore => return,
            other => other,
        };
        let w = waiting.remove(id).expect("looked up above");
        ready.unwatch(w.stream.as_raw_fd());
        match verdict {
            FirstMessage::Garbage(why) => {
                self.shared.counters.garbage.fetch_add(1, Ordering::Relaxed);
                self.shared.note(&format!(
                    "dropped connection from {}: garbage ({why})",
                    w.peer
                ));
            }
            FirstMessage::Quick => {
                if w.stream.set_nonblocking(false).is_ok() {
                    let reporter = self.reporter(w.peer, w.accepted);
                    self.shared.protocol.quick(Arrival {
                        stream: w.stream,
                        received: w.received,
                        peer: w.peer,
                        accepted: w.accepted,
                        reporter,
                    });
                }
            }
            FirstMessage::Handshake => self.start_handshake(w),
            FirstMessage::NeedMore => unreachable!("handled above"),
        }
    }

    fn start_handshake(&self, w: Waiting) {
        if w.stream.set_nonblocking(false).is_err() {
            return;
        }
        let Ok(watch) = w.stream.try_clone() else {
            return;
        };
        let (id, evicted) = self
            .shared
            .handshaking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(w.peer.ip(), w.deadline, watch);
        for s in evicted {
            self.shared.counters.evicted.fetch_add(1, Ordering::Relaxed);
            let _ = s.shutdown(Shutdown::Both);
        }
        let ticket = Ticket {
            id,
            shared: self.shared.clone(),
            deadline: w.deadline,
        };
        let arrival = Arrival {
            reporter: self.reporter(w.peer, w.accepted),
            stream: w.stream,
            received: w.received,
            peer: w.peer,
            accepted: w.accepted,
        };
        let protocol = self.shared.protocol.clone();
        let spawned = std::thread::Builder::new()
            .name("handshake".into())
            .spawn(move || protocol.handshake(arrival, ticket));
        if let Err(e) = spawned {
            self.shared
                .note(&format!("cannot start a handshake thread: {e}"));
        }
    }

    fn sweep(&self, ready: &Readiness, waiting: &mut PendingSet<Waiting>, now: Instant) {
        for w in waiting.expired(now) {
            self.shared.counters.expired.fetch_add(1, Ordering::Relaxed);
            let why = format!(
                "no complete first message within {} s ({} bytes received)",
                self.settings.deadline.as_secs(),
                w.received.len()
            );
            self.close_waiting(ready, w, &why);
        }
        let late = self
            .shared
            .handshaking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expired(now);
        for s in late {
            self.shared.counters.handshake_expired();
            // The handshake thread sees its socket fail and reports it.
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// First byte `H`: a handshake that admits itself; `Q`: quick; `N`: a
    /// handshake that never proves itself; anything else is garbage.
    struct Toy;

    impl Protocol for Toy {
        fn max_first_message(&self) -> usize {
            16
        }
        fn first_message(&self, received: &[u8]) -> FirstMessage {
            match received.first() {
                None => FirstMessage::NeedMore,
                Some(b'H' | b'N') => FirstMessage::Handshake,
                Some(b'Q') => FirstMessage::Quick,
                Some(b) => FirstMessage::Garbage(format!("first byte {b:#x}")),
            }
        }
        fn quick(&self, _arrival: Arrival) {}
        fn handshake(&self, arrival: Arrival, ticket: Ticket) {
            if arrival.received.first() == Some(&b'H') {
                ticket.admit().expect("admitted within the deadline");
            } else {
                // Holds its ticket until the sweep cuts it.
                let mut buf = [0u8; 1];
                let _ = (&arrival.stream).read(&mut buf);
            }
        }
        fn log(&self, _line: &str) {}
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// (accepted, admitted, evicted, expired, garbage)
    fn all(c: &Counters) -> [u64; 5] {
        [
            count(&c.accepted),
            count(&c.admitted),
            count(&c.evicted),
            count(&c.expired),
            count(&c.garbage),
        ]
    }

    fn wait_for(c: &Counters, want: [u64; 5]) {
        let end = Instant::now() + Duration::from_secs(10);
        while all(c) != want {
            assert!(Instant::now() < end, "counters {:?}, want {want:?}", all(c));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A pool of one handshake, as the lobby's is to its tickets.
    struct OnePool {
        pending: std::sync::Mutex<bool>,
        counters: Counters,
        budget: Arc<ProofBudget>,
    }

    impl TicketPool for OnePool {
        fn leave(&self, _id: EntryId) -> bool {
            std::mem::take(&mut *self.pending.lock().unwrap())
        }
        fn admitted(&self) {
            self.counters.admitted.fetch_add(1, Ordering::Relaxed);
        }
        fn note(&self, _line: &str) {}
        fn counters(&self) -> &Counters {
            &self.counters
        }
        fn budget(&self) -> &Arc<ProofBudget> {
            &self.budget
        }
    }

    /// Drops a ticket of a one-handshake pool with `deadline`, the pool
    /// still holding it or not; returns (expired, auth timeouts).
    fn drop_ticket(deadline: Instant, still_pending: bool) -> (u64, u64) {
        let pool = Arc::new(OnePool {
            pending: std::sync::Mutex::new(still_pending),
            counters: Counters::default(),
            budget: ProofBudget::new(crate::budget::ProofLimits {
                burst: 1,
                per_second: 1.0,
            }),
        });
        drop(Ticket {
            id: 0,
            shared: pool.clone(),
            deadline,
        });
        (
            count(&pool.counters.expired),
            count(&pool.counters.auth_timeout),
        )
    }

    #[test]
    fn a_handshake_that_ends_past_its_deadline_before_the_sweep_counts_as_expired() {
        // Its own read timed out before the sweep took it (CI saw 24 of 40
        // stalled logins counted): expired and a timed-out login all the same.
        let past = Instant::now() - Duration::from_millis(10);
        assert_eq!(drop_ticket(past, true), (1, 1));
        // The sweep took it first and counted it: not twice.
        assert_eq!(drop_ticket(past, false), (0, 0));
        // Ended before its deadline (the peer hung up): neither.
        assert_eq!(
            drop_ticket(Instant::now() + Duration::from_secs(5), true),
            (0, 0)
        );
    }

    #[test]
    fn counters_tell_each_fate_of_a_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = Settings {
            waiting: Limits {
                capacity: 8,
                per_source: 2,
            },
            handshaking: Limits {
                capacity: 8,
                per_source: 8,
            },
            deadline: Duration::from_secs(1),
            proofs: ProofLimits {
                burst: 10,
                per_second: 10.0,
            },
        };
        let lobby = Lobby::new(listener, Arc::new(Toy), settings);
        let counters = lobby.counters();
        std::thread::spawn(move || lobby.run());
        let connect = |first: &[u8]| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(first).unwrap();
            s
        };

        let _admitted = connect(b"H");
        wait_for(&counters, [1, 1, 0, 0, 0]);
        let _quick = connect(b"Q");
        wait_for(&counters, [2, 1, 0, 0, 0]);
        let _garbage = connect(b"x");
        wait_for(&counters, [3, 1, 0, 0, 1]);
        // Three silent ones from one source with room for two: the oldest
        // is pushed out; the deadline then cuts the other two.
        let silent: Vec<TcpStream> = (0..3).map(|_| connect(b"")).collect();
        wait_for(&counters, [6, 1, 1, 2, 1]);
        // A handshake that never proves itself is cut by the same deadline.
        let _stalled = connect(b"N");
        wait_for(&counters, [7, 1, 1, 3, 1]);
        // Of the expired, only the one that began its handshake failed to
        // authenticate; the silent ones never tried.
        assert_eq!(count(&counters.auth_timeout), 1);
        drop(silent);
    }
}
