//! Command-line flags (clap), node_exporter style: `--flag=value` or
//! `--flag value`, and `--collector.<name>` / `--no-collector.<name>` for
//! every collector of the registry (added from it, so a new collector gets
//! its switches for free).
//!
//! Parsing never exits: it returns a clap error that `main` prints and
//! turns into exit code 2 (help and version: 0).

use std::path::PathBuf;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};

use crate::config::*;
use crate::ports::PortRanges;
use crate::scrape::COLLECTORS;

/// Prometheus exporter for longhaul transfers, TCP flows and RAID
/// controllers.
#[derive(Debug, Parser)]
#[command(name = "longhaul-exporter", version)]
struct Flags {
    /// Address to serve /metrics on (default :9743, every interface; port 0
    /// picks a free port, printed at startup)
    #[arg(long = "web.listen-address", value_name = "ADDR", value_parser = listen_address)]
    listen_address: Option<String>,
    /// Requests in flight before answering 503, half of them per source
    /// (default 8)
    #[arg(long = "web.max-requests", value_name = "N", value_parser = count)]
    max_requests: Option<usize>,
    /// Web configuration file (Prometheus' format): TLS and basic auth
    /// (default none: plain HTTP, no authentication)
    #[arg(long = "web.config.file", value_name = "FILE", value_parser = path)]
    web_config: Option<PathBuf>,
    /// procfs mount point (default /proc)
    #[arg(long = "path.procfs", value_name = "DIR", value_parser = path)]
    procfs: Option<PathBuf>,
    /// sysfs mount point (default /sys)
    #[arg(long = "path.sysfs", value_name = "DIR", value_parser = path)]
    sysfs: Option<PathBuf>,
    /// pci.ids database for controller models (default /usr/share/misc/pci.ids)
    #[arg(long = "path.pciids", value_name = "FILE", value_parser = path)]
    pci_ids: Option<PathBuf>,
    /// The longhaul engine's stats API (default http://127.0.0.1:7401)
    #[arg(long = "engine.url", value_name = "URL", value_parser = engine_url)]
    engine_url: Option<String>,
    /// Connect and read timeout for the stats API (default 2s)
    #[arg(long = "engine.timeout", value_name = "DURATION", value_parser = duration)]
    engine_timeout: Option<Duration>,
    /// Stream labels per session; the rest are summed into stream="other"
    /// (default 256)
    #[arg(long = "collector.engine.max-streams", value_name = "N", value_parser = count)]
    max_streams: Option<usize>,
    /// TCP port ranges to report, e.g. 7400-7499,5201 (default 7400-7499)
    #[arg(long = "collector.tcp.ports", value_name = "PORTS", value_parser = port_ranges)]
    tcp_ports: Option<PortRanges>,
    /// Per-connection flow slots; the rest are summed into flow="other"
    /// (default 64)
    #[arg(long = "collector.tcp.max-flows", value_name = "N", value_parser = count)]
    max_flows: Option<usize>,
    /// Command printing storcli/perccli JSON (e.g. "storcli64 /call show J");
    /// off by default
    #[arg(long = "collector.raid.storcli-command", value_name = "COMMAND")]
    storcli_command: Option<String>,
    /// Kill the storcli command after this long (default 10s)
    #[arg(long = "collector.raid.storcli-timeout", value_name = "DURATION", value_parser = duration)]
    storcli_timeout: Option<Duration>,
    /// Rerun the storcli command this often, in the background (default 5m)
    #[arg(long = "collector.raid.storcli-interval", value_name = "DURATION", value_parser = duration)]
    storcli_interval: Option<Duration>,
    /// PEM files whose certificates' expiry to export, comma-separated (the
    /// certificate of --web.config.file is always among them)
    #[arg(long = "collector.certificates.files", value_name = "FILES", value_parser = path_list)]
    certificate_files: Option<PathList>,
    /// Start from no collectors
    #[arg(long = "collector.disable-defaults", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = clap::value_parser!(bool))]
    disable_defaults: Option<bool>,
}

fn listen_address(v: &str) -> Result<String, String> {
    crate::http::resolve_listen_address(v)?;
    Ok(v.to_string())
}

fn count(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("wants a whole number >= 1".into()),
    }
}

fn path(v: &str) -> Result<PathBuf, String> {
    if v.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(PathBuf::from(v))
}

fn engine_url(v: &str) -> Result<String, String> {
    crate::httpclient::Url::parse(v)?;
    Ok(v.to_string())
}

/// "2s", "500ms", "1m", "1.5" (seconds). Zero is refused: a zero timeout
/// would fail every scrape.
fn duration(v: &str) -> Result<Duration, String> {
    match longhaul_units::parse_duration(v).map_err(|e| e.to_string())? {
        d if d.is_zero() => Err("must be positive".into()),
        d => Ok(d),
    }
}

/// Certificate files a host lists; more is a mistake.
const MAX_CERTIFICATE_FILES: usize = 64;

/// Comma-separated paths (a newtype: clap would take a `Vec` for a flag
/// given several times).
#[derive(Debug, Clone)]
struct PathList(Vec<PathBuf>);

fn path_list(v: &str) -> Result<PathList, String> {
    let paths: Vec<PathBuf> = v
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    if paths.len() > MAX_CERTIFICATE_FILES {
        return Err(format!("more than {MAX_CERTIFICATE_FILES} files"));
    }
    Ok(PathList(paths))
}

fn port_ranges(v: &str) -> Result<PortRanges, String> {
    v.parse()
}

/// Argument ids of a collector's two switches.
fn switch_ids(name: &str) -> (String, String) {
    (format!("collector.{name}"), format!("no-collector.{name}"))
}

/// The whole command line: the fixed flags and every collector's switches.
pub fn command() -> clap::Command {
    let mut cmd = Flags::command();
    let mut listing = String::from("Collectors:\n");
    for c in COLLECTORS {
        let (on, off) = switch_ids(c.name);
        let state = if c.default_enabled { "on" } else { "off" };
        listing.push_str(&format!("  {:<10} [default {state}] {}\n", c.name, c.help));
        cmd = cmd
            .arg(
                Arg::new(on.clone())
                    .long(on.clone())
                    .help(format!("Enable the {} collector", c.name))
                    .value_name("BOOL")
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_parser(clap::value_parser!(bool))
                    .overrides_with(off.clone()),
            )
            .arg(
                Arg::new(off.clone())
                    .long(off)
                    .help(format!("Disable the {} collector", c.name))
                    .action(ArgAction::SetTrue)
                    .overrides_with(on),
            );
    }
    cmd.after_help(listing)
}

/// Parses `args` (with the program name first) into a [`Config`].
pub fn parse<I, S>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let matches = cmd
        .try_get_matches_from_mut(args)
        .map_err(|e| name_unknown_collector(e, &mut cmd))?;
    let flags = Flags::from_arg_matches(&matches)?;
    Ok(config(flags, &matches))
}

/// `--collector.nosuch` is an unknown collector, not just an unknown flag:
/// say so and list the known ones.
fn name_unknown_collector(e: clap::Error, cmd: &mut clap::Command) -> clap::Error {
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let flag = arg.split('=').next().unwrap_or(arg);
    let name = flag
        .strip_prefix("--collector.")
        .or_else(|| flag.strip_prefix("--no-collector."));
    match name {
        Some(name) if !name.contains('.') => {
            let known: Vec<&str> = COLLECTORS.iter().map(|c| c.name).collect();
            cmd.error(
                ErrorKind::UnknownArgument,
                format!(
                    "unknown collector {name:?} in {flag}; known collectors: {}",
                    known.join(", ")
                ),
            )
        }
        _ => e,
    }
}

fn config(flags: Flags, matches: &ArgMatches) -> Config {
    let d = Config::default();
    let mut collectors: Vec<&'static str> = if flags.disable_defaults == Some(true) {
        Vec::new()
    } else {
        COLLECTORS
            .iter()
            .filter(|c| c.default_enabled)
            .map(|c| c.name)
            .collect()
    };
    for c in COLLECTORS {
        let (on, off) = switch_ids(c.name);
        let wanted = match matches.get_one::<bool>(&on) {
            Some(&v) => Some(v),
            None if matches.get_flag(&off) => Some(false),
            None => None,
        };
        match wanted {
            Some(true) if !collectors.contains(&c.name) => collectors.push(c.name),
            Some(false) => collectors.retain(|n| *n != c.name),
            _ => {}
        }
    }
    collectors.sort_by_key(|name| COLLECTORS.iter().position(|c| c.name == *name));
    Config {
        listen_address: flags.listen_address.unwrap_or(d.listen_address),
        max_requests: flags.max_requests.unwrap_or(d.max_requests),
        web_config: flags.web_config.or(d.web_config),
        procfs: flags.procfs.unwrap_or(d.procfs),
        sysfs: flags.sysfs.unwrap_or(d.sysfs),
        pci_ids: flags.pci_ids.unwrap_or(d.pci_ids),
        engine_url: flags.engine_url.unwrap_or(d.engine_url),
        engine_timeout: flags.engine_timeout.unwrap_or(d.engine_timeout),
        max_streams: flags.max_streams.unwrap_or(d.max_streams),
        tcp_ports: flags.tcp_ports.unwrap_or(d.tcp_ports),
        max_flows: flags.max_flows.unwrap_or(d.max_flows),
        storcli_command: flags
            .storcli_command
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty()),
        storcli_timeout: flags.storcli_timeout.unwrap_or(d.storcli_timeout),
        storcli_interval: flags.storcli_interval.unwrap_or(d.storcli_interval),
        certificate_files: flags
            .certificate_files
            .map_or(d.certificate_files, |PathList(p)| p),
        collectors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, clap::Error> {
        parse(std::iter::once("longhaul-exporter").chain(args.iter().copied()))
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        command().debug_assert();
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
        assert_eq!(
            cfg.collectors,
            vec!["engine", "raid", "tcp", "certificates"]
        );
    }

    #[test]
    fn the_help_states_the_real_defaults() {
        let help = command().render_help().to_string();
        let d = Config::default();
        for text in [
            format!("default {}", d.listen_address),
            format!("default {}", d.max_requests),
            format!("default {}", d.engine_url),
            format!("default {}s", d.engine_timeout.as_secs()),
            format!("default {}", d.max_streams),
            format!("default {}", d.max_flows),
            format!("default {DEFAULT_TCP_PORTS}"),
            format!("default {}s", d.storcli_timeout.as_secs()),
            format!("default {}m", d.storcli_interval.as_secs() / 60),
            format!("default {DEFAULT_PCI_IDS}"),
        ] {
            assert!(help.contains(&text), "help lacks {text:?}:\n{help}");
        }
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
        assert_eq!(cfg.collectors, vec!["engine", "raid", "certificates"]);
        assert!(cfg.tcp_ports.contains(5201) && cfg.tcp_ports.contains(7001));
        let cfg = run(&["--collector.disable-defaults", "--collector.raid"]).unwrap();
        assert_eq!(cfg.collectors, vec!["raid"]);
        let cfg = run(&["--collector.raid=false"]).unwrap();
        assert_eq!(cfg.collectors, vec!["engine", "tcp", "certificates"]);
        // The last switch of a collector wins.
        let cfg = run(&["--no-collector.tcp", "--collector.tcp"]).unwrap();
        assert_eq!(
            cfg.collectors,
            vec!["engine", "raid", "tcp", "certificates"]
        );
        let cfg = run(&["--collector.tcp", "--no-collector.tcp"]).unwrap();
        assert_eq!(cfg.collectors, vec!["engine", "raid", "certificates"]);
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
            let e = run(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?} accepted");
        }
        let err = run(&["--collector.nosuch"]).unwrap_err().to_string();
        assert!(err.contains("unknown collector \"nosuch\""), "{err}");
        assert!(err.contains("engine, raid, tcp"), "{err}");
        let err = run(&["--collector.tcp.portz=1"]).unwrap_err().to_string();
        assert!(err.contains("'--collector.tcp.ports'"), "suggestion: {err}");
    }
}
