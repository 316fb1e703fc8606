//! Lines of the server's log: `2026-11-21T10:00:00.123Z longhaul serve: ...`,
//! an RFC 3339 UTC timestamp first ([`longhaul_units::log_line`], as every
//! longhaul binary writes it) so lines from several hosts sort and correlate
//! (journald adds its own, but the engine also runs under plain shells and
//! in containers).

/// Writes one line of the server's log to stderr.
pub fn server(msg: impl std::fmt::Display) {
    longhaul_units::log("longhaul serve", msg);
}
