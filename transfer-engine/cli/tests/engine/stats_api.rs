//! The stats API at GET /v1/sessions.

use std::time::{Duration, Instant};

use longhaul_stats_api::{Direction, Mode, State};

use crate::support::*;

#[test]
fn stats_api_shows_a_running_session_with_streams() {
    let server = Server::start(&[]);
    let snap = snapshot(server.stats_port);
    assert_eq!(snap.version, 1);
    assert!(snap.sessions.is_empty());

    let sender = spawn(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "4",
        "--time",
        "3",
        "--json",
    ]);
    let t = Instant::now();
    let session = loop {
        let snap = snapshot(server.stats_port);
        let found = snap.sessions.into_iter().find(|s| {
            s.state == State::Running
                && s.streams.len() == 4
                && s.bytes_received > 0
                && s.streams.iter().all(|st| st.tcp.is_some())
        });
        if let Some(s) = found {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no running session seen"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(session.mode, Mode::Memory);
    assert_eq!(session.direction, Direction::Receive);
    assert!(session.peer.starts_with("127.0.0.1:"));
    assert!(session
        .streams
        .iter()
        .all(|s| s.direction == Direction::Receive));

    let out = sender.wait(RUN_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let total = last_json(&out.stdout)["bytes"].as_u64().unwrap();
    // Finished sessions stay visible with their final counters.
    let t = Instant::now();
    loop {
        let snap = snapshot(server.stats_port);
        let s = &snap.sessions[0];
        if s.state == State::Finished {
            assert_eq!(s.bytes_received, total);
            assert_eq!(snap.engine.sessions_total, 1);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "session not finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(server.stats_port, "/nope").0, 404);
}
