//! Command line: `run` (the delay line; the default when the first argument
//! is a flag), `echo` and `probe` (the RTT check). Hand-rolled parsing:
//! every flag takes one value except `--json`, `--icmp`, `--offload` and
//! `--help`.

use crate::error::{Error, Result};
use crate::probe::ProbeConfig;
use crate::tun::check_ifname;
use crate::units::{parse_duration, parse_rate, parse_size};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Usage text printed by `--help` and after usage errors.
pub const USAGE: &str = "\
usage:
  longhaul-delay [run] --delay DUR --rate RATE [--dev-a NAME] [--dev-b NAME]
                 [--site-a IF --site-b IF] [--table-a N] [--table-b N] [--rule-priority N]
                 [--queue-limit BYTES] [--mtu N] [--txqueuelen N] [--stats-interval DUR]
                 [--realtime-priority N] [--offload]
  longhaul-delay echo --listen ADDR:PORT
  longhaul-delay probe --to ADDR:PORT [--count N] [--interval DUR] [--timeout DUR] [--json]
  longhaul-delay probe --icmp --to ADDR [...]   (ICMP echo like ping; needs root/CAP_NET_RAW)

  --delay DUR        one-way delay per direction, e.g. 46.5ms (RTT 93 ms)
  --rate RATE        bottleneck rate per direction in bits/s of IP packets, e.g. 1G; 0 = unlimited
  --dev-a/--dev-b    TUN devices to create (default lhd-a, lhd-b)
  --site-a/--site-b  router interfaces of the two sites: installs the policy routing that
                     sends their traffic through the delay line, removed again on exit
  --queue-limit      bottleneck buffer in bytes (default rate x 2 x delay, at least 64 x MTU)
  --mtu              MTU of the TUN devices (default 1500; 9000 for jumbo-frame labs)
  --stats-interval   counter report period on stderr (default 10s; 0s = only at exit)
  --realtime-priority  SCHED_FIFO priority of the forwarding threads (default 10; 0 = off)
  --offload          pass TCP segmentation-offload super-packets (up to 64 KB) through
                     whole: far fewer reads and writes, pacing in bursts of up to 64 KB";

/// Settings of the delay line itself.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub dev_a: String,
    pub dev_b: String,
    pub delay: Duration,
    pub rate_bps: u64,
    /// `None`: derived from rate and delay.
    pub queue_limit: Option<u64>,
    pub mtu: u32,
    pub txqueuelen: u32,
    pub sites: Option<(String, String)>,
    pub table_a: u32,
    pub table_b: u32,
    pub rule_priority: u32,
    pub stats_interval: Duration,
    pub realtime_priority: i32,
    /// GSO/checksum offload on the TUN devices (see `frame`).
    pub offload: bool,
}

/// A parsed command line.
#[derive(Debug, Clone)]
pub enum Command {
    Run(RunConfig),
    Echo { listen: SocketAddr },
    Probe { config: ProbeConfig, json: bool },
    Help,
}

/// Smallest MTU IPv4 allows; largest a TUN device takes.
const MTU_RANGE: std::ops::RangeInclusive<u32> = 68..=65535;
/// Default TUN transmit queue: packets the kernel may queue for us while the
/// forwarding thread is descheduled (the default 500 is 6 ms at 1 Gb/s).
const DEFAULT_TXQUEUELEN: u32 = 10_000;
/// SCHED_FIFO priority of the forwarding threads. Real time because a WAN
/// emulator must release packets on time even when the router's CPUs are
/// busy (on a loaded 2-core machine the normal scheduler let releases slip
/// by milliseconds and capped 1 Gb/s at 0.3-0.6 Gb/s); low within the RT range
/// so kernel threads (priority 50) still come first. The threads sleep
/// whenever nothing is due, and the kernel's RT throttling bounds them.
const DEFAULT_REALTIME_PRIORITY: i32 = 10;

fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| usage(format!("{flag}: invalid number '{value}'")))
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command> {
    let (sub, rest) = match args.first().map(String::as_str) {
        None | Some("-h") | Some("--help") | Some("help") => return Ok(Command::Help),
        Some(s) if s.starts_with("--") => ("run", args),
        Some(s) => (s, &args[1..]),
    };
    let mut pairs = Vec::new();
    let mut json = false;
    let mut icmp = false;
    let mut offload = false;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--json" => json = true,
            "--icmp" => icmp = true,
            "--offload" => offload = true,
            "-h" | "--help" => return Ok(Command::Help),
            f if f.starts_with("--") => {
                let value = it
                    .next()
                    .ok_or_else(|| usage(format!("{f} needs a value")))?;
                pairs.push((f.to_string(), value.clone()));
            }
            other => return Err(usage(format!("unexpected argument '{other}'"))),
        }
    }
    match sub {
        "run" => parse_run(&pairs, offload).map(Command::Run),
        "echo" => parse_echo(&pairs),
        "probe" => parse_probe(&pairs, json, icmp),
        other => Err(usage(format!("unknown subcommand '{other}'"))),
    }
}

fn addr(flag: &str, value: &str) -> Result<SocketAddr> {
    value
        .parse()
        .map_err(|_| usage(format!("{flag}: expected ADDR:PORT, got '{value}'")))
}

fn parse_echo(pairs: &[(String, String)]) -> Result<Command> {
    let mut listen = None;
    for (flag, value) in pairs {
        match flag.as_str() {
            "--listen" => listen = Some(addr(flag, value)?),
            f => return Err(usage(format!("echo: unknown flag {f}"))),
        }
    }
    let listen = listen.ok_or_else(|| usage("echo: --listen ADDR:PORT is required"))?;
    Ok(Command::Echo { listen })
}

fn parse_probe(pairs: &[(String, String)], json: bool, icmp: bool) -> Result<Command> {
    let mut to = None;
    let mut config = ProbeConfig {
        to: "127.0.0.1:7".parse().expect("literal address"),
        count: 20,
        interval: Duration::from_millis(100),
        timeout: Duration::from_secs(2),
        icmp: false,
    };
    for (flag, value) in pairs {
        match flag.as_str() {
            // ICMP needs no port: a bare address is accepted.
            "--to" => {
                to = Some(match value.parse::<IpAddr>() {
                    Ok(ip) => SocketAddr::new(ip, 0),
                    Err(_) => addr(flag, value)?,
                })
            }
            "--count" => config.count = number(flag, value)?,
            "--interval" => config.interval = parse_duration(value)?,
            "--timeout" => config.timeout = parse_duration(value)?,
            f => return Err(usage(format!("probe: unknown flag {f}"))),
        }
    }
    config.to =
        to.ok_or_else(|| usage("probe: --to ADDR:PORT (or ADDR with --icmp) is required"))?;
    config.icmp = icmp;
    if !icmp && config.to.port() == 0 {
        return Err(usage(
            "probe: UDP probes need --to ADDR:PORT (or use --icmp)",
        ));
    }
    if config.count == 0 {
        return Err(usage("probe: --count must be at least 1"));
    }
    Ok(Command::Probe { config, json })
}

fn parse_run(pairs: &[(String, String)], offload: bool) -> Result<RunConfig> {
    let mut cfg = RunConfig {
        dev_a: "lhd-a".into(),
        dev_b: "lhd-b".into(),
        delay: Duration::ZERO,
        rate_bps: 0,
        queue_limit: None,
        mtu: 1500,
        txqueuelen: DEFAULT_TXQUEUELEN,
        sites: None,
        table_a: 201,
        table_b: 202,
        rule_priority: 1000,
        stats_interval: Duration::from_secs(10),
        realtime_priority: DEFAULT_REALTIME_PRIORITY,
        offload,
    };
    let (mut delay, mut rate, mut site_a, mut site_b) = (None, None, None, None);
    for (flag, value) in pairs {
        match flag.as_str() {
            "--dev-a" => cfg.dev_a = value.clone(),
            "--dev-b" => cfg.dev_b = value.clone(),
            "--delay" => delay = Some(parse_duration(value)?),
            "--rate" => rate = Some(parse_rate(value)?),
            "--queue-limit" => cfg.queue_limit = Some(parse_size(value)?),
            "--mtu" => cfg.mtu = number(flag, value)?,
            "--txqueuelen" => cfg.txqueuelen = number(flag, value)?,
            "--site-a" => site_a = Some(value.clone()),
            "--site-b" => site_b = Some(value.clone()),
            "--table-a" => cfg.table_a = number(flag, value)?,
            "--table-b" => cfg.table_b = number(flag, value)?,
            "--rule-priority" => cfg.rule_priority = number(flag, value)?,
            "--stats-interval" => cfg.stats_interval = parse_duration(value)?,
            "--realtime-priority" => cfg.realtime_priority = number(flag, value)?,
            f => return Err(usage(format!("run: unknown flag {f}"))),
        }
    }
    cfg.delay = delay.ok_or_else(|| usage("run: --delay is required, e.g. --delay 46.5ms"))?;
    cfg.rate_bps =
        rate.ok_or_else(|| usage("run: --rate is required, e.g. --rate 1G (0 = unlimited)"))?;
    check_ifname(&cfg.dev_a)?;
    check_ifname(&cfg.dev_b)?;
    if cfg.dev_a == cfg.dev_b {
        return Err(usage("run: --dev-a and --dev-b must differ"));
    }
    if !MTU_RANGE.contains(&cfg.mtu) {
        return Err(usage(format!("run: --mtu must be within {MTU_RANGE:?}")));
    }
    cfg.sites = match (site_a, site_b) {
        (None, None) => None,
        (Some(a), Some(b)) => {
            check_ifname(&a)?;
            check_ifname(&b)?;
            if a == b {
                return Err(usage("run: --site-a and --site-b must differ"));
            }
            Some((a, b))
        }
        _ => return Err(usage("run: give both --site-a and --site-b, or neither")),
    };
    if !(0..=99).contains(&cfg.realtime_priority) {
        return Err(usage("run: --realtime-priority must be within 0..=99"));
    }
    if cfg.table_a == cfg.table_b {
        return Err(usage("run: --table-a and --table-b must differ"));
    }
    if let Some(limit) = cfg.queue_limit {
        if limit < cfg.mtu as u64 {
            return Err(usage(
                "run: --queue-limit must hold at least one MTU-sized packet",
            ));
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let Command::Run(cfg) = parse(&args(
            "--delay 46.5ms --rate 1G --site-a eth1 --site-b eth2",
        ))
        .unwrap() else {
            panic!("not run");
        };
        assert_eq!(cfg.delay, Duration::from_micros(46_500));
        assert_eq!(cfg.rate_bps, 1_000_000_000);
        assert_eq!(cfg.sites, Some(("eth1".into(), "eth2".into())));
        assert_eq!(cfg.mtu, 1500);
        assert!(!cfg.offload);
        let Command::Run(cfg) = parse(&args("run --offload --delay 1ms --rate 0")).unwrap() else {
            panic!("not run");
        };
        assert!(cfg.offload);
    }

    #[test]
    fn run_rejects_bad_combinations() {
        assert!(parse(&args("run --rate 1G")).is_err());
        assert!(parse(&args("run --delay 1ms")).is_err());
        assert!(parse(&args("run --delay 1ms --rate 1G --site-a eth1")).is_err());
        assert!(parse(&args("run --delay 1ms --rate 1G --dev-a x --dev-b x")).is_err());
        assert!(parse(&args("run --delay 1ms --rate 1G --mtu 20")).is_err());
        assert!(parse(&args("run --delay 1ms --rate 1G --bogus 1")).is_err());
        assert!(parse(&args("run --delay 1ms --rate 1G --queue-limit 100")).is_err());
    }

    #[test]
    fn probe_and_echo() {
        let Command::Probe { config, json } = parse(&args(
            "probe --to 10.99.2.2:7999 --count 5 --interval 10ms --json",
        ))
        .unwrap() else {
            panic!("not probe");
        };
        assert!(json);
        assert_eq!(config.count, 5);
        assert_eq!(config.interval, Duration::from_millis(10));
        assert!(matches!(
            parse(&args("echo --listen 0.0.0.0:7999")).unwrap(),
            Command::Echo { .. }
        ));
        assert!(parse(&args("probe --count 3")).is_err());
        assert!(parse(&args("probe --to 10.99.2.2")).is_err());
        let Command::Probe { config, .. } = parse(&args("probe --icmp --to 10.99.2.2")).unwrap()
        else {
            panic!("not probe");
        };
        assert!(config.icmp);
    }
}
