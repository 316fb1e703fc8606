//! Parsing of the CLI's sizes (`2M`, `64K`, `1G`: binary multiples of bytes),
//! rates (`5G`: decimal multiples of bits per second) and durations.

use crate::error::{Error, Result};

fn split_suffix(text: &str) -> (&str, Option<char>) {
    match text.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => (&text[..text.len() - 1], Some(c)),
        _ => (text, None),
    }
}

/// Parses a byte size: a number with an optional `K`, `M`, `G` or `T` suffix
/// (powers of 1024). `2M` is 2097152.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || {
        Error::Usage(format!(
            "invalid size '{text}': expected a number with an optional K, M, G or T suffix, e.g. 2M"
        ))
    };
    let (number, suffix) = split_suffix(text.trim());
    let shift = match suffix.map(|c| c.to_ascii_uppercase()) {
        None | Some('B') => 0,
        Some('K') => 10,
        Some('M') => 20,
        Some('G') => 30,
        Some('T') => 40,
        Some(_) => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let bytes = value * (1u64 << shift) as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// Parses a rate in bits per second: a number with an optional `K`, `M`, `G`
/// or `T` suffix (powers of 1000). `5G` is 5_000_000_000.
pub fn parse_rate(text: &str) -> Result<u64> {
    let bad = || {
        Error::Usage(format!(
            "invalid rate '{text}': expected bits per second with an optional K, M, G or T suffix, e.g. 5G"
        ))
    };
    let (number, suffix) = split_suffix(text.trim());
    let factor = match suffix.map(|c| c.to_ascii_uppercase()) {
        None => 1e0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('G') => 1e9,
        Some('T') => 1e12,
        Some(_) => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    if !value.is_finite() || value <= 0.0 || value * factor > 1e16 {
        return Err(bad());
    }
    Ok((value * factor).round() as u64)
}

/// Parses a positive number of seconds (fractions allowed).
pub fn parse_seconds(text: &str) -> Result<f64> {
    match text.trim().trim_end_matches('s').parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e7 => Ok(v),
        _ => Err(Error::Usage(format!(
            "invalid duration '{text}': expected a positive number of seconds"
        ))),
    }
}

/// Formats bits per second for humans: `9.41 Gb/s`.
pub fn format_bps(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gb/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.2} Mb/s", bps / 1e6)
    } else {
        format!("{:.2} Kb/s", bps / 1e3)
    }
}

/// Formats a byte count for humans: `1.50 GiB`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_multiples() {
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("2X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1M").is_err());
    }

    #[test]
    fn rates_are_decimal_bits() {
        assert_eq!(parse_rate("5G").unwrap(), 5_000_000_000);
        assert_eq!(parse_rate("100M").unwrap(), 100_000_000);
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }
}
