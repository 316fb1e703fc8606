//! The data planes, one per mode, and the one place a mode is chosen.
//!
//! - `memory`: memory to memory, a pattern out and nothing kept.
//! - `disk`: files and trees, read per device, verified and resumable.
//! - `messages`: fixed-length messages, request/response or streaming
//!   (the message-length sweeps of `longhaul sweep`).
//!
//! Each is a `DataPlane`, which owns everything particular to its mode
//! (see `crate::datapath`). A new mode is a new plane here, a `Mode`
//! variant on the wire and a `Payload` variant for the client.

pub mod messages;

pub(crate) use longhaul_core::memory_plane as memory;
pub use longhaul_disk as disk;

/// How much a stream moves in memory and messages mode.
pub use crate::sending::Amount;

use std::path::PathBuf;
use std::sync::Arc;

use crate::connection::Connection;
use crate::datapath::DataPlane;
use crate::error::Result;
use crate::messages::{Mode, SessionRequest};

use self::disk::{Claimant, DiskOptions};
use self::memory::MemoryPlane;
use self::messages::{MessagesParams, MessagesPlane};

/// What `longhaul send` moves: the mode and what that mode needs.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Memory to memory (no PATHs).
    Memory(Amount),
    /// Files and directories into `--root/dest` on the server; they are
    /// sent whole, so there is no amount.
    Files {
        paths: Vec<PathBuf>,
        dest: String,
        disk: DiskOptions,
    },
    /// Pull (`longhaul get`): `paths` beneath the server's `--root` into the
    /// local directory `dest`; direction `receive`.
    Pull {
        paths: Vec<String>,
        dest: PathBuf,
        disk: DiskOptions,
    },
    /// Fixed-length messages.
    Messages {
        params: MessagesParams,
        amount: Amount,
    },
}

impl Payload {
    pub fn mode(&self) -> Mode {
        match self {
            Payload::Memory(_) => Mode::Memory,
            Payload::Files { .. } | Payload::Pull { .. } => Mode::Disk,
            Payload::Messages { .. } => Mode::Messages,
        }
    }

    /// How much each sending stream moves; `None` for files (all of them).
    pub fn amount(&self) -> Option<Amount> {
        match self {
            Payload::Memory(a) | Payload::Messages { amount: a, .. } => Some(*a),
            Payload::Files { .. } | Payload::Pull { .. } => None,
        }
    }
}

/// What the server offers the planes: `--root` and the destination paths
/// live disk sessions are writing.
pub(crate) struct ServerPlanes<'a> {
    pub(crate) root: Option<&'a std::path::Path>,
    pub(crate) claimant: &'a Claimant,
}

/// The server's plane for a requested session. `conn` is the control
/// connection, between `SessionRequest` and `SessionAccepted` (disk mode
/// reads the manifest and answers the plan).
pub(crate) fn server_plane(
    req: &SessionRequest,
    offer: &ServerPlanes<'_>,
    conn: &mut Connection,
) -> Result<Arc<dyn DataPlane>> {
    match req.mode {
        Mode::Memory => Ok(Arc::new(MemoryPlane::from_env()?)),
        Mode::Disk => disk::server_plane(req, offer.root, conn, offer.claimant),
        Mode::Messages => Ok(Arc::new(MessagesPlane::new(MessagesParams::from_request(
            req,
        )?))),
    }
}

/// The client's plane for its own request and payload.
pub(crate) fn client_plane(req: &SessionRequest, payload: &Payload) -> Result<Arc<dyn DataPlane>> {
    match payload {
        Payload::Memory(_) => Ok(Arc::new(MemoryPlane::from_env()?)),
        Payload::Files { paths, dest, disk } => {
            Ok(Arc::new(disk::SenderPlane::push(req, paths, dest, disk)?))
        }
        Payload::Pull { paths, dest, disk } => {
            Ok(Arc::new(disk::ReceiverPlane::pull(req, paths, dest, disk)?))
        }
        Payload::Messages { params, .. } => Ok(Arc::new(MessagesPlane::new(params.check(req)?))),
    }
}
