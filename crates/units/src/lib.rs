//! Sizes, rates and durations as people type them on a command line, and
//! back as people read them. One set of rules for every longhaul binary
//! (the engine, the exporter, the lab's delay line):
//!
//! - a **size** is bytes, with an optional `K`, `M`, `G` or `T` suffix in
//!   binary multiples (`2M` = 2,097,152) or a plain `B`; fractions are
//!   allowed (`1.5K` = 1536);
//! - a **rate** is bits per second, with an optional `K`, `M`, `G` or `T`
//!   suffix in decimal multiples (`5G` = 5,000,000,000), like `tc` and
//!   iperf3;
//! - a **duration** is a number with a unit `ns`, `us`, `ms`, `s`, `m` or
//!   `h`; a bare number means seconds where [`parse_duration`] is used, and
//!   is refused by [`parse_duration_with_unit`] (the delay line's `--delay`,
//!   where a missing unit would be a silent thousand-fold error).
//!
//! - an **instant** in a log line or a report is RFC 3339 in UTC with
//!   milliseconds ([`rfc3339`]), so lines from several hosts and binaries
//!   sort and correlate.
//!
//! Suffixes are case-insensitive. Parsers accept zero; whether zero makes
//! sense (a rate of 0 is "unlimited" for the delay line, an error for the
//! engine) is the caller's rule. Errors name the text and what was expected.

use std::time::{Duration, SystemTime};

/// A value that does not follow the rules; the message names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} '{text}': expected {expected}")]
pub struct UnitError {
    kind: &'static str,
    text: String,
    expected: &'static str,
}

impl UnitError {
    fn new(kind: &'static str, text: &str, expected: &'static str) -> UnitError {
        UnitError {
            kind,
            text: text.to_string(),
            expected,
        }
    }
}

/// Largest size accepted: far above any buffer or file, far below u64::MAX
/// so that sums of a few sizes cannot overflow.
pub const MAX_SIZE: u64 = 1 << 60;

/// Largest rate accepted, bits per second (10 Pb/s).
pub const MAX_RATE: u64 = 10_000_000_000_000_000;

/// Longest duration accepted: about 31 years.
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000_000);

const SIZE_EXPECTED: &str =
    "bytes with an optional K, M, G or T suffix (binary multiples), e.g. 2M";
const RATE_EXPECTED: &str =
    "bits per second with an optional K, M, G or T suffix (decimal multiples), e.g. 5G";
const DURATION_EXPECTED: &str =
    "a number of seconds, or a number with a unit ns, us, ms, s, m or h, e.g. 500ms";
const DURATION_UNIT_EXPECTED: &str = "a number with a unit ns, us, ms, s, m or h, e.g. 46.5ms";

/// Splits `2.5M` into (`2.5`, Some('M')); the letter is upper-cased.
fn split_letter(text: &str) -> (&str, Option<char>) {
    match text.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            (&text[..text.len() - 1], Some(c.to_ascii_uppercase()))
        }
        _ => (text, None),
    }
}

/// A finite, non-negative decimal number (no sign, no exponent, no `inf`,
/// no space between the number and its unit).
fn number(text: &str) -> Option<f64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parses a size in bytes: `1000`, `512B`, `64K`, `2M`, `1.5G`, `1T`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::new("size", text, SIZE_EXPECTED);
    let t = text.trim();
    let (rest, letter) = split_letter(t);
    // `2MB`/`2KB` read as `2M`/`2K`; a lone `B` is bytes.
    let (rest, letter) = match letter {
        Some('B') => match split_letter(rest) {
            (r, Some(l)) => (r, Some(l)),
            (r, None) => (r, None),
        },
        other => (rest, other),
    };
    let shift = match letter {
        None => 0,
        Some('K') => 10,
        Some('M') => 20,
        Some('G') => 30,
        Some('T') => 40,
        Some(_) => return Err(bad()),
    };
    let value = number(rest).ok_or_else(bad)?;
    let bytes = (value * (1u64 << shift) as f64).round();
    if bytes > MAX_SIZE as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Parses a rate in bits per second: `1000`, `100M`, `5G`, `2.5g`.
pub fn parse_rate(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::new("rate", text, RATE_EXPECTED);
    let (rest, letter) = split_letter(text.trim());
    let factor = match letter {
        None => 1e0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('G') => 1e9,
        Some('T') => 1e12,
        Some(_) => return Err(bad()),
    };
    let bps = (number(rest).ok_or_else(bad)? * factor).round();
    if bps > MAX_RATE as f64 {
        return Err(bad());
    }
    Ok(bps as u64)
}

/// Splits a duration into its number and its unit in seconds.
fn duration_parts(t: &str) -> (&str, Option<f64>) {
    for (suffix, scale) in [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
        ("m", 60.0),
        ("h", 3600.0),
    ] {
        if let Some(n) = t.strip_suffix(suffix) {
            return (n, Some(scale));
        }
    }
    (t, None)
}

fn duration(text: &str, bare_is_seconds: bool) -> Result<Duration, UnitError> {
    let bad = || {
        if bare_is_seconds {
            UnitError::new("duration", text, DURATION_EXPECTED)
        } else {
            UnitError::new("duration", text, DURATION_UNIT_EXPECTED)
        }
    };
    let (rest, scale) = duration_parts(text.trim());
    let scale = match scale {
        Some(s) => s,
        None if bare_is_seconds => 1.0,
        None => return Err(bad()),
    };
    let secs = number(rest).ok_or_else(bad)? * scale;
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(bad());
    }
    Ok(Duration::from_nanos((secs * 1e9).round() as u64))
}

/// Parses a duration; a bare number is seconds: `10`, `0.5`, `10s`,
/// `500ms`, `5m`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    duration(text, true)
}

/// Parses a duration that must carry its unit: `46.5ms`, `1s`, `500us`.
pub fn parse_duration_with_unit(text: &str) -> Result<Duration, UnitError> {
    duration(text, false)
}

/// Bits per second for people: `9.41 Gb/s`, `120.00 Mb/s`, `3.20 Kb/s`.
pub fn format_bps(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gb/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.2} Mb/s", bps / 1e6)
    } else {
        format!("{:.2} Kb/s", bps / 1e3)
    }
}

/// A byte count for people: `1.50 GiB`, `3.00 MiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{bytes} B")
    }
}

/// A size as a command line takes it, exact: `2M` when it divides, else
/// `64K`, else plain bytes. [`parse_size`] reads it back to the same value.
pub fn size_arg(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-21T10:00:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        // Out of jiff's range (years beyond 9999): no clock says that.
        Err(_) => format!("{t:?}"),
    }
}

/// One line of a longhaul program's log as every one of them writes it:
/// the instant ([`rfc3339`]) first, so lines from several hosts and
/// programs sort and correlate, then `program: msg`.
pub fn log_line(at: SystemTime, program: &str, msg: impl std::fmt::Display) -> String {
    format!("{} {program}: {msg}", rfc3339(at))
}

/// Writes one [`log_line`] of `program`, stamped now, to stderr (the
/// journal under systemd; plain shells and containers stamp nothing).
pub fn log(program: &str, msg: impl std::fmt::Display) {
    eprintln!("{}", log_line(SystemTime::now(), program, msg));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn a_log_line_starts_with_its_utc_instant() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_151_200_250);
        assert_eq!(
            log_line(at, "longhaul-delay", "stopping (signal 15)"),
            "2025-11-26T10:00:00.250Z longhaul-delay: stopping (signal 15)"
        );
    }

    #[test]
    fn instants_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_999);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.999Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn sizes_are_binary_multiples() {
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("512B").unwrap(), 512);
        assert_eq!(parse_size("2MB").unwrap(), 2 << 20);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size(" 4M ").unwrap(), 4 << 20);
        assert_eq!(parse_size("0").unwrap(), 0);
        for bad in [
            "", "2X", "-1M", "M", "1e3", "inf", "2 M", "1.2.3K", "2000000T",
        ] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    #[test]
    fn rates_are_decimal_bits() {
        assert_eq!(parse_rate("5G").unwrap(), 5_000_000_000);
        assert_eq!(parse_rate("100M").unwrap(), 100_000_000);
        assert_eq!(parse_rate("2.5g").unwrap(), 2_500_000_000);
        assert_eq!(parse_rate("1k").unwrap(), 1000);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("5X").is_err());
        assert!(parse_rate("-5G").is_err());
        assert!(parse_rate("20000T").is_err());
        let e = parse_rate("fast").unwrap_err().to_string();
        assert!(e.contains("'fast'") && e.contains("bits per second"), "{e}");
    }

    #[test]
    fn durations_default_to_seconds() {
        let d = |t| parse_duration(t).unwrap();
        assert_eq!(d("10"), Duration::from_secs(10));
        assert_eq!(d("0.5"), Duration::from_millis(500));
        assert_eq!(d("10s"), Duration::from_secs(10));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("500us"), Duration::from_micros(500));
        assert_eq!(d("500µs"), Duration::from_micros(500));
        assert_eq!(d("7ns"), Duration::from_nanos(7));
        assert_eq!(d("5m"), Duration::from_secs(300));
        assert_eq!(d("2h"), Duration::from_secs(7200));
        assert_eq!(d("0ms"), Duration::ZERO);
        for bad in ["", "-1s", "xms", "1d", "inf", "1e12"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_with_unit_refuse_bare_numbers() {
        assert_eq!(
            parse_duration_with_unit("46.5ms").unwrap(),
            Duration::from_micros(46_500)
        );
        let e = parse_duration_with_unit("46.5").unwrap_err().to_string();
        assert!(e.contains("'46.5'") && e.contains("unit"), "{e}");
    }

    #[test]
    fn size_args_parse_back() {
        for b in [0u64, 1, 1000, 64 << 10, 2 << 20, 11_625_000, 3 << 30] {
            assert_eq!(parse_size(&size_arg(b)).unwrap(), b);
        }
        assert_eq!(size_arg(2 << 20), "2M");
        assert_eq!(size_arg(64 << 10), "64K");
        assert_eq!(size_arg(1000), "1000");
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_bps(9.41e9), "9.41 Gb/s");
        assert_eq!(format_bps(1.2e8), "120.00 Mb/s");
        assert_eq!(format_bps(3200.0), "3.20 Kb/s");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_bytes(3 << 20), "3.00 MiB");
        assert_eq!(format_bytes(512), "512 B");
    }
}
