//! `longhaul sweep`: runs a measurement matrix against one `longhaul serve`
//! and writes CSV and JSON.
//!
//! - Window x streams (`--streams 1,2,4 --buffer 64K,2M --time 10`): one
//!   memory-mode session per cell, exactly what `longhaul send --streams S
//!   --buffer B --time T` would run (each cell records that command).
//!   Writes `sweep.csv` and `sweep.json` and names the best cell.
//! - Message lengths (`--messages 64,1K,64K,1M`): per length one
//!   request/response session and one streaming session in messages mode
//!   ([`super::msgplane`]), one stream each. Writes `messages.csv` and
//!   `messages.json` (`messages-load<N>.*` with `--load N`, so a sweep with
//!   and one without load can share a directory).
//! - `--load N`: N background memory streams ([`super::load`]) run for the
//!   whole sweep.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use crate::client::{self, SendOptions};
use crate::error::{Error, Result};
use crate::messages::{CpuReport, Mode};
use crate::report::FinalReport;
use crate::units::format_bps;

use super::advise::size_arg;
use super::load::Load;
use super::msgplane::{MessagesParams, Pattern};

/// Default matrix of the issue (SLAC/IN2P3 style window x streams sweep).
pub const DEFAULT_STREAMS: &[u32] = &[1, 2, 4, 8, 16, 32];
pub const DEFAULT_BUFFERS: &[u64] = &[8 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20];

/// Default seconds per cell.
pub const DEFAULT_TIME: f64 = 10.0;

/// `longhaul sweep` options.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    pub to: String,
    pub token_file: Option<PathBuf>,
    pub cc: Option<String>,
    /// Window x streams matrix; empty = no matrix.
    pub streams: Vec<u32>,
    pub buffers: Vec<u64>,
    /// Message lengths; empty = no message sweep.
    pub messages: Vec<u64>,
    pub time: f64,
    pub load: u32,
    pub out: Option<PathBuf>,
    pub json: bool,
}

/// CPU of one end, the fields the figures use.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuCell {
    pub user_pct: f64,
    pub system_pct: f64,
    pub softirq_pct: f64,
    pub process_seconds: f64,
}

impl From<&CpuReport> for CpuCell {
    fn from(c: &CpuReport) -> CpuCell {
        CpuCell {
            user_pct: c.user_pct,
            system_pct: c.system_pct,
            softirq_pct: c.softirq_pct,
            process_seconds: ((c.process_user_seconds + c.process_system_seconds) * 1000.0).round()
                / 1000.0,
        }
    }
}

/// One window x streams cell.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixCell {
    pub streams: u32,
    pub buffer_bytes: u64,
    pub buffer: String,
    pub throughput_bps: f64,
    pub bytes: u64,
    pub seconds: f64,
    /// Sum over streams (the senders' tcpi_total_retrans).
    pub retransmits: u64,
    /// Mean of the streams' last smoothed RTT, microseconds.
    pub mean_rtt_us: f64,
    pub cpu_sender: Option<CpuCell>,
    pub cpu_receiver: Option<CpuCell>,
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One message length.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MessageCell {
    pub length: u64,
    pub load_streams: u32,
    /// Request/response: completed round trips, per second, latency.
    pub rr_messages: u64,
    pub rr_per_second: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_mean_us: f64,
    /// Streaming: payload throughput and messages per second.
    pub stream_throughput_bps: f64,
    pub stream_messages_per_second: f64,
    /// Streaming: worker thread CPU per message, microseconds.
    pub sender_cpu_us_per_message: f64,
    pub receiver_cpu_us_per_message: f64,
    /// Streaming: machine CPU of both ends.
    pub cpu_sender: Option<CpuCell>,
    pub cpu_receiver: Option<CpuCell>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a sweep wrote.
#[derive(Debug, Clone)]
pub struct SweepOutput {
    pub dir: PathBuf,
    pub matrix: Option<Value>,
    pub messages: Option<Value>,
}

/// UTC `YYYYmmddTHHMMSSZ` of a Unix time (the campaign results' format).
pub fn utc_stamp(unix: u64) -> String {
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn fmt_secs(t: f64) -> String {
    let s = format!("{t}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

impl SweepOptions {
    /// The `longhaul send` command line of one memory-mode run.
    fn send_argv(&self, streams: u32, buffer: u64, seconds: f64) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "send".into(),
            "--to".into(),
            self.to.clone(),
            "--streams".into(),
            streams.to_string(),
            "--buffer".into(),
            size_arg(buffer),
            "--time".into(),
            fmt_secs(seconds),
            "--json".into(),
        ];
        if let Some(cc) = &self.cc {
            v.extend(["--cc".into(), cc.clone()]);
        }
        if let Some(t) = &self.token_file {
            v.extend(["--token-file".into(), t.display().to_string()]);
        }
        v
    }

    /// Send options built by the `send` parser itself, so every cell runs
    /// with exactly the defaults of the command it records.
    fn send_options(&self, streams: u32, buffer: u64, seconds: f64) -> Result<SendOptions> {
        match crate::cli::parse(self.send_argv(streams, buffer, seconds))? {
            crate::cli::Command::Send(o) => Ok(o),
            _ => Err(Error::Usage("internal: send options did not parse".into())),
        }
    }
}

fn mean_rtt(r: &FinalReport) -> f64 {
    let rtts: Vec<f64> = r
        .streams
        .iter()
        .filter(|s| s.rtt_us > 0)
        .map(|s| s.rtt_us as f64)
        .collect();
    if rtts.is_empty() {
        0.0
    } else {
        (rtts.iter().sum::<f64>() / rtts.len() as f64).round()
    }
}

fn run_matrix_cell(opts: &SweepOptions, streams: u32, buffer: u64) -> MatrixCell {
    let argv = opts.send_argv(streams, buffer, opts.time);
    let mut cell = MatrixCell {
        streams,
        buffer_bytes: buffer,
        buffer: size_arg(buffer),
        throughput_bps: 0.0,
        bytes: 0,
        seconds: 0.0,
        retransmits: 0,
        mean_rtt_us: 0.0,
        cpu_sender: None,
        cpu_receiver: None,
        command: format!("longhaul {}", argv.join(" ")),
        error: None,
    };
    let result = opts
        .send_options(streams, buffer, opts.time)
        .and_then(|o| client::run(&o, &mut std::io::sink()));
    match result {
        Ok(r) => {
            cell.throughput_bps = r.throughput_bps;
            cell.bytes = r.bytes;
            cell.seconds = r.seconds;
            cell.retransmits = r.streams.iter().map(|s| s.retransmits).sum();
            cell.mean_rtt_us = mean_rtt(&r);
            cell.cpu_sender = Some((&r.cpu.sender).into());
            cell.cpu_receiver = Some((&r.cpu.receiver).into());
        }
        Err(e) => cell.error = Some(e.to_string()),
    }
    cell
}

/// Runs one messages-mode session of `pattern` and returns its report.
fn run_messages(opts: &SweepOptions, pattern: Pattern, length: u64) -> Result<FinalReport> {
    let o = opts.send_options(1, crate::session::DEFAULT_BUFFER, opts.time)?;
    let mut req = o.request();
    req.mode = Mode::Messages;
    req.mode_params = Some(MessagesParams { pattern, length }.to_value());
    client::run_request(&o, req, &mut std::io::sink())
}

fn num(v: Option<&Value>, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = cur.and_then(|c| c.get(p));
    }
    cur.and_then(Value::as_f64).unwrap_or(0.0)
}

fn run_message_cell(opts: &SweepOptions, length: u64) -> MessageCell {
    let mut cell = MessageCell {
        length,
        load_streams: opts.load,
        ..MessageCell::default()
    };
    let rr = run_messages(opts, Pattern::Rr, length);
    let stream = rr.and_then(|rr| {
        let sender = rr.messages.as_ref().and_then(|m| m.get("sender"));
        cell.rr_messages = num(sender, &["messages"]) as u64;
        cell.rr_per_second = (cell.rr_messages as f64 / rr.seconds.max(1e-9)).round();
        cell.latency_p50_us = num(sender, &["latency_us", "p50"]);
        cell.latency_p99_us = num(sender, &["latency_us", "p99"]);
        cell.latency_mean_us = num(sender, &["latency_us", "mean"]);
        run_messages(opts, Pattern::Stream, length)
    });
    match stream {
        Ok(s) => {
            let m = s.messages.as_ref();
            let sent = num(m.and_then(|m| m.get("sender")), &["messages"]);
            cell.stream_throughput_bps = s.throughput_bps;
            cell.stream_messages_per_second = (sent / s.seconds.max(1e-9)).round();
            cell.sender_cpu_us_per_message =
                num(m.and_then(|m| m.get("sender")), &["cpu_us_per_message"]);
            cell.receiver_cpu_us_per_message =
                num(m.and_then(|m| m.get("receiver")), &["cpu_us_per_message"]);
            cell.cpu_sender = Some((&s.cpu.sender).into());
            cell.cpu_receiver = Some((&s.cpu.receiver).into());
        }
        Err(e) => cell.error = Some(e.to_string()),
    }
    cell
}

fn csv_field(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) if s.contains([',', '"', '\n']) => {
            format!("\"{}\"", s.replace('"', "\"\""))
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Flattens `{a: {b: 1}}` into `a_b` columns.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(&key, v, out);
            }
        }
        // An absent value (None) is an empty field, not a column of its own.
        Value::Null => {}
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// Leading CSV columns of the matrix, in this order (the rest follow
/// alphabetically).
pub const MATRIX_COLUMNS: &[&str] = &[
    "streams",
    "buffer",
    "buffer_bytes",
    "throughput_bps",
    "retransmits",
    "mean_rtt_us",
    "bytes",
    "seconds",
];

/// Leading CSV columns of a message-length sweep.
pub const MESSAGE_COLUMNS: &[&str] = &[
    "length",
    "load_streams",
    "latency_p50_us",
    "latency_p99_us",
    "latency_mean_us",
    "rr_per_second",
    "rr_messages",
    "stream_throughput_bps",
    "stream_messages_per_second",
    "sender_cpu_us_per_message",
    "receiver_cpu_us_per_message",
];

/// CSV of serialized cells: one header from the union of the flattened
/// fields (`first` in that order, then the others alphabetically), one
/// line per cell.
pub fn to_csv<T: Serialize>(cells: &[T], first: &[&str]) -> String {
    let rows: Vec<Vec<(String, Value)>> = cells
        .iter()
        .map(|c| {
            let mut row = Vec::new();
            flatten(
                "",
                &serde_json::to_value(c).unwrap_or(Value::Null),
                &mut row,
            );
            row
        })
        .collect();
    let mut rest: Vec<String> = Vec::new();
    for row in &rows {
        for (k, _) in row {
            if !first.contains(&k.as_str()) && !rest.contains(k) {
                rest.push(k.clone());
            }
        }
    }
    rest.sort();
    let mut header: Vec<String> = first
        .iter()
        .filter(|f| rows.iter().any(|r| r.iter().any(|(k, _)| k == *f)))
        .map(|f| f.to_string())
        .collect();
    header.extend(rest);
    let mut out = header.join(",");
    out.push('\n');
    for row in rows {
        let line: Vec<String> = header
            .iter()
            .map(|h| {
                row.iter()
                    .find(|(k, _)| k == h)
                    .map(|(_, v)| csv_field(v))
                    .unwrap_or_default()
            })
            .collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn progress(opts: &SweepOptions, msg: String) {
    if !opts.json {
        eprintln!("sweep: {msg}");
    }
}

/// The best cell: highest throughput.
pub fn best(cells: &[MatrixCell]) -> Option<&MatrixCell> {
    cells
        .iter()
        .filter(|c| c.error.is_none())
        .max_by(|a, b| a.throughput_bps.total_cmp(&b.throughput_bps))
}

/// Runs the sweep, writes its files, returns what it wrote.
pub fn run(opts: &SweepOptions) -> Result<SweepOutput> {
    if opts.time <= 0.0 || !opts.time.is_finite() {
        return Err(Error::Usage("--time must be positive".into()));
    }
    let started = utc_stamp(now_unix());
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("results/sweep-{started}")));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // Fail early on refused/auth, before the load or a long matrix starts.
    let (s0, b0) = (
        opts.streams.first().copied().unwrap_or(1),
        opts.buffers
            .first()
            .copied()
            .unwrap_or(crate::session::DEFAULT_BUFFER),
    );
    opts.send_options(s0, b0, opts.time)?;
    let load = if opts.load > 0 {
        progress(
            opts,
            format!("starting {} background load stream(s)", opts.load),
        );
        let o = opts.send_options(opts.load, crate::session::DEFAULT_BUFFER, opts.time)?;
        Some(Load::start(o)?)
    } else {
        None
    };
    let header = |kind: &str| {
        json!({
            "kind": kind,
            "to": opts.to,
            "time_s": opts.time,
            "load_streams": opts.load,
            "started": started,
        })
    };

    let mut matrix = None;
    if !opts.streams.is_empty() && !opts.buffers.is_empty() {
        let total = opts.streams.len() * opts.buffers.len();
        let mut cells = Vec::with_capacity(total);
        for &s in &opts.streams {
            for &b in &opts.buffers {
                progress(
                    opts,
                    format!(
                        "cell {}/{total}: {s} stream(s) x {} buffer",
                        cells.len() + 1,
                        size_arg(b)
                    ),
                );
                cells.push(run_matrix_cell(opts, s, b));
            }
        }
        if cells.iter().all(|c| c.error.is_some()) {
            let e = cells[0].error.clone().unwrap_or_default();
            return Err(Error::PeerAborted(format!("every sweep cell failed: {e}")));
        }
        let mut v = header("sweep");
        v["streams"] = json!(opts.streams);
        v["buffers"] = json!(opts.buffers);
        v["best"] = json!(best(&cells));
        v["cells"] = json!(cells);
        write_file(&dir.join("sweep.csv"), &to_csv(&cells, MATRIX_COLUMNS))?;
        write_file(
            &dir.join("sweep.json"),
            &serde_json::to_string_pretty(&v).unwrap_or_default(),
        )?;
        matrix = Some(v);
    }

    let mut messages = None;
    if !opts.messages.is_empty() {
        let mut cells = Vec::with_capacity(opts.messages.len());
        for &len in &opts.messages {
            progress(
                opts,
                format!(
                    "message length {} (request/response, then stream)",
                    size_arg(len)
                ),
            );
            cells.push(run_message_cell(opts, len));
        }
        if cells.iter().all(|c| c.error.is_some()) {
            let e = cells[0].error.clone().unwrap_or_default();
            return Err(Error::PeerAborted(format!(
                "every message length failed: {e}"
            )));
        }
        let mut v = header("messages");
        v["ack_bytes"] = json!(super::msgplane::ACK_LEN);
        v["cells"] = json!(cells);
        let stem = if opts.load > 0 {
            format!("messages-load{}", opts.load)
        } else {
            "messages".to_string()
        };
        write_file(
            &dir.join(format!("{stem}.csv")),
            &to_csv(&cells, MESSAGE_COLUMNS),
        )?;
        write_file(
            &dir.join(format!("{stem}.json")),
            &serde_json::to_string_pretty(&v).unwrap_or_default(),
        )?;
        messages = Some(v);
    }
    if let Some(l) = load {
        if let Some(e) = l.error() {
            progress(
                opts,
                format!("warning: the background load stopped early: {e}"),
            );
        }
        let bytes = l.stop();
        progress(
            opts,
            format!(
                "background load moved {}",
                crate::units::format_bytes(bytes)
            ),
        );
    }
    Ok(SweepOutput {
        dir,
        matrix,
        messages,
    })
}

/// The human summary: tables and the best cell.
pub fn human(out: &SweepOutput) -> String {
    let mut s = String::new();
    if let Some(m) = &out.matrix {
        let cells: Vec<Value> = m["cells"].as_array().cloned().unwrap_or_default();
        s.push_str(&format!(
            "{:>7} {:>7} {:>12} {:>8} {:>10} {:>9} {:>9}\n",
            "streams", "buffer", "throughput", "retrans", "rtt us", "snd sys%", "rcv sys%"
        ));
        for c in &cells {
            if let Some(e) = c["error"].as_str() {
                s.push_str(&format!(
                    "{:>7} {:>7} failed: {e}\n",
                    c["streams"].to_string(),
                    c["buffer"].as_str().unwrap_or("?")
                ));
                continue;
            }
            s.push_str(&format!(
                "{:>7} {:>7} {:>12} {:>8} {:>10.0} {:>9.1} {:>9.1}\n",
                c["streams"].to_string(),
                c["buffer"].as_str().unwrap_or("?"),
                format_bps(c["throughput_bps"].as_f64().unwrap_or(0.0)),
                c["retransmits"].to_string(),
                c["mean_rtt_us"].as_f64().unwrap_or(0.0),
                c["cpu_sender"]["system_pct"].as_f64().unwrap_or(0.0),
                c["cpu_receiver"]["system_pct"].as_f64().unwrap_or(0.0),
            ));
        }
        if let Some(b) = m["best"].as_object() {
            s.push_str(&format!(
                "best: {} stream(s) x {} buffer = {}\n",
                b["streams"],
                b["buffer"].as_str().unwrap_or("?"),
                format_bps(b["throughput_bps"].as_f64().unwrap_or(0.0))
            ));
        }
    }
    if let Some(m) = &out.messages {
        s.push_str(&format!(
            "{:>8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>12}   (load: {} streams)\n",
            "length",
            "p50 us",
            "p99 us",
            "rr/s",
            "stream",
            "snd us/msg",
            "rcv us/msg",
            m["load_streams"]
        ));
        for c in m["cells"].as_array().cloned().unwrap_or_default() {
            let len = size_arg(c["length"].as_u64().unwrap_or(0));
            if let Some(e) = c["error"].as_str() {
                s.push_str(&format!("{len:>8} failed: {e}\n"));
                continue;
            }
            let f = |k: &str| c[k].as_f64().unwrap_or(0.0);
            s.push_str(&format!(
                "{len:>8} {:>10.1} {:>10.1} {:>12.0} {:>12} {:>12.3} {:>12.3}\n",
                f("latency_p50_us"),
                f("latency_p99_us"),
                f("rr_per_second"),
                format_bps(f("stream_throughput_bps")),
                f("sender_cpu_us_per_message"),
                f("receiver_cpu_us_per_message"),
            ));
        }
    }
    s.push_str(&format!("results in {}", out.dir.display()));
    s
}

/// `longhaul sweep` on the command line.
pub fn main(opts: &SweepOptions, out: &mut dyn Write) -> Result<()> {
    let o = run(opts)?;
    let text = if opts.json {
        let mut v = json!({ "type": "sweep", "dir": o.dir.display().to_string() });
        if let Some(m) = &o.matrix {
            v["matrix"] = m.clone();
        }
        if let Some(m) = &o.messages {
            v["messages"] = m.clone();
        }
        serde_json::to_string(&v).unwrap_or_default()
    } else {
        human(&o)
    };
    writeln!(out, "{text}").map_err(|e| Error::io("writing the output", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_795_251_430), "20261121T085710Z");
    }

    #[test]
    fn csv_flattens_and_quotes() {
        #[derive(Serialize)]
        struct C {
            a: u32,
            cpu: Option<CpuCell>,
            error: Option<String>,
        }
        let cpu = CpuCell {
            user_pct: 1.0,
            system_pct: 2.0,
            softirq_pct: 3.0,
            process_seconds: 0.5,
        };
        let csv = to_csv(
            &[
                C {
                    a: 1,
                    cpu: Some(cpu),
                    error: None,
                },
                C {
                    a: 2,
                    cpu: None,
                    error: Some("x, \"y\"".into()),
                },
            ],
            &["a"],
        );
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "a,cpu_process_seconds,cpu_softirq_pct,cpu_system_pct,cpu_user_pct,error"
        );
        assert_eq!(lines[1], "1,0.5,3.0,2.0,1.0,");
        assert_eq!(lines[2], "2,,,,,\"x, \"\"y\"\"\"");
    }
}
