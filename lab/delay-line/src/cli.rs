//! Command line (clap): `run` (the delay line; the default when the first
//! argument is a flag), `echo` and `probe` (the RTT check). Durations carry
//! their unit (`46.5ms`), rates are bits/s (`1G`), sizes bytes (`4M`), by
//! the rules of `longhaul-units`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::error::{Error, Result};
use crate::probe::ProbeConfig;
use crate::run::{RunConfig, DEFAULT_REALTIME_PRIORITY, DEFAULT_TXQUEUELEN, MTU_RANGE};
use crate::tun::check_ifname;

/// Userspace WAN delay line for the lab router: holds each packet for a
/// one-way delay and paces to a bottleneck rate (no netem needed).
#[derive(Debug, Parser)]
#[command(
    name = "longhaul-delay",
    version,
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Without a subcommand: `run` with these flags.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Forward between two TUN devices with a delay and a rate (the default)
    Run(RunArgs),
    /// Answer UDP probes (run it on the far site)
    Echo(EchoArgs),
    /// Measure the round trip time with UDP (or ICMP) probes
    Probe(ProbeArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// One-way delay per direction, e.g. 46.5ms (RTT 93 ms)
    #[arg(long, value_name = "DUR", value_parser = duration)]
    delay: Option<Duration>,
    /// Bottleneck rate per direction in bits/s of IP packets, e.g. 1G; 0 =
    /// unlimited
    #[arg(long, value_name = "RATE", value_parser = rate)]
    rate: Option<u64>,
    /// TUN device towards site B's traffic (created)
    #[arg(long, value_name = "NAME", default_value = "lhd-a", value_parser = ifname)]
    dev_a: String,
    /// TUN device towards site A's traffic (created)
    #[arg(long, value_name = "NAME", default_value = "lhd-b", value_parser = ifname)]
    dev_b: String,
    /// Router interface of site A: installs the policy routing that sends its
    /// traffic through the delay line, removed again on exit
    #[arg(long, value_name = "IF", requires = "site_b", value_parser = ifname)]
    site_a: Option<String>,
    /// Router interface of site B (see --site-a)
    #[arg(long, value_name = "IF", requires = "site_a", value_parser = ifname)]
    site_b: Option<String>,
    /// Routing table of site A's rule
    #[arg(long, value_name = "N", default_value_t = 201)]
    table_a: u32,
    /// Routing table of site B's rule
    #[arg(long, value_name = "N", default_value_t = 202)]
    table_b: u32,
    /// Priority of the policy routing rules
    #[arg(long, value_name = "N", default_value_t = 1000)]
    rule_priority: u32,
    /// Bottleneck buffer in bytes (default rate x 2 x delay, at least 64 x MTU)
    #[arg(long, value_name = "BYTES", value_parser = size)]
    queue_limit: Option<u64>,
    /// MTU of the TUN devices (9000 for jumbo-frame labs)
    #[arg(long, value_name = "N", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(i64::from(*MTU_RANGE.start())..=i64::from(*MTU_RANGE.end())))]
    mtu: u32,
    /// Transmit queue length of the TUN devices
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TXQUEUELEN)]
    txqueuelen: u32,
    /// Counter report period on stderr (0s = only at exit)
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration)]
    stats_interval: Duration,
    /// SCHED_FIFO priority of the forwarding threads (0 = off)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REALTIME_PRIORITY,
          value_parser = clap::value_parser!(i32).range(0..=99))]
    realtime_priority: i32,
    /// Pass TCP segmentation-offload super-packets (up to 64 KB) through
    /// whole: far fewer reads and writes, pacing in bursts of up to 64 KB
    #[arg(long)]
    offload: bool,
}

#[derive(Debug, Args)]
struct EchoArgs {
    /// Address to answer on
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
}

#[derive(Debug, Args)]
struct ProbeArgs {
    /// The echo: ADDR:PORT, or ADDR with --icmp
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = probe_target)]
    to: SocketAddr,
    /// Probes to send
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// Time between probes
    #[arg(long, value_name = "DUR", default_value = "100ms", value_parser = duration)]
    interval: Duration,
    /// How long to wait for the last answer
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = duration)]
    timeout: Duration,
    /// Print the summary as JSON
    #[arg(long)]
    json: bool,
    /// ICMP echo like ping (needs root or CAP_NET_RAW)
    #[arg(long)]
    icmp: bool,
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    Run(RunConfig),
    Echo { listen: SocketAddr },
    Probe { config: ProbeConfig, json: bool },
}

fn duration(v: &str) -> std::result::Result<Duration, String> {
    longhaul_units::parse_duration_with_unit(v).map_err(|e| e.to_string())
}

fn rate(v: &str) -> std::result::Result<u64, String> {
    longhaul_units::parse_rate(v).map_err(|e| e.to_string())
}

fn size(v: &str) -> std::result::Result<u64, String> {
    longhaul_units::parse_size(v).map_err(|e| e.to_string())
}

fn ifname(v: &str) -> std::result::Result<String, String> {
    check_ifname(v).map_err(|e| e.to_string())?;
    Ok(v.to_string())
}

/// ICMP needs no port: a bare address is accepted (port 0).
fn probe_target(v: &str) -> std::result::Result<SocketAddr, String> {
    match v.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, 0)),
        Err(_) => v
            .parse()
            .map_err(|_| "expected ADDR:PORT (or ADDR with --icmp)".to_string()),
    }
}

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

/// Parses the arguments (with the program name first). Clap's own errors
/// (and `--help`) come back as `Err(clap::Error)`; the rules between flags
/// as [`Error::Usage`].
pub fn parse<I, S>(args: I) -> std::result::Result<Result<Command>, clap::Error>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    Ok(match cli.command {
        None => run_config(cli.run).map(Command::Run),
        Some(Sub::Run(a)) => run_config(a).map(Command::Run),
        Some(Sub::Echo(a)) => Ok(Command::Echo { listen: a.listen }),
        Some(Sub::Probe(a)) => probe_config(a),
    })
}

fn probe_config(a: ProbeArgs) -> Result<Command> {
    if !a.icmp && a.to.port() == 0 {
        return Err(usage(
            "probe: UDP probes need --to ADDR:PORT (or use --icmp)",
        ));
    }
    Ok(Command::Probe {
        config: ProbeConfig {
            to: a.to,
            count: a.count,
            interval: a.interval,
            timeout: a.timeout,
            icmp: a.icmp,
        },
        json: a.json,
    })
}

fn run_config(a: RunArgs) -> Result<RunConfig> {
    let delay = a
        .delay
        .ok_or_else(|| usage("run: --delay is required, e.g. --delay 46.5ms"))?;
    let rate_bps = a
        .rate
        .ok_or_else(|| usage("run: --rate is required, e.g. --rate 1G (0 = unlimited)"))?;
    if a.dev_a == a.dev_b {
        return Err(usage("run: --dev-a and --dev-b must differ"));
    }
    let sites = match (a.site_a, a.site_b) {
        (Some(x), Some(y)) if x == y => {
            return Err(usage("run: --site-a and --site-b must differ"))
        }
        (Some(x), Some(y)) => Some((x, y)),
        _ => None,
    };
    if a.table_a == a.table_b {
        return Err(usage("run: --table-a and --table-b must differ"));
    }
    if let Some(limit) = a.queue_limit {
        if limit < a.mtu as u64 {
            return Err(usage(
                "run: --queue-limit must hold at least one MTU-sized packet",
            ));
        }
    }
    Ok(RunConfig {
        dev_a: a.dev_a,
        dev_b: a.dev_b,
        delay,
        rate_bps,
        queue_limit: a.queue_limit,
        mtu: a.mtu,
        txqueuelen: a.txqueuelen,
        sites,
        table_a: a.table_a,
        table_b: a.table_b,
        rule_priority: a.rule_priority,
        stats_interval: a.stats_interval,
        realtime_priority: a.realtime_priority,
        offload: a.offload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse_line(s: &str) -> std::result::Result<Result<Command>, clap::Error> {
        parse(std::iter::once("longhaul-delay").chain(s.split_whitespace()))
    }

    fn ok(s: &str) -> Command {
        parse_line(s).expect("clap accepts").expect("rules accept")
    }

    fn refused(s: &str) -> bool {
        !matches!(parse_line(s), Ok(Ok(_)))
    }

    #[test]
    fn the_clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let Command::Run(cfg) = ok("--delay 46.5ms --rate 1G --site-a eth1 --site-b eth2") else {
            panic!("not run");
        };
        assert_eq!(cfg.delay, Duration::from_micros(46_500));
        assert_eq!(cfg.rate_bps, 1_000_000_000);
        assert_eq!(cfg.sites, Some(("eth1".into(), "eth2".into())));
        assert_eq!(cfg.mtu, 1500);
        assert!(!cfg.offload);
        let Command::Run(cfg) = ok("run --offload --delay 1ms --rate 0") else {
            panic!("not run");
        };
        assert!(cfg.offload);
    }

    #[test]
    fn run_rejects_bad_combinations() {
        assert!(refused("run --rate 1G"));
        assert!(refused("run --delay 1ms"));
        assert!(refused("run --delay 1 --rate 1G"), "a delay needs its unit");
        assert!(refused("run --delay 1ms --rate 1G --site-a eth1"));
        assert!(refused("run --delay 1ms --rate 1G --dev-a x --dev-b x"));
        assert!(refused("run --delay 1ms --rate 1G --mtu 20"));
        assert!(refused("run --delay 1ms --rate 1G --bogus 1"));
        assert!(refused("run --delay 1ms --rate 1G --queue-limit 100"));
    }

    #[test]
    fn probe_and_echo() {
        let Command::Probe { config, json } =
            ok("probe --to 10.99.2.2:7999 --count 5 --interval 10ms --json")
        else {
            panic!("not probe");
        };
        assert!(json);
        assert_eq!(config.count, 5);
        assert_eq!(config.interval, Duration::from_millis(10));
        assert!(matches!(
            ok("echo --listen 0.0.0.0:7999"),
            Command::Echo { .. }
        ));
        assert!(refused("probe --count 3"));
        assert!(refused("probe --to 10.99.2.2"));
        let Command::Probe { config, .. } = ok("probe --icmp --to 10.99.2.2") else {
            panic!("not probe");
        };
        assert!(config.icmp);
    }
}
