//! Bad input: broken sysfs/procfs, malformed diskstats, engines that answer
//! garbage or hang, bad flags. The scrape is always served; the failing
//! collector reports success 0 and logs its cause once.

use std::fs;
use std::os::unix::fs::symlink;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn success(scrape: &str, collector: &str) -> f64 {
    samples(scrape)[&format!("longhaul_exporter_collector_success{{collector=\"{collector}\"}}")]
}

#[test]
fn missing_sysfs_and_procfs_fail_only_the_raid_collector() {
    let exp = Exporter::start(&[
        "--path.sysfs=/nonexistent/sys",
        "--path.procfs=/nonexistent/proc",
        "--no-collector.engine",
    ]);
    for _ in 0..3 {
        let s = exp.scrape();
        assert_eq!(success(&s, "raid"), 0.0);
        assert_eq!(success(&s, "tcp"), 1.0);
    }
    assert_eq!(
        exp.log_lines("collector raid failed"),
        1,
        "logged once: {}",
        exp.log_text()
    );
    assert!(
        exp.logged("/nonexistent/proc/diskstats"),
        "{}",
        exp.log_text()
    );
}

#[test]
fn unreadable_diskstats_is_reported_with_its_path() {
    let tmp = TempDir::new("unreadable");
    // A directory where the file should be: read fails with EISDIR (root
    // can read any mode bits, so permissions alone would not do).
    fs::create_dir_all(tmp.0.join("diskstats")).unwrap();
    let exp = Exporter::start(&[
        format!("--path.procfs={}", tmp.0.display()),
        format!("--path.sysfs={}", server_fixture().join("sys").display()),
        "--no-collector.engine".into(),
    ]);
    let s = exp.scrape();
    assert_eq!(success(&s, "raid"), 0.0);
    assert!(exp.logged("diskstats"), "{}", exp.log_text());
}

#[test]
fn malformed_diskstats_lines_drop_only_the_affected_controller() {
    let tmp = TempDir::new("malformed");
    let good = fs::read_to_string(server_fixture().join("proc/diskstats")).unwrap();
    let bad: String = good
        .lines()
        .map(|l| {
            if l.split_whitespace().nth(2) == Some("sdd") {
                "   8      48 sdd 12 x 7\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .chain(["garbage line\n".to_string()])
        .collect();
    fs::write(tmp.0.join("diskstats"), bad).unwrap();
    let exp = Exporter::start(&[
        format!("--path.procfs={}", tmp.0.display()),
        format!("--path.sysfs={}", server_fixture().join("sys").display()),
        "--no-collector.engine".into(),
    ]);
    let text = exp.scrape();
    let s = samples(&text);
    assert_eq!(success(&text, "raid"), 0.0);
    // sdd is on the arcmsr controller: no partial sum for it...
    assert!(!s.contains_key("longhaul_controller_read_bytes_total{controller=\"0000:81:00.0\"}"));
    // ...but the others are complete, and the metadata is still there.
    assert!(s.contains_key("longhaul_controller_read_bytes_total{controller=\"0000:03:00.0\"}"));
    assert!(s
        .keys()
        .any(|k| k.starts_with("longhaul_controller_info{controller=\"0000:81:00.0\"")));
    assert!(exp.logged("sdd"), "{}", exp.log_text());
    let log = exp.log_text();
    assert!(log.contains("line"), "{log}");
}

#[test]
fn a_vanished_device_in_sysfs_is_skipped() {
    let tmp = TempDir::new("brokensys");
    let sys = tmp.0.join("sys");
    fs::create_dir_all(sys.join("block")).unwrap();
    symlink(
        "../devices/pci0000:00/gone/block/sdq",
        sys.join("block/sdq"),
    )
    .unwrap();
    let exp = Exporter::start(&[
        format!("--path.sysfs={}", sys.display()),
        format!("--path.procfs={}", server_fixture().join("proc").display()),
        "--no-collector.engine".into(),
    ]);
    // A dangling /sys/block entry is a disk unplugged between readdir and
    // resolve: skipped, not an error.
    let s = exp.scrape();
    assert_eq!(success(&s, "raid"), 1.0);
    assert!(!s.contains("sdq"));
}

#[test]
fn no_engine_means_no_session_series_and_success_0() {
    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let exp = Exporter::start(&[format!("--engine.url=http://127.0.0.1:{port}")]);
    let s = exp.scrape();
    assert_eq!(success(&s, "engine"), 0.0);
    assert!(!s.contains("longhaul_session_"), "{s}");
    assert!(!s.contains("longhaul_stream_"), "{s}");
}

#[test]
fn engine_garbage_is_success_0_logged_once() {
    for behaviour in [
        Behaviour::Body("{\"version\": 1, \"sessions\": \"nope\"}".into()),
        Behaviour::Body("<html>not json</html>".into()),
        Behaviour::Raw(b"\x00\x01binary junk\r\n\r\n".to_vec()),
        Behaviour::Raw(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".to_vec()),
    ] {
        let engine = FakeEngine::start(behaviour);
        let exp = Exporter::start(&[engine.url(), "--no-collector.raid".into()]);
        for _ in 0..3 {
            let s = exp.scrape();
            assert_eq!(success(&s, "engine"), 0.0);
            assert!(!s.contains("longhaul_session_info"));
        }
        assert_eq!(
            exp.log_lines("collector engine failed"),
            1,
            "{}",
            exp.log_text()
        );
    }
}

/// Resident memory of a process now and at its peak, bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:") * 1024, field("VmHWM:") * 1024)
}

fn endless(prefix: &str, again: &str) -> Behaviour {
    Behaviour::Endless(prefix.as_bytes().to_vec(), again.as_bytes().to_vec())
}

/// The exporter's memory budget (issue 40).
const RSS_BUDGET: u64 = 30 << 20;

/// Issue 40: an engine URL answering an endless body, garbage that never
/// ends, or nothing at all, scraped 4 times at once: the engine collector
/// fails, the scrapes are served, and the exporter stays within 30 MiB.
/// Before, each scrape buffered up to 64 MiB: 4 at once peaked at 240 MiB.
#[test]
fn a_broken_engine_scraped_4_times_at_once_costs_under_30_mib() {
    // Cut at the 64 MiB limit, or at the engine timeout on a slow machine.
    let endless_cut: &[&str] = &["larger than", "within"];
    let cases: [(&str, Behaviour, &[&str]); 7] = [
        ("endless white space", endless("", " "), endless_cut),
        (
            "an endless session id",
            endless(r#"{"version":1,"sessions":[{"id":""#, "x"),
            &["a string too long"],
        ),
        (
            "an endless unknown string",
            endless(r#"{"version":1,"x":""#, "x"),
            endless_cut,
        ),
        (
            "endless nesting",
            endless(r#"{"version":1,"x":"#, "[{\"y\":"),
            endless_cut,
        ),
        (
            "endless streams",
            endless(
                r#"{"version":1,"sessions":[{"id":"s","peer":"p","mode":"memory","direction":"send","streams":[{"id":0,"direction":"send","bytes":1}"#,
                r#",{"id":1,"direction":"send","bytes":1,"tcp":{"rtt_us":1}}"#,
            ),
            &["more than 8192 streams"],
        ),
        (
            "endless sessions",
            endless(
                r#"{"version":1,"sessions":[{"id":"s","peer":"p","mode":"memory","direction":"send","streams":[]}"#,
                r#",{"id":"s","peer":"p","mode":"memory","direction":"send","streams":[{"id":1,"direction":"send","bytes":1}]}"#,
            ),
            &["more than 4224 sessions"],
        ),
        ("silence", Behaviour::Hang, &["within"]),
    ];
    for (what, behaviour, causes) in cases {
        let engine = FakeEngine::start(behaviour);
        let exp = Exporter::start(&[
            engine.url(),
            "--engine.timeout=3s".into(),
            "--no-collector.raid".into(),
        ]);
        let addr = exp.addr;
        let start = Instant::now();
        let scrapes: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || get(addr, "/metrics", None)))
            .collect();
        for s in scrapes {
            let r = s.join().unwrap();
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            assert_eq!(success(&r.body, "engine"), 0.0, "{what}");
            assert_eq!(success(&r.body, "tcp"), 1.0, "{what}");
        }
        // Cut at the answer's limit or the engine timeout.
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: {:?}",
            start.elapsed()
        );
        let (_, peak) = rss(exp.child.id());
        assert!(peak < RSS_BUDGET, "{what}: peak RSS {} MiB", peak >> 20);
        assert_eq!(
            exp.log_lines("collector engine failed"),
            1,
            "{what}: {}",
            exp.log_text()
        );
        // The failure's line (waited for above) names its cause.
        let log = exp.log_text();
        assert!(causes.iter().any(|c| log.contains(c)), "{what}: {log}");
    }
}

#[test]
fn a_hanging_engine_times_out_and_the_scrape_is_served() {
    let engine = FakeEngine::start(Behaviour::Hang);
    let exp = Exporter::start(&[
        engine.url(),
        "--engine.timeout=500ms".into(),
        "--no-collector.raid".into(),
    ]);
    let start = Instant::now();
    let s = exp.scrape();
    let took = start.elapsed();
    assert_eq!(success(&s, "engine"), 0.0);
    assert_eq!(success(&s, "tcp"), 1.0);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "scrape took {took:?}"
    );
    assert!(exp.logged("within"), "{}", exp.log_text());
}

fn run_exit(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unknown_collectors_and_bad_flags_exit_2_with_a_clear_message() {
    let (code, err) = run_exit(&["--collector.nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown collector \"nosuch\""), "{err}");
    assert!(err.contains("engine, raid, tcp"), "{err}");
    for (args, needle) in [
        (&["--no-collector.bogus"][..], "unknown collector"),
        (&["--frobnicate"], "unexpected argument '--frobnicate'"),
        (&["--collector.tcp.ports=1-x"], "--collector.tcp.ports"),
        (
            &["--collector.tcp.port=1"],
            "a similar argument exists: '--collector.tcp.ports'",
        ),
        (
            &["--web.listen-address"],
            "a value is required for '--web.listen-address",
        ),
        (&["--engine.url=ftp://x"], "--engine.url"),
        (&["--engine.timeout=soon"], "--engine.timeout"),
        (&["stray"], "unexpected argument"),
    ] {
        let (code, err) = run_exit(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let help = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for own in [
        "--web.listen-address",
        "--collector.tcp.ports",
        "--no-collector.raid",
        "Collectors:",
    ] {
        assert!(text.contains(own), "--help lacks {own}:\n{text}");
    }
}

#[test]
fn a_port_in_use_is_exit_1_not_a_panic() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("--web.listen-address={}", l.local_addr().unwrap());
    let (code, err) = run_exit(&[&addr]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("binding"), "{err}");
}
