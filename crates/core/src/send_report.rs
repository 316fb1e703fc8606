//! What a send reports: the final result object of DESIGN.md
//! ([`FinalReport`]) and the interval lines of `--interval`
//! ([`IntervalReport`]), each as JSON and for people. The mode adds its
//! own fields ([`ModeReport`]) without this module knowing them.

use std::sync::Arc;
use std::time::Duration;

use longhaul_units::{format_bps, format_bytes};
use serde::Serialize;

use crate::datapath::ModeReport;
use crate::error::Error;
use crate::messages::{CpuReport, Direction, Done, Mode, Role};
use crate::session::PhaseOutcome;
use crate::stream::StreamStats;

/// One stream in the final object. TCP fields come from the sending end's
/// socket (that is where cwnd, RTT and retransmits live).
#[derive(Debug, Clone, Serialize)]
pub struct StreamResult {
    pub id: u32,
    /// `send` (client -> server) or `receive` (server -> client).
    pub direction: &'static str,
    pub bytes: u64,
    pub retransmits: u64,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub cwnd_bytes: u64,
    pub pacing_rate_bps: u64,
    pub delivery_rate_bps: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuPair {
    pub sender: CpuReport,
    pub receiver: CpuReport,
}

/// Why a run failed, in its final object: `kind` is the error's short
/// code (`disk_full`, `busy`, `incomplete`, `timeout`, ...), `message`
/// what the command prints on stderr.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct ErrorReport {
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl ErrorReport {
    pub(crate) fn of(error: &Error) -> ErrorReport {
        ErrorReport {
            kind: error.code(),
            message: error.to_string(),
        }
    }
}

/// The final object of a run that failed before it had anything to report
/// (refused, auth, a peer gone in mid-run): `"ok": false` and the error,
/// with the mode and direction that were asked for.
#[derive(Debug, Clone, Serialize)]
pub struct FailedRun {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) ok: bool,
    pub(crate) error: ErrorReport,
    pub(crate) mode: Mode,
    pub(crate) direction: Direction,
}

impl FailedRun {
    pub fn new(mode: Mode, direction: Direction, error: &Error) -> FailedRun {
        FailedRun {
            kind: "result",
            ok: false,
            error: ErrorReport::of(error),
            mode,
            direction,
        }
    }
}

/// The final JSON object (DESIGN.md), plus a few extra fields.
#[derive(Debug, Clone, Serialize)]
pub struct FinalReport {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// False when the run failed after its data phase (files that failed,
    /// idle streams with `--strict`): the object then says why in `error`
    /// and still reports what moved and what was verified.
    pub(crate) ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ErrorReport>,
    pub(crate) mode: Mode,
    pub(crate) direction: Direction,
    /// Payload bytes moved (both directions added for bidir).
    pub bytes: u64,
    pub seconds: f64,
    pub throughput_bps: f64,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    pub streams: Vec<StreamResult>,
    /// Sender and receiver CPU. In bidir sessions both ends do both; there
    /// `sender` is the client (`longhaul send`) and `receiver` the server.
    pub cpu: CpuPair,
    pub(crate) session: String,
    pub(crate) peer: String,
    /// When the client started the data phase (said Start), RFC 3339 UTC
    /// with milliseconds, and the same instant in Unix seconds: the runs
    /// of a campaign phase line up on it.
    pub(crate) started: String,
    pub(crate) started_unix: f64,
    /// `--time`, when the run was asked for a duration: `seconds` is longer
    /// by the time the data already written but not yet delivered takes to
    /// reach the receiver after the sender stops writing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_seconds: Option<f64>,
    /// The mode's fields: `files` and `devices` (disk), `messages`.
    #[serde(flatten)]
    pub mode_report: ModeReport,
}

/// `started_unix`: Unix seconds with milliseconds.
pub(crate) fn unix_millis(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0)
        .unwrap_or(0.0)
}

/// What one finished send measured, from this end's point of view. From it
/// [`FinalReport::new`] derives the figures every protocol reports alike.
pub struct Measured {
    pub mode: Mode,
    pub direction: Direction,
    pub streams: Vec<StreamResult>,
    /// Bytes the receiving ends took in, client -> server and back.
    pub sent: u64,
    pub received: u64,
    /// The data phase's length at this end.
    pub seconds: f64,
    pub local_cpu: CpuReport,
    pub remote_cpu: CpuReport,
    pub session: String,
    pub peer: String,
    pub started: std::time::SystemTime,
    pub requested_seconds: Option<f64>,
    pub mode_report: ModeReport,
}

impl FinalReport {
    /// The final report of a send: totals, seconds to the microsecond,
    /// throughput, CPU by role (the client is the sender unless it only
    /// receives), the start instant in both forms.
    pub fn new(m: Measured) -> FinalReport {
        let bytes = m.sent + m.received;
        let seconds = m.seconds.max(1e-9);
        let cpu = match m.direction {
            Direction::Receive => CpuPair {
                sender: m.remote_cpu,
                receiver: m.local_cpu,
            },
            _ => CpuPair {
                sender: m.local_cpu,
                receiver: m.remote_cpu,
            },
        };
        FinalReport {
            kind: "result",
            ok: true,
            error: None,
            mode: m.mode,
            direction: m.direction,
            bytes,
            seconds: (seconds * 1e6).round() / 1e6,
            throughput_bps: (bytes as f64 * 8.0 / seconds).round(),
            bytes_sent: m.sent,
            bytes_received: m.received,
            streams: m.streams,
            cpu,
            session: m.session,
            peer: m.peer,
            started: longhaul_units::rfc3339(m.started),
            started_unix: unix_millis(m.started),
            requested_seconds: m.requested_seconds,
            mode_report: m.mode_report,
        }
    }

    /// Builds the client's final report from both ends' `Done`.
    pub fn from_outcome(
        mode: Mode,
        direction: Direction,
        outcome: &PhaseOutcome,
        mode_report: ModeReport,
        session: String,
        peer: String,
        started: std::time::SystemTime,
    ) -> FinalReport {
        let local: &Done = &outcome.local;
        let remote: &Done = &outcome.remote;
        let mut streams = Vec::with_capacity(local.streams.len());
        let (mut sent, mut received) = (0u64, 0u64);
        for (l, r) in local.streams.iter().zip(&remote.streams) {
            let (sender, receiver) = match l.role {
                Role::Send => (l, r),
                Role::Receive => (r, l),
            };
            let tcp = sender.tcp.unwrap_or_default();
            match l.role {
                Role::Send => sent += receiver.bytes,
                Role::Receive => received += receiver.bytes,
            }
            streams.push(StreamResult {
                id: l.id,
                direction: match l.role {
                    Role::Send => "send",
                    Role::Receive => "receive",
                },
                bytes: receiver.bytes,
                retransmits: tcp.retransmits,
                rtt_us: tcp.rtt_us,
                rttvar_us: tcp.rttvar_us,
                cwnd_bytes: tcp.cwnd_bytes,
                pacing_rate_bps: tcp.pacing_rate_bps,
                delivery_rate_bps: tcp.delivery_rate_bps,
            });
        }
        FinalReport::new(Measured {
            mode,
            direction,
            streams,
            sent,
            received,
            seconds: local.seconds,
            local_cpu: local.cpu,
            remote_cpu: remote.cpu,
            session,
            peer,
            started,
            requested_seconds: None,
            mode_report,
        })
    }

    /// The same report for a run that then failed with `error`.
    pub fn failed(mut self, error: &Error) -> FinalReport {
        self.ok = false;
        self.error = Some(ErrorReport::of(error));
        self
    }

    /// Human summary, a few lines.
    pub fn human(&self) -> String {
        let cpu = |c: &CpuReport| {
            format!(
                "user {:.1}% system {:.1}% softirq {:.1}% (process {:.2}+{:.2} s)",
                c.user_pct,
                c.system_pct,
                c.softirq_pct,
                c.process_user_seconds,
                c.process_system_seconds
            )
        };
        let retrans: u64 = self.streams.iter().map(|s| s.retransmits).sum();
        format!(
            "{} {}: {} in {:.2} s = {} over {} streams, {} retransmits\n  sender CPU:   {}\n  receiver CPU: {}{}",
            serde_json::to_value(self.mode).unwrap_or_default().as_str().unwrap_or("?"),
            serde_json::to_value(self.direction).unwrap_or_default().as_str().unwrap_or("?"),
            format_bytes(self.bytes),
            self.seconds,
            format_bps(self.throughput_bps),
            self.streams.len(),
            retrans,
            cpu(&self.cpu.sender),
            cpu(&self.cpu.receiver),
            self.mode_report.human
        )
    }
}

/// One interval's numbers for one stream.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IntervalStream {
    pub(crate) id: u32,
    pub(crate) direction: &'static str,
    pub(crate) bytes: u64,
    pub(crate) throughput_bps: f64,
    pub(crate) retransmits: u64,
    pub(crate) rtt_us: u32,
    pub(crate) cwnd_bytes: u64,
}

/// One interval line (`--interval`). `bytes` are delivered bytes: what the
/// receiver acknowledged (TCP's `bytes_acked` on a sending stream) or read
/// (a receiving stream), so an interval never shows more than the path
/// carried, nor socket buffers filling at the start.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalReport {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// `delivered`: what `bytes` count (older versions counted bytes written).
    pub(crate) counts: &'static str,
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub bytes: u64,
    pub throughput_bps: f64,
    pub(crate) streams: Vec<IntervalStream>,
}

/// Turns successive counter readings into interval reports.
#[derive(Debug, Default)]
pub struct IntervalTracker {
    last_at: f64,
    last_bytes: Vec<u64>,
}

impl IntervalTracker {
    pub fn next(&mut self, streams: &[Arc<StreamStats>], elapsed: Duration) -> IntervalReport {
        let end = elapsed.as_secs_f64();
        let span = (end - self.last_at).max(1e-9);
        if self.last_bytes.len() != streams.len() {
            self.last_bytes = vec![0; streams.len()];
        }
        let mut total = 0;
        let per: Vec<IntervalStream> = streams
            .iter()
            .zip(self.last_bytes.iter_mut())
            .map(|(s, last)| {
                let now = delivered(s);
                let delta = now - (*last).min(now);
                *last = now;
                total += delta;
                let tcp = s.last_tcp().unwrap_or_default();
                IntervalStream {
                    id: s.id,
                    direction: match s.role {
                        Role::Send => "send",
                        Role::Receive => "receive",
                    },
                    bytes: delta,
                    throughput_bps: (delta as f64 * 8.0 / span).round(),
                    retransmits: tcp.retransmits,
                    rtt_us: tcp.rtt_us,
                    cwnd_bytes: tcp.cwnd_bytes,
                }
            })
            .collect();
        let report = IntervalReport {
            kind: "interval",
            counts: "delivered",
            start: (self.last_at * 1000.0).round() / 1000.0,
            end: (end * 1000.0).round() / 1000.0,
            bytes: total,
            throughput_bps: (total as f64 * 8.0 / span).round(),
            streams: per,
        };
        self.last_at = end;
        report
    }
}

/// Bytes of a stream that reached the receiver: on a sending stream what TCP
/// says the receiver acknowledged (never more than was written: the
/// acknowledged count also holds the stream's header and FIN), on a
/// receiving stream what this end read.
fn delivered(s: &StreamStats) -> u64 {
    let written = s.bytes();
    match s.role {
        Role::Receive => written,
        Role::Send => crate::sockopt::tcp_info(&*s.socket)
            .map_or(written, |info| info.bytes_acked.min(written)),
    }
}

impl IntervalReport {
    pub fn human(&self) -> String {
        let retrans: u64 = self.streams.iter().map(|s| s.retransmits).sum();
        let rtts: Vec<u32> = self.streams.iter().map(|s| s.rtt_us).collect();
        let avg_rtt = if rtts.is_empty() {
            0
        } else {
            rtts.iter().map(|&r| r as u64).sum::<u64>() / rtts.len() as u64
        };
        format!(
            "[{:7.2}-{:7.2} s] {:>12}  {:>11}  {} streams  retrans {}  rtt {} us",
            self.start,
            self.end,
            format_bytes(self.bytes),
            format_bps(self.throughput_bps),
            self.streams.len(),
            retrans,
            avg_rtt
        )
    }
}
