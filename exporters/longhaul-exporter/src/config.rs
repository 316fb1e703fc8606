//! The exporter's configuration: every setting the flags can change, with
//! its default and why it has that value. Collectors and the HTTP server
//! read it; the command line (cli.rs) fills it.

use std::path::PathBuf;
use std::time::Duration;

use crate::ports::PortRanges;

/// Default listen address (DESIGN.md): all interfaces, port 9743.
pub const DEFAULT_LISTEN: &str = ":9743";
/// Default engine stats API (the engine's `--stats-listen` default).
pub const DEFAULT_ENGINE_URL: &str = "http://127.0.0.1:7401";
/// The engine's data ports by convention: 7400 control, the rest data.
pub const DEFAULT_TCP_PORTS: &str = "7400-7499";
/// Prometheus scrapes one target once per interval; more than a handful
/// in flight means something is wrong (stuck collectors, a scrape storm),
/// so refuse more with 503 instead of piling up threads. Scrapes in flight
/// share one collection, so each costs a waiting thread; one source gets
/// half of them (http.rs), so a stranger who floods leaves 4 to Prometheus
/// (a pair) and people.
pub const DEFAULT_MAX_REQUESTS: usize = 8;
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
    /// `--web.config.file`: TLS and basic auth (None: plain, open).
    pub web_config: Option<PathBuf>,
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
    /// PEM files whose certificates' expiry the `certificates` collector
    /// exports (the web config's certificate is added at start).
    pub certificate_files: Vec<PathBuf>,
    /// Enabled collectors, in registry order (the command line starts from
    /// those on by default).
    pub collectors: Vec<&'static str>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen_address: DEFAULT_LISTEN.into(),
            max_requests: DEFAULT_MAX_REQUESTS,
            web_config: None,
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
            certificate_files: Vec::new(),
            collectors: Vec::new(),
        }
    }
}
