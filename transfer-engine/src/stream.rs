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
use std::time::Instant;

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

/// One stream as a task of the data workers.
struct StreamTask {
    stats: Arc<StreamStats>,
    phase: Phase,
    finished: Option<Finished>,
    /// Cap on a sending turn (see [`send_turn`]).
    send_turn: usize,
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
        }));
    }
    pool.spawn(tasks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
