//! `raid` collector: IO per disk controller, summed from `/proc/diskstats`
//! over the whole disks sysfs places under each controller
//! (longhaul-topology), plus controller, disk and md metadata.
//!
//! Only whole physical disks are summed: partitions, md and dm devices are
//! left out because their IO is already counted on the disks below them, and
//! loop/ram because theirs is not controller IO. A controller whose disks'
//! diskstats lines are missing or malformed gets no counters this scrape;
//! the collector then reports failure, with the cause logged once.
//!
//! A controller's counters are carried from scrape to scrape: each disk
//! adds what it did since the last scrape (its whole count the first time
//! it is seen, and after its own counters restarted, what it did since).
//! So a disk that leaves takes nothing away, and one that comes back adds
//! only its new IO. Summing the present disks' lifetime counters afresh
//! made the controller's counter fall when a disk was unplugged, which
//! rate() reads as a reset: the other disks' whole lifetime counted again.
//! (An exporter restarted after an unplug starts again from the present
//! disks' lifetime, lower than before: one reset, as any restart may be.)
//!
//! Resolving the topology walks hundreds of sysfs symlinks (the bulk of a
//! scrape's cost on a 64-disk box), while it changes only on hotplug. It is
//! therefore kept between scrapes and rebuilt when the `/sys/block` listing
//! changes or after [`LAYOUT_MAX_AGE`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use longhaul_topology::{self as topology, ControllerInfo, Disk, MdArray, DISKSTATS_SECTOR_BYTES};

use crate::collector::{Collector, CollectorSpec, Round};
use crate::config::Config;
use crate::diskstats::{self, DiskStats};
use crate::metrics::Family;
use crate::storcli::Storcli;

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "raid",
    default_enabled: true,
    help: "IO per disk controller from diskstats and sysfs topology",
    new,
};

/// Longest a resolved topology is reused while `/sys/block` lists the same
/// devices (a disk swapped under the same name is picked up within this).
const LAYOUT_MAX_AGE: Duration = Duration::from_secs(60);

/// The resolved topology of one `/sys/block` listing.
struct Layout {
    listing: Vec<String>,
    built: Instant,
    disks: Vec<Disk>,
    controllers: Vec<ControllerInfo>,
    md: Vec<MdArray>,
    /// Non-fatal problems found while resolving (reported every scrape
    /// until the layout is rebuilt).
    problems: Vec<String>,
}

impl Layout {
    fn build(sysfs: &Path, listing: Vec<String>) -> anyhow::Result<Layout> {
        let disks = topology::whole_disks(sysfs).context("reading disk topology")?;
        let mut problems = Vec::new();
        let mut ids: Vec<&str> = disks.iter().map(|d| d.controller.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let controllers = ids
            .into_iter()
            .map(|id| {
                topology::controller_info(sysfs, id).unwrap_or_else(|e| {
                    problems.push(format!("controller {id}: {e}"));
                    ControllerInfo {
                        id: id.to_string(),
                        ..Default::default()
                    }
                })
            })
            .collect();
        let md = topology::md_arrays(sysfs).unwrap_or_else(|e| {
            problems.push(format!("md arrays: {e}"));
            Vec::new()
        });
        Ok(Layout {
            listing,
            built: Instant::now(),
            disks,
            controllers,
            md,
            problems,
        })
    }
}

fn new(cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(RaidCollector {
        procfs: cfg.procfs.clone(),
        sysfs: cfg.sysfs.clone(),
        pci_ids: cfg.pci_ids.clone(),
        pci_names: Mutex::default(),
        layout: Mutex::default(),
        carried: Mutex::default(),
        storcli: cfg
            .storcli_command
            .as_deref()
            .map(|c| Storcli::new(c, cfg.storcli_timeout, cfg.storcli_interval)),
    }))
}

pub struct RaidCollector {
    procfs: PathBuf,
    sysfs: PathBuf,
    pci_ids: PathBuf,
    /// "vendor:device" -> pci.ids name (None: not listed), so pci.ids
    /// (1.3 MB) is read only when a new controller model shows up.
    pci_names: Mutex<HashMap<String, Option<String>>>,
    storcli: Option<Storcli>,
    layout: Mutex<Option<Arc<Layout>>>,
    carried: Mutex<Carried>,
}

/// The controllers' counters between scrapes (module docs).
#[derive(Default)]
struct Carried {
    /// By controller: everything its disks did while this exporter watched.
    totals: HashMap<String, DiskStats>,
    /// By disk: its controller and its counters when last seen (kept after
    /// it leaves: one entry per disk name the host ever had).
    last: HashMap<String, (String, DiskStats)>,
}

impl Carried {
    /// Adds what `disk` on `controller` did since the last scrape.
    fn see(&mut self, disk: &str, controller: &str, now: DiskStats) {
        let since = match self.last.get(disk) {
            Some((c, before)) if c == controller => DiskStats {
                reads_completed: grown(before.reads_completed, now.reads_completed),
                sectors_read: grown(before.sectors_read, now.sectors_read),
                writes_completed: grown(before.writes_completed, now.writes_completed),
                sectors_written: grown(before.sectors_written, now.sectors_written),
                io_ticks_ms: grown(before.io_ticks_ms, now.io_ticks_ms),
            },
            // New here (or moved from another controller): all of it.
            _ => now,
        };
        let t = self.totals.entry(controller.to_string()).or_default();
        t.reads_completed += since.reads_completed;
        t.sectors_read += since.sectors_read;
        t.writes_completed += since.writes_completed;
        t.sectors_written += since.sectors_written;
        t.io_ticks_ms += since.io_ticks_ms;
        self.last
            .insert(disk.to_string(), (controller.to_string(), now));
    }
}

/// The md software RAID arrays of the layout and their members.
fn md_families(layout: &Layout) -> [Family; 2] {
    let mut md_info = Family::gauge("longhaul_md_info", "An md software RAID array; always 1.");
    let mut md_member = Family::gauge(
        "longhaul_md_member_info",
        "A member device (partition or disk) of an md array; always 1.",
    );
    for md in &layout.md {
        md_info.push(&[("md", &md.name), ("level", &md.level)], 1.0);
        for m in &md.members {
            md_member.push(&[("md", &md.name), ("device", m)], 1.0);
        }
    }
    [md_info, md_member]
}

/// How much a disk counter grew from `before` to `now`; a counter that went
/// down restarted (the disk was re-added), so all of `now` is new.
fn grown(before: u64, now: u64) -> u64 {
    now.checked_sub(before).unwrap_or(now)
}

#[derive(Default)]
struct Sum {
    disks: u64,
    complete: bool,
}

impl Collector for RaidCollector {
    fn update(&self, _round: &Round, out: &mut Vec<Family>) -> anyhow::Result<()> {
        // Held from the read on: two scrapes at once must fold their
        // readings in the order they were taken (an older one folded last
        // would look like every disk's counters restarting).
        let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.procfs.join("diskstats");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let stats = diskstats::parse(&text);
        let layout = self.layout()?;
        let disks = &layout.disks;
        let mut problems: Vec<String> = stats.malformed.clone();
        problems.extend(layout.problems.iter().cloned());

        let mut disk_info = Family::gauge(
            "longhaul_disk_controller_info",
            "Which controller a whole disk hangs off; always 1.",
        );
        let mut sums: BTreeMap<&str, Sum> = BTreeMap::new();
        // A disk gone from the layout leaves its IO in the totals and its
        // last counters in `carried.last`: back under the same controller,
        // it adds only what it did since (or since its counters restarted).
        for d in disks {
            disk_info.push(&[("device", &d.name), ("controller", &d.controller)], 1.0);
            let sum = sums.entry(&d.controller).or_insert_with(|| Sum {
                complete: true,
                ..Default::default()
            });
            sum.disks += 1;
            match stats.devices.get(&d.name) {
                Some(s) => carried.see(&d.name, &d.controller, *s),
                None => {
                    sum.complete = false;
                    problems.push(format!(
                        "{} has no usable line in {}",
                        d.name,
                        path.display()
                    ));
                }
            }
        }

        let storcli_models = self
            .storcli
            .as_ref()
            .map(Storcli::models)
            .unwrap_or_default();
        let mut info = Family::gauge(
            "longhaul_controller_info",
            "A disk controller: PCI address, kernel driver and model; always 1.",
        );
        let mut disks_f = Family::gauge(
            "longhaul_controller_disks",
            "Whole disks (volumes, for hardware RAID) behind the controller.",
        );
        let mut read_b = Family::counter(
            "longhaul_controller_read_bytes_total",
            "Bytes read from the controller's whole disks.",
        );
        let mut written_b = Family::counter(
            "longhaul_controller_written_bytes_total",
            "Bytes written to the controller's whole disks.",
        );
        let mut reads = Family::counter(
            "longhaul_controller_reads_completed_total",
            "Reads completed by the controller's whole disks.",
        );
        let mut writes = Family::counter(
            "longhaul_controller_writes_completed_total",
            "Writes completed by the controller's whole disks.",
        );
        let mut io_time = Family::counter(
            "longhaul_controller_io_time_seconds_total",
            "Seconds the controller's disks had IO in flight, summed over its disks (so it can exceed wall time).",
        );
        for ci in &layout.controllers {
            let ctrl = ci.id.as_str();
            let Some(sum) = sums.get(ctrl) else { continue };
            let model = self.model(ci, &storcli_models);
            info.push(
                &[
                    ("controller", ctrl),
                    ("pci_address", ci.pci_address.as_deref().unwrap_or("")),
                    ("driver", ci.driver.as_deref().unwrap_or("")),
                    ("model", &model),
                ],
                1.0,
            );
            let l = [("controller", ctrl)];
            disks_f.push_u64(&l, sum.disks);
            if let (true, Some(t)) = (sum.complete, carried.totals.get(ctrl)) {
                read_b.push_u64(&l, t.sectors_read * DISKSTATS_SECTOR_BYTES);
                written_b.push_u64(&l, t.sectors_written * DISKSTATS_SECTOR_BYTES);
                reads.push_u64(&l, t.reads_completed);
                writes.push_u64(&l, t.writes_completed);
                io_time.push(&l, t.io_ticks_ms as f64 / 1000.0);
            }
        }

        out.extend([
            info, disks_f, read_b, written_b, reads, writes, io_time, disk_info,
        ]);
        out.extend(md_families(&layout));
        if !problems.is_empty() {
            bail!("{}", problems.join("; "));
        }
        Ok(())
    }
}

impl RaidCollector {
    /// The cached layout, rebuilt when `/sys/block` changed or aged out.
    fn layout(&self) -> anyhow::Result<Arc<Layout>> {
        let block = self.sysfs.join("block");
        let mut listing: Vec<String> = std::fs::read_dir(&block)
            .with_context(|| format!("reading {}", block.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        listing.sort_unstable();
        let mut cached = self.layout.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = cached.as_ref() {
            if l.listing == listing && l.built.elapsed() < LAYOUT_MAX_AGE {
                return Ok(Arc::clone(l));
            }
        }
        let fresh = Arc::new(Layout::build(&self.sysfs, listing)?);
        *cached = Some(Arc::clone(&fresh));
        Ok(fresh)
    }

    /// Model label: storcli's name, else the kernel's (NVMe), else pci.ids,
    /// else the raw "vendor:device" ids, else "".
    fn model(&self, ci: &ControllerInfo, storcli: &HashMap<String, String>) -> String {
        if let Some(m) = ci.pci_address.as_ref().and_then(|a| storcli.get(a)) {
            return m.clone();
        }
        if let Some(m) = &ci.model {
            return m.clone();
        }
        let (Some(v), Some(d)) = (&ci.vendor_id, &ci.device_id) else {
            return String::new();
        };
        let key = format!(
            "{}:{}",
            v.trim_start_matches("0x"),
            d.trim_start_matches("0x")
        );
        let mut cache = self.pci_names.lock().unwrap_or_else(|p| p.into_inner());
        let name = cache.entry(key.clone()).or_insert_with(|| {
            std::fs::read_to_string(&self.pci_ids)
                .ok()
                .and_then(|db| topology::pci_ids_name(&db, v, d))
        });
        name.clone().unwrap_or(key)
    }
}
