//! Command-line parsing of `longhaul serve` and `longhaul send`.
//!
//! Hand-written (a handful of flags, no dependency): `--flag value` and
//! `--flag=value`, positional PATHs for `send`. Every mistake is an
//! [`Error::Usage`] that names the flag, which `main` maps to exit code 2.

use std::path::PathBuf;

use crate::auth::Token;
use crate::client::SendOptions;
use crate::error::{Error, Result};
use crate::messages::Direction;
use crate::server::ServeOptions;
use crate::session::{DEFAULT_BUFFER, MAX_STREAMS};
use crate::units::{parse_rate, parse_seconds, parse_size};

pub const USAGE: &str = "\
usage:
  longhaul serve [--listen ADDR:PORT] [--root DIR] [--token-file F] [--allow-unauthenticated]
                 [--stats-listen ADDR:PORT] [--max-sessions N]
  longhaul send --to HOST:PORT [--streams N] [--buffer SIZE] [--cc ALG] [--rate RATE]
                [--time SECS | --bytes SIZE] [--bidir] [--reverse] [--interval SECS]
                [--json] [--token-file F] [--strict] [PATH...] [--dest DIR]
                [--io-workers-per-device N] [--direct] [--follow-symlinks] [--no-resume]
                [--checksum]
  longhaul sweep --to HOST:PORT [--streams LIST] [--buffer LIST] [--messages LIST]
                 [--time SECS] [--load N] [--out DIR] [--json] [--token-file F] [--cc ALG]
  longhaul advise --to HOST:PORT [--rate RATE] [--pings N] [--json] [--token-file F]
  longhaul report RESULTS_DIR [--out FILE] [--title TEXT]
                  [--prometheus URL --from T --to T [--step SECS]]

--strict: fail (exit 1) when a stream moved no bytes (always warned about).
--checksum: skip a file already on the receiver only if its content hashes the same
  (default: same size and mtime; reported as skipped but not verified).
SIZE: bytes with K, M, G suffix (binary), e.g. 2M. RATE: bits/s with K, M, G suffix, e.g. 5G.
Exit codes: 0 success, 1 transfer failed, 2 usage error.";

/// A parsed command line.
#[derive(Debug)]
pub enum Command {
    Serve(ServeOptions),
    Send(SendOptions),
    /// `sweep`, `advise` and `report` ([`crate::science`]).
    Science(crate::science::Command),
    /// Hidden: prints single-core memcpy bandwidth (bytes/s) for the bench.
    MemcpyBench,
    Help,
    Version,
}

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

/// Splits `--flag=value` and hands out values for flags that need one.
struct Args {
    items: std::vec::IntoIter<String>,
    pending_value: Option<String>,
}

impl Args {
    fn next_flag(&mut self) -> Option<String> {
        let item = self.items.next()?;
        if item.starts_with("--") {
            if let Some((flag, value)) = item.split_once('=') {
                self.pending_value = Some(value.to_string());
                return Some(flag.to_string());
            }
        }
        Some(item)
    }

    fn value(&mut self, flag: &str) -> Result<String> {
        if let Some(v) = self.pending_value.take() {
            return Ok(v);
        }
        match self.items.next() {
            Some(v) if !v.starts_with("--") => Ok(v),
            _ => Err(usage(format!("{flag} needs a value"))),
        }
    }

    fn no_value(&mut self, flag: &str) -> Result<()> {
        match self.pending_value.take() {
            Some(_) => Err(usage(format!("{flag} takes no value"))),
            None => Ok(()),
        }
    }
}

/// Parses `argv` without the program name.
pub fn parse(argv: Vec<String>) -> Result<Command> {
    let mut items = argv.into_iter();
    let Some(sub) = items.next() else {
        return Err(usage("missing subcommand (serve or send)"));
    };
    let rest: Vec<String> = items.collect();
    if rest.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Command::Help);
    }
    if matches!(sub.as_str(), "sweep" | "advise" | "report") {
        return crate::science::args::parse(&sub, rest).map(Command::Science);
    }
    let mut args = Args {
        items: rest.into_iter(),
        pending_value: None,
    };
    match sub.as_str() {
        "serve" => parse_serve(&mut args).map(Command::Serve),
        "send" => parse_send(&mut args).map(Command::Send),
        "memcpy-bench" => Ok(Command::MemcpyBench),
        "-h" | "--help" | "help" => Ok(Command::Help),
        "-V" | "--version" => Ok(Command::Version),
        other => Err(usage(format!(
            "unknown subcommand '{other}' (expected serve, send, sweep, advise or report)"
        ))),
    }
}

fn parse_count(flag: &str, text: &str) -> Result<u64> {
    text.parse()
        .map_err(|_| usage(format!("{flag}: '{text}' is not a whole number")))
}

fn parse_serve(args: &mut Args) -> Result<ServeOptions> {
    let mut o = ServeOptions::default();
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--listen" => o.listen = args.value(&flag)?,
            "--root" => o.root = Some(PathBuf::from(args.value(&flag)?)),
            "--token-file" => o.token = Some(Token::from_file(args.value(&flag)?.as_ref())?),
            "--allow-unauthenticated" => {
                args.no_value(&flag)?;
                o.allow_unauthenticated = true
            }
            "--stats-listen" => o.stats_listen = args.value(&flag)?,
            "--max-sessions" => {
                let n = parse_count(&flag, &args.value(&flag)?)?;
                if n == 0 || n > 4096 {
                    return Err(usage(format!(
                        "--max-sessions must be between 1 and 4096, got {n}"
                    )));
                }
                o.max_sessions = n as usize;
            }
            "-h" | "--help" => return Err(usage(USAGE)),
            other if other.starts_with('-') => {
                return Err(usage(format!("unknown flag '{other}' for serve")))
            }
            other => return Err(usage(format!("unexpected argument '{other}' for serve"))),
        }
    }
    Ok(o)
}

fn parse_send(args: &mut Args) -> Result<SendOptions> {
    let mut to = None;
    let mut o = SendOptions {
        to: String::new(),
        streams: 1,
        buffer: DEFAULT_BUFFER,
        cc: None,
        rate_bps: None,
        seconds: None,
        bytes: None,
        direction: Direction::Send,
        interval: None,
        json: false,
        strict: false,
        token: None,
        paths: Vec::new(),
        dest: None,
        disk: crate::disk::DiskOptions::default(),
    };
    let (mut bidir, mut reverse) = (false, false);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--to" => to = Some(args.value(&flag)?),
            "--streams" => {
                let n = parse_count(&flag, &args.value(&flag)?)?;
                if n == 0 || n > MAX_STREAMS as u64 {
                    return Err(usage(format!(
                        "--streams must be between 1 and {MAX_STREAMS}, got {n}"
                    )));
                }
                o.streams = n as u32;
            }
            "--buffer" => {
                let v = args.value(&flag)?;
                o.buffer = parse_size(&v).map_err(|e| usage(format!("--buffer: {e}")))?;
                if o.buffer == 0 {
                    return Err(usage("--buffer must be positive"));
                }
            }
            "--cc" => o.cc = Some(args.value(&flag)?),
            "--rate" => {
                let v = args.value(&flag)?;
                o.rate_bps = Some(parse_rate(&v).map_err(|e| usage(format!("--rate: {e}")))?);
            }
            "--time" => {
                let v = args.value(&flag)?;
                o.seconds = Some(parse_seconds(&v).map_err(|e| usage(format!("--time: {e}")))?);
            }
            "--bytes" => {
                let v = args.value(&flag)?;
                let b = parse_size(&v).map_err(|e| usage(format!("--bytes: {e}")))?;
                if b == 0 {
                    return Err(usage("--bytes must be positive"));
                }
                o.bytes = Some(b);
            }
            "--bidir" => {
                args.no_value(&flag)?;
                bidir = true
            }
            "--reverse" => {
                args.no_value(&flag)?;
                reverse = true
            }
            "--interval" => {
                let v = args.value(&flag)?;
                o.interval =
                    Some(parse_seconds(&v).map_err(|e| usage(format!("--interval: {e}")))?);
            }
            "--json" => {
                args.no_value(&flag)?;
                o.json = true
            }
            "--token-file" => o.token = Some(Token::from_file(args.value(&flag)?.as_ref())?),
            "--dest" => o.dest = Some(args.value(&flag)?),
            "--io-workers-per-device" => {
                let n = parse_count(&flag, &args.value(&flag)?)?;
                let max = crate::disk::plane::MAX_IO_WORKERS_PER_DEVICE as u64;
                if n == 0 || n > max {
                    return Err(usage(format!(
                        "--io-workers-per-device must be between 1 and {max}, got {n}"
                    )));
                }
                o.disk.io_workers_per_device = n as usize;
            }
            "--direct" => {
                args.no_value(&flag)?;
                o.disk.direct = true
            }
            "--follow-symlinks" => {
                args.no_value(&flag)?;
                o.disk.follow_symlinks = true
            }
            "--no-resume" => {
                args.no_value(&flag)?;
                o.disk.resume = false
            }
            "--checksum" => {
                args.no_value(&flag)?;
                o.disk.checksum = true
            }
            "--strict" => {
                args.no_value(&flag)?;
                o.strict = true
            }
            "-h" | "--help" => return Err(usage(USAGE)),
            other if other.starts_with('-') && other != "-" => {
                return Err(usage(format!("unknown flag '{other}' for send")))
            }
            path => o.paths.push(PathBuf::from(path)),
        }
    }
    o.to = to.ok_or_else(|| usage("send needs --to HOST:PORT"))?;
    if o.seconds.is_some() && o.bytes.is_some() {
        return Err(usage("--time and --bytes exclude each other"));
    }
    o.direction = match (bidir, reverse) {
        (true, true) => return Err(usage("--bidir and --reverse exclude each other")),
        (true, false) => Direction::Bidir,
        (false, true) => Direction::Receive,
        (false, false) => Direction::Send,
    };
    if let Some(cc) = &o.cc {
        crate::sockopt::check_cc(cc).map_err(|e| usage(format!("--cc: {e}")))?;
    }
    if o.disk.checksum && o.paths.is_empty() {
        return Err(usage(
            "--checksum compares files: it needs PATHs (disk mode)",
        ));
    }
    if o.disk.checksum && !o.disk.resume {
        return Err(usage(
            "--checksum decides which files to skip; --no-resume sends them all",
        ));
    }
    if o.interval.is_none() && !o.json {
        o.interval = Some(1.0);
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(args: &[&str]) -> Result<Command> {
        let mut v = vec!["send".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        parse(v)
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_problem() {
        let e = send(&["--to", "x:1", "--streams", "0"]).unwrap_err();
        assert!(e.to_string().contains("--streams"), "{e}");
        let e = send(&["--to", "x:1", "--streams", "1025"]).unwrap_err();
        assert!(e.to_string().contains("1025"), "{e}");
        let e = send(&["--to", "x:1", "--buffer", "2X"]).unwrap_err();
        assert!(e.to_string().contains("2X"), "{e}");
        let e = send(&["--to", "x:1", "--frobnicate"]).unwrap_err();
        assert!(e.to_string().contains("--frobnicate"), "{e}");
        assert!(matches!(send(&["--streams", "4"]), Err(Error::Usage(_))));
    }

    #[test]
    fn good_flags_parse() {
        let Command::Send(o) = send(&[
            "--to=127.0.0.1:7400",
            "--streams",
            "35",
            "--buffer",
            "2M",
            "--rate",
            "5G",
            "--bidir",
            "--json",
        ])
        .unwrap() else {
            panic!("not send")
        };
        assert_eq!(o.streams, 35);
        assert_eq!(o.buffer, 2 << 20);
        assert_eq!(o.rate_bps, Some(5_000_000_000));
        assert_eq!(o.direction, Direction::Bidir);
        assert!(o.interval.is_none());
    }
}
