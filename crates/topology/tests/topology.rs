//! Topology on the fixture disk server (the workspace's tests/fixtures/sysfs-server,
//! written by tests/fixtures/mkfixture.py) and on broken trees.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use longhaul_topology::*;

const MEGARAID: &str = "0000:03:00.0";
const ARCMSR: &str = "0000:81:00.0";
const AHCI: &str = "0000:00:1f.2";

fn sysfs() -> PathBuf {
    longhaul_testkit::package_dir().join("../../tests/fixtures/sysfs-server/sys")
}

fn disk(name: &str, controller: &str) -> Disk {
    Disk {
        name: name.into(),
        controller: controller.into(),
    }
}

fn placement(major: u32, minor: u32) -> Placement {
    placement_of_dev(&sysfs(), major, minor).unwrap()
}

#[test]
fn partition_resolves_to_its_disk_and_controller() {
    assert_eq!(
        placement(8, 1),
        Placement {
            device: "sda1".into(),
            whole_disks: vec![disk("sda", AHCI)]
        }
    );
    assert_eq!(
        placement(259, 2).whole_disks,
        vec![disk("nvme0n1", "nvme0")]
    );
}

#[test]
fn raid_volumes_resolve_to_the_pci_function_nearest_the_scsi_host() {
    assert_eq!(placement(8, 32).whole_disks, vec![disk("sdc", MEGARAID)]);
    assert_eq!(placement(8, 48).whole_disks, vec![disk("sdd", ARCMSR)]);
}

#[test]
fn md_and_dm_resolve_to_their_members_recursively() {
    let md = placement(9, 0);
    assert_eq!(md.device, "md0");
    assert_eq!(md.whole_disks, vec![disk("sda", AHCI), disk("sdb", AHCI)]);
    // dm-1 is LVM on md0.
    assert_eq!(placement(253, 1).whole_disks, md.whole_disks);
    // dm-0 is LVM on the first megaraid volume; dm-2 dm-crypt on nvme0n1p2.
    assert_eq!(placement(253, 0).whole_disks, vec![disk("sdc", MEGARAID)]);
    assert_eq!(
        placement(253, 2).whole_disks,
        vec![disk("nvme0n1", "nvme0")]
    );
}

#[test]
fn loop_is_virtual_and_unknown_devices_are_named_by_number() {
    assert_eq!(
        placement(7, 0),
        Placement {
            device: "loop0".into(),
            whole_disks: vec![disk("loop0", VIRTUAL_CONTROLLER)]
        }
    );
    assert_eq!(
        placement(0, 45),
        Placement {
            device: "0:45".into(),
            whole_disks: vec![]
        }
    );
}

#[test]
fn every_whole_disk_is_under_exactly_one_controller() {
    let disks = whole_disks(&sysfs()).unwrap();
    let mut by_ctrl: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for d in &disks {
        by_ctrl.entry(&d.controller).or_default().push(&d.name);
    }
    let expected: BTreeMap<&str, Vec<&str>> = [
        (AHCI, vec!["sda", "sdb"]),
        (MEGARAID, vec!["sdc", "sde", "sdg"]),
        (ARCMSR, vec!["sdd", "sdf", "sdh"]),
        ("nvme0", vec!["nvme0n1"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_ctrl, expected);
    let mut names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    names.dedup();
    assert_eq!(names.len(), disks.len(), "a disk listed twice");
}

#[test]
fn kinds() {
    let s = sysfs();
    assert_eq!(kind_of(&s, "sda").unwrap(), BlockKind::Disk);
    assert_eq!(kind_of(&s, "sda1").unwrap(), BlockKind::Partition);
    assert_eq!(kind_of(&s, "md0").unwrap(), BlockKind::Md);
    assert_eq!(kind_of(&s, "dm-1").unwrap(), BlockKind::Dm);
    assert_eq!(kind_of(&s, "loop1").unwrap(), BlockKind::Loop);
    assert!(matches!(
        kind_of(&s, "sdz"),
        Err(TopologyError::NoSuchDevice { .. })
    ));
    assert!(kind_of(&s, "../block").is_err());
    let devs = block_devices(&s).unwrap();
    assert_eq!(devs.len(), 15);
    let md0 = devs.iter().find(|d| d.name == "md0").unwrap();
    assert_eq!(md0.controller, AHCI);
}

#[test]
fn md_arrays_with_level_and_members() {
    assert_eq!(
        md_arrays(&sysfs()).unwrap(),
        vec![MdArray {
            name: "md0".into(),
            level: "raid0".into(),
            members: vec!["sda2".into(), "sdb2".into()],
        }]
    );
}

#[test]
fn controller_info_from_pci_and_nvme() {
    let s = sysfs();
    let mr = controller_info(&s, MEGARAID).unwrap();
    assert_eq!(mr.pci_address.as_deref(), Some(MEGARAID));
    assert_eq!(mr.driver.as_deref(), Some("megaraid_sas"));
    assert_eq!(mr.vendor_id.as_deref(), Some("0x1000"));
    assert_eq!(mr.device_id.as_deref(), Some("0x005d"));
    let arc = controller_info(&s, ARCMSR).unwrap();
    assert_eq!(arc.driver.as_deref(), Some("arcmsr"));
    let nvme = controller_info(&s, "nvme0").unwrap();
    assert_eq!(nvme.pci_address.as_deref(), Some("0000:04:00.0"));
    assert_eq!(nvme.driver.as_deref(), Some("nvme"));
    assert_eq!(nvme.model.as_deref(), Some("SAMSUNG MZQL23T8HCLS-00A07"));
    let virt = controller_info(&s, VIRTUAL_CONTROLLER).unwrap();
    assert_eq!(virt.pci_address, None);
    assert_eq!(virt.driver, None);
}

#[test]
fn placement_of_a_real_path_works_on_this_host() {
    // Whatever this machine's root is (overlayfs in a container, ext4 on a
    // VM disk), the call succeeds and names a device.
    let p = placement_of_path(Path::new(DEFAULT_SYSFS), Path::new("/")).unwrap();
    assert!(!p.device.is_empty());
    let err = placement_of_path(&sysfs(), Path::new("/nonexistent/longhaul")).unwrap_err();
    assert!(matches!(err, TopologyError::Stat { .. }), "{err}");
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "longhaul-topology-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn missing_sysfs_is_an_error_not_a_panic() {
    let err = whole_disks(Path::new("/nonexistent/sys")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/sys"), "{err}");
    // An unknown device number is not an error even without sysfs.
    let p = placement_of_dev(Path::new("/nonexistent/sys"), 8, 0).unwrap();
    assert_eq!(p.device, "8:0");
}

#[test]
fn a_cycle_between_stacked_devices_is_reported() {
    let tmp = TempDir::new("cycle");
    let sys = &tmp.0;
    for (name, other) in [("md0", "md1"), ("md1", "md0")] {
        let dir = sys.join("devices/virtual/block").join(name);
        fs::create_dir_all(dir.join("slaves")).unwrap();
        fs::create_dir_all(dir.join("md")).unwrap();
        symlink(format!("../../{other}"), dir.join("slaves").join(other)).unwrap();
        fs::create_dir_all(sys.join("block")).unwrap();
        symlink(
            format!("../devices/virtual/block/{name}"),
            sys.join("block").join(name),
        )
        .unwrap();
    }
    let err = whole_disks_of(sys, "md0").unwrap_err();
    assert!(matches!(err, TopologyError::TooDeep { .. }), "{err}");
}

#[test]
fn a_disk_without_pci_parent_is_virtual() {
    // virtio-mmio disk: /sys/devices/platform/a003e00.virtio_mmio/virtio0/block/vda
    let tmp = TempDir::new("mmio");
    let sys = &tmp.0;
    let dir = sys.join("devices/platform/a003e00.virtio_mmio/virtio0/block/vda");
    fs::create_dir_all(&dir).unwrap();
    fs::create_dir_all(sys.join("block")).unwrap();
    symlink(
        "../devices/platform/a003e00.virtio_mmio/virtio0/block/vda",
        sys.join("block/vda"),
    )
    .unwrap();
    assert_eq!(
        whole_disks(sys).unwrap(),
        vec![disk("vda", VIRTUAL_CONTROLLER)]
    );
}

#[test]
fn nvme_native_multipath_heads_map_to_their_controller() {
    // Kernels with nvme_core.multipath=Y put the namespace head under
    // /sys/devices/virtual/nvme-subsystem/nvme-subsysN/.
    let tmp = TempDir::new("nvme-mp");
    let sys = &tmp.0;
    let dir = sys.join("devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1");
    fs::create_dir_all(dir.join("nvme1n1p1")).unwrap();
    fs::write(dir.join("nvme1n1p1/partition"), "1\n").unwrap();
    fs::create_dir_all(sys.join("block")).unwrap();
    fs::create_dir_all(sys.join("class/block")).unwrap();
    fs::create_dir_all(sys.join("dev/block")).unwrap();
    symlink(
        "../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1",
        sys.join("block/nvme1n1"),
    )
    .unwrap();
    symlink(
        "../../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/nvme1n1p1",
        sys.join("class/block/nvme1n1p1"),
    )
    .unwrap();
    symlink(
        "../../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/nvme1n1p1",
        sys.join("dev/block/259:5"),
    )
    .unwrap();
    assert_eq!(whole_disks(sys).unwrap(), vec![disk("nvme1n1", "nvme1")]);
    assert_eq!(
        placement_of_dev(sys, 259, 5).unwrap(),
        Placement {
            device: "nvme1n1p1".into(),
            whole_disks: vec![disk("nvme1n1", "nvme1")]
        }
    );
    assert_eq!(controller_of(sys, "nvme1n1p1").unwrap(), "nvme1");
}
