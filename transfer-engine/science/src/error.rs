//! Science's error: what stops a sweep, an advice or a report, and the exit
//! code of the CLI for it (DESIGN.md: 2 for a usage error, 1 for any other).
//! A transfer that fails keeps the engine's own error, as `longhaul send`
//! reports it; what only science meets (Prometheus, its files) has its own.

use std::io;

/// Result with science's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad option, or a file named on the command line that cannot serve
    /// (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A transfer the command ran failed: a sweep's cell, advise's probe,
    /// the background load's start.
    #[error(transparent)]
    Transfer(#[from] longhaul_engine::Error),
    /// Every transfer of a sweep failed, or its background load stopped:
    /// what the first of them said.
    #[error("{0}")]
    Failed(String),
    /// Prometheus cannot be asked at all: nothing listening there, its
    /// certificate or the password refused, plain HTTP to its TLS port. A
    /// report stops on it rather than note it under every figure.
    #[error("refused: {0}")]
    PrometheusRefused(String),
    /// Prometheus gave no complete answer in time.
    #[error("timeout: {0}")]
    PrometheusTimeout(String),
    /// Prometheus answered, but not what was asked for: an HTTP status other
    /// than 200 (`status`), or a body that is not a query's answer.
    #[error("{message}")]
    PrometheusAnswer {
        status: Option<u16>,
        message: String,
    },
    /// Reading or writing a file or a directory, or drawing a figure.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Exit code of the CLI for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::Transfer(e) => e.exit_code(),
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_2_a_transfer_keeps_the_engine_s_code_the_rest_is_1() {
        assert_eq!(Error::Usage("--time".into()).exit_code(), 2);
        let engine = longhaul_engine::Error::Usage("bad".into());
        assert_eq!(Error::from(engine).exit_code(), 2);
        let refused = longhaul_engine::Error::Refused("nobody".into());
        assert_eq!(Error::from(refused).exit_code(), 1);
        for e in [
            Error::Failed("every sweep cell failed".into()),
            Error::PrometheusRefused("401".into()),
            Error::PrometheusTimeout("late".into()),
            Error::PrometheusAnswer {
                status: Some(503),
                message: "loading".into(),
            },
            Error::io("writing x", io::Error::other("full")),
        ] {
            assert_eq!(e.exit_code(), 1, "{e}");
        }
    }

    #[test]
    fn a_transfer_s_error_reads_as_the_engine_says_it() {
        let e = Error::from(longhaul_engine::Error::Timeout("no answer".into()));
        assert_eq!(e.to_string(), "timeout: no answer");
    }
}
