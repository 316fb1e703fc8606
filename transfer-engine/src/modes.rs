//! Mode dispatch: which [`DataPlane`] serves a session's mode on each end.
//!
//! This is the one place a new mode hooks in. Memory mode is built in; disk
//! mode lives in src/disk/ ([`crate::disk::plane`]); messages mode (the
//! message-length sweeps) in [`crate::science::msgplane`].

use std::path::PathBuf;
use std::sync::Arc;

use crate::client::SendOptions;
use crate::connection::Connection;
use crate::datapath::{DataPlane, MemoryPlane};
use crate::error::{Error, Result};
use crate::messages::{Mode, SessionRequest};
use crate::session::{PhaseOutcome, Side};

/// The server's plane for a requested session. `root` is `--root`; `conn`
/// is the control connection, between `SessionRequest` and
/// `SessionAccepted` (disk mode reads the manifest and answers the plan).
pub fn server_plane(
    req: &SessionRequest,
    root: &Option<PathBuf>,
    conn: &mut Connection,
    claimant: &crate::disk::claims::Claimant,
) -> Result<Arc<dyn DataPlane>> {
    match req.mode {
        Mode::Memory => Ok(Arc::new(MemoryPlane::from_env()?)),
        Mode::Disk => Ok(crate::disk::plane::server_plane(
            req,
            root.as_deref(),
            conn,
            claimant,
        )?),
        Mode::Messages => Ok(Arc::new(crate::science::msgplane::MessagesPlane::new(req)?)),
    }
}

/// The client's plane for its own request.
pub fn client_plane(req: &SessionRequest, opts: &SendOptions) -> Result<Arc<dyn DataPlane>> {
    match req.mode {
        Mode::Memory => Ok(Arc::new(MemoryPlane::from_env()?)),
        Mode::Disk => {
            if opts.bytes.is_some() || opts.seconds.is_some() {
                return Err(Error::Usage(
                    "--bytes/--time do not apply when PATHs are given (disk mode sends the files)"
                        .into(),
                ));
            }
            let dest = opts.dest.as_deref().unwrap_or("");
            Ok(Arc::new(crate::disk::plane::ClientPlane::new(
                req,
                &opts.paths,
                dest,
                &opts.disk,
            )?))
        }
        Mode::Messages => Ok(Arc::new(crate::science::msgplane::MessagesPlane::new(req)?)),
    }
}

/// The mode's verdict on a finished data phase, on either end: disk mode
/// fails when any file failed (the client exits 1, the server logs the
/// session as failed).
pub fn check_outcome(req: &SessionRequest, side: Side, outcome: &PhaseOutcome) -> Result<()> {
    if req.mode != Mode::Disk {
        return Ok(());
    }
    let (local, remote) = (
        outcome.local.mode_summary.as_ref(),
        outcome.remote.mode_summary.as_ref(),
    );
    // `check` takes the sender's summary first; the client is the sender.
    match side {
        Side::Client => crate::disk::plane::check(local, remote),
        Side::Server => crate::disk::plane::check(remote, local),
    }
}
