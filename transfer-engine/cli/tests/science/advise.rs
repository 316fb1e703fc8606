//! `longhaul advise` on loopback.

use crate::support::{last_json, ok, run, Server};

#[test]
fn recommendation_is_within_20_percent_of_the_measured_bdp() {
    let server = Server::start(&[]);
    for rate in ["10G", "100G", "1T"] {
        let v = last_json(&ok(&[
            "advise",
            "--to",
            &server.addr(),
            "--rate",
            rate,
            "--json",
        ]));
        assert_eq!(v["type"], "advice");
        let rtt_us = v["rtt_us"].as_f64().unwrap();
        assert!(rtt_us > 0.0, "{v}");
        let rate_bps = v["target_rate_bps"].as_f64().unwrap();
        let bdp = rate_bps / 8.0 * rtt_us / 1e6;
        let r = &v["recommendation"];
        let product = r["streams"].as_f64().unwrap() * r["buffer_bytes"].as_f64().unwrap();
        assert!(
            (product - bdp).abs() <= 0.2 * bdp,
            "rate {rate}: {product} vs BDP {bdp}: {v}"
        );
        assert!(r["buffer_bytes"].as_u64().unwrap() <= v["buffer_limit_bytes"].as_u64().unwrap());
        // Both ends' limits were read (the server's over the control connection).
        assert!(v["local_limits"]["wmem_max"].as_u64().unwrap() > 0, "{v}");
        assert!(v["remote_limits"]["rmem_max"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["rtt"]["samples"], 10);
        // The command it prints is one `send` accepts.
        let cmd = r["command"].as_str().unwrap();
        assert!(cmd.starts_with("longhaul send --to "), "{cmd}");
    }
}

#[test]
fn human_advice_and_errors() {
    let server = Server::start(&[]);
    let text = ok(&[
        "advise",
        "--to",
        &server.addr(),
        "--rate",
        "1G",
        "--pings",
        "3",
    ]);
    assert!(text.contains("recommended:"), "{text}");
    assert!(text.contains("3 pings"), "{text}");
    // A server that is not there: exit 1, the cause named.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let o = run(&["advise", "--to", &addr]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(o.stderr.contains("refused"), "{}", o.stderr);
}
