//! Lines of the server's log: `2026-11-21T10:00:00.123Z longhaul serve: ...`,
//! an RFC 3339 UTC timestamp first so lines from several hosts sort and
//! correlate (journald adds its own, but the engine also runs under plain
//! shells and in containers).

use std::time::SystemTime;

/// Writes one line of the server's log to stderr.
pub fn server(msg: impl std::fmt::Display) {
    eprintln!("{} longhaul serve: {msg}", rfc3339(SystemTime::now()));
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-21T10:00:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        // Out of jiff's range (years beyond 9999): no clock says that.
        Err(_) => format!("{t:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_999);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.999Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }
}
