//! What a collector is, after node_exporter: something that appends its
//! families to a scrape ([`Collector`]), registered with a name, a default
//! on/off and a constructor ([`CollectorSpec`]). The registry and the
//! scrape that runs them are in scrape.rs.

use crate::config::Config;
use crate::metrics::Family;

/// One collector: appends its families for one scrape.
pub trait Collector: Send + Sync {
    /// Fills `out`. An `Err` marks the collector failed for this scrape;
    /// families pushed before the error are still exposed (they are only
    /// pushed once known to be complete).
    fn update(&self, out: &mut Vec<Family>) -> anyhow::Result<()>;
}

/// Registry entry.
pub struct CollectorSpec {
    pub name: &'static str,
    pub default_enabled: bool,
    pub help: &'static str,
    pub new: fn(&Config) -> anyhow::Result<Box<dyn Collector>>,
}
