//! Command-line flags, node_exporter style: `--flag=value` or `--flag value`,
//! `--collector.<name>` / `--no-collector.<name>` to switch collectors.
//!
//! Parsing never exits: it returns a [`UsageError`] and `main` turns that into
//! exit code 2, so the rules are unit-testable.

use std::path::PathBuf;
use std::time::Duration;

use crate::collector::COLLECTORS;
use crate::ports::PortRanges;

/// Default listen address (DESIGN.md): all interfaces, port 9743.
pub const DEFAULT_LISTEN: &str = ":9743";
/// Default engine stats API (the engine's `--stats-listen` default).
pub const DEFAULT_ENGINE_URL: &str = "http://127.0.0.1:7401";
/// The engine's data ports by convention: 7400 control, the rest data.
pub const DEFAULT_TCP_PORTS: &str = "7400-7499";
/// Prometheus scrapes one target once per interval; a handful in flight
/// means something is wrong (stuck collectors, a scrape storm), so refuse
/// more with 503 instead of piling up threads.
pub const DEFAULT_MAX_REQUESTS: usize = 4;
/// A hung engine must not hold a scrape: Prometheus' default scrape timeout
/// is 10 s, so 2 s for connect+read leaves room for the other collectors.
pub const DEFAULT_ENGINE_TIMEOUT: Duration = Duration::from_secs(2);
/// DESIGN.md: stream labels capped at 256 per session.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Per-connection series (`flow` slots) of the tcp collector, all peers together.
pub const DEFAULT_MAX_FLOWS: usize = 64;
/// storcli can take seconds on a busy controller; it runs in the background.
pub const DEFAULT_STORCLI_TIMEOUT: Duration = Duration::from_secs(10);
/// Controller models do not change while the host runs; refresh rarely.
pub const DEFAULT_STORCLI_INTERVAL: Duration = Duration::from_secs(300);
/// Debian's pci-data location, for controller model names.
pub const DEFAULT_PCI_IDS: &str = "/usr/share/misc/pci.ids";

/// Everything the flags configure.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen_address: String,
    pub max_requests: usize,
    pub procfs: PathBuf,
    pub sysfs: PathBuf,
    pub pci_ids: PathBuf,
    pub engine_url: String,
    pub engine_timeout: Duration,
    pub max_streams: usize,
    pub tcp_ports: PortRanges,
    pub max_flows: usize,
    pub storcli_command: Option<String>,
    pub storcli_timeout: Duration,
    pub storcli_interval: Duration,
    /// Enabled collectors, in registry order.
    pub collectors: Vec<&'static str>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen_address: DEFAULT_LISTEN.into(),
            max_requests: DEFAULT_MAX_REQUESTS,
            procfs: "/proc".into(),
            sysfs: longhaul_topology::DEFAULT_SYSFS.into(),
            pci_ids: DEFAULT_PCI_IDS.into(),
            engine_url: DEFAULT_ENGINE_URL.into(),
            engine_timeout: DEFAULT_ENGINE_TIMEOUT,
            max_streams: DEFAULT_MAX_STREAMS,
            tcp_ports: DEFAULT_TCP_PORTS
                .parse()
                .expect("default port ranges parse"),
            max_flows: DEFAULT_MAX_FLOWS,
            storcli_command: None,
            storcli_timeout: DEFAULT_STORCLI_TIMEOUT,
            storcli_interval: DEFAULT_STORCLI_INTERVAL,
            collectors: COLLECTORS
                .iter()
                .filter(|c| c.default_enabled)
                .map(|c| c.name)
                .collect(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    Help,
    Version,
}

/// A bad command line; `main` prints it with the usage hint and exits 2.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Flags that take a value.
const VALUE_FLAGS: &[&str] = &[
    "web.listen-address",
    "web.max-requests",
    "path.procfs",
    "path.sysfs",
    "path.pciids",
    "engine.url",
    "engine.timeout",
    "collector.engine.max-streams",
    "collector.tcp.ports",
    "collector.tcp.max-flows",
    "collector.raid.storcli-command",
    "collector.raid.storcli-timeout",
    "collector.raid.storcli-interval",
];

pub fn help_text() -> String {
    let mut s = String::from(
        "longhaul-exporter: Prometheus exporter for longhaul transfers, TCP flows and RAID controllers\n\n\
         Usage: longhaul-exporter [FLAGS]\n\n\
         Flags (--flag=value or --flag value):\n",
    );
    let rows: &[(&str, String)] = &[
        ("--web.listen-address", format!("address to serve /metrics on (default {DEFAULT_LISTEN}; port 0 picks a free port, printed at startup)")),
        ("--web.max-requests", format!("requests in flight before answering 503 (default {DEFAULT_MAX_REQUESTS})")),
        ("--path.procfs", "procfs mount point (default /proc)".into()),
        ("--path.sysfs", "sysfs mount point (default /sys)".into()),
        ("--path.pciids", format!("pci.ids database for controller models (default {DEFAULT_PCI_IDS})")),
        ("--engine.url", format!("longhaul engine stats API (default {DEFAULT_ENGINE_URL})")),
        ("--engine.timeout", "connect+read timeout for the stats API (default 2s)".into()),
        ("--collector.engine.max-streams", format!("stream labels per session; the rest are summed into stream=\"other\" (default {DEFAULT_MAX_STREAMS})")),
        ("--collector.tcp.ports", format!("TCP port ranges to report, e.g. 7400-7499,5201 (default {DEFAULT_TCP_PORTS})")),
        ("--collector.tcp.max-flows", format!("per-connection flow slots; the rest are summed into flow=\"other\" (default {DEFAULT_MAX_FLOWS})")),
        ("--collector.raid.storcli-command", "command printing storcli/perccli JSON (e.g. \"storcli64 /call show J\"); off by default".into()),
        ("--collector.raid.storcli-timeout", "kill the storcli command after this long (default 10s)".into()),
        ("--collector.raid.storcli-interval", "rerun the storcli command this often, in the background (default 5m)".into()),
        ("--collector.<name>", "enable a collector".into()),
        ("--no-collector.<name>", "disable a collector".into()),
        ("--collector.disable-defaults", "start from no collectors".into()),
        ("--help, --version", String::new()),
    ];
    for (flag, text) in rows {
        s.push_str(&format!("  {flag:<36} {text}\n"));
    }
    s.push_str("\nCollectors:\n");
    for c in COLLECTORS {
        let state = if c.default_enabled { "on" } else { "off" };
        s.push_str(&format!("  {:<10} [default {state}] {}\n", c.name, c.help));
    }
    s
}

/// Parses `args` (without the program name).
pub fn parse<I, S>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut cfg = Config::default();
    let mut switches: Vec<(String, bool)> = Vec::new();
    let mut disable_defaults = false;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        if arg == "--version" {
            return Ok(Command::Version);
        }
        let Some(flag) = arg.strip_prefix("--") else {
            return usage(format!("unexpected argument {arg:?} (flags start with --)"));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        if VALUE_FLAGS.contains(&name.as_str()) {
            let value = match inline {
                Some(v) => v,
                None => match args.next() {
                    Some(v) => v,
                    None => return usage(format!("--{name} needs a value")),
                },
            };
            set_value(&mut cfg, &name, &value)?;
            continue;
        }
        if name == "collector.disable-defaults" {
            disable_defaults = parse_bool_switch(&name, inline.as_deref())?;
            continue;
        }
        let (collector, on) = if let Some(c) = name.strip_prefix("no-collector.") {
            if inline.is_some() {
                return usage(format!("--{name} takes no value"));
            }
            (c, false)
        } else if let Some(c) = name.strip_prefix("collector.") {
            (c, parse_bool_switch(&name, inline.as_deref())?)
        } else {
            return usage(format!("unknown flag --{name} (see --help)"));
        };
        if !COLLECTORS.iter().any(|c| c.name == collector) {
            let known: Vec<&str> = COLLECTORS.iter().map(|c| c.name).collect();
            return usage(format!(
                "unknown collector {collector:?} in --{name}; known collectors: {}",
                known.join(", ")
            ));
        }
        switches.push((collector.to_string(), on));
    }
    if disable_defaults {
        cfg.collectors.clear();
    }
    for (name, on) in switches {
        cfg.collectors.retain(|c| *c != name);
        if on {
            let spec = COLLECTORS.iter().find(|c| c.name == name).expect("checked");
            cfg.collectors.push(spec.name);
        }
    }
    cfg.collectors.sort_by_key(|name| {
        COLLECTORS
            .iter()
            .position(|c| c.name == *name)
            .unwrap_or(usize::MAX)
    });
    Ok(Command::Run(Box::new(cfg)))
}

fn parse_bool_switch(name: &str, inline: Option<&str>) -> Result<bool, UsageError> {
    match inline {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(v) => usage(format!("--{name} is a switch; got value {v:?}")),
    }
}

fn set_value(cfg: &mut Config, name: &str, value: &str) -> Result<(), UsageError> {
    let nonempty = |v: &str| -> Result<String, UsageError> {
        if v.trim().is_empty() {
            usage(format!("--{name} must not be empty"))
        } else {
            Ok(v.to_string())
        }
    };
    match name {
        "web.listen-address" => {
            cfg.listen_address = nonempty(value)?;
            crate::http::resolve_listen_address(&cfg.listen_address)
                .map_err(|e| UsageError(format!("--web.listen-address {value:?}: {e}")))?;
        }
        "web.max-requests" => cfg.max_requests = parse_count(name, value, 1)?,
        "path.procfs" => cfg.procfs = nonempty(value)?.into(),
        "path.sysfs" => cfg.sysfs = nonempty(value)?.into(),
        "path.pciids" => cfg.pci_ids = nonempty(value)?.into(),
        "engine.url" => {
            crate::httpclient::Url::parse(value)
                .map_err(|e| UsageError(format!("--engine.url {value:?}: {e}")))?;
            cfg.engine_url = value.to_string();
        }
        "engine.timeout" => cfg.engine_timeout = parse_duration(name, value)?,
        "collector.engine.max-streams" => cfg.max_streams = parse_count(name, value, 1)?,
        "collector.tcp.ports" => {
            cfg.tcp_ports = value
                .parse()
                .map_err(|e| UsageError(format!("--collector.tcp.ports {value:?}: {e}")))?
        }
        "collector.tcp.max-flows" => cfg.max_flows = parse_count(name, value, 1)?,
        "collector.raid.storcli-command" => {
            cfg.storcli_command = Some(value.trim().to_string()).filter(|v| !v.is_empty())
        }
        "collector.raid.storcli-timeout" => cfg.storcli_timeout = parse_duration(name, value)?,
        "collector.raid.storcli-interval" => cfg.storcli_interval = parse_duration(name, value)?,
        _ => unreachable!("VALUE_FLAGS and set_value disagree on {name}"),
    }
    Ok(())
}

fn parse_count(name: &str, value: &str, min: usize) -> Result<usize, UsageError> {
    match value.parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => usage(format!(
            "--{name} wants a whole number >= {min}, got {value:?}"
        )),
    }
}

/// "2s", "500ms", "1m", "1.5" (seconds). Zero is refused: a zero timeout
/// would fail every scrape.
pub fn parse_duration(name: &str, value: &str) -> Result<Duration, UsageError> {
    let v = value.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = v.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (v, 1.0)
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x * scale < 1e9 => {
            Ok(Duration::from_secs_f64(x * scale))
        }
        _ => usage(format!(
            "--{name} wants a positive duration like 2s, 500ms or 5m, got {value:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, UsageError> {
        match parse(args.iter().copied())? {
            Command::Run(cfg) => Ok(*cfg),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_follow_design() {
        let cfg = run(&[]).unwrap();
        assert_eq!(cfg.listen_address, ":9743");
        assert_eq!(cfg.procfs, PathBuf::from("/proc"));
        assert_eq!(cfg.sysfs, PathBuf::from("/sys"));
        assert_eq!(cfg.engine_url, "http://127.0.0.1:7401");
        assert!(cfg.tcp_ports.contains(7400) && cfg.tcp_ports.contains(7499));
        assert!(!cfg.tcp_ports.contains(7500));
        assert_eq!(cfg.collectors, vec!["engine", "raid", "tcp"]);
    }

    #[test]
    fn both_value_spellings_and_switches() {
        let cfg = run(&[
            "--path.sysfs=/x/sys",
            "--path.procfs",
            "/x/proc",
            "--no-collector.tcp",
            "--collector.tcp.ports=5201,7000-7001",
        ])
        .unwrap();
        assert_eq!(cfg.sysfs, PathBuf::from("/x/sys"));
        assert_eq!(cfg.procfs, PathBuf::from("/x/proc"));
        assert_eq!(cfg.collectors, vec!["engine", "raid"]);
        assert!(cfg.tcp_ports.contains(5201) && cfg.tcp_ports.contains(7001));
        let cfg = run(&["--collector.disable-defaults", "--collector.raid"]).unwrap();
        assert_eq!(cfg.collectors, vec!["raid"]);
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for bad in [
            &["--collector.nosuch"][..],
            &["--no-collector.nosuch"],
            &["--frobnicate"],
            &["positional"],
            &["--path.sysfs"],
            &["--collector.tcp.ports=70000"],
            &["--collector.tcp.ports=9-3"],
            &["--engine.timeout=0s"],
            &["--engine.url=ftp://x"],
            &["--web.max-requests=0"],
            &["--collector.engine.max-streams=many"],
            &["--web.listen-address=nohost"],
            &["--collector.raid=maybe"],
        ] {
            assert!(run(bad).is_err(), "{bad:?} accepted");
        }
        let err = run(&["--collector.nosuch"]).unwrap_err();
        assert!(err.0.contains("unknown collector \"nosuch\""), "{err}");
        assert!(err.0.contains("engine, raid, tcp"), "{err}");
    }

    #[test]
    fn durations() {
        let d = |v| parse_duration("x", v).unwrap();
        assert_eq!(d("2s"), Duration::from_secs(2));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("5m"), Duration::from_secs(300));
        assert_eq!(d("1.5"), Duration::from_millis(1500));
        assert!(parse_duration("x", "-1s").is_err());
    }
}
