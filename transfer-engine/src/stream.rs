//! How a data stream runs, and the live counters it updates.
//!
//! A sending stream pumps its [`Source`], half-closes the socket and waits
//! for the receiver to close its side, which proves every byte arrived. A
//! receiving stream drains its [`Sink`] until end of stream and closes.
//!
//! [`start`] is the boundary between a session and its streams: the session
//! hands over each stream's [`StreamStats`] and [`Work`], and hears of the
//! stream's end through its [`Finished`] callback. Today every stream is a
//! thread of its own; a data path that multiplexes sockets on a few
//! per-core workers replaces what happens behind [`start`] and leaves the
//! session as it is (docs/architecture.md).

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use longhaul_stats_api::TcpInfo;

use crate::datapath::{SendBudget, Sink, Source};
use crate::error::{Error, Result};
use crate::limits::SHUTDOWN_TIMEOUT;
use crate::messages::{Role, StreamReport};
use crate::sockopt;

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

    /// Unblocks the worker when the session fails.
    pub fn abort(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

/// What a worker does.
pub enum Work {
    Send(Box<dyn Source>, SendBudget),
    Receive(Box<dyn Sink>),
}

/// Holds a session's stream workers until every one of them exists, then
/// lets them all go at the same instant, which is also when `--time`
/// starts. Without it the first workers would saturate the CPUs while the
/// session thread is still starting the others, and on a busy machine the
/// last hundreds of a 1024-stream session would start after the deadline
/// and move nothing.
///
/// The waiters sleep on a futex that `open` wakes in one system call: woken
/// one by one (a condition variable's mutex, or unparking in a loop), the
/// first woken streams preempt the waker and the tail of a 1024-stream
/// session is woken seconds late, which starves it just the same.
#[derive(Debug, Default)]
pub struct StartGate {
    /// 0 while closed, 1 once open.
    state: AtomicU32,
    start: OnceLock<Instant>,
}

impl StartGate {
    /// Opens the gate (once; later calls return the same instant).
    pub fn open(&self) -> Instant {
        let t = *self.start.get_or_init(Instant::now);
        self.state.store(1, Ordering::Release);
        futex_wake_all(&self.state);
        t
    }

    /// Waits until the gate opens; returns when it did.
    pub fn wait(&self) -> Instant {
        while self.state.load(Ordering::Acquire) == 0 {
            futex_wait(&self.state, 0);
        }
        *self.start.get().expect("set before the gate opens")
    }
}

/// Sleeps while `*word == expected` (or until a spurious wake-up).
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which lives
    // across the call; a null timeout waits indefinitely.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes every thread sleeping on `word`, in one system call.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

fn run(stats: &StreamStats, work: Work, gate: &StartGate) -> Result<u64> {
    let sock = &*stats.socket;
    let ctx = |what: &str| format!("stream {}: {what}", stats.id);
    let start = gate.wait();
    match work {
        Work::Send(mut source, mut budget) => {
            budget.started_at(start);
            let n = source
                .pump(sock, &budget, &stats.bytes)
                .map_err(|e| prefix(e, stats.id))?;
            stats.sample();
            sock.shutdown(Shutdown::Write)
                .map_err(|e| Error::io(ctx("half-closing"), e))?;
            // Wait for the receiver to close: all data delivered.
            let _ = sock.set_read_timeout(Some(SHUTDOWN_TIMEOUT));
            let mut buf = [0u8; 64];
            loop {
                match (&*sock).read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io(ctx("waiting for the receiver to finish"), e)),
                }
            }
            stats.sample();
            Ok(n)
        }
        Work::Receive(mut sink) => {
            let n = sink
                .drain(sock, &stats.bytes)
                .map_err(|e| prefix(e, stats.id))?;
            stats.sample();
            let _ = sock.shutdown(Shutdown::Both);
            Ok(n)
        }
    }
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

/// Starts one stream: it waits at `gate`, runs its work and calls
/// `finished` with the result.
pub fn start(
    stats: Arc<StreamStats>,
    work: Work,
    gate: Arc<StartGate>,
    finished: Finished,
) -> Result<()> {
    std::thread::Builder::new()
        .name(format!("stream-{}", stats.id))
        .spawn(move || finished(run(&stats, work, &gate)))
        .map(drop)
        .map_err(|e| Error::io("starting a stream worker", e))
}
