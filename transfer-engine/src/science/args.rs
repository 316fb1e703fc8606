//! Command lines of `longhaul sweep`, `longhaul advise` and `longhaul report`.
//!
//! Usage text in [`crate::cli::USAGE`]. Same conventions as [`crate::cli`]: `--flag value` or `--flag=value`,
//! every mistake an [`Error::Usage`] naming the flag (exit code 2).

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::session::MAX_STREAMS;
use crate::units::{parse_rate, parse_seconds, parse_size};

use super::advise::{AdviseOptions, DEFAULT_PINGS, DEFAULT_RATE_BPS};
use super::report::ReportOptions;
use super::sweep::{SweepOptions, DEFAULT_BUFFERS, DEFAULT_STREAMS, DEFAULT_TIME};

/// One of the science subcommands.
#[derive(Debug)]
pub enum Command {
    Sweep(SweepOptions),
    Advise(AdviseOptions),
    Report(ReportOptions),
}

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

/// `--flag value` / `--flag=value` splitting.
struct Args {
    items: std::vec::IntoIter<String>,
    pending: Option<String>,
}

impl Args {
    fn new(argv: Vec<String>) -> Args {
        Args {
            items: argv.into_iter(),
            pending: None,
        }
    }

    fn next_flag(&mut self) -> Option<String> {
        let item = self.items.next()?;
        if item.starts_with("--") {
            if let Some((flag, value)) = item.split_once('=') {
                self.pending = Some(value.to_string());
                return Some(flag.to_string());
            }
        }
        Some(item)
    }

    fn value(&mut self, flag: &str) -> Result<String> {
        if let Some(v) = self.pending.take() {
            return Ok(v);
        }
        match self.items.next() {
            Some(v) if !v.starts_with("--") => Ok(v),
            _ => Err(usage(format!("{flag} needs a value"))),
        }
    }

    fn no_value(&mut self, flag: &str) -> Result<()> {
        match self.pending.take() {
            Some(_) => Err(usage(format!("{flag} takes no value"))),
            None => Ok(()),
        }
    }
}

/// Parses a comma-separated list with `item`.
fn list<T>(flag: &str, text: &str, item: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    let v: Result<Vec<T>> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| item(s).map_err(|e| usage(format!("{flag}: {e}"))))
        .collect();
    let v = v?;
    if v.is_empty() {
        return Err(usage(format!("{flag} needs at least one value")));
    }
    Ok(v)
}

fn count(flag: &str, text: &str) -> Result<u64> {
    text.parse()
        .map_err(|_| usage(format!("{flag}: '{text}' is not a whole number")))
}

fn positive_size(text: &str) -> Result<u64> {
    match parse_size(text)? {
        0 => Err(usage(format!("'{text}' must be positive"))),
        n => Ok(n),
    }
}

/// Parses `argv` after the subcommand name; `sub` is that name.
pub fn parse(sub: &str, argv: Vec<String>) -> Result<Command> {
    let mut args = Args::new(argv);
    match sub {
        "sweep" => parse_sweep(&mut args).map(Command::Sweep),
        "advise" => parse_advise(&mut args).map(Command::Advise),
        "report" => parse_report(&mut args).map(Command::Report),
        other => Err(usage(format!("unknown subcommand '{other}'"))),
    }
}

fn unknown(flag: &str, sub: &str) -> Error {
    if flag.starts_with('-') {
        usage(format!("unknown flag '{flag}' for {sub}"))
    } else {
        usage(format!("unexpected argument '{flag}' for {sub}"))
    }
}

fn parse_sweep(args: &mut Args) -> Result<SweepOptions> {
    let mut o = SweepOptions {
        time: DEFAULT_TIME,
        ..SweepOptions::default()
    };
    let mut to = None;
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--to" => to = Some(args.value(&flag)?),
            "--streams" => {
                o.streams = list(&flag, &args.value(&flag)?, |s| {
                    let n = count("--streams", s)?;
                    if n == 0 || n > MAX_STREAMS as u64 {
                        return Err(usage(format!("{n} is not between 1 and {MAX_STREAMS}")));
                    }
                    Ok(n as u32)
                })?
            }
            "--buffer" => o.buffers = list(&flag, &args.value(&flag)?, positive_size)?,
            "--messages" => {
                o.messages = list(&flag, &args.value(&flag)?, |s| {
                    let n = positive_size(s)?;
                    if n > super::msgplane::MAX_MESSAGE_LEN {
                        return Err(usage(format!(
                            "{s} is longer than the largest message ({} bytes)",
                            super::msgplane::MAX_MESSAGE_LEN
                        )));
                    }
                    Ok(n)
                })?
            }
            "--time" => {
                let v = args.value(&flag)?;
                o.time = parse_seconds(&v).map_err(|e| usage(format!("--time: {e}")))?;
            }
            "--load" => {
                let n = count(&flag, &args.value(&flag)?)?;
                if n > MAX_STREAMS as u64 {
                    return Err(usage(format!("--load must be at most {MAX_STREAMS}")));
                }
                o.load = n as u32;
            }
            "--out" => o.out = Some(PathBuf::from(args.value(&flag)?)),
            "--json" => {
                args.no_value(&flag)?;
                o.json = true
            }
            "--token-file" => {
                let path = PathBuf::from(args.value(&flag)?);
                // Read once now so a bad file is a usage error up front.
                crate::auth::Token::from_file(&path)?;
                o.token_file = Some(path);
            }
            "--cc" => o.cc = Some(args.value(&flag)?),
            other => return Err(unknown(other, "sweep")),
        }
    }
    o.to = to.ok_or_else(|| usage("sweep needs --to HOST:PORT"))?;
    let matrix_asked = !o.streams.is_empty() || !o.buffers.is_empty();
    if matrix_asked || o.messages.is_empty() {
        if o.streams.is_empty() {
            o.streams = DEFAULT_STREAMS.to_vec();
        }
        if o.buffers.is_empty() {
            o.buffers = DEFAULT_BUFFERS.to_vec();
        }
    }
    Ok(o)
}

fn parse_advise(args: &mut Args) -> Result<AdviseOptions> {
    let mut o = AdviseOptions {
        to: String::new(),
        rate_bps: DEFAULT_RATE_BPS,
        pings: DEFAULT_PINGS,
        token: None,
        json: false,
    };
    let mut to = None;
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--to" => to = Some(args.value(&flag)?),
            "--rate" => {
                let v = args.value(&flag)?;
                o.rate_bps = parse_rate(&v).map_err(|e| usage(format!("--rate: {e}")))?;
            }
            "--pings" => {
                let n = count(&flag, &args.value(&flag)?)?;
                let max = super::advise::MAX_PINGS - 1;
                if n == 0 || n > max {
                    return Err(usage(format!("--pings must be between 1 and {max}")));
                }
                o.pings = n as u32;
            }
            "--json" => {
                args.no_value(&flag)?;
                o.json = true
            }
            "--token-file" => {
                o.token = Some(crate::auth::Token::from_file(args.value(&flag)?.as_ref())?)
            }
            other => return Err(unknown(other, "advise")),
        }
    }
    o.to = to.ok_or_else(|| usage("advise needs --to HOST:PORT"))?;
    Ok(o)
}

fn parse_report(args: &mut Args) -> Result<ReportOptions> {
    let mut o = ReportOptions::default();
    let mut dir = None;
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--out" => o.out = Some(PathBuf::from(args.value(&flag)?)),
            "--title" => o.title = Some(args.value(&flag)?),
            "--prometheus" => o.prometheus = Some(args.value(&flag)?),
            "--from" => o.from = Some(args.value(&flag)?),
            "--to" => o.to = Some(args.value(&flag)?),
            "--step" => {
                let v = args.value(&flag)?;
                o.step = Some(parse_seconds(&v).map_err(|e| usage(format!("--step: {e}")))?);
            }
            other if other.starts_with('-') => return Err(unknown(other, "report")),
            path if dir.is_none() => dir = Some(PathBuf::from(path)),
            other => return Err(unknown(other, "report")),
        }
    }
    o.dir = dir.ok_or_else(|| usage("report needs RESULTS_DIR"))?;
    if o.prometheus.is_some() && (o.from.is_none() || o.to.is_none()) {
        return Err(usage("--prometheus needs --from and --to"));
    }
    if o.prometheus.is_none() && (o.from.is_some() || o.to.is_some()) {
        return Err(usage("--from/--to only apply with --prometheus"));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sweep_lists_and_defaults() {
        let Command::Sweep(o) = parse(
            "sweep",
            argv(&[
                "--to",
                "h:1",
                "--streams",
                "1,2",
                "--buffer=64K,2M",
                "--time",
                "1",
            ]),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(o.streams, vec![1, 2]);
        assert_eq!(o.buffers, vec![64 << 10, 2 << 20]);
        assert!(o.messages.is_empty());
        let Command::Sweep(o) = parse(
            "sweep",
            argv(&["--to", "h:1", "--messages", "64,1K", "--load", "2"]),
        )
        .unwrap() else {
            panic!()
        };
        assert!(o.streams.is_empty() && o.buffers.is_empty());
        assert_eq!(o.messages, vec![64, 1024]);
        assert_eq!(o.load, 2);
        let Command::Sweep(o) = parse("sweep", argv(&["--to", "h:1"])).unwrap() else {
            panic!()
        };
        assert_eq!(o.streams.len() * o.buffers.len(), 36);
    }

    #[test]
    fn mistakes_name_the_flag() {
        let e = parse("sweep", argv(&["--to", "h:1", "--streams", "1,0"])).unwrap_err();
        assert!(e.to_string().contains("--streams"), "{e}");
        let e = parse("sweep", argv(&["--to", "h:1", "--buffer", "2X"])).unwrap_err();
        assert!(e.to_string().contains("--buffer"), "{e}");
        let e = parse("sweep", argv(&["--streams", "1"])).unwrap_err();
        assert!(e.to_string().contains("--to"), "{e}");
        let e = parse("advise", argv(&["--to", "h:1", "--rate", "fast"])).unwrap_err();
        assert!(e.to_string().contains("--rate"), "{e}");
        let e = parse("report", argv(&["d", "--prometheus", "http://x"])).unwrap_err();
        assert!(e.to_string().contains("--from"), "{e}");
        assert!(matches!(parse("report", argv(&[])), Err(Error::Usage(_))));
    }
}
