//! Memory-to-memory transfers: exact byte counts, directions, JSON shape.

use crate::support::*;

const ODD_BYTES: u64 = 3 * 1024 * 1024 + 7;

fn check_final(v: &serde_json::Value, streams: usize) {
    assert_eq!(v["mode"], "memory");
    let list = v["streams"].as_array().expect("streams");
    assert_eq!(list.len(), streams, "{v}");
    for s in list {
        for key in ["id", "bytes", "retransmits", "rtt_us", "cwnd_bytes"] {
            assert!(s[key].is_u64(), "stream lacks {key}: {s}");
        }
        assert!(s["cwnd_bytes"].as_u64().unwrap() > 0, "{s}");
    }
    for end in ["sender", "receiver"] {
        for key in ["user_pct", "system_pct", "softirq_pct"] {
            assert!(v["cpu"][end][key].is_f64(), "cpu.{end}.{key} missing: {v}");
        }
    }
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    assert!(v["throughput_bps"].as_f64().unwrap() > 0.0);
}

#[test]
fn one_four_and_35_streams_move_exactly_bytes() {
    let server = Server::start(&[]);
    for n in [1usize, 4, 35] {
        let v = send_json(
            &server.addr(),
            &[
                "--streams",
                &n.to_string(),
                "--bytes",
                &ODD_BYTES.to_string(),
            ],
        );
        check_final(&v, n);
        assert_eq!(v["direction"], "send");
        assert_eq!(v["bytes"].as_u64(), Some(ODD_BYTES), "{v}");
        let sum: u64 = v["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, ODD_BYTES);
    }
}

#[test]
fn bidir_moves_data_both_ways() {
    let server = Server::start(&[]);
    let v = send_json(
        &server.addr(),
        &["--streams", "3", "--bytes", "4M", "--bidir"],
    );
    check_final(&v, 6);
    assert_eq!(v["direction"], "bidir");
    assert_eq!(v["bytes_sent"].as_u64(), Some(4 << 20));
    assert_eq!(v["bytes_received"].as_u64(), Some(4 << 20));
    let dirs: Vec<&str> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["direction"].as_str().unwrap())
        .collect();
    assert_eq!(
        dirs,
        ["send", "send", "send", "receive", "receive", "receive"]
    );
}

#[test]
fn reverse_makes_the_server_send() {
    let server = Server::start(&[]);
    let v = send_json(
        &server.addr(),
        &["--streams", "2", "--bytes", "4M", "--reverse"],
    );
    check_final(&v, 2);
    assert_eq!(v["direction"], "receive");
    assert_eq!(v["bytes_received"].as_u64(), Some(4 << 20));
    assert_eq!(v["bytes_sent"].as_u64(), Some(0));
}

#[test]
fn time_mode_prints_json_intervals_then_the_result() {
    let server = Server::start(&[]);
    let out = run(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--time",
        "1.2",
        "--interval",
        "0.5",
        "--json",
        "--rate",
        "200M",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert!(lines.len() >= 3, "{}", out.stdout);
    assert!(lines[..lines.len() - 1]
        .iter()
        .all(|l| l["type"] == "interval"));
    let last = lines.last().unwrap();
    check_final(last, 2);
    // Intervals count delivered bytes (acknowledged by the receiver), never
    // more than the receiver got; the asked duration is in the result, and
    // both ends of a loopback run share one kernel.
    let intervals = &lines[..lines.len() - 1];
    assert!(intervals.iter().all(|l| l["counts"] == "delivered"));
    let delivered: u64 = intervals.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    assert!(
        delivered <= last["bytes"].as_u64().unwrap(),
        "{delivered} > {last}"
    );
    assert!(delivered > 0);
    assert_eq!(last["requested_seconds"].as_f64(), Some(1.2));
    let boot = |end: &str| last["cpu"][end]["kernel_boot_id"].as_u64().unwrap();
    assert!(
        boot("sender") != 0 && boot("sender") == boot("receiver"),
        "{last}"
    );
    // --rate 200M: the in-process pacer holds the total near 200 Mb/s.
    let bps = last["throughput_bps"].as_f64().unwrap();
    assert!(bps > 120e6 && bps < 260e6, "paced throughput {bps}");
}

#[test]
fn human_output_by_default() {
    let server = Server::start(&[]);
    let out = run(&["send", "--to", &server.addr(), "--time", "1.1"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("b/s"), "{}", out.stdout);
    assert!(out.stdout.contains("sender CPU"), "{}", out.stdout);
}

#[test]
fn two_concurrent_sessions_both_complete() {
    let server = Server::start(&[]);
    let a = spawn(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--time",
        "1.5",
        "--json",
    ]);
    let b = spawn(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "3",
        "--time",
        "1.5",
        "--json",
    ]);
    for (run, n) in [(a, 2), (b, 3)] {
        let out = run.wait(RUN_TIMEOUT);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        check_final(&last_json(&out.stdout), n);
    }
}

#[test]
fn a_buffer_the_kernel_caps_is_warned_about_naming_the_sysctl() {
    let max: u64 = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let server = Server::start(&[]);
    let ask = (max * 2).to_string();
    let out = run(&[
        "send",
        "--to",
        &server.addr(),
        "--bytes",
        "1M",
        "--buffer",
        &ask,
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("net.core.wmem_max"), "{}", out.stderr);
}

/// `--start-at T`: senders launched up to 1.5 s apart all start their data
/// phase at T (their JSON `started_unix` within 1 s of each other and not
/// before T), as a campaign phase needs; a T already past is a usage error.
#[test]
fn senders_given_one_start_instant_start_together() {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    let server = Server::start(&[]);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let at = (now + Duration::from_secs(4)).as_secs_f64();
    let at_text = format!("{at:.3}");
    let mut running = Vec::new();
    for pair in 0..4 {
        running.push(spawn(&[
            "send",
            "--to",
            &server.addr(),
            "--start-at",
            &at_text,
            "--bytes",
            "4M",
            "--json",
        ]));
        if pair < 3 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let starts: Vec<f64> = running
        .into_iter()
        .map(|r| {
            let out = r.wait(RUN_TIMEOUT);
            assert_eq!(out.code, Some(0), "{}", out.stderr);
            let v = last_json(&out.stdout);
            assert!(v["started"].as_str().unwrap().ends_with('Z'), "{v}");
            v["started_unix"].as_f64().unwrap()
        })
        .collect();
    let first = starts.iter().cloned().fold(f64::MAX, f64::min);
    let last = starts.iter().cloned().fold(f64::MIN, f64::max);
    assert!(first >= at - 0.001, "started before T: {starts:?} (T {at})");
    assert!(last - first < 1.0, "start times spread {starts:?}");
    let out = run(&[
        "send",
        "--to",
        &server.addr(),
        "--start-at",
        &format!("{:.3}", at - 60.0),
        "--bytes",
        "1M",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("passed"), "{}", out.stderr);
}
