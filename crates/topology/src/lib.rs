//! Block device topology from sysfs: block device -> whole disks -> controller.
//!
//! Two users share this crate. The engine's disk scheduler asks "which
//! controller does this file live on?" ([`placement_of_path`]) so it can give
//! every device its own reader/writer workers, and the exporter's `raid`
//! collector asks "which whole disks hang off which controller?"
//! ([`whole_disks`], [`controller_info`], [`md_arrays`]) so it can sum
//! `/proc/diskstats` per controller without counting a partition, an md array
//! or a device-mapper volume twice.
//!
//! Everything is read below a sysfs root passed by the caller (normally
//! [`DEFAULT_SYSFS`]), so tests run on fixture trees. The layout relied upon:
//!
//! * `/sys/dev/block/MAJ:MIN` and `/sys/class/block/NAME` are symlinks into
//!   `/sys/devices/...`; a partition is a subdirectory of its disk's
//!   directory and has a `partition` file.
//! * stacked devices (md, dm) list what they sit on in `slaves/`.
//! * the resolved path of a whole disk names its controller: the last PCI
//!   function before the disk (e.g. `.../0000:03:00.0/host0/target0:2:0/...`)
//!   for SCSI/SATA/virtio, the `nvme/nvmeN` directory for NVMe, and
//!   `/sys/devices/virtual/...` for loop, ram and zram.
//!
//! Controller ids are stable strings (DESIGN.md): a PCI address such as
//! `0000:03:00.0`, `nvme0`, or [`VIRTUAL_CONTROLLER`].

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where sysfs is mounted on a normal Linux host.
pub const DEFAULT_SYSFS: &str = "/sys";

/// Controller id of devices without a hardware controller (loop, ram, zram,
/// virtio without PCI).
pub const VIRTUAL_CONTROLLER: &str = "virtual";

/// Sector size of the counters in `/proc/diskstats` and `stat`: always 512
/// bytes, whatever the device's logical block size.
pub const DISKSTATS_SECTOR_BYTES: u64 = 512;

/// How deep md/dm stacks may nest before we call it a cycle. Real stacks are
/// two or three levels (dm-crypt on LVM on md); 16 leaves ample room.
const MAX_STACK_DEPTH: usize = 16;

/// Where the file system holding a file (or a block device) lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    /// Kernel name of the device the file system sits on, e.g. "sda1",
    /// "md0", "dm-0", "loop3", or "MAJ:MIN" (e.g. "0:45") when sysfs has no
    /// entry for it (overlayfs, tmpfs, btrfs subvolumes, ...).
    pub device: String,
    /// Whole disks underneath: a partition resolves to its disk, md and dm
    /// to their members, recursively. Sorted by name, no duplicates. Empty
    /// when the device is not a block device known to sysfs.
    pub whole_disks: Vec<Disk>,
}

/// A whole disk and the controller it hangs off.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Disk {
    /// Kernel name, e.g. "sda", "nvme0n1", "loop3".
    pub name: String,
    /// Controller id: PCI address ("0000:03:00.0"), NVMe controller
    /// ("nvme0"), or [`VIRTUAL_CONTROLLER`].
    pub controller: String,
}

/// What kind of block device a kernel name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockKind {
    /// A whole disk behind a controller (SCSI/SATA/SAS/NVMe/virtio/...).
    Disk,
    /// A partition of a whole disk.
    Partition,
    /// A Linux software RAID array (`mdN`).
    Md,
    /// A device-mapper volume (`dm-N`: LVM, dm-crypt, multipath, ...).
    Dm,
    /// A loop device.
    Loop,
    /// A RAM disk (`ramN`, `zramN`).
    Ram,
}

impl BlockKind {
    /// True for devices whose IO is also counted on the devices below them
    /// (partitions, md, dm): the ones a per-controller sum must skip.
    pub fn is_stacked_or_partition(self) -> bool {
        matches!(self, BlockKind::Partition | BlockKind::Md | BlockKind::Dm)
    }
}

/// Hardware facts about a controller, for `longhaul_controller_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerInfo {
    /// The controller id (see [`Disk::controller`]).
    pub id: String,
    /// PCI address of the controller's function, if it has one.
    pub pci_address: Option<String>,
    /// Kernel driver bound to it, e.g. "megaraid_sas", "arcmsr", "ahci", "nvme".
    pub driver: Option<String>,
    /// PCI vendor id, e.g. "0x1000".
    pub vendor_id: Option<String>,
    /// PCI device id, e.g. "0x005d".
    pub device_id: Option<String>,
    /// Model string the kernel knows (NVMe controllers report one); PCI
    /// functions have only ids, see [`pci_ids_name`].
    pub model: Option<String>,
}

/// An md software RAID array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdArray {
    /// Kernel name, e.g. "md0".
    pub name: String,
    /// RAID level as the kernel reports it ("raid0", "raid1", ...), or
    /// "unknown" when `md/level` is missing.
    pub level: String,
    /// Kernel names of the member devices (partitions or whole disks), sorted.
    pub members: Vec<String>,
}

/// What can go wrong reading the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A file or directory that should exist could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path given to [`placement_of_path`] could not be stat'ed.
    #[error("cannot stat {path}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No block device of that name in sysfs.
    #[error("no block device {name:?} under {sysfs}")]
    NoSuchDevice { name: String, sysfs: PathBuf },
    /// md/dm members nest deeper than any real stack: a cycle in sysfs.
    #[error(
        "block devices stacked deeper than {MAX_STACK_DEPTH} levels at {name:?} (cycle in sysfs?)"
    )]
    TooDeep { name: String },
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> TopologyError + '_ {
    move |source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Placement of the block device `major:minor` (as in `st_dev`).
///
/// A device number sysfs does not know (overlayfs, tmpfs, btrfs's anonymous
/// devices, ...) is not an error: it yields device "MAJ:MIN" and no disks.
pub fn placement_of_dev(sysfs: &Path, major: u32, minor: u32) -> Result<Placement, TopologyError> {
    let link = sysfs.join("dev/block").join(format!("{major}:{minor}"));
    let target = match fs::canonicalize(&link) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Placement {
                device: format!("{major}:{minor}"),
                whole_disks: Vec::new(),
            })
        }
        Err(e) => return Err(read_err(&link)(e)),
    };
    let name = file_name(&target);
    let whole_disks = whole_disks_of(sysfs, &name)?;
    Ok(Placement {
        device: name,
        whole_disks,
    })
}

/// Placement of the file system holding `path` (via `stat().st_dev`).
pub fn placement_of_path(sysfs: &Path, path: &Path) -> Result<Placement, TopologyError> {
    let meta = fs::metadata(path).map_err(|source| TopologyError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    let (major, minor) = split_dev(meta.dev());
    placement_of_dev(sysfs, major, minor)
}

/// Placement of a block device given by kernel name ("sda1", "md0").
pub fn placement_of_name(sysfs: &Path, name: &str) -> Result<Placement, TopologyError> {
    Ok(Placement {
        device: name.to_string(),
        whole_disks: whole_disks_of(sysfs, name)?,
    })
}

/// Splits a Linux `dev_t` (glibc encoding) into major and minor.
pub fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// The sysfs directory of a block device (disk or partition), resolved.
fn device_dir(sysfs: &Path, name: &str) -> Result<PathBuf, TopologyError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(TopologyError::NoSuchDevice {
            name: name.to_string(),
            sysfs: sysfs.to_path_buf(),
        });
    }
    for class in ["class/block", "block"] {
        let link = sysfs.join(class).join(name);
        match fs::canonicalize(&link) {
            Ok(dir) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(read_err(&link)(e)),
        }
    }
    Err(TopologyError::NoSuchDevice {
        name: name.to_string(),
        sysfs: sysfs.to_path_buf(),
    })
}

/// What kind of block device `name` is.
pub fn kind_of(sysfs: &Path, name: &str) -> Result<BlockKind, TopologyError> {
    let dir = device_dir(sysfs, name)?;
    Ok(kind_of_dir(name, &dir))
}

fn kind_of_dir(name: &str, dir: &Path) -> BlockKind {
    if dir.join("partition").exists() {
        BlockKind::Partition
    } else if dir.join("md").is_dir() || (name.starts_with("md") && has_slaves(dir)) {
        BlockKind::Md
    } else if dir.join("dm").is_dir() || name.starts_with("dm-") {
        BlockKind::Dm
    } else if name.starts_with("loop") {
        BlockKind::Loop
    } else if name.starts_with("ram") || name.starts_with("zram") {
        BlockKind::Ram
    } else {
        BlockKind::Disk
    }
}

fn has_slaves(dir: &Path) -> bool {
    fs::read_dir(dir.join("slaves"))
        .map(|mut it| it.next().is_some())
        .unwrap_or(false)
}

/// Names listed in `<dir>/slaves`, sorted; empty when there is none.
fn slaves(dir: &Path) -> Result<Vec<String>, TopologyError> {
    let path = dir.join("slaves");
    let entries = match fs::read_dir(&path) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(&path)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_err(&path))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Whole disks under a device name, recursively through partitions and
/// stacked devices; sorted and deduplicated.
pub fn whole_disks_of(sysfs: &Path, name: &str) -> Result<Vec<Disk>, TopologyError> {
    let root = canonical_root(sysfs)?;
    let mut out = BTreeSet::new();
    collect_whole_disks(sysfs, &root, name, 0, &mut out)?;
    Ok(out.into_iter().collect())
}

fn canonical_root(sysfs: &Path) -> Result<PathBuf, TopologyError> {
    fs::canonicalize(sysfs).map_err(read_err(sysfs))
}

fn collect_whole_disks(
    sysfs: &Path,
    root: &Path,
    name: &str,
    depth: usize,
    out: &mut BTreeSet<Disk>,
) -> Result<(), TopologyError> {
    if depth > MAX_STACK_DEPTH {
        return Err(TopologyError::TooDeep {
            name: name.to_string(),
        });
    }
    let dir = device_dir(sysfs, name)?;
    if dir.join("partition").exists() {
        let parent = dir.parent().map(file_name).unwrap_or_default();
        return collect_whole_disks(sysfs, root, &parent, depth + 1, out);
    }
    let members = slaves(&dir)?;
    if !members.is_empty() {
        for member in members {
            collect_whole_disks(sysfs, root, &member, depth + 1, out)?;
        }
        return Ok(());
    }
    if matches!(kind_of_dir(name, &dir), BlockKind::Md | BlockKind::Dm) {
        // An md/dm device with no members yet (inactive array, empty
        // table): nothing physical underneath.
        return Ok(());
    }
    out.insert(Disk {
        name: name.to_string(),
        controller: controller_of_dir(root, name, &dir),
    });
    Ok(())
}

/// Controller id of a whole disk given its resolved sysfs directory.
fn controller_of_dir(root: &Path, name: &str, dir: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    // NVMe: .../0000:04:00.0/nvme/nvme0/nvme0n1
    for pair in parts.windows(2) {
        if pair[0] == "nvme" && is_nvme_ctrl(&pair[1]) {
            return pair[1].clone();
        }
    }
    // Native NVMe multipath: /sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1.
    if parts.iter().any(|p| p == "nvme-subsystem") {
        if let Some(ctrl) = nvme_ctrl_from_name(name) {
            return ctrl;
        }
    }
    // SCSI/SATA/virtio/USB: the PCI function nearest the disk.
    if let Some(pci) = parts.iter().rev().find(|p| is_pci_address(p)) {
        return pci.clone();
    }
    VIRTUAL_CONTROLLER.to_string()
}

/// Controller id of a whole disk (or of any block device: partitions and
/// stacked devices are resolved first; several controllers are joined with
/// "+", which only happens for md/dm spanning controllers).
pub fn controller_of(sysfs: &Path, name: &str) -> Result<String, TopologyError> {
    let disks = whole_disks_of(sysfs, name)?;
    let ctrls: BTreeSet<&str> = disks.iter().map(|d| d.controller.as_str()).collect();
    if ctrls.is_empty() {
        return Ok(VIRTUAL_CONTROLLER.to_string());
    }
    Ok(ctrls.into_iter().collect::<Vec<_>>().join("+"))
}

fn is_nvme_ctrl(s: &str) -> bool {
    s.strip_prefix("nvme")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// "nvme0n1" -> "nvme0" (also for "nvme0c1n1" -> "nvme1": the path's controller).
fn nvme_ctrl_from_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("nvme")?;
    let (digits, tail) = split_digits(rest);
    if digits.is_empty() {
        return None;
    }
    if let Some(after_c) = tail.strip_prefix('c') {
        let (ctrl, _) = split_digits(after_c);
        if !ctrl.is_empty() {
            return Some(format!("nvme{ctrl}"));
        }
    }
    Some(format!("nvme{digits}"))
}

fn split_digits(s: &str) -> (&str, &str) {
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

/// True for "DDDD:BB:DD.F" (hex digits).
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A block device listed in `/sys/block`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    pub name: String,
    pub kind: BlockKind,
    /// Controller of a [`BlockKind::Disk`]; [`VIRTUAL_CONTROLLER`] for loop
    /// and ram; the joined controllers of the members for md/dm.
    pub controller: String,
}

/// Every entry of `/sys/block` (whole devices, no partitions), sorted by name.
pub fn block_devices(sysfs: &Path) -> Result<Vec<BlockDevice>, TopologyError> {
    let root = canonical_root(sysfs)?;
    let block = sysfs.join("block");
    let mut names = Vec::new();
    for entry in fs::read_dir(&block).map_err(read_err(&block))? {
        let entry = entry.map_err(read_err(&block))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        // A disk unplugged between readdir and resolve leaves a dangling
        // entry for a moment: skip it rather than fail the listing.
        let dir = match device_dir(sysfs, &name) {
            Ok(dir) => dir,
            Err(TopologyError::NoSuchDevice { .. }) => continue,
            Err(e) => return Err(e),
        };
        let kind = kind_of_dir(&name, &dir);
        let controller = match kind {
            BlockKind::Md | BlockKind::Dm | BlockKind::Partition => controller_of(sysfs, &name)?,
            _ => controller_of_dir(&root, &name, &dir),
        };
        out.push(BlockDevice {
            name,
            kind,
            controller,
        });
    }
    Ok(out)
}

/// The physical whole disks (kind [`BlockKind::Disk`]) with their
/// controllers, sorted by name: the devices a per-controller IO sum adds up.
/// Partitions, md and dm are left out because their IO is already counted on
/// these disks; loop and ram are left out because their IO is not disk IO of
/// any controller (a loop file's IO reaches the disk holding the file).
pub fn whole_disks(sysfs: &Path) -> Result<Vec<Disk>, TopologyError> {
    Ok(block_devices(sysfs)?
        .into_iter()
        .filter(|d| d.kind == BlockKind::Disk)
        .map(|d| Disk {
            name: d.name,
            controller: d.controller,
        })
        .collect())
}

/// The md arrays in `/sys/block`, sorted by name.
pub fn md_arrays(sysfs: &Path) -> Result<Vec<MdArray>, TopologyError> {
    let mut out = Vec::new();
    for dev in block_devices(sysfs)? {
        if dev.kind != BlockKind::Md {
            continue;
        }
        let dir = device_dir(sysfs, &dev.name)?;
        let level = read_trimmed(&dir.join("md/level"))?.unwrap_or_else(|| "unknown".to_string());
        let level = if level.is_empty() {
            "unknown".to_string()
        } else {
            level
        };
        out.push(MdArray {
            members: slaves(&dir)?,
            name: dev.name,
            level,
        });
    }
    Ok(out)
}

/// Reads a sysfs attribute, trimmed; `None` when it does not exist.
fn read_trimmed(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_err(path)(e)),
    }
}

fn link_name(path: &Path) -> Option<String> {
    fs::read_link(path).ok().map(|t| file_name(&t))
}

/// Hardware facts about the controller `id` (a PCI address or "nvmeN").
/// Missing attributes are `None`; an unknown id yields an info with only
/// the id set.
pub fn controller_info(sysfs: &Path, id: &str) -> Result<ControllerInfo, TopologyError> {
    let mut info = ControllerInfo {
        id: id.to_string(),
        ..Default::default()
    };
    let pci_dir = if is_nvme_ctrl(id) {
        let ctrl_dir = sysfs.join("class/nvme").join(id);
        info.model = read_trimmed(&ctrl_dir.join("model"))?;
        let dev = ctrl_dir.join("device");
        match fs::canonicalize(&dev) {
            Ok(d) if is_pci_address(&file_name(&d)) => Some(d),
            _ => None,
        }
    } else if is_pci_address(id) {
        Some(sysfs.join("bus/pci/devices").join(id))
    } else {
        None
    };
    if let Some(dir) = pci_dir.filter(|d| d.exists()) {
        info.pci_address = Some(file_name(&fs::canonicalize(&dir).map_err(read_err(&dir))?));
        info.driver = link_name(&dir.join("driver"));
        info.vendor_id = read_trimmed(&dir.join("vendor"))?;
        info.device_id = read_trimmed(&dir.join("device"))?;
    } else if is_pci_address(id) {
        info.pci_address = Some(id.to_string());
    }
    Ok(info)
}

/// Looks up "vendor device" names in a pci.ids database text (as shipped in
/// /usr/share/misc/pci.ids). Ids are hex with or without "0x". Returns e.g.
/// "Broadcom / LSI MegaRAID SAS-3 3108 [Invader]".
pub fn pci_ids_name(pci_ids: &str, vendor_id: &str, device_id: &str) -> Option<String> {
    let vendor = vendor_id.trim_start_matches("0x").to_ascii_lowercase();
    let device = device_id.trim_start_matches("0x").to_ascii_lowercase();
    let mut vendor_name: Option<&str> = None;
    for line in pci_ids.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(vname) = vendor_name {
            if line.starts_with("\t\t") {
                continue;
            }
            if let Some(rest) = line.strip_prefix('\t') {
                if let Some((id, name)) = rest.split_once("  ") {
                    if id.eq_ignore_ascii_case(&device) {
                        return Some(format!("{vname} {}", name.trim()));
                    }
                }
                continue;
            }
            // Next vendor: the device was not listed.
            return Some(vname.to_string());
        }
        if !line.starts_with('\t') {
            if let Some((id, name)) = line.split_once("  ") {
                if id.eq_ignore_ascii_case(&vendor) {
                    vendor_name = Some(name.trim());
                }
            }
        }
    }
    vendor_name.map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_address_shape() {
        assert!(is_pci_address("0000:03:00.0"));
        assert!(is_pci_address("0000:af:1f.7"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("0000:03:00"));
        assert!(!is_pci_address("host0"));
    }

    #[test]
    fn dev_t_split_matches_glibc() {
        // glibc's makedev, to build test values.
        fn makedev(major: u64, minor: u64) -> u64 {
            ((major & 0xfff) << 8)
                | ((major & !0xfff) << 32)
                | (minor & 0xff)
                | ((minor & !0xff) << 12)
        }
        assert_eq!(split_dev(makedev(8, 17)), (8, 17));
        assert_eq!(split_dev(makedev(259, 65536)), (259, 65536));
        assert_eq!(split_dev(makedev(4096, 1 << 19)), (4096, 1 << 19));
    }

    #[test]
    fn nvme_names() {
        assert_eq!(nvme_ctrl_from_name("nvme0n1").as_deref(), Some("nvme0"));
        assert_eq!(nvme_ctrl_from_name("nvme2c5n1").as_deref(), Some("nvme5"));
        assert_eq!(nvme_ctrl_from_name("nvmex"), None);
        assert!(is_nvme_ctrl("nvme12"));
        assert!(!is_nvme_ctrl("nvme0n1"));
    }

    #[test]
    fn pci_ids_lookup() {
        let db = "# comment\n1000  Broadcom / LSI\n\t005d  MegaRAID SAS-3 3108 [Invader]\n\t\t1028 1f49  PERC H730\n17d3  Areca Technology Corp.\n\t1880  ARC-188x series of PCIe 2.0/3.0 to SAS/SATA 6/12Gb RAID Controllers\n";
        assert_eq!(
            pci_ids_name(db, "0x1000", "0x005d").as_deref(),
            Some("Broadcom / LSI MegaRAID SAS-3 3108 [Invader]")
        );
        assert_eq!(
            pci_ids_name(db, "0x1000", "0x0001").as_deref(),
            Some("Broadcom / LSI")
        );
        assert_eq!(pci_ids_name(db, "0xffff", "0x0001"), None);
        assert!(pci_ids_name(db, "17d3", "1880")
            .unwrap()
            .starts_with("Areca"));
    }
}
