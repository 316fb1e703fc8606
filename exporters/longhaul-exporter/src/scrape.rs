//! The registry of collectors and the collection that runs them: every
//! enabled collector in parallel, timed, its failure turned into
//! `longhaul_exporter_collector_success{collector} 0` instead of a failed
//! scrape. A failure is logged when it first happens (and when its cause
//! changes or it recovers), not on every scrape.
//!
//! Scrapes share collections ([`Exporter::shared`]): a scrape that arrives
//! while a collection runs waits for that collection's result (within its
//! own deadline) instead of starting another, so any number of scrapers at
//! once cost one collection, one stats API request and one encoding per
//! format.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::collector::{Collector, CollectorSpec, Round};
use crate::collectors::{certificates, engine, raid, tcp};
use crate::config::Config;
use crate::metrics::{self, Family, Format};
use crate::stats::EngineApi;

/// Every collector there is, in output order.
pub static COLLECTORS: &[CollectorSpec] =
    &[engine::SPEC, raid::SPEC, tcp::SPEC, certificates::SPEC];

struct Enabled {
    name: &'static str,
    collector: Box<dyn Collector>,
    /// Last failure reported, so each distinct failure is logged once.
    last_error: Mutex<Option<String>>,
}

/// The enabled collectors of one exporter process.
pub struct Exporter {
    collectors: Vec<Enabled>,
    /// The engine's stats API, read once per collection (None: the engine
    /// collector is off).
    engine: Option<EngineApi>,
    /// The collection running now, if any.
    flight: Mutex<Option<Arc<Flight>>>,
}

/// A collection in progress; scrapes that arrive meanwhile wait for it.
#[derive(Default)]
struct Flight {
    done: Mutex<Option<Arc<Collection>>>,
    finished: Condvar,
}

/// The result of one collection, shared by every scrape that waited for
/// it, with its encodings made once each, on first use.
pub struct Collection {
    families: Vec<Family>,
    text: OnceLock<Bytes>,
    open_metrics: OnceLock<Bytes>,
}

impl Collection {
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// The scrape in `format`.
    pub fn encoded(&self, format: Format) -> Bytes {
        let cell = match format {
            Format::Text => &self.text,
            Format::OpenMetrics => &self.open_metrics,
        };
        cell.get_or_init(|| Bytes::from(metrics::encode(&self.families, format)))
            .clone()
    }
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
        let engine = if cfg.collectors.contains(&engine::SPEC.name) {
            Some(EngineApi::new(
                &cfg.engine_url,
                cfg.engine_timeout,
                cfg.max_streams,
            )?)
        } else {
            None
        };
        Ok(Exporter {
            collectors,
            engine,
            flight: Mutex::new(None),
        })
    }

    /// The result of a collection: the one running now if there is one,
    /// else a new one. `None` if the running collection does not finish
    /// within `patience`.
    pub fn shared(&self, patience: Duration) -> Option<Arc<Collection>> {
        let (flight, leader) = {
            let mut current = self.flight.lock().unwrap_or_else(|p| p.into_inner());
            match &*current {
                Some(f) => (Arc::clone(f), false),
                None => {
                    let f = Arc::new(Flight::default());
                    *current = Some(Arc::clone(&f));
                    (f, true)
                }
            }
        };
        if leader {
            // Whatever happens, the next scrape starts a new collection.
            struct Land<'a>(&'a Mutex<Option<Arc<Flight>>>);
            impl Drop for Land<'_> {
                fn drop(&mut self) {
                    *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
            }
            let _land = Land(&self.flight);
            let collection = Arc::new(Collection {
                families: self.scrape(),
                text: OnceLock::new(),
                open_metrics: OnceLock::new(),
            });
            *flight.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&collection));
            flight.finished.notify_all();
            return Some(collection);
        }
        let deadline = Instant::now() + patience;
        let mut done = flight.done.lock().unwrap_or_else(|p| p.into_inner());
        while done.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            done = flight
                .finished
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        done.clone()
    }

    /// Runs every collector (in parallel) and returns all families, the
    /// exporter's own duration/success families last. [`Exporter::shared`]
    /// is what scrapes use.
    pub fn scrape(&self) -> Vec<Family> {
        let round = Round::new(self.engine.as_ref());
        let round = &round;
        let results: Vec<(Vec<Family>, f64, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .collectors
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let start = Instant::now();
                        let mut out = Vec::new();
                        let res = c.collector.update(round, &mut out);
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
