//! `/proc/diskstats` parsing (kernel Documentation/admin-guide/iostats.rst).
//!
//! Lines have 14 fields (kernels before 4.18), 18 (discard counters) or 20
//! (flush counters); we need the first 14. A malformed line is reported by
//! name so the caller can skip just that device.

/// The counters the raid collector sums, for one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub reads_completed: u64,
    pub sectors_read: u64,
    pub writes_completed: u64,
    pub sectors_written: u64,
    /// Milliseconds the device had IO in flight.
    pub io_ticks_ms: u64,
}

/// Parsed file: good lines by device name, and descriptions of bad lines.
#[derive(Debug, Default)]
pub struct Parsed {
    pub devices: std::collections::HashMap<String, DiskStats>,
    pub malformed: Vec<String>,
}

pub fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Ok((name, stats)) => {
                parsed.devices.insert(name.to_string(), stats);
            }
            Err(why) => parsed.malformed.push(format!("line {}: {why}", n + 1)),
        }
    }
    parsed
}

fn parse_line(line: &str) -> Result<(&str, DiskStats), String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 14 {
        return Err(format!(
            "{} fields, want at least 14: {:?}",
            f.len(),
            short(line)
        ));
    }
    let num = |i: usize| -> Result<u64, String> {
        f[i].parse::<u64>()
            .map_err(|_| format!("field {} of {} is not a counter: {:?}", i + 1, f[2], f[i]))
    };
    num(0)?;
    num(1)?;
    Ok((
        f[2],
        DiskStats {
            reads_completed: num(3)?,
            sectors_read: num(5)?,
            writes_completed: num(7)?,
            sectors_written: num(9)?,
            io_ticks_ms: num(12)?,
        },
    ))
}

fn short(line: &str) -> String {
    line.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_old_and_new_layouts_and_names_bad_lines() {
        let text = "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11\n\
                    259 0 nvme0n1 1 0 16 0 2 0 32 0 0 7 7 0 0 0 0 0 0\n\
                    8 16 sdb 1 2 3\n\
                    8 32 sdc x 2 3 4 5 6 7 8 9 10 11\n\n";
        let p = parse(text);
        assert_eq!(
            p.devices["sda"],
            DiskStats {
                reads_completed: 1,
                sectors_read: 3,
                writes_completed: 5,
                sectors_written: 7,
                io_ticks_ms: 10
            }
        );
        assert_eq!(p.devices["nvme0n1"].sectors_written, 32);
        assert_eq!(p.malformed.len(), 2);
        assert!(p.malformed[0].starts_with("line 3"), "{:?}", p.malformed);
        assert!(p.malformed[1].contains("sdc"), "{:?}", p.malformed);
    }
}
