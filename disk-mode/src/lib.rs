//! Disk-to-disk mode: files and trees read on the sender, written under
//! `--root/--dest` on the receiver, verified and resumable.
//!
//! The layers, from the file system up:
//!
//! - `walk` turns `PATH...` arguments into a manifest of files and
//!   directories with paths relative to the argument's parent.
//! - `devices` groups files by the block device and controller they live on
//!   (via `longhaul-topology`) and keeps per-device IO counters.
//! - `checksum` is the per-file checksum: xxh3-64 over the xxh3-64 of every
//!   `CHUNK_SIZE` chunk, so the receiver can hash chunks in any order and
//!   holes cost nothing to hash.
//! - `safepath` resolves wire paths beneath the receiver's root without ever
//!   following a symlink or leaving the root.
//! - `partial` names the temporary file and the resume sidecar of a file and
//!   decides, per manifest entry, what the receiver already has.
//! - `wire` holds the manifest/plan/report messages (carried on the control
//!   connection) and the block frames (carried on any data connection).
//! - `ioqueue` keeps reads and writes in flight at a queue depth (io_uring, or
//!   a few threads where io_uring is unavailable).
//! - `reader` is the sender pipeline: reader threads per device feed one
//!   bounded queue that every data stream drains, hashing as it sends.
//! - `writer` is the receiver pipeline: data streams parse frames,
//!   hashing as they receive, and hand blocks to the writer threads of the
//!   file's device.
//! - `source` ties walk, devices and reader together for the client.
//! - `plane` puts both pipelines behind the core's session: the
//!   manifest/plan exchange and the `DataPlane`s.
//!
//! Memory stays flat whatever the tree size: every block lives in a buffer
//! from a fixed-size `buffer::BufferPool`, and every queue is bounded.

mod buffer;
mod checksum;
mod claims;
mod devices;
mod ioqueue;
mod partial;
mod plane;
mod reader;
mod safepath;
mod source;
mod walk;
mod wire;
mod writer;

// What the ends (`longhaul-engine`) use: the planes of both ends, the root
// claims a server holds, the options; and for the decoders' tests, the
// control messages and the block frames' header.
pub use claims::{Claimant, Claims, RootLock};
pub use plane::{
    decode_disk_message, server_plane, DiskMessage, ReceiverPlane, SenderPlane,
    MAX_IO_WORKERS_PER_DEVICE,
};
pub use wire::{read_header, FrameHeader, ManifestEntry, Plan, FRAME_HEADER_LEN, FRAME_MAGIC};

#[cfg(test)]
mod roundtrip_tests;

// The core's modules by their short names, as the engine's own modules
// name them (`crate::datapath`).
use longhaul_core::{
    connection, datapath, error, frame, limits, logline, messages, sockopt, workers,
};

use std::io;
use std::path::PathBuf;

/// Size of one block on the wire and of one checksum chunk. 1 MiB: large
/// enough that per-block overhead (a 40-byte header, one queue hop, one
/// syscall) is noise, small enough that 8 streams x a few blocks in flight
/// stay far under the 256 MiB RSS budget. Part of the wire format.
pub(crate) const CHUNK_SIZE: u64 = 1 << 20;

/// Largest file a receiver takes (1 PiB); a bigger manifest entry is
/// refused by name. Manifest sizes come from the peer, and a sparse entry
/// costs nothing to claim: one `Hole` frame over it makes the writer fold a
/// zero hash per chunk, so 2^62 bytes held a writer for hours. 1 PiB is 2^30
/// chunks, about a second to fold ([`checksum::FileDigest::push_repeated`]),
/// and far above what is moved as one file: ext4 stops at 16 TiB, and the
/// largest files of data-movement campaigns (disk images, experiment runs,
/// database dumps) are a few TiB. XFS, btrfs and ZFS allow 8-16 EiB, so this
/// is a policy, not a file system limit.
pub(crate) const MAX_FILE_SIZE: u64 = 1 << 50;

/// Alignment of buffers, offsets and lengths for O_DIRECT.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// Options shared by both ends of a disk transfer.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Reader workers per device on the sender, writer workers per device on
    /// the receiver (`--io-workers-per-device`).
    pub io_workers_per_device: usize,
    /// O_DIRECT with aligned buffers (`--direct`).
    pub direct: bool,
    /// Follow symlinks while walking the sender's PATHs (`--follow-symlinks`).
    pub follow_symlinks: bool,
    /// Skip complete files and continue partial ones (default; `--no-resume`).
    pub resume: bool,
    /// Skip a file only if its content matches, not on size and mtime alone
    /// (`--checksum`); the sender hashes every file before the session.
    pub checksum: bool,
    /// Number of data streams that move blocks; sizes the buffer pool.
    pub streams: usize,
    /// sysfs root for the topology lookup (tests point it at fixtures).
    pub sysfs: PathBuf,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            io_workers_per_device: 1,
            direct: false,
            follow_symlinks: false,
            resume: true,
            checksum: false,
            streams: 1,
            sysfs: PathBuf::from("/sys"),
        }
    }
}

/// What went wrong with one file or path; the message names it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    #[error("disk full (No space left on device) writing {path}")]
    DiskFull { path: String },
    #[error("checksum mismatch for {path}")]
    ChecksumMismatch { path: String },
    #[error("permission denied: {path}")]
    PermissionDenied { path: String },
    #[error("refused path {path}: {reason}")]
    Refused { path: String, reason: String },
    #[error("source changed during read: {path}")]
    SourceChanged { path: String },
    #[error("{path} is being written by another session ({by}); retry when it ends")]
    InUse { path: String, by: String },
    #[error("source vanished: {path}")]
    SourceVanished { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl DiskError {
    /// Classify an IO error on `path` into the variant that names its cause.
    pub(crate) fn from_io(path: impl Into<String>, err: io::Error) -> DiskError {
        let path = path.into();
        match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => DiskError::DiskFull { path },
            Some(libc::EACCES) | Some(libc::EPERM) => DiskError::PermissionDenied { path },
            _ => DiskError::Io { path, source: err },
        }
    }
}

impl DiskError {
    /// Short stable name of the cause, carried in reports.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            DiskError::DiskFull { .. } => "disk_full",
            DiskError::ChecksumMismatch { .. } => "checksum",
            DiskError::PermissionDenied { .. } => "permission",
            DiskError::Refused { .. } => "refused",
            DiskError::SourceChanged { .. } => "source_changed",
            DiskError::SourceVanished { .. } => "source_vanished",
            DiskError::InUse { .. } => "in_use",
            DiskError::Io { .. } => "io",
        }
    }
}

/// Result type of this module.
pub(crate) type Result<T, E = DiskError> = std::result::Result<T, E>;
