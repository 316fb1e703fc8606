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
//! [`SendBudget`] tells a source how much to send: the stream's limit
//! (bytes or time), the shared pacer and the fair start of all streams.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::connection::Connection;
use crate::error::Result;
use crate::pacer::Pacer;

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

/// Makes the sending streams of one end that already moved data pause
/// until every one of them has started sending. A 1024-stream session on
/// a few cores otherwise leaves the scheduler to decide which streams run:
/// the busy ones keep the CPUs and some streams never send a byte.
#[derive(Debug)]
pub struct FairStart {
    not_started: AtomicUsize,
}

/// How long a stream that already sent naps while others have not started.
const FAIR_START_NAP: std::time::Duration = std::time::Duration::from_millis(2);

/// Streams stop waiting for the others after this long, whatever happens
/// (a stream that cannot start in this time is stuck for other reasons).
const FAIR_START_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl FairStart {
    /// A start for `streams` sending streams.
    pub fn new(streams: usize) -> FairStart {
        FairStart {
            not_started: AtomicUsize::new(streams),
        }
    }

    fn started(&self) {
        self.not_started.fetch_sub(1, Ordering::AcqRel);
    }

    fn everyone_started(&self) -> bool {
        self.not_started.load(Ordering::Acquire) == 0
    }
}

/// Everything a [`Source`] needs to know about how much to send.
#[derive(Debug, Clone)]
pub struct SendBudget {
    pub limit: Limit,
    /// Shared in-process pacer of this direction (`--rate`).
    pub pacer: Option<Arc<Pacer>>,
    /// Shared by this end's sending streams; see [`FairStart`].
    pub fair: Option<Arc<FairStart>>,
    /// Whether this stream told `fair` it started.
    pub counted: std::cell::Cell<bool>,
    /// Set when the session fails; sources stop at the next chunk.
    pub stop: Arc<AtomicBool>,
}

impl SendBudget {
    /// The streams started at `start`: a [`Limit::For`] ends then.
    pub fn started_at(&mut self, start: Instant) {
        if let Limit::For(d) = self.limit {
            self.limit = Limit::Until(start + d);
        }
    }

    /// Bytes to send next after `sent` so far (0 = done).
    pub fn next_chunk(&self, sent: u64, max: usize) -> usize {
        if self.stop.load(Ordering::Relaxed) {
            return 0;
        }
        if let Some(fair) = &self.fair {
            if !self.counted.replace(true) {
                fair.started();
            } else {
                self.wait_for_the_others(fair);
            }
        }
        let max = match &self.pacer {
            Some(p) => max.min(p.chunk()),
            None => max,
        };
        match self.limit {
            Limit::Bytes(total) => (total.saturating_sub(sent)).min(max as u64) as usize,
            Limit::Until(deadline) if Instant::now() < deadline => max,
            Limit::Until(_) => 0,
            // Not started: the stream worker calls `started_at` first.
            Limit::For(_) => 0,
        }
    }

    /// Naps while some stream of this end has not sent yet (bounded by the
    /// deadline, the stop flag and [`FAIR_START_MAX_WAIT`]).
    fn wait_for_the_others(&self, fair: &FairStart) {
        let since = Instant::now();
        while !fair.everyone_started()
            && !self.stop.load(Ordering::Relaxed)
            && since.elapsed() < FAIR_START_MAX_WAIT
            && !matches!(self.limit, Limit::Until(d) if Instant::now() >= d)
        {
            std::thread::sleep(FAIR_START_NAP);
        }
    }
}

/// Produces a sending stream's payload.
pub trait Source: Send {
    /// Writes payload to `sock` until the budget says stop, adding every
    /// byte accepted by the kernel to `counter`. Returns the total.
    fn pump(&mut self, sock: &TcpStream, budget: &SendBudget, counter: &AtomicU64) -> Result<u64>;
}

/// Consumes a receiving stream's payload.
pub trait Sink: Send {
    /// Reads from `sock` until end of stream, adding to `counter`. Returns
    /// the total.
    fn drain(&mut self, sock: &TcpStream, counter: &AtomicU64) -> Result<u64>;
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
