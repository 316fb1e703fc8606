//! Device groups: which block device (and controller) a file lives on, and
//! the IO counters kept per group.
//!
//! The scheduling unit is the device the file system sits on
//! ([`longhaul_topology::Placement::device`]: "sda1", "md0", "dm-0", ...), so
//! two RAID controllers, or four plain disks, each get their own workers.
//! Its controller is the controller of its whole disks; an md array spanning
//! two controllers reports both, joined with '+'. When the topology lookup
//! fails the group is the raw "MAJ:MIN" with controller "virtual", so a
//! missing sysfs never stops a transfer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use longhaul_stats_api::DeviceIo;
use longhaul_topology::{placement_of_dev, split_dev, Placement, VIRTUAL_CONTROLLER};

use crate::datapath::DeviceCounters;

/// One device group and its live counters.
#[derive(Debug)]
pub(crate) struct DeviceGroup {
    pub(crate) device: String,
    pub(crate) controller: String,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) written_bytes: AtomicU64,
}

impl DeviceGroup {
    pub(crate) fn new(device: String, controller: String) -> Self {
        DeviceGroup {
            device,
            controller,
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        }
    }

    pub(crate) fn add_read(&self, n: u64) {
        self.read_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.written_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DeviceIo {
        DeviceIo {
            device: self.device.clone(),
            controller: self.controller.clone(),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
        }
    }
}

impl DeviceCounters for DeviceGroup {
    fn snapshot(&self) -> DeviceIo {
        DeviceGroup::snapshot(self)
    }
}

/// The controller id of a placement.
pub(crate) fn controller_of(p: &Placement) -> String {
    let mut ids: Vec<&str> = p
        .whole_disks
        .iter()
        .map(|d| d.controller.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        VIRTUAL_CONTROLLER.to_string()
    } else {
        ids.join("+")
    }
}

/// Maps st_dev values to device groups, looking each up once.
#[derive(Debug)]
pub(crate) struct DeviceMap {
    sysfs: PathBuf,
    groups: Vec<Arc<DeviceGroup>>,
    by_dev: HashMap<u64, usize>,
    by_name: HashMap<String, usize>,
}

impl DeviceMap {
    pub(crate) fn new(sysfs: &Path) -> Self {
        DeviceMap {
            sysfs: sysfs.to_path_buf(),
            groups: Vec::new(),
            by_dev: HashMap::new(),
            by_name: HashMap::new(),
        }
    }

    /// Index of the group that `st_dev` belongs to.
    pub(crate) fn group_of(&mut self, dev: u64) -> usize {
        if let Some(&i) = self.by_dev.get(&dev) {
            return i;
        }
        let (major, minor) = split_dev(dev);
        let (device, controller) = match placement_of_dev(&self.sysfs, major, minor) {
            Ok(p) => {
                let c = controller_of(&p);
                (p.device, c)
            }
            Err(_) => (format!("{major}:{minor}"), VIRTUAL_CONTROLLER.to_string()),
        };
        let i = match self.by_name.get(&device) {
            Some(&i) => i,
            None => {
                self.groups
                    .push(Arc::new(DeviceGroup::new(device.clone(), controller)));
                self.by_name.insert(device, self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        self.by_dev.insert(dev, i);
        i
    }

    pub(crate) fn groups(&self) -> &[Arc<DeviceGroup>] {
        &self.groups
    }

    pub(crate) fn group(&self, i: usize) -> &Arc<DeviceGroup> {
        &self.groups[i]
    }
}

/// Counters of every group, for the stats API and the final JSON.
pub(crate) fn snapshot(groups: &[Arc<DeviceGroup>]) -> Vec<DeviceIo> {
    groups.iter().map(|g| g.snapshot()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_topology::Disk;

    #[test]
    fn controller_names_join_and_default_to_virtual() {
        let disk = |n: &str, c: &str| Disk {
            name: n.into(),
            controller: c.into(),
        };
        let p = Placement {
            device: "md0".into(),
            whole_disks: vec![
                disk("sda", "0000:03:00.0"),
                disk("sdb", "0000:04:00.0"),
                disk("sdc", "0000:03:00.0"),
            ],
        };
        assert_eq!(controller_of(&p), "0000:03:00.0+0000:04:00.0");
        let p = Placement {
            device: "0:45".into(),
            whole_disks: vec![],
        };
        assert_eq!(controller_of(&p), "virtual");
    }

    #[test]
    fn two_raid_controllers_of_the_fixture_server_are_two_groups() {
        let sysfs = longhaul_testkit::package_dir().join("../tests/fixtures/sysfs-server/sys");
        let mut m = DeviceMap::new(&sysfs);
        let sdc = m.group_of(libc::makedev(8, 32));
        let sdd = m.group_of(libc::makedev(8, 48));
        let sde = m.group_of(libc::makedev(8, 64));
        let sda1 = m.group_of(libc::makedev(8, 1));
        assert_ne!(sdc, sdd);
        assert_ne!(sdc, sde, "every device is its own group");
        assert_eq!(m.group(sdc).controller, "0000:03:00.0");
        assert_eq!(m.group(sde).controller, "0000:03:00.0");
        assert_eq!(m.group(sdd).controller, "0000:81:00.0");
        assert_eq!(
            (
                m.group(sda1).device.as_str(),
                m.group(sda1).controller.as_str()
            ),
            ("sda1", "0000:00:1f.2")
        );
        assert_eq!(m.groups().len(), 4);
    }

    #[test]
    fn unknown_devices_fall_back_to_maj_min() {
        let mut m = DeviceMap::new(Path::new("/nonexistent-sysfs"));
        let a = m.group_of(libc::makedev(8, 1));
        let b = m.group_of(libc::makedev(8, 1));
        assert_eq!(a, b);
        assert_eq!(m.group(a).device, "8:1");
        assert_eq!(m.group(a).controller, "virtual");
        m.group(a).add_read(5);
        assert_eq!(snapshot(m.groups())[0].read_bytes, 5);
    }
}
