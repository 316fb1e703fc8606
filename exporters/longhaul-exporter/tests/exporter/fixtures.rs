//! The fixture disk server: golden scrape, controller sums, promtool.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::common::*;

/// Scrape of the fixture server plus the fixture engine snapshot, tcp off
/// (the host's sockets are not a fixture).
fn fixture_scrape() -> String {
    let body = fs::read_to_string(exporter_fixtures().join("sessions.json")).unwrap();
    let engine = FakeEngine::start(Behaviour::Body(body));
    exporter_of(&engine).scrape()
}

/// An exporter of the fixture server reading `engine`, tcp off.
fn exporter_of(engine: &FakeEngine) -> Exporter {
    let mut args = fixture_args();
    args.push(engine.url());
    args.push("--no-collector.tcp".into());
    args.push("--collector.engine.max-streams=4".into());
    Exporter::start(&args)
}

/// Durations change every scrape; everything else is deterministic.
fn without_durations(scrape: &str) -> String {
    scrape
        .lines()
        .filter(|l| !l.starts_with("longhaul_exporter_collector_duration_seconds{"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn golden_scrape() {
    let got = without_durations(&fixture_scrape());
    let golden_path = exporter_fixtures().join("golden.prom");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::write(&golden_path, &got).unwrap();
    }
    let want = fs::read_to_string(&golden_path)
        .expect("tests/fixtures/golden.prom (regenerate with UPDATE_GOLDEN=1)");
    if got != want {
        let diff: Vec<String> = want
            .lines()
            .zip(got.lines())
            .filter(|(w, g)| w != g)
            .take(5)
            .map(|(w, g)| format!("-{w}\n+{g}"))
            .collect();
        panic!(
            "scrape differs from golden.prom ({} vs {} lines; UPDATE_GOLDEN=1 to accept):\n{}",
            want.lines().count(),
            got.lines().count(),
            diff.join("\n")
        );
    }
}

/// The fixture engine's answer as the rows view (what the exporter asks a
/// current engine for).
fn fixture_rows() -> String {
    let body = fs::read_to_string(exporter_fixtures().join("sessions.json")).unwrap();
    let snap: longhaul_stats_api::Snapshot = serde_json::from_str(&body).unwrap();
    serde_json::to_string(&snap.rows_view()).unwrap()
}

fn scrape_of(engine: &FakeEngine) -> (Exporter, String) {
    let exp = exporter_of(engine);
    let scrape = without_durations(&exp.scrape());
    (exp, scrape)
}

#[test]
fn the_rows_view_scrapes_as_the_whole_snapshot_does() {
    let rows = fixture_rows();
    assert!(rows.contains("\"stream_rows\":[["), "{rows}");
    let engine = FakeEngine::start(Behaviour::Body(rows));
    let (_exp, scrape) = scrape_of(&engine);
    assert_eq!(scrape, without_durations(&fixture_scrape()));
}

#[test]
fn an_engine_without_the_rows_view_is_asked_for_the_series_view_once_refused() {
    let body = fs::read_to_string(exporter_fixtures().join("sessions.json")).unwrap();
    let engine = FakeEngine::start(Behaviour::WithoutRows(body));
    let (exp, scrape) = scrape_of(&engine);
    assert_eq!(scrape, without_durations(&fixture_scrape()));
    let asked = engine.requests();
    // The rows view refused, then the series view: the first scrape's two
    // requests, and the exporter said so once.
    assert_eq!(asked, 2, "{asked} requests");
    assert_eq!(
        exp.log_lines("asking this engine for the series view instead"),
        1
    );
    // Later scrapes of the same engine ask for the series view alone.
    for _ in 0..3 {
        assert_eq!(without_durations(&exp.scrape()), scrape);
    }
    assert_eq!(
        engine.requests(),
        asked + 3,
        "a refused rows view was asked again"
    );
}

#[test]
fn a_refused_rows_view_is_remembered_even_when_the_series_request_fails() {
    let body = fs::read_to_string(exporter_fixtures().join("sessions.json")).unwrap();
    let engine = FakeEngine::start(Behaviour::WithoutRowsBusyOnce(body));
    let exp = exporter_of(&engine);
    // First scrape: the rows view refused, the series view answered 503.
    let first = exp.scrape();
    assert!(first.contains("longhaul_exporter_collector_success{collector=\"engine\"} 0"));
    assert_eq!(engine.requests(), 2);
    // Later scrapes ask for the series view alone, and the refusal was
    // said once.
    for _ in 0..3 {
        assert!(exp
            .scrape()
            .contains("longhaul_exporter_collector_success{collector=\"engine\"} 1"));
    }
    assert_eq!(engine.requests(), 5, "a refused rows view was asked again");
    assert_eq!(
        exp.log_lines("asking this engine for the series view instead"),
        1
    );
}

#[test]
fn promtool_accepts_the_fixture_scrape() {
    promtool_check(&fixture_scrape());
}

/// Every whole disk of the fixture is under exactly one controller, and each
/// controller's counters equal the sum over its disks' diskstats lines.
#[test]
fn controllers_sum_their_whole_disks_exactly_once() {
    let s = samples(&fixture_scrape());
    let mut disk_ctrl: BTreeMap<String, String> = BTreeMap::new();
    for key in s
        .keys()
        .filter(|k| k.starts_with("longhaul_disk_controller_info{"))
    {
        let dev = label(key, "device").unwrap();
        let ctrl = label(key, "controller").unwrap();
        assert!(
            disk_ctrl.insert(dev.clone(), ctrl).is_none(),
            "{dev} listed under two controllers"
        );
    }
    // The fixture's whole physical disks: /sys/block minus md, dm, loop.
    let whole: BTreeSet<String> = fs::read_dir(server_fixture().join("sys/block"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("md") && !n.starts_with("dm-") && !n.starts_with("loop"))
        .collect();
    assert_eq!(disk_ctrl.keys().cloned().collect::<BTreeSet<_>>(), whole);

    let diskstats = fs::read_to_string(server_fixture().join("proc/diskstats")).unwrap();
    let mut per_disk: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in diskstats.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        per_disk.insert(
            f[2].to_string(),
            f[3..].iter().map(|v| v.parse().unwrap()).collect(),
        );
    }
    let ctrls: BTreeSet<&String> = disk_ctrl.values().collect();
    assert_eq!(
        ctrls.len(),
        4,
        "ahci, megaraid_sas, arcmsr, nvme: {ctrls:?}"
    );
    for ctrl in ctrls {
        let disks: Vec<&String> = disk_ctrl
            .iter()
            .filter(|(_, c)| *c == ctrl)
            .map(|(d, _)| d)
            .collect();
        let sum = |field: usize| -> f64 { disks.iter().map(|d| per_disk[*d][field] as f64).sum() };
        let metric = |name: &str| s[&format!("{name}{{controller=\"{ctrl}\"}}")];
        assert_eq!(metric("longhaul_controller_reads_completed_total"), sum(0));
        assert_eq!(
            metric("longhaul_controller_read_bytes_total"),
            sum(2) * 512.0
        );
        assert_eq!(metric("longhaul_controller_writes_completed_total"), sum(4));
        assert_eq!(
            metric("longhaul_controller_written_bytes_total"),
            sum(6) * 512.0
        );
        let io = metric("longhaul_controller_io_time_seconds_total");
        assert!((io - sum(9) / 1000.0).abs() < 1e-9, "{ctrl}: {io}");
        assert_eq!(metric("longhaul_controller_disks"), disks.len() as f64);
    }
}

#[test]
fn stream_cap_folds_the_rest_into_other() {
    let s = samples(&fixture_scrape());
    let a1: Vec<(&String, &f64)> = s
        .iter()
        .filter(|(k, _)| k.starts_with("longhaul_stream_bytes_total{session=\"a1b2c3\""))
        .collect();
    let streams: BTreeSet<String> = a1
        .iter()
        .map(|(k, _)| label(k, "stream").unwrap())
        .collect();
    assert_eq!(
        streams,
        ["0", "1", "2", "3", "other"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    let total: f64 = a1.iter().map(|(_, v)| **v).sum();
    assert_eq!(total, 6e9, "the cap never loses bytes");
    assert_eq!(
        s["longhaul_stream_bytes_total{session=\"a1b2c3\",stream=\"other\",direction=\"send\"}"],
        2e9
    );
}

#[test]
fn openmetrics_when_asked() {
    let exp = Exporter::start(&fixture_args());
    let r = get(
        exp.addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(r.status, 200);
    assert!(
        r.head
            .contains("application/openmetrics-text; version=1.0.0"),
        "{}",
        r.head
    );
    assert!(r.body.ends_with("# EOF\n"));
    assert!(r
        .body
        .contains("# TYPE longhaul_controller_read_bytes counter\n"));
    let plain = exp.get("/metrics");
    assert!(plain.head.contains("text/plain; version=0.0.4"));
    assert!(!plain.body.contains("# EOF"));
}

/// Copies the fixture server (symlinks kept) into a scratch directory.
fn scratch_server(tag: &str) -> TempDir {
    let tmp = TempDir::new(tag);
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(server_fixture())
        .arg(tmp.0.join("server"))
        .status()
        .unwrap();
    assert!(st.success());
    tmp
}

#[test]
fn a_disk_removed_from_sysfs_disappears_on_the_next_scrape() {
    let tmp = scratch_server("hotplug");
    let root = tmp.0.join("server");
    let exp = Exporter::start(&[
        format!("--path.sysfs={}", root.join("sys").display()),
        format!("--path.procfs={}", root.join("proc").display()),
        "--no-collector.engine".into(),
    ]);
    let arcmsr = "longhaul_controller_disks{controller=\"0000:81:00.0\"}";
    assert_eq!(samples(&exp.scrape())[arcmsr], 3.0);
    fs::remove_file(root.join("sys/block/sdh")).unwrap();
    let s = samples(&exp.scrape());
    assert_eq!(s[arcmsr], 2.0);
    assert!(!s.keys().any(|k| k.contains("\"sdh\"")));
}

/// A disk unplugged, back in the layout with its old counters, then
/// plugged back with its counters restarted: the controller's counters
/// never go down (before, they fell by the disk's lifetime, and rate() read
/// that as a reset), never count a disk's lifetime twice, and the disk's
/// new IO is added to them.
#[test]
fn a_controllers_counters_survive_a_disk_leaving_and_coming_back() {
    let tmp = scratch_server("replug");
    let root = tmp.0.join("server");
    let exp = Exporter::start(&[
        format!("--path.sysfs={}", root.join("sys").display()),
        format!("--path.procfs={}", root.join("proc").display()),
        "--no-collector.engine".into(),
    ]);
    let read = "longhaul_controller_read_bytes_total{controller=\"0000:81:00.0\"}";
    let disks = "longhaul_controller_disks{controller=\"0000:81:00.0\"}";
    let diskstats = root.join("proc/diskstats");
    let original = fs::read_to_string(&diskstats).unwrap();
    let with_sdh = |line: Option<&str>| -> String {
        original
            .lines()
            .filter_map(|l| match l.split_whitespace().nth(2) {
                Some("sdh") => line.map(str::to_string),
                _ => Some(l.to_string()),
            })
            .map(|l| l + "\n")
            .collect()
    };
    let before = samples(&exp.scrape())[read];
    // Unplugged: gone from sysfs and from diskstats.
    let link = root.join("sys/block/sdh");
    let target = fs::read_link(&link).unwrap();
    fs::remove_file(&link).unwrap();
    fs::write(&diskstats, with_sdh(None)).unwrap();
    let s = samples(&exp.scrape());
    assert_eq!(s[disks], 2.0);
    assert_eq!(s[read], before, "the counter went down when sdh left");
    // Back in the layout with its counters where they were (a blip in
    // sysfs): nothing new to add.
    std::os::unix::fs::symlink(&target, &link).unwrap();
    fs::write(&diskstats, &original).unwrap();
    let s = samples(&exp.scrape());
    assert_eq!(s[disks], 3.0);
    assert_eq!(s[read], before, "sdh's lifetime was added again");
    // Plugged back for real: its counters start again from zero...
    let zero = "   8     112 sdh 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0";
    fs::write(&diskstats, with_sdh(Some(zero))).unwrap();
    let s = samples(&exp.scrape());
    assert_eq!(s[disks], 3.0);
    assert_eq!(s[read], before);
    // ...and what it reads now is added: 100 sectors of 512 bytes.
    let read_100 = "   8     112 sdh 10 0 100 5 0 0 0 0 0 5 5 0 0 0 0 0 0";
    fs::write(&diskstats, with_sdh(Some(read_100))).unwrap();
    assert_eq!(samples(&exp.scrape())[read], before + 51200.0);
}

#[test]
fn storcli_models_enrich_controller_info_without_blocking() {
    let tmp = TempDir::new("storcli");
    let script = tmp.0.join("storcli64");
    fs::write(
        &script,
        "#!/bin/sh\ncat <<'JSON'\n{\"Controllers\":[{\"Command Status\":{\"Controller\":0,\"Status\":\"Success\"},\
         \"Response Data\":{\"Product Name\":\"AVAGO MegaRAID SAS 9361-8i\",\"PCI Address\":\"00:03:00:00\"}}]}\nJSON\n",
    )
    .unwrap();
    let hang = tmp.0.join("hang");
    fs::write(&hang, "#!/bin/sh\nexec sleep 30\n").unwrap();
    for p in [&script, &hang] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut args = fixture_args();
    args.push("--no-collector.engine".into());
    args.push(format!(
        "--collector.raid.storcli-command={} /call show J",
        script.display()
    ));
    let exp = Exporter::start(&args);
    let model = wait_for(std::time::Duration::from_secs(10), || {
        let s = exp.scrape();
        s.lines()
            .find(|l| l.starts_with("longhaul_controller_info{controller=\"0000:03:00.0\""))
            .filter(|l| l.contains("9361-8i"))
            .map(str::to_string)
    });
    assert!(model.is_some(), "storcli model never showed up");

    let mut args = fixture_args();
    args.push("--no-collector.engine".into());
    args.push(format!(
        "--collector.raid.storcli-command={}",
        hang.display()
    ));
    args.push("--collector.raid.storcli-timeout=2s".into());
    let exp = Exporter::start(&args);
    let start = std::time::Instant::now();
    let s = exp.scrape();
    // The command runs for 2 s before it is killed; the scrape never waits.
    assert!(start.elapsed() < std::time::Duration::from_millis(1500));
    assert!(s.contains("longhaul_exporter_collector_success{collector=\"raid\"} 1"));
    let logged = wait_for(std::time::Duration::from_secs(10), || {
        exp.log_text().contains("killed").then_some(())
    });
    assert!(logged.is_some(), "{}", exp.log_text());
}
