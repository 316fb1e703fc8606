//! The delay line's error type: each variant names what went wrong so the
//! binary can print one clear line and pick the exit code (2 for usage).

use std::io;

/// Everything that can go wrong while setting up or running the delay line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command line: unknown flag, missing or malformed value.
    #[error("{0}")]
    Usage(String),
    /// `/dev/net/tun` could not be opened or the device could not be created
    /// (no tun module, not root / no CAP_NET_ADMIN, name in use).
    #[error("tun device {name}: {source}")]
    Tun { name: String, source: io::Error },
    /// A site interface named on the command line does not exist.
    #[error("site interface '{0}' does not exist")]
    NoSuchInterface(String),
    /// An interface ioctl (MTU, flags, queue length) failed.
    #[error("interface {name}: {what}: {source}")]
    Interface {
        name: String,
        what: &'static str,
        source: io::Error,
    },
    /// An `ip` command used for policy routing failed.
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    /// A sysctl under /proc/sys could not be read or written.
    #[error("sysctl {path}: {source}")]
    Sysctl { path: String, source: io::Error },
    /// Reading from or writing to a socket or device failed at run time.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;
