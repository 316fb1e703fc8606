//! The data plane interface: what a stream sends, where received bytes go,
//! and what a mode adds to the session around them.
//!
//! A session's mode picks a [`DataPlane`] (the planes live in
//! [`crate::planes`]), which hands every sending stream a [`Source`] and
//! every receiving stream a [`Sink`]. The plane also owns everything else
//! that is particular to its mode, so the session, the client and the
//! server never ask which mode they run: its negotiation on the control
//! connection, its summary in `Done`, its fields of the final report
//! ([`ModeReport`]), its verdict on a finished session ([`DataPlane::check`]),
//! its device counters for the stats API and its progress for the client's
//! display.
//!
//! Sources and sinks never block: the data workers ([`crate::workers`])
//! call them in turns, each on a non-blocking socket, and a turn ends with
//! a [`Progress`] (wait for the socket, for a time or for a [`Waker`];
//! yield; done). [`SendBudget`] tells a source how much it may send: the
//! stream's limit (bytes or time) and the shared pacer.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::connection::Connection;
use crate::error::Result;
use crate::pacer::Pacer;
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
}

/// Everything a [`Source`] needs to know about how much to send.
#[derive(Debug, Clone)]
pub struct SendBudget {
    pub limit: Limit,
    /// Shared in-process pacer of this direction (`--rate`).
    pub pacer: Option<Arc<Pacer>>,
    /// Set when the session fails; sources stop at their next grant.
    pub stop: Arc<AtomicBool>,
    /// Bytes the pacer granted that are not sent yet, and from when.
    credit: usize,
    credit_from: Option<Instant>,
}

impl SendBudget {
    pub fn new(limit: Limit, pacer: Option<Arc<Pacer>>, stop: Arc<AtomicBool>) -> SendBudget {
        SendBudget {
            limit,
            pacer,
            stop,
            credit: 0,
            credit_from: None,
        }
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
    pub fn deadline(&self) -> Option<Instant> {
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
    pub counter: &'a AtomicU64,
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
