//! `longhaul sweep --messages` (messages mode) with and without load.

use crate::support::{ok, Scratch, Server};

fn check_cells(path: &std::path::Path, load: u64) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(json["kind"], "messages");
    assert_eq!(json["load_streams"], load);
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for c in cells {
        assert!(c["error"].is_null(), "{c}");
        let p50 = c["latency_p50_us"].as_f64().unwrap();
        let p99 = c["latency_p99_us"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= p99, "p50 {p50} p99 {p99}: {c}");
        assert!(c["rr_messages"].as_u64().unwrap() > 0, "{c}");
        assert!(c["stream_throughput_bps"].as_f64().unwrap() > 0.0, "{c}");
        assert!(
            c["stream_messages_per_second"].as_f64().unwrap() > 0.0,
            "{c}"
        );
        assert!(
            c["sender_cpu_us_per_message"].as_f64().unwrap() > 0.0,
            "{c}"
        );
        assert!(
            c["receiver_cpu_us_per_message"].as_f64().unwrap() > 0.0,
            "{c}"
        );
        assert_eq!(c["load_streams"], load);
    }
    let csv_path = path.with_extension("csv");
    let csv = std::fs::read_to_string(csv_path).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(
        csv.starts_with("length,load_streams,latency_p50_us,latency_p99_us"),
        "{csv}"
    );
}

#[test]
fn two_lengths_without_and_with_load() {
    let server = Server::start(&[]);
    let dir = Scratch::new("messages");
    let out = dir.join("out");
    let addr = server.addr();
    let base = [
        "sweep",
        "--to",
        &addr,
        "--messages",
        "64,64K",
        "--time",
        "1",
        "--out",
        &out,
    ];
    ok(&base);
    check_cells(&dir.path().join("out/messages.json"), 0);
    let mut loaded = base.to_vec();
    loaded.extend(["--load", "1"]);
    let stdout = ok(&loaded);
    assert!(stdout.contains("load: 1 streams"), "{stdout}");
    check_cells(&dir.path().join("out/messages-load1.json"), 1);
    // No window x streams matrix unless asked for.
    assert!(!dir.path().join("out/sweep.json").exists());
}

#[test]
fn send_json_of_a_messages_session_reports_both_ends() {
    // The library path the sweep uses, seen through the sweep's JSON: the
    // request/response count on the client equals the server's.
    let server = Server::start(&[]);
    let dir = Scratch::new("messages-json");
    let out = dir.join("out");
    let stdout = ok(&[
        "sweep",
        "--to",
        &server.addr(),
        "--messages",
        "1K",
        "--time",
        "0.5",
        "--out",
        &out,
        "--json",
    ]);
    let v = crate::support::last_json(&stdout);
    let cell = &v["messages"]["cells"][0];
    assert_eq!(cell["length"], 1024);
    assert!(cell["rr_per_second"].as_f64().unwrap() > 0.0, "{cell}");
}
