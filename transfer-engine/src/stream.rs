//! How a data stream runs, and the live counters it updates.
//!
//! A sending stream sends from its [`Source`], half-closes the socket and
//! waits for the receiver to close its side, which proves every byte
//! arrived. A receiving stream drains its [`Sink`] until end of stream and
//! closes.
//!
//! [`start`] is the boundary between a session and its streams: the session
//! hands over each stream's [`StreamStats`] and [`Work`], and hears of the
//! stream's end through its [`Finished`] callback. Behind it, every stream
//! is a task of the process's data workers ([`crate::workers`]): a few
//! threads, each multiplexing many non-blocking sockets in fair turns, so
//! a stream costs a socket and a few hundred bytes, never a thread.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use longhaul_stats_api::TcpInfo;

use crate::datapath::{Progress, SendBudget, Sink, Source, StreamIo};
use crate::error::{Error, Result};
use crate::limits::SHUTDOWN_TIMEOUT;
use crate::messages::{Role, StreamReport};
use crate::sockopt;
use crate::workers::{self, Task, Turn, Waker};

/// Live state of one stream, shared by its worker, the session loop (which
/// samples TCP_INFO) and the stats API.
#[derive(Debug)]
pub struct StreamStats {
    pub id: u32,
    /// What this end does on the stream.
    pub role: Role,
    pub bytes: AtomicU64,
    pub tcp: Mutex<Option<TcpInfo>>,
    pub socket: Arc<TcpStream>,
    /// The socket's two ends, taken when the stream starts (a closed socket
    /// no longer knows its peer), for the stats API's connection list.
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// Runs the stream's task again; set on its first turn.
    waker: OnceLock<Waker>,
}

impl StreamStats {
    pub fn new(id: u32, role: Role, socket: TcpStream) -> StreamStats {
        StreamStats {
            id,
            role,
            bytes: AtomicU64::new(0),
            tcp: Mutex::new(None),
            local: socket.local_addr().ok(),
            peer: socket.peer_addr().ok(),
            socket: Arc::new(socket),
            waker: OnceLock::new(),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Takes a TCP_INFO sample (kept if the socket still answers).
    pub fn sample(&self) {
        if let Some(info) = sockopt::tcp_info(&*self.socket) {
            *self.tcp.lock().unwrap_or_else(|e| e.into_inner()) = Some(info);
        }
    }

    pub fn last_tcp(&self) -> Option<TcpInfo> {
        *self.tcp.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn report(&self) -> StreamReport {
        StreamReport {
            id: self.id,
            role: self.role,
            bytes: self.bytes(),
            tcp: self.last_tcp(),
        }
    }

    /// Bytes this end moved plus what TCP acknowledged and received on the
    /// socket (headers, keep-alives, control bytes included): it grows while
    /// the stream makes any progress at all.
    pub fn progress(&self) -> u64 {
        self.bytes()
            .wrapping_add(sockopt::tcp_progress(&*self.socket).unwrap_or(0))
    }

    /// Runs the stream's task again soon (it looks at its stop flag).
    pub fn wake(&self) {
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }

    /// Ends the stream when the session fails: its socket is shut down
    /// and its task woken, whatever it waits for.
    pub fn abort(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        self.wake();
    }
}

/// What a stream does.
pub enum Work {
    Send(Box<dyn Source>, SendBudget),
    Receive(Box<dyn Sink>),
}

/// Adds which stream failed to an error's message, keeping its kind. The
/// message already says what was being done ("sending: ..."), so only the
/// stream is added.
fn prefix(err: Error, id: u32) -> Error {
    let what = format!("stream {id}");
    match err {
        Error::Io { context, source } => Error::io(format!("{what}: {context}"), source),
        Error::PeerAborted(m) => Error::PeerAborted(format!("{what}: {m}")),
        Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
        Error::DiskFull(m) => Error::DiskFull(format!("{what}: {m}")),
        Error::Refused(m) => Error::PeerAborted(format!("{what}: {m}")),
        other => other,
    }
}

/// Told a stream's result (payload bytes it moved) when the stream ends.
pub type Finished = Box<dyn FnOnce(Result<u64>) + Send>;

/// Where a stream is in its life.
enum Phase {
    Sending(Box<dyn Source>, SendBudget),
    /// Half-closed after the last byte; the receiver's close is due by the
    /// deadline.
    Closing(Instant),
    Receiving(Box<dyn Sink>),
}

/// Most bytes a sending stream whose socket runs BBR moves in one turn:
/// one memory-mode chunk or disk block, against the workers'
/// [`workers::TURN_BYTES`].
///
/// Chosen by measurement on loopback (2 cores, 2M buffers, alternating
/// 4 s runs; docs/performance.md, "The sending turn"). With BBR, one chunk
/// per turn: 128 streams 88-90 -> 101-102 Gb/s, 1024 streams 77 -> 85-87,
/// CPU per GB 5-10 % lower; 1, 4 and 35 streams the same within noise. The
/// receivers' queues then hold at most about a chunk per socket (with
/// 4 MiB turns up to 4 MB, 25 MB in all at 128 streams). With cubic the
/// 4 MiB turn is the faster one (128 streams 119.5 against 108.7 Gb/s with
/// one chunk, 35 streams the same or worse), though its queues are longer
/// still, so the queue length alone does not explain the difference: only
/// BBR sockets get this turn.
pub const BBR_SEND_TURN: usize = 1 << 20;

/// The turn a sending stream on this socket may take: [`BBR_SEND_TURN`]
/// when its congestion control is BBR (any version), the workers' full
/// turn otherwise. Asked once, when the stream starts (after the session
/// set `--cc`).
fn send_turn(socket: &TcpStream) -> usize {
    match sockopt::get_cc(socket) {
        Some(cc) if cc.starts_with("bbr") => BBR_SEND_TURN,
        _ => usize::MAX,
    }
}

/// Time at its delivery rate that a `--time` stream may keep queued unsent
/// in its socket ([`TimedQueue`]).
const TIMED_QUEUE: Duration = Duration::from_millis(500);
/// The least unsent data a `--time` stream may queue, whatever its rate.
const TIMED_QUEUE_FLOOR: u64 = 64 << 10;
/// What the peer must acknowledge of a `--time` stream's data before its
/// delivery rate is taken for the path's.
const TIMED_QUEUE_MEASURED: u64 = 256 << 10;
/// How often a `--time` stream's cap follows its delivery rate.
const TIMED_QUEUE_EVERY: Duration = Duration::from_millis(200);

/// What a sending stream with a `--time` deadline keeps queued in its
/// socket: at most [`TIMED_QUEUE`] of its delivery rate (less in the last
/// half second: what is left of it), through TCP_NOTSENT_LOWAT.
///
/// Everything a socket holds when the deadline comes still has to cross
/// the path before the receiver's end of stream, so a full 2 MB buffer
/// (4 MB as the kernel sizes it) per stream made `--time 5` with 35 streams
/// through a 100 Mb/s bottleneck last 15 s. A stream whose cap would be
/// the whole buffer or more (loopback, LANs) is left alone: its queue
/// drains in well under the cap anyway.
struct TimedQueue {
    deadline: Instant,
    next: Instant,
    /// The socket's delivery rate counts once the peer has acknowledged
    /// this many bytes: before, it is the rate of the stream's setup
    /// messages, not of the path.
    measured_from: Option<u64>,
    /// The TCP_NOTSENT_LOWAT in force, 0 for none.
    set: u64,
}

impl TimedQueue {
    fn new(sock: &TcpStream, deadline: Instant) -> TimedQueue {
        TimedQueue {
            deadline,
            next: Instant::now(),
            measured_from: sockopt::delivery(sock).map(|(_, acked)| acked + TIMED_QUEUE_MEASURED),
            set: 0,
        }
    }

    /// Follows the delivery rate, every [`TIMED_QUEUE_EVERY`] at most. Until
    /// the peer has acknowledged [`TIMED_QUEUE_MEASURED`] of the stream's
    /// data the cap is [`TIMED_QUEUE_FLOOR`], looked at again every turn: a
    /// stream must not fill its whole buffer before it knows what its path
    /// carries. A socket that refuses the option (it is failing; its next
    /// send says why) is left as it is.
    fn follow(&mut self, sock: &TcpStream) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        let rate = sockopt::delivery(sock)
            .filter(|(rate, acked)| *rate > 0 && Some(*acked) >= self.measured_from)
            .map(|(rate, _)| rate);
        // Read each time: the kernel grows the buffer of a socket whose
        // size was not set (autotuning).
        let sndbuf = sockopt::sndbuf(sock).unwrap_or(usize::MAX) as u64;
        let want = match rate {
            Some(rate) => {
                self.next = now + TIMED_QUEUE_EVERY;
                timed_queue_cap(rate, self.deadline.saturating_duration_since(now), sndbuf)
            }
            None => timed_queue_cap(0, TIMED_QUEUE, sndbuf),
        };
        // Only a real change is worth a system call.
        let worth = want != self.set
            && (want == 0 || self.set == 0 || want.abs_diff(self.set) > self.set / 8);
        if worth && sockopt::set_notsent_lowat(sock, want).is_ok() {
            self.set = want;
        }
    }
}

/// The TCP_NOTSENT_LOWAT for a stream delivering `rate` bytes a second
/// with `left` to its deadline and a `sndbuf`-byte send buffer: 0 (none)
/// when the cap would not be below the buffer.
fn timed_queue_cap(rate: u64, left: Duration, sndbuf: u64) -> u64 {
    let horizon = TIMED_QUEUE.min(left).as_secs_f64();
    let want = ((rate as f64 * horizon) as u64).max(TIMED_QUEUE_FLOOR);
    if want >= sndbuf {
        0
    } else {
        want
    }
}

/// One stream as a task of the data workers.
struct StreamTask {
    stats: Arc<StreamStats>,
    phase: Phase,
    finished: Option<Finished>,
    /// Cap on a sending turn (see [`send_turn`]).
    send_turn: usize,
    /// A `--time` sender's unsent queue (none for other streams).
    timed_queue: Option<TimedQueue>,
}

impl StreamTask {
    fn step(&mut self, turn: &Turn<'_>) -> Result<Progress> {
        let stats = &*self.stats;
        let sock = &*stats.socket;
        let io = StreamIo {
            sock,
            counter: &stats.bytes,
            allowance: match self.phase {
                Phase::Sending(..) => turn.allowance.min(self.send_turn),
                _ => turn.allowance,
            },
            waker: turn.waker(),
        };
        loop {
            match &mut self.phase {
                Phase::Sending(source, budget) => {
                    if let Some(q) = &mut self.timed_queue {
                        q.follow(sock);
                    }
                    let p = source.send(&io, budget)?;
                    if p != Progress::Done {
                        return Ok(p);
                    }
                    stats.sample();
                    sock.shutdown(Shutdown::Write)
                        .map_err(|e| Error::io("half-closing", e))?;
                    self.phase = Phase::Closing(Instant::now() + SHUTDOWN_TIMEOUT);
                }
                Phase::Closing(deadline) => {
                    // Anything the receiver still says is dropped; its
                    // close (EOF) means every byte arrived.
                    let mut buf = [0u8; 256];
                    loop {
                        match (&mut &*sock).read(&mut buf) {
                            Ok(0) => {
                                stats.sample();
                                return Ok(Progress::Done);
                            }
                            Ok(_) => {}
                            Err(e) if crate::datapath::would_block(&e) => break,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                return Err(Error::io("waiting for the receiver to finish", e))
                            }
                        }
                    }
                    if Instant::now() >= *deadline {
                        return Err(Error::Timeout(
                            "waiting for the receiver to finish: no answer in time".into(),
                        ));
                    }
                    return Ok(Progress::Wait {
                        on: workers::Interest::READ,
                        until: Some(*deadline),
                    });
                }
                Phase::Receiving(sink) => {
                    let p = sink.receive(&io)?;
                    if p == Progress::Done {
                        stats.sample();
                        let _ = sock.shutdown(Shutdown::Both);
                    }
                    return Ok(p);
                }
            }
        }
    }

    fn finish(&mut self, result: Result<u64>) {
        if let Some(f) = self.finished.take() {
            f(result);
        }
    }
}

impl Task for StreamTask {
    fn fd(&self) -> RawFd {
        self.stats.socket.as_raw_fd()
    }

    fn turn(&mut self, turn: &Turn<'_>) -> Progress {
        // From its first turn on, aborting the stream wakes it.
        self.stats.waker.get_or_init(|| turn.waker().clone());
        match self.step(turn) {
            Ok(Progress::Done) => {
                let n = self.stats.bytes();
                self.finish(Ok(n));
                Progress::Done
            }
            Ok(p) => p,
            Err(e) => {
                let e = prefix(e, self.stats.id);
                self.finish(Err(e));
                Progress::Done
            }
        }
    }
}

impl Drop for StreamTask {
    /// A stream dropped before it finished (its worker panicked) still
    /// tells its session.
    fn drop(&mut self) {
        let id = self.stats.id;
        self.finish(Err(Error::PeerAborted(format!(
            "stream {id}: the data worker running it failed"
        ))));
    }
}

/// Starts streams on the data workers, all at once: each runs its work and
/// calls its `finished` with the result. The sockets become non-blocking.
pub fn start(streams: Vec<(Arc<StreamStats>, Work, Finished)>) -> Result<()> {
    let pool = workers::pool()?;
    let mut tasks: Vec<Box<dyn Task>> = Vec::with_capacity(streams.len());
    for (stats, work, finished) in streams {
        stats.socket.set_nonblocking(true).map_err(|e| {
            Error::io(
                format!("stream {}: making the socket non-blocking", stats.id),
                e,
            )
        })?;
        let timed_queue = match &work {
            Work::Send(_, budget) => budget.deadline().map(|d| TimedQueue::new(&stats.socket, d)),
            Work::Receive(_) => None,
        };
        let phase = match work {
            Work::Send(source, budget) => Phase::Sending(source, budget),
            Work::Receive(sink) => Phase::Receiving(sink),
        };
        let send_turn = send_turn(&stats.socket);
        tasks.push(Box::new(StreamTask {
            stats,
            phase,
            finished: Some(finished),
            send_turn,
            timed_queue,
        }));
    }
    pool.spawn(tasks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_stream_queues_half_a_second_of_its_rate_and_less_near_its_end() {
        let sndbuf = 4 << 20;
        let far = Duration::from_secs(10);
        // 35 streams sharing 100 Mb/s: 357 kB/s each, half a second queued.
        assert_eq!(timed_queue_cap(357_000, far, sndbuf), 178_500);
        // What is left of the last half second, no more.
        assert_eq!(
            timed_queue_cap(2_000_000, Duration::from_millis(200), sndbuf),
            400_000
        );
        // Never below the floor, even at the deadline or before any rate.
        assert_eq!(timed_queue_cap(10_000, far, sndbuf), TIMED_QUEUE_FLOOR);
        assert_eq!(
            timed_queue_cap(2_000_000, Duration::ZERO, sndbuf),
            TIMED_QUEUE_FLOOR
        );
        assert_eq!(timed_queue_cap(0, TIMED_QUEUE, sndbuf), TIMED_QUEUE_FLOOR);
        // A cap as large as the buffer is none (loopback, LANs).
        assert_eq!(timed_queue_cap(8_400_000, far, sndbuf), 0);
        assert_eq!(timed_queue_cap(100_000_000, far, sndbuf), 0);
    }

    #[test]
    fn the_cap_is_set_on_the_socket_and_lifted_again() {
        let (sock, peer) = longhaul_testkit::loopback_pair();
        // As a session sets it (--buffer 2M): 4 MiB as the kernel sizes it.
        sockopt::set_buffers(&sock, 2 << 20).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut q = TimedQueue::new(&sock, deadline);
        // Nothing acknowledged yet: the floor.
        q.follow(&sock);
        assert_eq!(q.set, TIMED_QUEUE_FLOOR);
        assert_eq!(notsent_lowat(&sock), TIMED_QUEUE_FLOOR as i32);
        // Loopback delivers far more than a buffer's worth in half a
        // second: once measured, the cap is lifted.
        let mut reader = peer.try_clone().unwrap();
        let drain = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
        });
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..4 {
            std::io::Write::write_all(&mut &sock, &chunk).unwrap();
        }
        // The 200 ms between looks.
        std::thread::sleep(TIMED_QUEUE_EVERY);
        q.follow(&sock);
        assert_eq!(q.set, 0);
        assert_eq!(notsent_lowat(&sock), 0);
        sock.shutdown(Shutdown::Both).unwrap();
        drain.join().unwrap();
    }

    fn notsent_lowat(sock: &TcpStream) -> i32 {
        sockopt::getsockopt_int(sock, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT).unwrap()
    }

    #[test]
    fn only_bbr_sockets_send_one_chunk_per_turn() {
        let (sock, _peer) = longhaul_testkit::loopback_pair();
        sockopt::set_cc(&sock, "bbr").expect("this machine has bbr (DESIGN.md)");
        assert_eq!(send_turn(&sock), BBR_SEND_TURN);
        sockopt::set_cc(&sock, "cubic").unwrap();
        assert_eq!(send_turn(&sock), usize::MAX);
        sockopt::set_cc(&sock, "reno").unwrap();
        assert_eq!(send_turn(&sock), usize::MAX);
    }
}
