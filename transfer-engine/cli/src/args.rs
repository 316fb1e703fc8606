//! The `longhaul` command line (clap): the subcommands and their flags as
//! DESIGN.md names them, the rules for their values (sizes, rates and
//! durations after `longhaul-units`, ranges after the engine's limits), and
//! the engine and science options they make.
//!
//! Every mistake is a usage error naming the flag, with a suggestion for a
//! misspelt one; `main` exits 2 on it.

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};
use longhaul_engine::auth::Token;
use longhaul_engine::client::SendOptions;
use longhaul_engine::iperf3::{Iperf3Options, ServerAuth, DEFAULT_SKEW as AUTH_SKEW};
use longhaul_engine::limits::MAX_STREAMS;
use longhaul_engine::messages::Direction;
use longhaul_engine::planes::disk::{DiskOptions, MAX_IO_WORKERS_PER_DEVICE};
use longhaul_engine::planes::messages::MAX_MESSAGE_LEN;
use longhaul_engine::planes::{Amount, Payload};
use longhaul_engine::probe::MAX_PINGS;
use longhaul_engine::server::{ServeOptions, DEFAULT_LISTEN, DEFAULT_MAX_SESSIONS};
use longhaul_engine::sockopt;
use longhaul_science::advise::AdviseOptions;
use longhaul_science::report::ReportOptions;
use longhaul_science::sweep::{SweepOptions, DEFAULT_BUFFERS, DEFAULT_STREAMS};

/// Most sessions one server may run at once (`--max-sessions`).
pub const MAX_SESSIONS: usize = 4096;

/// How sizes, rates and durations are written (`longhaul-units`).
const UNITS_HELP: &str = "SIZE: bytes with a K, M, G or T suffix (binary), e.g. 2M. \
    RATE: bits/s with a K, M, G or T suffix (decimal), e.g. 5G. \
    SECS: seconds, or a number with a unit ms, s, m or h.";

/// Fast WAN transfers over many parallel TCP streams: memory to memory and
/// disk to disk, with the measurements that tune them.
#[derive(Debug, Parser)]
#[command(
    name = "longhaul",
    version,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = "Exit codes: 0 success, 1 transfer failed, 2 usage error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive: run sessions for any number of clients (default port 7400)
    Serve(ServeArgs),
    /// Send to a server: memory to memory, or the PATHs given
    #[command(after_help = UNITS_HELP)]
    Send(SendArgs),
    /// Pull files and directories from a server's --root (disk mode)
    #[command(after_help = UNITS_HELP)]
    Get(GetArgs),
    /// Measure a window x streams matrix or message lengths against a server
    #[command(after_help = UNITS_HELP)]
    Sweep(SweepArgs),
    /// Recommend streams x buffer for a path from its RTT and buffer limits
    #[command(after_help = UNITS_HELP)]
    Advise(AdviseArgs),
    /// Write an HTML report of a results directory (and Prometheus)
    Report(ReportArgs),
    /// Print single-core memcpy bandwidth in bytes/s (the bench's yardstick)
    #[command(hide = true)]
    MemcpyBench,
}

/// Where the data workers run (`serve`, `send`, `sweep`).
#[derive(Debug, Args, Clone, Default)]
pub struct WorkerArgs {
    /// Data worker threads, each multiplexing many streams (default: one
    /// per online CPU, or one per CPU of --cpus)
    #[arg(long, value_name = "N",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_THREADS as u64))]
    pub threads: Option<usize>,
    /// Pin the data workers to these CPUs, e.g. 0-3,8 (worker i on the
    /// i-th CPU of the list)
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub cpus: Option<CpuList>,
}

/// A parsed `--cpus` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Most data worker threads (`--threads`).
pub const MAX_THREADS: usize = 1024;

fn cpu_list(text: &str) -> Result<CpuList, String> {
    longhaul_engine::cpus::parse_list(text).map(CpuList)
}

impl WorkerArgs {
    /// Sets up this process's data workers; a CPU that is not online is a
    /// usage error naming it.
    pub fn apply(&self, sub: &str) -> Result<(), clap::Error> {
        longhaul_engine::workers::configure(self.threads, self.cpus.as_ref().map(|c| &c.0[..]))
            .map_err(|e| usage_error(sub, ErrorKind::InvalidValue, e.to_string()))
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Control and data address
    #[arg(long, value_name = "ADDR:PORT", default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Directory disk-mode sessions write under (disk mode is off without it)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Shared session token; clients prove they know it
    #[arg(long, value_name = "F", value_parser = token)]
    pub token_file: Option<Token>,
    /// Accept clients without a token from any address (default: loopback only)
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Address of the stats API (GET /v1/sessions)
    #[arg(long, value_name = "ADDR:PORT", default_value = longhaul_stats_api::DEFAULT_STATS_LISTEN)]
    pub stats_listen: String,
    /// Sessions run at once; more are refused as busy
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_SESSIONS as u64))]
    pub max_sessions: usize,
    /// Sessions one client address (an IPv6 /64) may run at once; more are
    /// refused as busy (default: all of --max-sessions)
    #[arg(long, value_name = "N",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_SESSIONS as u64))]
    pub max_sessions_per_source: Option<usize>,
    /// Also speak iperf3's protocol on this address (TCP and UDP; iperf3's
    /// port is 5201): iperf3 clients run tests here, many at once
    #[arg(long, value_name = "ADDR:PORT")]
    pub iperf3_listen: Option<String>,
    /// iperf3 tests run at once; more are refused as busy
    #[arg(long, value_name = "N", default_value_t = longhaul_engine::iperf3::DEFAULT_MAX_TESTS,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub iperf3_max_tests: usize,
    /// iperf3 tests one client address (an IPv6 /64) may hold at once,
    /// starting or running; more are refused as busy, so one source cannot
    /// take every slot (default: a quarter of --iperf3-max-tests)
    #[arg(long, value_name = "N",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub iperf3_max_tests_per_source: Option<usize>,
    /// iperf3 connections of one client address still exchanging their
    /// parameters; a newer one pushes out the oldest (default: 8, or
    /// --iperf3-max-tests-per-source when that is more)
    #[arg(long, value_name = "N",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=longhaul_engine::limits::HANDSHAKING_CAPACITY as u64))]
    pub iperf3_max_pending_per_source: Option<usize>,
    /// Longest iperf3 test, its omitted seconds (-O) included, as iperf3's
    /// max duration: longer tests are refused, and a test still running
    /// then is stopped (default 3600 s)
    #[arg(long, value_name = "SECS", value_parser = iperf3_max_duration)]
    pub iperf3_max_duration: Option<std::time::Duration>,
    /// Highest total rate of an iperf3 test (both directions), as iperf3's
    /// --server-bitrate-limit: a client asking more (-b) is refused, and a
    /// test averaging more over 5 s is stopped (default: no limit)
    #[arg(long, value_name = "RATE", value_parser = positive_rate)]
    pub iperf3_server_bitrate_limit: Option<u64>,
    /// iperf3 authentication: the server's RSA private key (PEM), as
    /// iperf3's --rsa-private-key-path
    #[arg(long, value_name = "F", requires = "iperf3_authorized_users_path")]
    pub iperf3_rsa_private_key_path: Option<PathBuf>,
    /// iperf3 authentication: the users file (user,sha256 lines), as
    /// iperf3's --authorized-users-path
    #[arg(long, value_name = "F", requires = "iperf3_rsa_private_key_path")]
    pub iperf3_authorized_users_path: Option<PathBuf>,
    #[command(flatten)]
    pub workers: WorkerArgs,
}

/// How a session runs, whatever it moves: `send`'s and `get`'s shared flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Parallel TCP streams per direction
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_STREAMS)))]
    pub streams: u32,
    /// Socket buffer (SO_SNDBUF/SO_RCVBUF) of every stream
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = positive_size)]
    pub buffer: u64,
    /// TCP congestion control of the data streams, e.g. bbr or cubic
    #[arg(long, value_name = "ALG")]
    pub cc: Option<String>,
    /// Total rate per direction, paced
    #[arg(long, value_name = "RATE", value_parser = positive_rate)]
    pub rate: Option<u64>,
    /// Print a progress line every SECS (default 1 s unless --json; on a
    /// terminal a progress bar instead)
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub interval: Option<f64>,
    /// Print JSON: the final result object (and with --interval one line
    /// per interval before it)
    #[arg(long)]
    pub json: bool,
    /// Shared session token of the server
    #[arg(long, value_name = "F", value_parser = token)]
    pub token_file: Option<Token>,
    /// Fail (exit 1) when a stream moved no bytes (always warned about)
    #[arg(long)]
    pub strict: bool,
    /// Connect and attach shortly before, start moving data at instant T (RFC 3339,
    /// e.g. 2026-11-24T01:00:00Z, or Unix seconds): a campaign hands one T
    /// to every sender of a phase
    #[arg(long, value_name = "T", value_parser = start_instant)]
    pub start_at: Option<std::time::SystemTime>,
    #[command(flatten)]
    pub label: CampaignArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
}

/// Which campaign and run a transfer is (`send`, `get`, `sweep`).
#[derive(Debug, Args, Clone, Default)]
pub struct CampaignArgs {
    /// The campaign this is a run of: the server's stats API lists it with
    /// the session, the exporter labels the session with it (letters,
    /// digits, '.', '_', '-'; at most 64)
    #[arg(long, value_name = "NAME", value_parser = plain_name)]
    pub campaign: Option<String>,
    /// The run of the campaign (same rules as --campaign)
    #[arg(long, value_name = "NAME", value_parser = plain_name)]
    pub run: Option<String>,
}

/// Disk mode's flags, shared by `send` (push) and `get` (pull).
#[derive(Debug, Args)]
pub struct FilesArgs {
    /// Read the PATHs from file F, one per line (`-`: standard input),
    /// instead of the command line
    #[arg(long, value_name = "F", conflicts_with = "paths")]
    pub file_list: Option<PathBuf>,
    /// Where the PATHs land: send, under the server's --root; get, a local
    /// directory (default: the current one)
    #[arg(long, value_name = "DIR")]
    pub dest: Option<String>,
    /// Reader workers per device on the sender, writer workers per device
    /// on the receiver
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_IO_WORKERS_PER_DEVICE)))]
    pub io_workers_per_device: u32,
    /// O_DIRECT reads and writes
    #[arg(long)]
    pub direct: bool,
    /// Send every file whole, even what the receiver already has
    #[arg(long)]
    pub no_resume: bool,
    /// Skip a file the receiver already has only if its content hashes the
    /// same (default: same size and mtime; reported as skipped but not
    /// verified)
    #[arg(long, conflicts_with = "no_resume")]
    pub checksum: bool,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The server
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    #[command(flatten)]
    pub run: RunArgs,
    /// Send for this long (default 10 s; memory mode)
    #[arg(long, value_name = "SECS", value_parser = positive_seconds, conflicts_with = "bytes")]
    pub time: Option<f64>,
    /// Send exactly this many bytes per direction (memory mode)
    #[arg(long, value_name = "SIZE", value_parser = positive_size)]
    pub bytes: Option<u64>,
    /// Both directions at once (--streams each way)
    #[arg(long, conflicts_with = "reverse")]
    pub bidir: bool,
    /// Server to client (memory mode; `longhaul get` pulls files)
    #[arg(long)]
    pub reverse: bool,
    /// Files and directories to send (disk mode); none: memory to memory
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub files: FilesArgs,
    /// Follow symlinks while walking the PATHs
    #[arg(long)]
    pub follow_symlinks: bool,
    /// The server's protocol: longhaul's own, or iperf3's (any iperf3
    /// server; memory mode, up to 128 streams)
    #[arg(long, value_enum, default_value_t = WireProtocol::Longhaul)]
    pub protocol: WireProtocol,
    /// iperf3's UDP test, as `iperf3 -u` (with --protocol iperf3 and
    /// --rate): datagrams paced at --rate, the server's jitter and loss in
    /// the JSON
    #[arg(long)]
    pub udp: bool,
}

/// What `send --protocol` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WireProtocol {
    Longhaul,
    Iperf3,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The server (its `serve --root` holds the PATHs)
    #[arg(long, value_name = "HOST:PORT")]
    pub from: String,
    #[command(flatten)]
    pub run: RunArgs,
    /// Files and directories to pull, relative to the server's --root;
    /// each lands under its last component in --dest
    #[arg(value_name = "PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub files: FilesArgs,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The server
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// Stream counts of the matrix, e.g. 1,2,4 (default 1,2,4,8,16,32)
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_STREAMS)))]
    pub streams: Vec<u32>,
    /// Socket buffers of the matrix, e.g. 64K,2M (default 8K,64K,256K,1M,2M,4M)
    #[arg(long = "buffer", value_name = "LIST", value_delimiter = ',', value_parser = positive_size)]
    pub buffers: Vec<u64>,
    /// Message lengths to sweep instead of (or besides) the matrix, e.g. 64,1K,64K,1M
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = message_length)]
    pub messages: Vec<u64>,
    /// Seconds per cell
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = positive_seconds)]
    pub time: f64,
    /// Background memory streams running for the whole sweep
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_STREAMS)))]
    pub load: u32,
    /// Results directory (default results/sweep-<UTC time>)
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the results as one JSON object (no progress lines)
    #[arg(long)]
    pub json: bool,
    /// Shared session token of the server
    #[arg(long, value_name = "F", value_parser = token_file)]
    pub token_file: Option<PathBuf>,
    /// TCP congestion control of the data streams
    #[arg(long, value_name = "ALG")]
    pub cc: Option<String>,
    #[command(flatten)]
    pub label: CampaignArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
}

#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// The server
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// Target rate of the path
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = positive_rate)]
    pub rate: u64,
    /// Timed pings (the RTT is their median)
    #[arg(long, value_name = "N", default_value_t = longhaul_science::advise::DEFAULT_PINGS,
          value_parser = clap::value_parser!(u32).range(1..=(MAX_PINGS as i64 - 1)))]
    pub pings: u32,
    /// Print the advice as JSON
    #[arg(long)]
    pub json: bool,
    /// Shared session token of the server
    #[arg(long, value_name = "F", value_parser = token)]
    pub token_file: Option<Token>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Directory of results: send --json output, sweep and advise files
    #[arg(value_name = "RESULTS_DIR")]
    pub dir: PathBuf,
    /// The HTML file to write (default RESULTS_DIR/report.html)
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Title of the page
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
    /// Also draw series from this Prometheus (http://HOST:PORT or https://HOST:PORT)
    #[arg(long, value_name = "URL", requires_all = ["from", "to"])]
    pub prometheus: Option<String>,
    /// PEM CA file an https Prometheus' certificate must chain to (default: the host's
    /// trust store, /etc/ssl/certs/ca-certificates.crt, where site.yml installs its CA)
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    pub prometheus_ca: Option<PathBuf>,
    /// User to ask Prometheus as (basic auth; site.yml's people use admin)
    #[arg(long, value_name = "USER", requires_all = ["prometheus", "prometheus_password_file"])]
    pub prometheus_user: Option<String>,
    /// File whose first line is that user's password (never the command line)
    #[arg(long, value_name = "FILE", requires = "prometheus_user")]
    pub prometheus_password_file: Option<PathBuf>,
    /// Start of the Prometheus range (RFC 3339 or Unix seconds)
    #[arg(long, value_name = "T", requires = "prometheus")]
    pub from: Option<String>,
    /// End of the Prometheus range
    #[arg(long, value_name = "T", requires = "prometheus")]
    pub to: Option<String>,
    /// Prometheus query step (default 15 s)
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub step: Option<f64>,
}

fn positive_size(text: &str) -> Result<u64, String> {
    match longhaul_units::parse_size(text).map_err(|e| e.to_string())? {
        0 => Err("must be positive".into()),
        n => Ok(n),
    }
}

fn positive_rate(text: &str) -> Result<u64, String> {
    match longhaul_units::parse_rate(text).map_err(|e| e.to_string())? {
        0 => Err("must be positive".into()),
        n => Ok(n),
    }
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    let d = longhaul_units::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be positive".into());
    }
    Ok(d.as_secs_f64())
}

/// `--iperf3-max-duration`: whole seconds, 1 s up to iperf3's longest test.
fn iperf3_max_duration(text: &str) -> Result<std::time::Duration, String> {
    use longhaul_engine::iperf3::MAX_TIME;
    let d = longhaul_units::parse_duration(text).map_err(|e| e.to_string())?;
    if d.subsec_nanos() != 0 || d.is_zero() {
        return Err("must be a whole number of seconds, at least 1".into());
    }
    if d.as_secs() > MAX_TIME {
        return Err(format!("longer than iperf3's longest test ({MAX_TIME} s)"));
    }
    Ok(d)
}

fn message_length(text: &str) -> Result<u64, String> {
    let n = positive_size(text)?;
    if n > MAX_MESSAGE_LEN {
        return Err(format!(
            "longer than the largest message ({MAX_MESSAGE_LEN} bytes)"
        ));
    }
    Ok(n)
}

/// `--start-at`: RFC 3339 with an offset, or Unix seconds.
fn start_instant(text: &str) -> Result<std::time::SystemTime, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs));
        }
        return Err("Unix seconds must be a positive number".into());
    }
    let t: jiff::Timestamp = text
        .parse()
        .map_err(|e| format!("not RFC 3339 (e.g. 2026-11-24T01:00:00Z) or Unix seconds: {e}"))?;
    let nanos = u64::try_from(t.as_nanosecond()).map_err(|_| "before 1970".to_string())?;
    Ok(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos))
}

/// `--campaign`, `--run`: a plain name (longhaul_stats_api::check_name).
fn plain_name(text: &str) -> Result<String, String> {
    longhaul_stats_api::check_name(text).map(|()| text.to_string())
}

/// Reads the token now, so a bad file is a usage error up front.
fn token(path: &str) -> Result<Token, String> {
    Token::from_file(path.as_ref()).map_err(|e| e.to_string())
}

/// Like [`token`], keeping the path (a sweep records it).
fn token_file(path: &str) -> Result<PathBuf, String> {
    token(path).map(|_| PathBuf::from(path))
}

/// A usage error of subcommand `sub` in clap's words and format.
fn usage_error(sub: &str, kind: ErrorKind, message: impl std::fmt::Display) -> clap::Error {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(sub) {
        Some(cmd) => cmd.error(kind, message),
        None => cli.error(kind, message),
    }
}

impl ServeArgs {
    /// `--iperf3-listen` and its companions; None without it.
    pub fn iperf3_options(&self) -> longhaul_engine::Result<Option<Iperf3Options>> {
        let Some(listen) = &self.iperf3_listen else {
            return Ok(None);
        };
        let mut opts = Iperf3Options::new(listen.clone());
        opts.max_tests = self.iperf3_max_tests;
        opts.max_tests_per_source = self.iperf3_max_tests_per_source.unwrap_or(
            longhaul_engine::iperf3::default_tests_per_source(self.iperf3_max_tests),
        );
        opts.max_pending_per_source = self.iperf3_max_pending_per_source.unwrap_or(
            longhaul_engine::iperf3::default_pending_per_source(opts.max_tests_per_source),
        );
        opts.check()?;
        if let Some(max) = self.iperf3_max_duration {
            opts.limits.max_duration = max;
        }
        opts.limits.max_rate_bps = self.iperf3_server_bitrate_limit.unwrap_or(0);
        if let (Some(key), Some(users)) = (
            &self.iperf3_rsa_private_key_path,
            &self.iperf3_authorized_users_path,
        ) {
            opts.auth = Some(ServerAuth::load(key, users, AUTH_SKEW)?);
        }
        Ok(Some(opts))
    }

    pub fn options(self) -> ServeOptions {
        ServeOptions {
            listen: self.listen,
            root: self.root,
            token: self.token_file,
            allow_unauthenticated: self.allow_unauthenticated,
            stats_listen: self.stats_listen,
            max_sessions: self.max_sessions,
            max_sessions_per_source: self.max_sessions_per_source,
        }
    }
}

/// The PATHs of a disk transfer: `--file-list F` (one a line, `-` for
/// standard input; empty lines are skipped), else the command line's.
fn read_paths(
    sub: &str,
    given: &[String],
    list: Option<&PathBuf>,
) -> Result<Vec<String>, clap::Error> {
    let Some(list) = list else {
        return Ok(given.to_vec());
    };
    let bad = |why: String| {
        usage_error(
            sub,
            ErrorKind::InvalidValue,
            format!("--file-list {}: {why}", list.display()),
        )
    };
    let text = if list.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| bad(e.to_string()))?
    } else {
        std::fs::read_to_string(list).map_err(|e| bad(e.to_string()))?
    };
    let paths: Vec<String> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if paths.is_empty() {
        return Err(bad("names no paths".into()));
    }
    Ok(paths)
}

impl RunArgs {
    /// The session flags onto `o`; `sub` names the subcommand in errors.
    fn apply(&self, sub: &str, o: &mut SendOptions) -> Result<(), clap::Error> {
        if let Some(cc) = &self.cc {
            sockopt::check_cc(cc)
                .map_err(|e| usage_error(sub, ErrorKind::InvalidValue, format!("--cc: {e}")))?;
        }
        o.streams = self.streams;
        o.buffer = self.buffer;
        o.cc = self.cc.clone();
        o.rate_bps = self.rate;
        o.strict = self.strict;
        o.token = self.token_file.clone();
        o.start_at = self.start_at;
        o.campaign = self.label.campaign.clone();
        o.run = self.label.run.clone();
        Ok(())
    }
}

impl FilesArgs {
    fn disk(&self, follow_symlinks: bool) -> DiskOptions {
        DiskOptions {
            io_workers_per_device: self.io_workers_per_device as usize,
            direct: self.direct,
            follow_symlinks,
            resume: !self.no_resume,
            checksum: self.checksum,
            ..DiskOptions::default()
        }
    }
}

impl SendArgs {
    /// What the flags ask the engine to do; checks the rules between flags.
    pub fn options(&self) -> Result<SendOptions, clap::Error> {
        let bad = |message: String| usage_error("send", ErrorKind::ArgumentConflict, message);
        let given: Vec<String> = self
            .paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let paths = match self.files.file_list {
            Some(_) => read_paths("send", &given, self.files.file_list.as_ref())?
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            None => self.paths.clone(),
        };
        let payload = if paths.is_empty() {
            if self.files.checksum {
                return Err(bad(
                    "--checksum compares files: it needs PATHs (disk mode)".into()
                ));
            }
            Payload::Memory(self.amount())
        } else {
            if self.time.is_some() || self.bytes.is_some() {
                return Err(bad(
                    "--bytes/--time do not apply when PATHs are given (disk mode sends the files)"
                        .into(),
                ));
            }
            Payload::Files {
                paths,
                dest: self.files.dest.clone().unwrap_or_default(),
                disk: self.files.disk(self.follow_symlinks),
            }
        };
        if self.udp && self.protocol != WireProtocol::Iperf3 {
            return Err(bad(
                "--udp is iperf3's UDP test: it needs --protocol iperf3".into(),
            ));
        }
        if self.udp && self.run.rate.is_none() {
            return Err(bad(
                "--udp needs --rate: UDP has no congestion control, the datagrams go at the rate given"
                    .into(),
            ));
        }
        let mut o = SendOptions::new(self.to.clone(), payload);
        self.run.apply("send", &mut o)?;
        o.direction = match (self.bidir, self.reverse) {
            (true, _) => Direction::Bidir,
            (false, true) => Direction::Receive,
            (false, false) => Direction::Send,
        };
        Ok(o)
    }

    /// `--time` or `--bytes` (default: the engine's default time).
    fn amount(&self) -> Amount {
        match (self.bytes, self.time) {
            (Some(b), _) => Amount::Bytes(b),
            (None, Some(s)) => Amount::Seconds(s),
            (None, None) => Amount::Seconds(longhaul_engine::limits::DEFAULT_SECONDS),
        }
    }

    /// Bytes this end sends in all, when the flags fix it (`--bytes`).
    pub fn bytes_total(&self) -> Option<u64> {
        let per_direction = self.bytes?;
        Some(if self.bidir {
            2 * per_direction
        } else {
            per_direction
        })
    }
}

impl GetArgs {
    /// The pull the flags ask for: disk mode, server to client.
    pub fn options(&self) -> Result<SendOptions, clap::Error> {
        let paths = read_paths("get", &self.paths, self.files.file_list.as_ref())?;
        if paths.is_empty() {
            return Err(usage_error(
                "get",
                ErrorKind::MissingRequiredArgument,
                "nothing to pull: give PATHs or --file-list",
            ));
        }
        let payload = Payload::Pull {
            paths,
            dest: PathBuf::from(self.files.dest.as_deref().unwrap_or(".")),
            disk: self.files.disk(false),
        };
        let mut o = SendOptions::new(self.from.clone(), payload);
        self.run.apply("get", &mut o)?;
        o.direction = Direction::Receive;
        Ok(o)
    }
}

impl SweepArgs {
    pub fn options(self) -> SweepOptions {
        let mut o = SweepOptions {
            to: self.to,
            token_file: self.token_file,
            cc: self.cc,
            streams: self.streams,
            buffers: self.buffers,
            messages: self.messages,
            time: self.time,
            load: self.load,
            out: self.out,
            progress: !self.json,
            campaign: self.label.campaign,
            run: self.label.run,
        };
        // The matrix runs when asked for, or when nothing else is.
        let matrix_asked = !o.streams.is_empty() || !o.buffers.is_empty();
        if matrix_asked || o.messages.is_empty() {
            if o.streams.is_empty() {
                o.streams = DEFAULT_STREAMS.to_vec();
            }
            if o.buffers.is_empty() {
                o.buffers = DEFAULT_BUFFERS.to_vec();
            }
        }
        o
    }
}

impl AdviseArgs {
    pub fn options(self) -> AdviseOptions {
        AdviseOptions {
            to: self.to,
            rate_bps: self.rate,
            pings: self.pings,
            token: self.token_file,
        }
    }
}

impl ReportArgs {
    pub fn options(self) -> ReportOptions {
        ReportOptions {
            dir: self.dir,
            out: self.out,
            title: self.title,
            prometheus: self
                .prometheus
                .map(|url| longhaul_science::prometheus::Source {
                    url,
                    ca_file: self.prometheus_ca,
                    user: self.prometheus_user,
                    password_file: self.prometheus_password_file,
                }),
            from: self.from,
            to: self.to,
            step: self.step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("longhaul").chain(args.iter().copied()))
    }

    fn send(args: &[&str]) -> Result<SendOptions, clap::Error> {
        let mut v = vec!["send"];
        v.extend(args);
        match parse(&v)?.command {
            Command::Send(a) => a.options(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_engines() {
        let o = send(&["--to", "h:1"]).unwrap();
        assert_eq!(o.buffer, longhaul_engine::limits::DEFAULT_BUFFER);
        assert_eq!(o.streams, 1);
        let Command::Advise(a) = parse(&["advise", "--to", "h:1"]).unwrap().command else {
            panic!()
        };
        assert_eq!(a.rate, longhaul_science::advise::DEFAULT_RATE_BPS);
        let Command::Sweep(s) = parse(&["sweep", "--to", "h:1"]).unwrap().command else {
            panic!()
        };
        assert_eq!(s.time, longhaul_science::sweep::DEFAULT_TIME);
    }

    #[test]
    fn good_flags_parse() {
        let o = send(&[
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
        .unwrap();
        assert_eq!(o.streams, 35);
        assert_eq!(o.buffer, 2 << 20);
        assert_eq!(o.rate_bps, Some(5_000_000_000));
        assert_eq!(o.direction, Direction::Bidir);
        assert!(matches!(o.payload, Payload::Memory(Amount::Seconds(s)) if s == 10.0));
        let o = send(&["--to", "h:1", "--bytes", "1G", "-", "--dest", "d"]);
        assert!(o.is_err(), "--bytes with PATHs");
        let o = send(&["--to", "h:1", "/x", "--dest", "d", "--checksum"]).unwrap();
        assert!(matches!(o.payload, Payload::Files { ref disk, .. } if disk.checksum));
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_problem() {
        for (args, needle) in [
            (&["--to", "x:1", "--streams", "0"][..], "--streams"),
            (&["--to", "x:1", "--streams", "1025"], "1025"),
            (&["--to", "x:1", "--buffer", "2X"], "2X"),
            (&["--to", "x:1", "--buffer", "0"], "--buffer"),
            (&["--to", "x:1", "--frobnicate"], "--frobnicate"),
            (&["--streams", "4"], "--to"),
            (&["--to", "x:1", "--time", "1", "--bytes", "1M"], "--bytes"),
            (&["--to", "x:1", "--bidir", "--reverse"], "--reverse"),
            (&["--to", "x:1", "--checksum"], "needs PATHs"),
            (
                &["--to", "x:1", "/x", "--checksum", "--no-resume"],
                "--no-resume",
            ),
        ] {
            let e = send(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn get_pulls_into_a_local_directory() {
        let Command::Get(a) = parse(&[
            "get",
            "--from",
            "h:1",
            "--streams",
            "4",
            "runs/r7",
            "--checksum",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        let o = a.options().unwrap();
        assert_eq!(o.direction, Direction::Receive);
        assert_eq!(o.streams, 4);
        let Payload::Pull { paths, dest, disk } = &o.payload else {
            panic!("{:?}", o.payload)
        };
        assert_eq!(paths, &["runs/r7".to_string()]);
        assert_eq!(dest, &PathBuf::from("."));
        assert!(disk.checksum && disk.resume && !disk.follow_symlinks);
        let e = parse(&["get", "--from", "h:1", "--follow-symlinks", "x"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn start_at_takes_rfc3339_or_unix_seconds() {
        let at = |t: &str| send(&["--to", "h:1", "--start-at", t]).map(|o| o.start_at);
        let want = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_500);
        assert_eq!(at("1795000000.5").unwrap(), Some(want));
        assert_eq!(at("2026-11-18T11:06:40.5Z").unwrap(), Some(want));
        assert_eq!(at("2026-11-18T12:06:40.5+01:00").unwrap(), Some(want));
        for bad in ["tomorrow", "2026-11-18 08:26", "1e400"] {
            let e = at(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.to_string().contains("--start-at"), "{bad}: {e}");
        }
    }

    #[test]
    fn sweep_lists_and_defaults() {
        let Command::Sweep(a) = parse(&[
            "sweep",
            "--to",
            "h:1",
            "--streams",
            "1,2",
            "--buffer=64K,2M",
            "--time",
            "1",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        let o = a.options();
        assert_eq!(o.streams, vec![1, 2]);
        assert_eq!(o.buffers, vec![64 << 10, 2 << 20]);
        assert!(o.messages.is_empty());
        let Command::Sweep(a) =
            parse(&["sweep", "--to", "h:1", "--messages", "64,1K", "--load", "2"])
                .unwrap()
                .command
        else {
            panic!()
        };
        let o = a.options();
        assert!(o.streams.is_empty() && o.buffers.is_empty());
        assert_eq!(o.messages, vec![64, 1024]);
        assert_eq!(o.load, 2);
        let Command::Sweep(a) = parse(&["sweep", "--to", "h:1"]).unwrap().command else {
            panic!()
        };
        let o = a.options();
        assert_eq!(o.streams.len() * o.buffers.len(), 36);
    }

    #[test]
    fn science_mistakes_name_the_flag() {
        for (args, needle) in [
            (
                &["sweep", "--to", "h:1", "--streams", "1,0"][..],
                "--streams",
            ),
            (&["sweep", "--to", "h:1", "--buffer", "2X"], "--buffer"),
            (&["sweep", "--streams", "1"], "--to"),
            (
                &["sweep", "--to", "h:1", "--messages", "128M"],
                "largest message",
            ),
            (&["advise", "--to", "h:1", "--rate", "fast"], "--rate"),
            (&["advise", "--to", "h:1", "--pings", "0"], "--pings"),
            (&["report", "d", "--prometheus", "http://x"], "--from"),
            (&["report", "d", "--from", "0"], "--prometheus"),
            (&["report"], "RESULTS_DIR"),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn typos_get_suggestions() {
        let e = send(&["--to", "x:1", "--stream", "4"]).unwrap_err();
        assert!(e.to_string().contains("--streams"), "{e}");
        let e = parse(&["sendd"]).unwrap_err();
        assert!(e.to_string().contains("send"), "{e}");
    }
}
