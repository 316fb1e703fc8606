//! One worker thread per data stream, and the live counters it updates.
//!
//! A sending worker pumps its [`Source`], half-closes the socket and waits
//! for the receiver to close its side, which proves every byte arrived. A
//! receiving worker drains its [`Sink`] until end of stream and closes.
//! Both report their total through the session's event channel.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use longhaul_stats_api::TcpInfo;

use crate::datapath::{SendBudget, Sink, Source};
use crate::error::{Error, Result};
use crate::messages::{Role, StreamReport};
use crate::session::{Event, SHUTDOWN_TIMEOUT};
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

fn run(stats: &StreamStats, work: Work) -> Result<u64> {
    let sock = &*stats.socket;
    let ctx = |what: &str| format!("stream {}: {what}", stats.id);
    match work {
        Work::Send(mut source, budget) => {
            let n = source
                .pump(sock, &budget, &stats.bytes)
                .map_err(|e| prefix(e, &ctx("sending")))?;
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
                .map_err(|e| prefix(e, &ctx("receiving")))?;
            stats.sample();
            let _ = sock.shutdown(Shutdown::Both);
            Ok(n)
        }
    }
}

/// Adds which stream failed to an error's message, keeping its kind.
fn prefix(err: Error, what: &str) -> Error {
    match err {
        Error::Io { context, source } => Error::io(format!("{what}: {context}"), source),
        Error::PeerAborted(m) => Error::PeerAborted(format!("{what}: {m}")),
        Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
        Error::DiskFull(m) => Error::DiskFull(format!("{what}: {m}")),
        Error::Refused(m) => Error::PeerAborted(format!("{what}: {m}")),
        other => other,
    }
}

/// Starts the worker thread of one stream.
pub fn spawn(stats: Arc<StreamStats>, work: Work, events: Sender<Event>) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("stream-{}", stats.id))
        .spawn(move || {
            let result = run(&stats, work);
            let _ = events.send(Event::Worker {
                id: stats.id,
                result,
            });
        })
        .map_err(|e| Error::io("starting a stream worker", e))
}
