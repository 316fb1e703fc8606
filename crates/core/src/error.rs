//! The library's error type. Each variant names the cause the way the CLI
//! reports it (`refused`, `auth`, `timeout`, `peer aborted`, ...), so `main`
//! only has to print it and pick the exit code.

use std::io;

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command line or configuration (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// Nobody listens at the address (ECONNREFUSED, unreachable host).
    #[error("refused: {0}")]
    Refused(String),
    /// Token missing, wrong, or the peer may not connect without one.
    #[error("auth failed: {0}")]
    Auth(String),
    /// The peer stopped answering within one of the named timeouts.
    #[error("timeout: {0}")]
    Timeout(String),
    /// The two ends speak different protocol versions.
    #[error("protocol version mismatch: we speak {ours}, the peer speaks {theirs}")]
    VersionMismatch { ours: u32, theirs: u32 },
    /// The peer found that the two ends speak different protocol versions.
    #[error("protocol version mismatch: {0}")]
    RemoteVersionMismatch(String),
    /// The peer sent something that is not our protocol (bad magic, bad frame).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The peer went away or reported a failure in the middle of the session.
    #[error("peer aborted: {0}")]
    PeerAborted(String),
    /// The server is at `--max-sessions`.
    #[error("server busy: {0}")]
    Busy(String),
    /// The two ends disagree about the bytes a stream carried.
    #[error("checksum mismatch: {0}")]
    ChecksumMismatch(String),
    /// No space left on the receiving device (disk mode).
    #[error("disk full: {0}")]
    DiskFull(String),
    /// Streams that moved no bytes at all (`--strict`).
    #[error("idle streams: {0}")]
    IdleStreams(String),
    /// Disk mode: some files failed (each named), the others arrived.
    #[error("incomplete: {0}")]
    Incomplete(String),
    /// A socket option or mode the kernel or the peer cannot provide.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Any other I/O failure, with what we were doing.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error, mapping the kinds that have a name of their own
    /// (refused, timeout, reset) to the matching variant.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        let context = context.into();
        match source.kind() {
            io::ErrorKind::ConnectionRefused => Error::Refused(format!("{context}: {source}")),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                Error::Timeout(format!("{context}: no answer in time"))
            }
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof => Error::PeerAborted(format!("{context}: {source}")),
            _ if source.raw_os_error() == Some(libc::ENOSPC) => {
                Error::DiskFull(format!("{context}: {source}"))
            }
            _ if matches!(
                source.raw_os_error(),
                Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH)
            ) =>
            {
                Error::Refused(format!("{context}: {source}"))
            }
            _ => Error::Io { context, source },
        }
    }

    /// Short code sent to the peer in an `Error` message, see
    /// [`Error::from_remote`].
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Error::Usage(_) => "usage",
            Error::Refused(_) => "refused",
            Error::Auth(_) => "auth",
            Error::Timeout(_) => "timeout",
            Error::VersionMismatch { .. } | Error::RemoteVersionMismatch(_) => "version",
            Error::Protocol(_) => "protocol",
            Error::PeerAborted(_) => "aborted",
            Error::Busy(_) => "busy",
            Error::ChecksumMismatch(_) => "checksum",
            Error::DiskFull(_) => "disk_full",
            Error::Unsupported(_) => "unsupported",
            Error::IdleStreams(_) => "idle_streams",
            Error::Incomplete(_) => "incomplete",
            Error::Io { .. } => "io",
        }
    }

    /// Rebuilds an error the peer reported with [`Error::code`].
    pub(crate) fn from_remote(code: &str, message: &str) -> Error {
        let m = format!("peer says: {message}");
        match code {
            "auth" => Error::Auth(m),
            "version" => Error::RemoteVersionMismatch(message.to_string()),
            "busy" => Error::Busy(m),
            "timeout" => Error::Timeout(m),
            "checksum" => Error::ChecksumMismatch(m),
            "disk_full" => Error::DiskFull(m),
            "unsupported" | "usage" => Error::Unsupported(m),
            "protocol" => Error::Protocol(m),
            _ => Error::PeerAborted(m),
        }
    }

    /// The error without its cause prefix, for the peer's `Error` message
    /// (the peer adds the cause again from [`Error::code`]).
    pub(crate) fn detail(&self) -> String {
        match self {
            Error::Usage(m)
            | Error::Refused(m)
            | Error::Auth(m)
            | Error::Timeout(m)
            | Error::RemoteVersionMismatch(m)
            | Error::Protocol(m)
            | Error::PeerAborted(m)
            | Error::Busy(m)
            | Error::ChecksumMismatch(m)
            | Error::DiskFull(m)
            | Error::IdleStreams(m)
            | Error::Incomplete(m)
            | Error::Unsupported(m) => m.clone(),
            // Only the server sends this one (it checks the client's Hello).
            Error::VersionMismatch { ours, theirs } => {
                format!("the server speaks version {ours}, the client {theirs}")
            }
            Error::Io { .. } => self.to_string(),
        }
    }

    /// Exit code of the CLI for this error (DESIGN.md: 2 usage, 1 failure).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
}
