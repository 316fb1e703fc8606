//! What `longhaul send` and `longhaul get` show while they run, and their
//! final report.
//!
//! - For scripts (stdout not a terminal), or with `--interval`: one line
//!   per interval, for people or as JSON with `--json` (the shape of
//!   DESIGN.md); without `--interval` the period is 1 s, and `--json` alone
//!   prints no interval lines.
//! - On a terminal, without `--interval` and `--json`: a progress bar with
//!   the bytes moved, the rate, the time left and, in disk mode, the files
//!   sent; cleared when the run ends.
//!
//! Then the final report: the human summary, or the JSON object; a run
//! that fails prints one too (`"ok": false` and the error, with what moved
//! and was verified when the data phase ended), and its error on stderr.

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use longhaul_engine::client::{self, Failure, Live, SendOptions, Watch};
use longhaul_engine::planes::Amount;
use longhaul_engine::send_report::{FailedRun, FinalReport, IntervalTracker};
use longhaul_units::{format_bps, format_bytes};

use crate::args::{GetArgs, RunArgs, SendArgs, WireProtocol};

/// Interval of the lines when `--interval` is not given.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// How often the progress bar is refreshed: smooth enough for a person,
/// rare enough that sampling TCP_INFO of 1,024 streams costs nothing.
const BAR_REFRESH: Duration = Duration::from_millis(500);

/// What the bar's length counts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BarScale {
    /// Milliseconds of a `--time` run.
    Millis(u64),
    /// Payload bytes (`--bytes`, or the files of a disk run once known).
    Bytes(Option<u64>),
}

/// How a running send is shown.
enum Display {
    Lines {
        every: Duration,
        json: bool,
    },
    Bar {
        bar: ProgressBar,
        scale: BarScale,
        moved: u64,
    },
    Nothing,
}

impl Display {
    /// `bytes_total`: what this end sends in all, when the flags fix it.
    fn choose(
        args: &RunArgs,
        opts: &SendOptions,
        bytes_total: Option<u64>,
        terminal: bool,
    ) -> Display {
        match (args.interval, args.json) {
            (Some(s), json) => Display::Lines {
                every: Duration::from_secs_f64(s),
                json,
            },
            (None, true) => Display::Nothing,
            (None, false) if !terminal => Display::Lines {
                every: DEFAULT_INTERVAL,
                json: false,
            },
            (None, false) => {
                let scale = match opts.payload.amount() {
                    Some(Amount::Seconds(s)) => BarScale::Millis((s * 1000.0) as u64),
                    Some(Amount::Bytes(_)) => BarScale::Bytes(bytes_total),
                    None => BarScale::Bytes(None),
                };
                Display::Bar {
                    bar: new_bar(scale),
                    scale,
                    moved: 0,
                }
            }
        }
    }
}

fn new_bar(scale: BarScale) -> ProgressBar {
    let len = match scale {
        BarScale::Millis(ms) => ms,
        BarScale::Bytes(b) => b.unwrap_or(0),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stdout());
    let style = ProgressStyle::with_template(
        "{spinner} {elapsed:>4} [{wide_bar}] {percent:>3}%  {msg}  ETA {eta}",
    )
    .expect("the template is valid")
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// Runs `send` with `args`, showing it on `out`, and prints the final
/// report there.
pub fn send(args: &SendArgs, out: &mut dyn Write, terminal: bool) -> anyhow::Result<()> {
    run(
        &args.run,
        &args.options()?,
        args.bytes_total(),
        args.protocol,
        args.udp,
        out,
        terminal,
    )
}

/// Runs `get` with `args`, like [`send`].
pub fn get(args: &GetArgs, out: &mut dyn Write, terminal: bool) -> anyhow::Result<()> {
    run(
        &args.run,
        &args.options()?,
        None,
        WireProtocol::Longhaul,
        false,
        out,
        terminal,
    )
}

fn run(
    args: &RunArgs,
    opts: &SendOptions,
    bytes_total: Option<u64>,
    protocol: WireProtocol,
    udp: bool,
    out: &mut dyn Write,
    terminal: bool,
) -> anyhow::Result<()> {
    let mut display = Display::choose(args, opts, bytes_total, terminal);
    let mut tracker = IntervalTracker::default();
    let every = match &display {
        Display::Lines { every, .. } => Some(*every),
        Display::Bar { .. } => Some(BAR_REFRESH),
        Display::Nothing => None,
    };
    let mut tick = |live: &Live<'_>| show(&mut display, &mut tracker, live, out);
    let watch = every.map(|every| Watch {
        every,
        tick: &mut tick,
    });
    let report = match protocol {
        WireProtocol::Longhaul => client::run_reporting(opts, watch),
        WireProtocol::Iperf3 => {
            let transport = if udp {
                longhaul_engine::iperf3::Transport::Udp
            } else {
                longhaul_engine::iperf3::Transport::Tcp
            };
            opts.iperf3_test()
                .and_then(|test| longhaul_engine::iperf3::run_client(&test, transport, watch))
                .map_err(Failure::from)
        }
    };
    if let Display::Bar { bar, .. } = &display {
        bar.finish_and_clear();
    }
    match report {
        Ok(report) => print_report(&report, args.json, out),
        Err(Failure { error, report }) => {
            print_failure(opts, &error, report.as_deref(), args.json, out)?;
            Err(error.into())
        }
    }
}

/// What a failed run prints on stdout before its error goes to stderr:
/// with `--json` always a final object (`"ok": false`, the error, and all
/// the report holds when the data phase ran to its end), for people the
/// summary of what moved and was verified, if there is one.
fn print_failure(
    opts: &SendOptions,
    error: &longhaul_engine::Error,
    report: Option<&FinalReport>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match (report, json) {
        (Some(report), json) => print_report(report, json, out),
        (None, true) => {
            let failed = FailedRun::new(opts.payload.mode(), opts.direction, error);
            writeln!(out, "{}", serde_json::to_string(&failed)?)?;
            Ok(())
        }
        (None, false) => Ok(()),
    }
}

fn show(
    display: &mut Display,
    tracker: &mut IntervalTracker,
    live: &Live<'_>,
    out: &mut dyn Write,
) {
    let interval = tracker.next(live.streams, live.elapsed);
    match display {
        Display::Lines { json, .. } => {
            let line = if *json {
                serde_json::to_string(&interval).unwrap_or_default()
            } else {
                interval.human()
            };
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        Display::Bar { bar, scale, moved } => {
            *moved += interval.bytes;
            let mut msg = format!(
                "{} at {}",
                format_bytes(*moved),
                format_bps(interval.throughput_bps)
            );
            if let Some(p) = live.plane {
                if p.files_total > 0 {
                    msg.push_str(&format!(", files {}/{}", p.files_done, p.files_total));
                }
                if *scale == BarScale::Bytes(None) {
                    if let Some(total) = p.bytes_total {
                        bar.set_length(total);
                        *scale = BarScale::Bytes(Some(total));
                    }
                }
            }
            bar.set_message(msg);
            match scale {
                BarScale::Millis(ms) => {
                    bar.set_position((live.elapsed.as_millis() as u64).min(*ms))
                }
                BarScale::Bytes(_) => bar.set_position(*moved),
            }
        }
        Display::Nothing => {}
    }
}

/// The final report: the JSON object, or the summary for people.
pub fn print_report(report: &FinalReport, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string(report)?)?;
    } else {
        writeln!(out, "{}", report.human())?;
    }
    Ok(())
}
