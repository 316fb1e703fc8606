//! `longhaul sweep`: runs a measurement matrix against one `longhaul serve`
//! and writes CSV and JSON.
//!
//! - Window x streams (`--streams 1,2,4 --buffer 64K,2M --time 10`): one
//!   memory-mode session per cell, exactly what `longhaul send --streams S
//!   --buffer B --time T` would run (each cell records that command).
//!   Writes `sweep.csv` and `sweep.json` and names the best cell.
//! - Message lengths (`--messages 64,1K,64K,1M`): per length one
//!   request/response session and one streaming session in messages mode
//!   (the engine's messages plane), one stream each. Writes `messages.csv` and
//!   `messages.json` (`messages-load<N>.*` with `--load N`, so a sweep with
//!   and one without load can share a directory).
//! - `--load N`: N background memory streams ([`crate::load`]) run for the
//!   whole sweep.
//!
//! Every cell is a [`SendOptions`] value run in this process; the command
//! line it records is for the reader, not parsed again.

use std::path::{Path, PathBuf};

use crate::{Error, Result};
use longhaul_engine::auth::Token;
use longhaul_engine::client::{self, SendOptions};
use longhaul_engine::limits::DEFAULT_BUFFER;
use longhaul_engine::messages::CpuReport;
use longhaul_engine::planes::messages::{MessagesParams, Pattern, ACK_LEN};
use longhaul_engine::planes::{Amount, Payload};
use longhaul_engine::send_report::FinalReport;
use longhaul_units::{format_bps, format_bytes, size_arg};
use serde::Serialize;
use serde_json::{json, Value};

use crate::csv::to_csv;
use crate::load::Load;
use crate::results::{self, num};

/// Default matrix of the issue (SLAC/IN2P3 style window x streams sweep).
pub const DEFAULT_STREAMS: &[u32] = &[1, 2, 4, 8, 16, 32];
pub const DEFAULT_BUFFERS: &[u64] = &[8 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20];

/// Default seconds per cell.
pub const DEFAULT_TIME: f64 = 10.0;

/// `longhaul sweep` options.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    pub to: String,
    /// Read once when the sweep starts; recorded in each cell's command.
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
    /// Progress lines on stderr (`sweep: cell 3/36 ...`).
    pub progress: bool,
    /// The campaign and run every session of the sweep names (`--campaign`,
    /// `--run`), as `longhaul send` does.
    pub campaign: Option<String>,
    pub run: Option<String>,
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

fn fmt_secs(t: f64) -> String {
    let s = format!("{t}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

impl SweepOptions {
    /// The `longhaul send` command line that runs the same memory-mode cell
    /// (recorded with the cell for the reader).
    fn send_command(&self, streams: u32, buffer: u64) -> String {
        let mut v: Vec<String> = vec![
            "longhaul send --to".into(),
            self.to.clone(),
            "--streams".into(),
            streams.to_string(),
            "--buffer".into(),
            size_arg(buffer),
            "--time".into(),
            fmt_secs(self.time),
            "--json".into(),
        ];
        if let Some(cc) = &self.cc {
            v.extend(["--cc".into(), cc.clone()]);
        }
        if let Some(t) = &self.token_file {
            v.extend(["--token-file".into(), t.display().to_string()]);
        }
        v.join(" ")
    }
}

/// What every session of the sweep shares: server, token, congestion
/// control, time per cell.
struct Sessions<'a> {
    opts: &'a SweepOptions,
    token: Option<Token>,
}

impl Sessions<'_> {
    fn send_options(&self, streams: u32, buffer: u64, payload: Payload) -> SendOptions {
        let mut o = SendOptions::new(self.opts.to.clone(), payload);
        o.streams = streams;
        o.buffer = buffer;
        o.cc = self.opts.cc.clone();
        o.token = self.token.clone();
        o.campaign = self.opts.campaign.clone();
        o.run = self.opts.run.clone();
        o
    }

    /// One memory-mode cell, as `longhaul send` runs it.
    fn memory(&self, streams: u32, buffer: u64) -> SendOptions {
        let time = Amount::Seconds(self.opts.time);
        self.send_options(streams, buffer, Payload::Memory(time))
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

fn run_matrix_cell(sessions: &Sessions<'_>, streams: u32, buffer: u64) -> MatrixCell {
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
        command: sessions.opts.send_command(streams, buffer),
        error: None,
    };
    match client::run(&sessions.memory(streams, buffer), None) {
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
fn run_messages(
    sessions: &Sessions<'_>,
    pattern: Pattern,
    length: u64,
) -> longhaul_engine::Result<FinalReport> {
    let payload = Payload::Messages {
        params: MessagesParams { pattern, length },
        amount: Amount::Seconds(sessions.opts.time),
    };
    client::run(&sessions.send_options(1, DEFAULT_BUFFER, payload), None)
}

fn run_message_cell(sessions: &Sessions<'_>, length: u64) -> MessageCell {
    let mut cell = MessageCell {
        length,
        load_streams: sessions.opts.load,
        ..MessageCell::default()
    };
    let rr = run_messages(sessions, Pattern::Rr, length);
    let stream = rr.and_then(|rr| {
        let sender = rr
            .mode_report
            .messages
            .as_ref()
            .and_then(|m| m.get("sender"));
        cell.rr_messages = num(sender, &["messages"]) as u64;
        cell.rr_per_second = (cell.rr_messages as f64 / rr.seconds.max(1e-9)).round();
        cell.latency_p50_us = num(sender, &["latency_us", "p50"]);
        cell.latency_p99_us = num(sender, &["latency_us", "p99"]);
        cell.latency_mean_us = num(sender, &["latency_us", "mean"]);
        run_messages(sessions, Pattern::Stream, length)
    });
    match stream {
        Ok(s) => {
            let m = s.mode_report.messages.as_ref();
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

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn progress(opts: &SweepOptions, msg: String) {
    if opts.progress {
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

/// The streams x buffers matrix, when asked for: its cells run one after
/// the other, written to sweep.csv and sweep.json under `dir`.
fn matrix_sweep(sessions: &Sessions<'_>, dir: &Path, header: Value) -> Result<Option<Value>> {
    let opts = sessions.opts;
    if opts.streams.is_empty() || opts.buffers.is_empty() {
        return Ok(None);
    }
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
            cells.push(run_matrix_cell(sessions, s, b));
        }
    }
    if cells.iter().all(|c| c.error.is_some()) {
        let e = cells[0].error.clone().unwrap_or_default();
        return Err(Error::Failed(format!("every sweep cell failed: {e}")));
    }
    let mut v = header;
    v["streams"] = json!(opts.streams);
    v["buffers"] = json!(opts.buffers);
    v["best"] = json!(best(&cells));
    v["cells"] = json!(cells);
    write_file(&dir.join("sweep.csv"), &to_csv(&cells, MATRIX_COLUMNS))?;
    write_file(
        &dir.join("sweep.json"),
        &serde_json::to_string_pretty(&v).unwrap_or_default(),
    )?;
    Ok(Some(v))
}

/// The message lengths, when asked for: each one's request/response and
/// streaming cell, written to messages[-loadN].csv and .json under `dir`.
fn message_sweep(sessions: &Sessions<'_>, dir: &Path, header: Value) -> Result<Option<Value>> {
    let opts = sessions.opts;
    if opts.messages.is_empty() {
        return Ok(None);
    }
    let mut cells = Vec::with_capacity(opts.messages.len());
    for &len in &opts.messages {
        progress(
            opts,
            format!(
                "message length {} (request/response, then stream)",
                size_arg(len)
            ),
        );
        cells.push(run_message_cell(sessions, len));
    }
    if cells.iter().all(|c| c.error.is_some()) {
        let e = cells[0].error.clone().unwrap_or_default();
        return Err(Error::Failed(format!("every message length failed: {e}")));
    }
    let mut v = header;
    v["ack_bytes"] = json!(ACK_LEN);
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
    Ok(Some(v))
}

/// Runs the sweep, writes its files, returns what it wrote.
pub fn run(opts: &SweepOptions) -> Result<SweepOutput> {
    if opts.time <= 0.0 || !opts.time.is_finite() {
        return Err(Error::Usage("--time must be positive".into()));
    }
    let started = results::utc_stamp(jiff::Timestamp::now());
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("results/sweep-{started}")));
    // Fail early on a bad token file, refused or auth, before the load or a
    // long matrix starts.
    let token = match &opts.token_file {
        Some(path) => Some(Token::from_file(path)?),
        None => None,
    };
    let sessions = Sessions { opts, token };
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let load = if opts.load > 0 {
        progress(
            opts,
            format!("starting {} background load stream(s)", opts.load),
        );
        Some(Load::start(sessions.memory(opts.load, DEFAULT_BUFFER))?)
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
    let matrix = matrix_sweep(&sessions, &dir, header("sweep"))?;
    let messages = message_sweep(&sessions, &dir, header("messages"))?;
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
            format!("background load moved {}", format_bytes(bytes)),
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

/// The `--json` output: the files' contents in one object.
pub fn to_json(out: &SweepOutput) -> Value {
    let mut v = json!({ "type": "sweep", "dir": out.dir.display().to_string() });
    if let Some(m) = &out.matrix {
        v["matrix"] = m.clone();
    }
    if let Some(m) = &out.messages {
        v["messages"] = m.clone();
    }
    v
}
