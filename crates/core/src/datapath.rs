//! The data plane interface: what a stream sends, where received bytes go,
//! and what a mode adds to the session around them.
//!
//! A session's mode picks a [`DataPlane`] (the memory plane is in this
//! crate, the others in the engine's `planes` and in `longhaul-disk`),
//! which hands every sending stream a [`Source`] and every receiving stream
//! a [`Sink`]. The plane also owns everything else that is particular to its mode, so the
//! session, the client and the server never ask which mode they run: its
//! negotiation on the control connection, its summary in `Done`, its fields
//! of the final report ([`ModeReport`]), its verdict on a finished session
//! ([`DataPlane::check`]), its device counters for the stats API and its
//! progress for the client's display.
//!
//! Sources and sinks never block: the data workers ([`crate::workers`])
//! call them in turns, each on a non-blocking socket, and a turn ends with
//! a [`Progress`] (wait for the socket, for a time or for a [`Waker`];
//! yield; done). [`SendBudget`] tells a source how much it may send: the
//! stream's limit (bytes or time) and the shared pacer.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::connection::Connection;
use crate::error::Result;
use crate::pacer::Pacer;
use crate::sockopt;
pub use crate::workers::{Interest, Progress, Waker};

/// When a sending stream stops.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    /// Exactly this many payload bytes.
    Bytes(u64),
    /// For this long after the session's streams start (`--time`); turned
    /// into [`Limit::Until`] by [`SendBudget::started_at`].
    For(std::time::Duration),
    /// Until this instant.
    Until(Instant),
}

/// What a source may send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Up to this many bytes.
    Send(usize),
    /// Nothing before this instant (the pacer's slot, or the deadline).
    WaitUntil(Instant),
    /// Nothing more: the limit is reached, or the session stopped.
    Done,
    /// Not now: the socket holds all the unsent data the stream may queue
    /// (a `--time` stream's cap, see [`SendBudget::set_queue_room`]); wait
    /// until it is writable.
    Full,
}

/// Everything a [`Source`] needs to know about how much to send.
#[derive(Debug, Clone)]
pub struct SendBudget {
    pub limit: Limit,
    /// Shared in-process pacer of this direction (`--rate`).
    pub(crate) pacer: Option<Arc<Pacer>>,
    /// Set when the session fails; sources stop at their next grant.
    pub(crate) stop: Arc<AtomicBool>,
    /// Bytes the pacer granted that are not sent yet, and from when.
    credit: usize,
    credit_from: Option<Instant>,
    /// Unsent bytes the socket may still take this turn, if capped.
    queue_room: Option<usize>,
}

impl SendBudget {
    pub fn new(limit: Limit, pacer: Option<Arc<Pacer>>, stop: Arc<AtomicBool>) -> SendBudget {
        SendBudget {
            limit,
            pacer,
            stop,
            credit: 0,
            credit_from: None,
            queue_room: None,
        }
    }

    /// Caps what [`Self::grant`] lets out this turn at `room` more unsent
    /// bytes in the socket (`None`: no cap). The kernel's own cap,
    /// TCP_NOTSENT_LOWAT, only stops a write from starting a new packet
    /// buffer: the last one still takes up to a whole GSO packet (64 KiB),
    /// so 1024 slow streams with a 64 KiB cap held 80 MB, not 64.
    pub(crate) fn set_queue_room(&mut self, room: Option<usize>) {
        self.queue_room = room;
    }

    /// The streams started at `start`: a [`Limit::For`] ends then.
    pub fn started_at(&mut self, start: Instant) {
        if let Limit::For(d) = self.limit {
            self.limit = Limit::Until(start + d);
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The `--time` deadline: a stream waiting for its socket looks again
    /// then, even if the socket stays full.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.limit {
            Limit::Until(d) => Some(d),
            _ => None,
        }
    }

    /// How much to send next after `sent` so far, at most `max`.
    pub fn grant(&mut self, sent: u64, max: usize) -> Grant {
        if self.stopped() {
            return Grant::Done;
        }
        let max = match self.limit {
            Limit::Bytes(total) => match total.saturating_sub(sent) {
                0 => return Grant::Done,
                left => left.min(max as u64) as usize,
            },
            Limit::Until(deadline) if Instant::now() < deadline => max,
            Limit::Until(_) => return Grant::Done,
            // Not started: the stream calls `started_at` first.
            Limit::For(_) => return Grant::Done,
        };
        let max = match self.queue_room {
            Some(0) => return Grant::Full,
            Some(room) => max.min(room),
            None => max,
        };
        self.pace(max)
    }

    /// How much of `max` bytes the pacer lets out now, whatever the limit
    /// (disk mode sends its files, not an amount).
    pub fn pace(&mut self, mut max: usize) -> Grant {
        if self.stopped() {
            return Grant::Done;
        }
        if let Some(p) = &self.pacer {
            if self.credit == 0 {
                let chunk = p.chunk();
                self.credit_from = Some(p.reserve(chunk));
                self.credit = chunk;
            }
            if let Some(from) = self.credit_from {
                if from > Instant::now() {
                    let until = self.deadline().map_or(from, |d| d.min(from));
                    return Grant::WaitUntil(until);
                }
            }
            max = max.min(self.credit);
        }
        Grant::Send(max)
    }

    /// `n` of the granted bytes went out.
    pub fn spent(&mut self, n: usize) {
        self.credit = self.credit.saturating_sub(n);
        if let Some(room) = &mut self.queue_room {
            *room = room.saturating_sub(n);
        }
    }

    /// How a source that would block on its socket waits: for the socket
    /// to become writable, or the deadline.
    pub fn until_writable(&self) -> Progress {
        Progress::Wait {
            on: Interest::WRITE,
            until: self.deadline(),
        }
    }
}

/// A stream's socket and counter, as one turn of its source or sink sees
/// them.
pub struct StreamIo<'a> {
    /// Non-blocking.
    pub sock: &'a TcpStream,
    /// The stream's live byte counter: add every payload byte moved.
    pub(crate) counter: &'a AtomicU64,
    /// Bytes this turn may move before it yields.
    pub allowance: usize,
    /// Wakes the stream; for whatever it waits for besides the socket.
    pub waker: &'a Waker,
}

impl StreamIo<'_> {
    /// Counts `n` payload bytes moved.
    pub fn moved(&self, n: u64) {
        self.counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Batched wake-ups for a fast receiving stream.
///
/// By default a receiving socket is readable as soon as one segment is
/// queued, so a stream moving gigabytes a second wakes its worker (on
/// loopback and in VMs an IPI each) for every 64 KiB. While a stream is
/// fast, its sink sets SO_RCVLOWAT to [`RecvBatching::BATCH`]: the kernel
/// wakes it once a batch is queued, at end of stream, or when the receive
/// window is about to close. Measured on loopback (docs/performance.md):
/// fewer wake-ups leave the sending side's core to the copy, 1 stream
/// 37 -> 53 Gb/s and 35 streams 65 -> 100 Gb/s, at less CPU per GB.
///
/// Batching is on only while it can neither slow the stream nor hide it:
/// - it turns on when the stream received a batch within one
///   [`RecvBatching::WINDOW`] (20 MB/s), and off below a quarter of that;
/// - the batch must fit in the receive buffer beside the bandwidth-delay
///   product (rate x the handshake's round trip): unread bytes shrink the
///   window that a sender on a long path needs, so such streams (the WAN
///   campaigns) are not batched;
/// - while it is on, the sink also wakes after [`RecvBatching::LATEST`]
///   without a batch and takes what is queued: a stream that slows down
///   or stalls is counted within that time, and turns batching off.
#[derive(Debug)]
pub(crate) struct RecvBatching {
    on: bool,
    since: Instant,
    bytes: u64,
}

impl Default for RecvBatching {
    fn default() -> Self {
        RecvBatching::new()
    }
}

impl RecvBatching {
    /// Bytes queued before a batching socket is readable.
    pub(crate) const BATCH: usize = 1 << 20;
    /// How often the rate is judged.
    pub(crate) const WINDOW: Duration = Duration::from_millis(50);
    /// The longest a batching stream waits before it takes what is queued.
    pub(crate) const LATEST: Duration = Duration::from_millis(100);

    pub(crate) fn new() -> RecvBatching {
        RecvBatching {
            on: false,
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Whether SO_RCVLOWAT is at [`Self::BATCH`] now.
    #[cfg(test)]
    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// The sink received `moved` bytes since its last call and now waits
    /// for more: judges the rate once per window, sets SO_RCVLOWAT when
    /// batching turns on or off, and says how to wait.
    pub(crate) fn wait(&mut self, sock: &TcpStream, moved: usize) -> Progress {
        let now = Instant::now();
        self.bytes += moved as u64;
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Self::WINDOW {
            let want = self.worth_it(sock, elapsed);
            if want != self.on {
                let lowat = if want { Self::BATCH } else { 1 };
                // A socket that refuses keeps the default: correct, slower.
                if sockopt::set_rcvlowat(sock, lowat).is_ok() {
                    self.on = want;
                }
            }
            self.since = now;
            self.bytes = 0;
        }
        Progress::Wait {
            on: Interest::READ,
            until: self.on.then(|| now + Self::LATEST),
        }
    }

    fn worth_it(&self, sock: &TcpStream, elapsed: Duration) -> bool {
        let window = Self::WINDOW.as_secs_f64();
        let rate = self.bytes as f64 / elapsed.as_secs_f64();
        // On at a batch per window, off below a quarter of one: a stream
        // near the line does not flip every window.
        let needed = if self.on {
            Self::BATCH / 4
        } else {
            Self::BATCH
        };
        if rate * window < needed as f64 {
            return false;
        }
        let (Some(rcvbuf), Some(rtt_us)) = (sockopt::rcvbuf(sock), sockopt::rtt_us(sock)) else {
            return false;
        };
        let in_flight = rate * f64::from(rtt_us) / 1e6;
        in_flight + (Self::BATCH as f64) <= (rcvbuf / 2) as f64
    }
}

/// Produces a sending stream's payload.
pub trait Source: Send {
    /// Sends for one turn; [`Progress::Done`] once the budget says stop (the
    /// stream then half-closes the socket).
    fn send(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress>;
}

/// Consumes a receiving stream's payload.
pub trait Sink: Send {
    /// Receives for one turn; [`Progress::Done`] at the end of the stream.
    fn receive(&mut self, io: &StreamIo<'_>) -> Result<Progress>;
}

/// Whether an I/O error only means the non-blocking socket is not ready.
pub fn would_block(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
}

/// One end's data plane of one session: a factory of sources and sinks
/// plus everything particular to its mode (see the module documentation).
pub trait DataPlane: Send + Sync {
    fn source(&self, stream_id: u32) -> Result<Box<dyn Source>>;
    fn sink(&self, stream_id: u32) -> Result<Box<dyn Sink>>;
    /// Called on each end once its workers are done; the value is sent to
    /// the peer in `Done::mode_summary` (disk mode: files verified, failed,
    /// device counters).
    fn summary(&self) -> Result<Option<Value>> {
        Ok(None)
    }
    /// Client only: `SessionRequest::mode_params` of this mode.
    fn mode_params(&self) -> Option<Value> {
        None
    }
    /// Client only: runs after `SessionRequest` is sent and before
    /// `SessionAccepted` is read (disk mode: manifest out, plan in).
    fn negotiate(&self, _conn: &mut Connection) -> Result<()> {
        Ok(())
    }
    /// Per-device IO counters for the stats API (disk mode).
    fn devices(&self) -> Vec<Arc<dyn DeviceCounters>> {
        Vec::new()
    }
    /// The mode's fields of the client's final report, from this end's
    /// summary (`local`) and the peer's (`remote`).
    fn report(&self, _local: Option<&Value>, _remote: Option<&Value>) -> ModeReport {
        ModeReport::default()
    }
    /// The mode's verdict on a finished data phase, from both ends'
    /// summaries: disk mode fails when any file failed (the client exits 1,
    /// the server logs the session as failed).
    fn check(&self, _local: Option<&Value>, _remote: Option<&Value>) -> Result<()> {
        Ok(())
    }
    /// Whether a stream may move no bytes at all in a good session (disk
    /// mode with fewer files than streams); otherwise idle streams are
    /// warned about, or fail the run with `--strict`.
    fn idle_streams_are_normal(&self) -> bool {
        false
    }
    /// Progress beyond bytes, for the client's display (disk mode: files).
    fn progress(&self) -> Option<PlaneProgress> {
        None
    }
}

/// Live IO counters of one device, as the stats API shows them.
pub trait DeviceCounters: Send + Sync + std::fmt::Debug {
    fn snapshot(&self) -> longhaul_stats_api::DeviceIo;
}

/// A mode's fields of the final report (DESIGN.md: `files` in disk mode)
/// and the lines it adds to the human summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeReport {
    /// Disk mode: counts, bytes, verified, failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<Value>,
    /// Disk mode: per-device IO of both ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Value>,
    /// Messages mode: both ends' message counts, latencies, CPU per message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Value>,
    /// `--protocol iperf3`: both ends' iperf3 results blocks, the server's
    /// own figures among them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iperf3: Option<Value>,
    /// Extra lines of the human summary, each starting with a newline.
    #[serde(skip)]
    pub human: String,
}

/// What a plane knows of its progress beyond bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlaneProgress {
    /// Payload bytes this end will send in all, when known in advance.
    pub bytes_total: Option<u64>,
    pub files_done: u64,
    pub files_total: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn rcvlowat(sock: &TcpStream) -> i32 {
        sockopt::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT).unwrap()
    }

    /// Waits for readability as a worker would for `progress`: until the
    /// socket is readable (SO_RCVLOWAT applies) or its timer.
    fn wait_as_told(sock: &TcpStream, progress: &Progress) {
        let Progress::Wait { on, until } = progress else {
            panic!("a sink that drained its socket waits, got {progress:?}");
        };
        assert_eq!(*on, Interest::READ);
        let timeout = until.map_or(5_000, |t| {
            t.saturating_duration_since(Instant::now()).as_millis() as i32 + 1
        });
        let mut fds = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        unsafe { libc::poll(&mut fds, 1, timeout) };
    }

    #[test]
    fn the_queue_room_caps_grants_and_says_full_when_spent() {
        let mut b = SendBudget::new(
            Limit::Bytes(1 << 30),
            None,
            Arc::new(AtomicBool::new(false)),
        );
        assert_eq!(b.grant(0, 1 << 20), Grant::Send(1 << 20));
        b.set_queue_room(Some(5000));
        assert_eq!(b.grant(0, 1 << 20), Grant::Send(5000));
        b.spent(3000);
        assert_eq!(b.grant(3000, 1 << 20), Grant::Send(2000));
        b.spent(2000);
        assert_eq!(b.grant(5000, 1 << 20), Grant::Full);
        // The limit still ends the stream first.
        let mut done = SendBudget::new(Limit::Bytes(10), None, Arc::new(AtomicBool::new(false)));
        done.set_queue_room(Some(0));
        assert_eq!(done.grant(10, 100), Grant::Done);
        b.set_queue_room(None);
        assert_eq!(b.grant(5000, 1 << 20), Grant::Send(1 << 20));
    }

    #[test]
    fn a_fast_stream_is_batched_and_a_slowed_one_is_still_seen_promptly() {
        const TRICKLE: usize = 1000;
        const TRICKLES: usize = 50;
        let (mut tx, mut rx) = longhaul_testkit::loopback_pair();
        sockopt::set_buffers(&tx, 2 << 20).unwrap();
        sockopt::set_buffers(&rx, 2 << 20).unwrap();
        rx.set_nonblocking(true).unwrap();
        let writer = std::thread::spawn(move || {
            // Fast for 300 ms, then 1000 bytes every 10 ms, then quiet for
            // a second before the end of stream (which wakes a reader
            // regardless of SO_RCVLOWAT).
            let chunk = vec![7u8; 1 << 20];
            let start = Instant::now();
            let mut fast = 0;
            while start.elapsed() < Duration::from_millis(300) {
                tx.write_all(&chunk).unwrap();
                fast += chunk.len();
            }
            let mut last = Instant::now();
            for _ in 0..TRICKLES {
                std::thread::sleep(Duration::from_millis(10));
                tx.write_all(&chunk[..TRICKLE]).unwrap();
                last = Instant::now();
            }
            std::thread::sleep(Duration::from_secs(1));
            (fast, last)
        });
        let mut batching = RecvBatching::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        let mut seen = Vec::new();
        let mut lowat_while_on = None;
        loop {
            let mut moved = 0;
            let eof = loop {
                match rx.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(n) => moved += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                    Err(e) => panic!("{e}"),
                }
            };
            total += moved;
            if moved > 0 {
                seen.push((Instant::now(), total));
            }
            if eof {
                break;
            }
            let progress = batching.wait(&rx, moved);
            if batching.is_on() && lowat_while_on.is_none() {
                lowat_while_on = Some(rcvlowat(&rx));
            }
            wait_as_told(&rx, &progress);
        }
        let (fast, last_write) = writer.join().unwrap();
        assert_eq!(total, fast + TRICKLE * TRICKLES);
        assert_eq!(
            lowat_while_on,
            Some(RecvBatching::BATCH as i32),
            "a loopback stream of {fast} bytes in 300 ms was never batched"
        );
        assert!(!batching.is_on(), "batching stayed on for a trickle");
        assert_eq!(rcvlowat(&rx), 1);
        // Every byte of the trickle was read soon after it was written: no
        // byte waited for a batch that would never fill.
        let all = seen.iter().find(|(_, t)| *t == total).unwrap().0;
        let late = all.saturating_duration_since(last_write);
        assert!(
            late < RecvBatching::LATEST + Duration::from_millis(50),
            "the trickle's last byte was read {late:?} after it was written"
        );
    }
}
