//! HTTP behaviour: index page, 404/405, the concurrent-scrape limit, SIGTERM and SIGINT.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn index_links_to_metrics_and_unknown_paths_are_404() {
    let exp = Exporter::start(&["--no-collector.engine"]);
    let index = exp.get("/");
    assert_eq!(index.status, 200);
    assert!(
        index.body.contains("<a href=\"/metrics\">"),
        "{}",
        index.body
    );
    assert_eq!(exp.get("/nope").status, 404);
    assert_eq!(exp.get("/metrics?x=1").status, 200);

    let mut s = TcpStream::connect(exp.addr).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
}

#[test]
fn scrapes_beyond_the_limit_get_503() {
    // A hanging engine holds the first scrape for the engine timeout.
    let engine = FakeEngine::start(Behaviour::Hang);
    let exp = Exporter::start(&[
        engine.url(),
        "--engine.timeout=1500ms".into(),
        "--web.max-requests=1".into(),
        "--no-collector.raid".into(),
    ]);
    let addr = exp.addr;
    let first = std::thread::spawn(move || get(addr, "/metrics", None).status);
    std::thread::sleep(Duration::from_millis(300));
    let second = exp.get("/metrics");
    assert_eq!(second.status, 503, "{}", second.body);
    assert_eq!(first.join().unwrap(), 200);
    // The slot is released afterwards.
    assert_eq!(exp.get("/").status, 200);
}

#[test]
fn concurrent_scrapes_share_one_stats_api_request() {
    // The engine takes 3 s to answer: the scrapes that arrive meanwhile
    // (all 16 leave together, well within that) wait for that collection
    // instead of asking the engine again (the engine and tcp collectors read
    // the one answer).
    let body = std::fs::read_to_string(exporter_fixtures().join("sessions.json")).unwrap();
    let engine = FakeEngine::start(Behaviour::Slow(body, Duration::from_secs(3)));
    let exp = Exporter::start(&[
        engine.url(),
        "--no-collector.raid".into(),
        "--web.max-requests=64".into(),
        "--engine.timeout=8s".into(),
    ]);
    let before = engine.requests();
    let addr = exp.addr;
    let start = std::sync::Arc::new(std::sync::Barrier::new(16));
    let scrapes: Vec<_> = (0..16)
        .map(|_| {
            let start = std::sync::Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                get(addr, "/metrics", None)
            })
        })
        .collect();
    for scrape in scrapes {
        let answer = scrape.join().unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
        let got = samples(&answer.body);
        assert!(
            got.keys().any(|k| k.starts_with("longhaul_session_info{")),
            "a scrape without the engine's sessions:\n{}",
            answer.body
        );
        assert_eq!(
            got.get("longhaul_exporter_collector_success{collector=\"tcp\"}"),
            Some(&1.0)
        );
    }
    assert_eq!(engine.requests() - before, 1, "16 scrapes at once");
    // A collection is not kept past its end: the next scrape asks again.
    exp.scrape();
    assert_eq!(engine.requests() - before, 2, "one more scrape");
}

/// The exporter, sent `signal` once it has answered a scrape, exits 0
/// within 5 s, no longer listening, and says which signal stopped it.
fn shuts_down_cleanly_on(signal: libc::c_int, name: &str) {
    let mut exp = Exporter::start(&["--no-collector.engine"]);
    exp.scrape();
    // SAFETY: kill(2) on the pid of our own child.
    let rc = unsafe { libc::kill(exp.child.id() as i32, signal) };
    assert_eq!(rc, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = exp.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no exit after {name}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(TcpStream::connect(exp.addr).is_err(), "still listening");
    assert!(
        exp.logged(&format!("signal received, shutting down ({name})")),
        "{}",
        exp.log_text()
    );
}

#[test]
fn sigterm_shuts_down_cleanly() {
    shuts_down_cleanly_on(libc::SIGTERM, "SIGTERM");
}

#[test]
fn sigint_shuts_down_cleanly() {
    shuts_down_cleanly_on(libc::SIGINT, "SIGINT");
}
