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
    pub(crate) bytes: AtomicU64,
    pub(crate) tcp: Mutex<Option<TcpInfo>>,
    pub socket: Arc<TcpStream>,
    /// The socket's two ends, taken when the stream starts (a closed socket
    /// no longer knows its peer), for the stats API's connection list.
    pub(crate) local: Option<SocketAddr>,
    pub(crate) peer: Option<SocketAddr>,
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

    pub(crate) fn report(&self) -> StreamReport {
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
pub(crate) const BBR_SEND_TURN: usize = 1 << 20;

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
/// The unsent data a `--time` stream may queue before its rate is known
/// (less when `--rate` already says: half a second of its share).
const TIMED_QUEUE_FLOOR: u64 = 64 << 10;
/// The least unsent data a `--time` stream may queue once its rate is
/// known, however slow it is. Every stream holds at least this much when
/// the deadline comes, so it bounds the tail of many slow streams: 1024
/// streams sharing 100 Mb/s leave 8 MiB, under 0.7 s of the path.
const TIMED_QUEUE_MEASURED_FLOOR: u64 = 8 << 10;
/// What the peer must acknowledge of a `--time` stream's data before its
/// rate is taken for the path's...
const TIMED_QUEUE_MEASURED: u64 = 256 << 10;
/// ...or how long the stream must have run: a stream whose share of a slow
/// path is under 256 KiB a second is measured after this long.
const TIMED_QUEUE_MEASURED_AFTER: Duration = Duration::from_secs(1);
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
///
/// The delivery rate is the stream's own: the bytes the peer acknowledged
/// over the last look's [`TIMED_QUEUE_EVERY`] (over the whole stream for
/// the first look), or a faster window's, fading by a fifth a look. The
/// kernel's tcpi_delivery_rate is one sample of the last round trip; a
/// stream sharing a bottleneck with many others sees samples up to the
/// whole path's rate, which lifted the caps of 128 streams through
/// 100 Mb/s to 20 MB in all (1.6 s of the path).
struct TimedQueue {
    deadline: Instant,
    next: Instant,
    /// When the stream started and what the peer had acknowledged then:
    /// until it acknowledged [`TIMED_QUEUE_MEASURED`] more, or ran for
    /// [`TIMED_QUEUE_MEASURED_AFTER`], its rate is that of its setup
    /// messages and slow start, not of the path.
    started: (Instant, u64),
    /// The start of the window the next rate is taken over.
    window: (Instant, u64),
    /// The cap until the stream is measured.
    unmeasured: u64,
    /// The delivery rate the cap follows, bytes a second.
    rate: u64,
    /// The TCP_NOTSENT_LOWAT in force, 0 for none.
    set: u64,
}

impl TimedQueue {
    fn new(sock: &TcpStream, deadline: Instant) -> TimedQueue {
        TimedQueue::new_at(sock, deadline, Instant::now())
    }

    /// As [`Self::new`], the stream starting at `now`.
    fn new_at(sock: &TcpStream, deadline: Instant, now: Instant) -> TimedQueue {
        let start = (now, sockopt::bytes_acked(sock).unwrap_or(0));
        // A paced stream (`--rate`: SO_MAX_PACING_RATE is its share) never
        // goes faster than that share.
        let unmeasured = match sockopt::max_pacing_rate(sock) {
            Some(rate) => timed_queue_cap(rate, TIMED_QUEUE, u64::MAX, TIMED_QUEUE_MEASURED_FLOOR)
                .min(TIMED_QUEUE_FLOOR),
            None => TIMED_QUEUE_FLOOR,
        };
        TimedQueue {
            deadline,
            next: now,
            started: start,
            window: start,
            unmeasured,
            rate: 0,
            set: 0,
        }
    }

    /// Follows the delivery rate, every [`TIMED_QUEUE_EVERY`] at most. Until
    /// the stream is measured the cap is [`TIMED_QUEUE_FLOOR`] (or half a
    /// second of its `--rate` share, if less), looked at again every turn:
    /// a stream must not fill its whole buffer before it knows what its
    /// path carries. A socket that refuses the option (it is failing; its
    /// next send says why) is left as it is.
    fn follow(&mut self, sock: &TcpStream) {
        self.follow_at(sock, Instant::now());
    }

    fn follow_at(&mut self, sock: &TcpStream, now: Instant) {
        if now < self.next {
            return;
        }
        let Some(acked) = sockopt::bytes_acked(sock) else {
            return;
        };
        let (start, start_acked) = self.started;
        let measured = acked.saturating_sub(start_acked) >= TIMED_QUEUE_MEASURED
            || now.saturating_duration_since(start) >= TIMED_QUEUE_MEASURED_AFTER;
        // Read each time: the kernel grows the buffer of a socket whose
        // size was not set (autotuning).
        let sndbuf = sockopt::sndbuf(sock).unwrap_or(usize::MAX) as u64;
        let want = if measured {
            let (from, from_acked) = self.window;
            let span = now.saturating_duration_since(from).as_secs_f64();
            let rate = if span > 0.0 {
                (acked.saturating_sub(from_acked) as f64 / span) as u64
            } else {
                0
            };
            // A dip of one window (BBR's ProbeRTT drains the pipe for
            // 200 ms every 10 s) must not shrink the queue the stream
            // needs right after it: the rate is the best window's,
            // fading by a fifth a window.
            self.rate = rate.max(self.rate - self.rate / 5);
            self.window = (now, acked);
            self.next = now + TIMED_QUEUE_EVERY;
            timed_queue_cap(
                self.rate,
                self.deadline.saturating_duration_since(now),
                sndbuf,
                TIMED_QUEUE_MEASURED_FLOOR,
            )
        } else {
            timed_queue_cap(0, TIMED_QUEUE, sndbuf, self.unmeasured)
        };
        // Only a real change is worth a system call.
        let worth = want != self.set
            && (want == 0 || self.set == 0 || want.abs_diff(self.set) > self.set / 8);
        if worth && sockopt::set_notsent_lowat(sock, want).is_ok() {
            self.set = want;
        }
    }

    /// Unsent bytes the socket may still take under the cap in force
    /// (`None`: no cap, or the socket cannot say).
    fn room(&self, sock: &TcpStream) -> Option<usize> {
        if self.set == 0 {
            return None;
        }
        let queued = sockopt::notsent(sock)?;
        Some(self.set.saturating_sub(queued) as usize)
    }
}

/// The TCP_NOTSENT_LOWAT for a stream delivering `rate` bytes a second
/// with `left` to its deadline and a `sndbuf`-byte send buffer, never
/// below `floor`: 0 (none) when the cap would not be below the buffer.
fn timed_queue_cap(rate: u64, left: Duration, sndbuf: u64, floor: u64) -> u64 {
    let horizon = TIMED_QUEUE.min(left).as_secs_f64();
    let want = ((rate as f64 * horizon) as u64).max(floor);
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
                        budget.set_queue_room(q.room(sock));
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
        let floor = TIMED_QUEUE_MEASURED_FLOOR;
        // 35 streams sharing 100 Mb/s: 357 kB/s each, half a second queued.
        assert_eq!(timed_queue_cap(357_000, far, sndbuf, floor), 178_500);
        // What is left of the last half second, no more.
        assert_eq!(
            timed_queue_cap(2_000_000, Duration::from_millis(200), sndbuf, floor),
            400_000
        );
        // Never below the floor, even at the deadline or before any rate.
        assert_eq!(timed_queue_cap(10_000, far, sndbuf, floor), floor);
        assert_eq!(
            timed_queue_cap(2_000_000, Duration::ZERO, sndbuf, floor),
            floor
        );
        assert_eq!(
            timed_queue_cap(0, TIMED_QUEUE, sndbuf, TIMED_QUEUE_FLOOR),
            TIMED_QUEUE_FLOOR
        );
        // 1024 streams sharing 100 Mb/s: 12 kB/s each, 6 kB would do; the
        // floor is what all of them leave at the deadline, 8 MiB in all.
        assert_eq!(timed_queue_cap(12_200, far, sndbuf, floor), 8 << 10);
        // A cap as large as the buffer is none (loopback, LANs).
        assert_eq!(timed_queue_cap(8_400_000, far, sndbuf, floor), 0);
        assert_eq!(timed_queue_cap(100_000_000, far, sndbuf, floor), 0);
    }

    #[test]
    fn a_slow_stream_is_measured_after_a_second_by_what_its_peer_acknowledged() {
        let (sock, peer) = longhaul_testkit::loopback_pair();
        sockopt::set_buffers(&sock, 2 << 20).unwrap();
        let t0 = Instant::now();
        let mut q = TimedQueue::new_at(&sock, t0 + Duration::from_secs(60), t0);
        // 40 kB, well under the 256 KiB that would measure it: the peer's
        // kernel acknowledges them (nobody needs to read them).
        std::io::Write::write_all(&mut &sock, &[1u8; 40_000]).unwrap();
        wait_acked(&sock, 40_000);
        // Not measured yet: the floor of an unknown path.
        q.follow_at(&sock, t0 + Duration::from_millis(900));
        assert_eq!(q.set, TIMED_QUEUE_FLOOR);
        // After a second: 40 kB in 1.6 s is 25 kB/s, half a second of it.
        q.follow_at(&sock, t0 + Duration::from_millis(1600));
        assert_eq!(q.set, 12_500);
        assert_eq!(notsent_lowat(&sock), 12_500);
        // Looked at again only after TIMED_QUEUE_EVERY...
        q.follow_at(&sock, t0 + Duration::from_millis(1700));
        assert_eq!(q.set, 12_500);
        // ...then over that window alone: nothing acknowledged in it, so
        // the faster window's rate, a fifth less (20 kB/s)...
        q.follow_at(&sock, t0 + Duration::from_millis(1800));
        assert_eq!(q.set, 10_000);
        // ...and less each empty window, down to the floor of a measured
        // stream (16 kB/s would be 8 kB).
        q.follow_at(&sock, t0 + Duration::from_millis(2000));
        assert_eq!(q.set, TIMED_QUEUE_MEASURED_FLOOR);
        assert_eq!(notsent_lowat(&sock), TIMED_QUEUE_MEASURED_FLOOR as i32);
        drop(peer);
    }

    fn wait_acked(sock: &TcpStream, bytes: u64) {
        let until = Instant::now() + Duration::from_secs(5);
        while sockopt::bytes_acked(sock).unwrap() < bytes {
            assert!(Instant::now() < until, "{bytes} bytes never acknowledged");
            std::thread::sleep(Duration::from_millis(1));
        }
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
