//! What a collector is, after node_exporter: something that appends its
//! families to a scrape ([`Collector`]), registered with a name, a default
//! on/off and a constructor ([`CollectorSpec`]). The registry and the
//! scrape that runs them are in scrape.rs.
//!
//! A collection is one [`Round`]: what several collectors read from the
//! same source is read once per round and shared (the engine's stats API
//! answer, which both the `engine` and the `tcp` collector use).

use std::sync::OnceLock;

use crate::config::Config;
use crate::metrics::Family;
use crate::stats::{EngineApi, EngineView};

/// One collector: appends its families for one collection.
pub trait Collector: Send + Sync {
    /// Fills `out`. An `Err` marks the collector failed for this scrape;
    /// families pushed before the error are still exposed (they are only
    /// pushed once known to be complete).
    fn update(&self, round: &Round, out: &mut Vec<Family>) -> anyhow::Result<()>;
}

/// Registry entry.
pub struct CollectorSpec {
    pub name: &'static str,
    pub default_enabled: bool,
    pub help: &'static str,
    pub new: fn(&Config) -> anyhow::Result<Box<dyn Collector>>,
}

/// Why the round could not read the engine's stats API.
#[derive(Debug, Clone)]
pub struct EngineFailure {
    pub message: String,
    /// Nothing listens at the stats API's address (the engine is stopped),
    /// as opposed to an engine that is slow, hung or answered garbage.
    pub refused: bool,
}

/// The inputs of one collection, read at most once each.
pub struct Round<'a> {
    engine: Option<&'a EngineApi>,
    view: OnceLock<Result<EngineView, EngineFailure>>,
}

impl<'a> Round<'a> {
    /// A round that reads `engine` (None: the engine collector is off).
    pub fn new(engine: Option<&'a EngineApi>) -> Round<'a> {
        Round {
            engine,
            view: OnceLock::new(),
        }
    }

    /// The engine's stats API answer, read by the first collector that
    /// asks (the others wait for it); None when no engine is configured.
    pub fn engine(&self) -> Option<&Result<EngineView, EngineFailure>> {
        let api = self.engine?;
        Some(self.view.get_or_init(|| {
            api.view().map_err(|e| EngineFailure {
                message: format!("{e:#}"),
                refused: crate::stats::refused(&e),
            })
        }))
    }
}
