//! Port ranges for `--collector.tcp.ports`, e.g. `7400-7499,5201,54321`.

use std::fmt;
use std::str::FromStr;

/// A set of inclusive TCP port ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRanges(Vec<(u16, u16)>);

impl PortRanges {
    pub fn contains(&self, port: u16) -> bool {
        self.matching(port).is_some()
    }

    /// The first configured range holding `port`, as written in the flag
    /// (`7400-7499`, `5201`): a stable label for every flow on it.
    pub fn matching(&self, port: u16) -> Option<String> {
        self.0
            .iter()
            .find(|&&(lo, hi)| lo <= port && port <= hi)
            .map(|&(lo, hi)| range_text(lo, hi))
    }
}

fn range_text(lo: u16, hi: u16) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

impl FromStr for PortRanges {
    type Err = String;

    fn from_str(s: &str) -> Result<PortRanges, String> {
        let port = |p: &str| -> Result<u16, String> {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{p:?} is not a port (1-65535)")),
            }
        };
        let mut ranges = Vec::new();
        for part in s.split(',') {
            if part.trim().is_empty() {
                return Err("empty entry in port list".into());
            }
            let range = match part.split_once('-') {
                Some((lo, hi)) => (port(lo)?, port(hi)?),
                None => {
                    let p = port(part)?;
                    (p, p)
                }
            };
            if range.0 > range.1 {
                return Err(format!("range {part:?} runs backwards"));
            }
            ranges.push(range);
        }
        Ok(PortRanges(ranges))
    }
}

impl fmt::Display for PortRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&range_text(*lo, *hi))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let r: PortRanges = "7400-7499, 5201,54321".parse().unwrap();
        assert!(r.contains(7400) && r.contains(7450) && r.contains(5201) && r.contains(54321));
        assert!(!r.contains(7500) && !r.contains(22));
        assert_eq!(r.to_string(), "7400-7499,5201,54321");
        assert_eq!(r.matching(7450).as_deref(), Some("7400-7499"));
        assert_eq!(r.matching(5201).as_deref(), Some("5201"));
        assert_eq!(r.matching(22), None);
        for bad in ["", "0", "1,,2", "a-b", "65536", "10-5", "5-"] {
            assert!(bad.parse::<PortRanges>().is_err(), "{bad}");
        }
    }
}
