//! Parsing of the command line's durations (`46.5ms`, `20ms`, `1s`, `500us`),
//! rates (`1G`: decimal multiples of bits per second, like tc and the
//! engine's `--rate`) and byte sizes (`4M`: binary multiples).

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses a duration with a unit: `ns`, `us`, `ms` or `s` (fractions allowed).
/// A bare number is rejected: a delay line with the wrong unit is a silent
/// thousand-fold error.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let bad = || {
        Error::Usage(format!(
            "invalid duration '{text}': expected a number with a unit ns, us, ms or s, e.g. 46.5ms"
        ))
    };
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=3600.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_nanos((secs * 1e9).round() as u64))
}

/// Parses a rate in bits per second with an optional `K`, `M`, `G` suffix
/// (powers of 1000); `0` means unlimited (no pacing).
pub fn parse_rate(text: &str) -> Result<u64> {
    let bad = || {
        Error::Usage(format!(
            "invalid rate '{text}': expected bits per second with an optional K, M or G suffix, e.g. 1G"
        ))
    };
    let t = text.trim();
    let (number, factor) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bps = value * factor;
    if !bps.is_finite() || !(0.0..=1e12).contains(&bps) {
        return Err(bad());
    }
    Ok(bps.round() as u64)
}

/// Parses a byte size with an optional `K`, `M`, `G` suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || {
        Error::Usage(format!(
            "invalid size '{text}': expected bytes with an optional K, M or G suffix, e.g. 4M"
        ))
    };
    let t = text.trim();
    let (number, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || !(0.0..=(1u64 << 40) as f64).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("46.5ms").unwrap(),
            Duration::from_micros(46_500)
        );
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("0ms").unwrap(), Duration::ZERO);
        assert!(parse_duration("46.5").is_err());
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("xms").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("200M").unwrap(), 200_000_000);
        assert_eq!(parse_rate("2.5g").unwrap(), 2_500_000_000);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("1500").unwrap(), 1500);
        assert!(parse_size("4X").is_err());
    }
}
