//! What every sending client shares, whichever protocol it speaks (the
//! engine's `send`, iperf3's client): how much a stream moves, how a caller
//! watches the run, and when a `--start-at` run begins.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::datapath::PlaneProgress;
use crate::error::{Error, Result};
use crate::stream::StreamStats;

/// How long ago a `--start-at` instant may have passed when the run begins:
/// the orchestrator hands one instant to every sender of a phase, and a
/// sender that starts later than this is out of step with the others.
pub(crate) const START_AT_SLACK: Duration = Duration::from_secs(1);

/// How much a sending stream moves in the modes that have no data of their
/// own to send (memory, messages).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// For this many seconds (`--time`).
    Seconds(f64),
    /// Exactly this many payload bytes per direction, split over the
    /// streams (`--bytes`).
    Bytes(u64),
}

/// A look at a running send, handed to the watcher every period.
pub struct Live<'a> {
    /// This end's streams with their live counters and last TCP_INFO.
    pub streams: &'a [Arc<StreamStats>],
    /// Since the streams started.
    pub elapsed: Duration,
    /// What the mode knows beyond bytes (disk mode: files).
    pub plane: Option<PlaneProgress>,
}

/// How a caller follows a running send: `tick` is called every `every`
/// (TCP_INFO is sampled just before).
pub struct Watch<'a> {
    pub every: Duration,
    pub tick: &'a mut dyn FnMut(&Live<'_>),
}

/// Refuses a `--start-at` instant more than [`START_AT_SLACK`] past: a
/// sender that late would run out of step with its phase.
pub fn check_start_at(start_at: Option<SystemTime>) -> Result<()> {
    if let Some(at) = start_at {
        if let Ok(late) = SystemTime::now().duration_since(at) {
            if late > START_AT_SLACK {
                return Err(Error::Usage(format!(
                    "--start-at {} passed {:.1} s ago; hand the senders a later instant",
                    longhaul_units::rfc3339(at),
                    late.as_secs_f64()
                )));
            }
        }
    }
    Ok(())
}

/// Sleeps until the wall-clock instant `at` (at once if it has passed).
pub fn sleep_until(at: SystemTime) {
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        std::thread::sleep(wait);
    }
}
