//! The registry of collectors and the scrape that runs them: every enabled
//! collector in parallel, timed, its failure turned into
//! `longhaul_exporter_collector_success{collector} 0` instead of a failed
//! scrape. A failure is logged when it first happens (and when its cause
//! changes or it recovers), not on every scrape.

use std::sync::Mutex;
use std::time::Instant;

use crate::collector::{Collector, CollectorSpec};
use crate::collectors::{engine, raid, tcp};
use crate::config::Config;
use crate::metrics::Family;

/// Every collector there is, in output order.
pub static COLLECTORS: &[CollectorSpec] = &[engine::SPEC, raid::SPEC, tcp::SPEC];

struct Enabled {
    name: &'static str,
    collector: Box<dyn Collector>,
    /// Last failure reported, so each distinct failure is logged once.
    last_error: Mutex<Option<String>>,
}

/// The enabled collectors of one exporter process.
pub struct Exporter {
    collectors: Vec<Enabled>,
}

impl Exporter {
    /// Builds the collectors `cfg` enables. A constructor error is a startup
    /// error (bad configuration), unlike a collect error.
    pub fn new(cfg: &Config) -> anyhow::Result<Exporter> {
        let mut collectors = Vec::new();
        for name in &cfg.collectors {
            let spec = COLLECTORS
                .iter()
                .find(|c| c.name == *name)
                .ok_or_else(|| anyhow::anyhow!("unknown collector {name:?}"))?;
            let collector =
                (spec.new)(cfg).map_err(|e| e.context(format!("collector {}", spec.name)))?;
            collectors.push(Enabled {
                name: spec.name,
                collector,
                last_error: Mutex::new(None),
            });
        }
        Ok(Exporter { collectors })
    }

    /// Runs every collector (in parallel) and returns all families, the
    /// exporter's own duration/success families last.
    pub fn scrape(&self) -> Vec<Family> {
        let results: Vec<(Vec<Family>, f64, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .collectors
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let start = Instant::now();
                        let mut out = Vec::new();
                        let res = c.collector.update(&mut out);
                        (out, start.elapsed().as_secs_f64(), res)
                    })
                })
                .collect();
            handles
                .into_iter()
                .zip(&self.collectors)
                .map(|(h, c)| match h.join() {
                    Ok((out, secs, res)) => {
                        let ok = res.is_ok();
                        c.report(res.err().map(|e| format!("{e:#}")));
                        (out, secs, ok)
                    }
                    Err(_) => {
                        c.report(Some("collector panicked".into()));
                        (Vec::new(), 0.0, false)
                    }
                })
                .collect()
        });
        let mut duration = Family::gauge(
            "longhaul_exporter_collector_duration_seconds",
            "Seconds a collector took in this scrape.",
        );
        let mut success = Family::gauge(
            "longhaul_exporter_collector_success",
            "1 if the collector succeeded in this scrape, 0 if it failed (see the exporter's log).",
        );
        let mut families = Vec::new();
        for (c, (out, secs, ok)) in self.collectors.iter().zip(results) {
            families.extend(out);
            duration.push(&[("collector", c.name)], secs);
            success.push(&[("collector", c.name)], if ok { 1.0 } else { 0.0 });
        }
        families.push(duration);
        families.push(success);
        families
    }
}

impl Enabled {
    fn report(&self, error: Option<String>) {
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        if *last == error {
            return;
        }
        match &error {
            Some(e) => crate::log(&format!("collector {} failed: {e}", self.name)),
            None => crate::log(&format!("collector {} recovered", self.name)),
        }
        *last = error;
    }
}
