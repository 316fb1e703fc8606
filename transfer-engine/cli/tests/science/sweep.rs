//! `longhaul sweep` window x streams matrix on loopback.

use crate::support::{last_json, ok, Scratch, Server};

#[test]
fn a_2x2_matrix_writes_csv_and_json_with_4_cells() {
    let server = Server::start(&[]);
    let dir = Scratch::new("sweep");
    let out = dir.join("out");
    let stdout = ok(&[
        "sweep",
        "--to",
        &server.addr(),
        "--streams",
        "1,2",
        "--buffer",
        "64K,256K",
        "--time",
        "1",
        "--out",
        &out,
        "--json",
    ]);
    let printed = last_json(&stdout);
    assert_eq!(printed["type"], "sweep");

    let csv = std::fs::read_to_string(dir.path().join("out/sweep.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "header + 4 cells:\n{csv}");
    assert!(
        lines[0].starts_with("streams,buffer,buffer_bytes,throughput_bps,retransmits,mean_rtt_us"),
        "{}",
        lines[0]
    );
    for col in [
        "cpu_sender_system_pct",
        "cpu_receiver_softirq_pct",
        "command",
    ] {
        assert!(lines[0].contains(col), "{col} missing: {}", lines[0]);
    }

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/sweep.json")).unwrap())
            .unwrap();
    assert_eq!(json["kind"], "sweep");
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    let mut seen = Vec::new();
    for c in cells {
        assert!(c["error"].is_null(), "{c}");
        assert!(c["throughput_bps"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["cpu_sender"]["system_pct"].is_number(), "{c}");
        assert!(
            c["mean_rtt_us"].is_number() && c["retransmits"].is_u64(),
            "{c}"
        );
        seen.push((
            c["streams"].as_u64().unwrap(),
            c["buffer"].as_str().unwrap().to_string(),
        ));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (1, "256K".into()),
            (1, "64K".into()),
            (2, "256K".into()),
            (2, "64K".into())
        ]
    );
    let best = &json["best"];
    let max = cells
        .iter()
        .map(|c| c["throughput_bps"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(best["throughput_bps"].as_f64().unwrap(), max);
    assert_eq!(printed["matrix"]["best"], *best);
}

#[test]
fn human_output_prints_a_table_and_the_best_cell() {
    let server = Server::start(&[]);
    let dir = Scratch::new("sweep-human");
    let out = dir.join("out");
    let stdout = ok(&[
        "sweep",
        "--to",
        &server.addr(),
        "--streams",
        "1",
        "--buffer",
        "128K",
        "--time",
        "0.5",
        "--out",
        &out,
    ]);
    assert!(
        stdout.contains("streams") && stdout.contains("128K"),
        "{stdout}"
    );
    assert!(
        stdout.contains("best: 1 stream(s) x 128K buffer"),
        "{stdout}"
    );
}

#[test]
fn bad_lists_are_usage_errors() {
    let o = crate::support::run(&["sweep", "--to", "127.0.0.1:1", "--buffer", "64K,zz"]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--buffer"), "{}", o.stderr);
}

#[test]
fn a_sweep_whose_every_cell_failed_says_so_and_exits_1() {
    // Nothing listens there: every cell is refused. The sweep's own failure
    // is said as such, the first cell's cause with it: no transfer of the
    // command's own ran, so nothing "peer aborted" it.
    let addr = format!("127.0.0.1:{}", crate::support::free_port());
    let dir = Scratch::new("sweep-dead");
    let out = dir.join("out");
    let o = crate::support::run(&[
        "sweep",
        "--to",
        &addr,
        "--streams",
        "1,2",
        "--buffer",
        "128K",
        "--time",
        "0.5",
        "--out",
        &out,
    ]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    // After the cells' progress lines, the error.
    let said = o.stderr.lines().last().unwrap_or_default();
    assert!(
        said.starts_with("longhaul: every sweep cell failed: refused:"),
        "{}",
        o.stderr
    );
    assert!(!said.contains("peer aborted"), "{}", o.stderr);
}
