//! The stats API at GET /v1/sessions.

use std::time::{Duration, Instant};

use longhaul_stats_api::{EngineDirection, Mode, State};

use crate::support::*;

/// `send --campaign fig5 --run a-to-b`: the server keeps both names with
/// the session and its stats API lists them, while it runs and after; a
/// session without them lists none.
#[test]
fn stats_api_lists_the_campaign_and_run_a_client_named() {
    let server = Server::start(&[]);
    let named = [
        "send",
        "--to",
        &server.addr(),
        "--time",
        "1",
        "--json",
        "--campaign",
        "fig5",
        "--run",
        "a-to-b",
    ];
    let sender = spawn(&named);
    let t = Instant::now();
    let running = loop {
        let snap = snapshot(server.stats_port);
        if let Some(s) = snap
            .sessions
            .into_iter()
            .find(|s| s.state == State::Running)
        {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no running session seen"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (running.campaign.as_deref(), running.run.as_deref()),
        (Some("fig5"), Some("a-to-b"))
    );
    let out = sender.wait(RUN_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = run(&["send", "--to", &server.addr(), "--time", "1"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let snap = snapshot(server.stats_port);
    let names: Vec<_> = snap
        .sessions
        .iter()
        .map(|s| (s.state, s.campaign.as_deref(), s.run.as_deref()))
        .collect();
    assert_eq!(
        names,
        [
            (State::Finished, Some("fig5"), Some("a-to-b")),
            (State::Finished, None, None)
        ]
    );
}

/// A client that skips the command line and names a campaign that is not a
/// plain name in its request is refused with an error naming the field; the
/// name never reaches the stats API, and the error quotes at most its start.
#[test]
fn a_crafted_request_with_a_name_that_is_not_plain_is_refused() {
    use longhaul_engine::messages::{Message, SessionRequest};
    let server = Server::start(&[]);
    let huge = format!("x\"}} 1\n{}", "y".repeat(100_000));
    for (campaign, run) in [(Some(huge.clone()), None), (None, Some("a b".to_string()))] {
        let sock = std::net::TcpStream::connect(server.addr()).unwrap();
        let mut conn = authenticate(sock).unwrap();
        let request = SessionRequest {
            campaign: campaign.clone(),
            run: run.clone(),
            ..disk_request(
                longhaul_engine::messages::Direction::Send,
                serde_json::json!({}),
            )
        };
        conn.send(&Message::SessionRequest(SessionRequest {
            mode: longhaul_engine::messages::Mode::Memory,
            mode_params: None,
            ..request
        }))
        .unwrap();
        let answer = conn.recv();
        let text = format!("{answer:?}");
        let flag = if campaign.is_some() {
            "--campaign"
        } else {
            "--run"
        };
        assert!(text.contains(flag), "{text}");
        assert!(
            text.len() < 1_000,
            "the error quotes the whole name: {} bytes",
            text.len()
        );
    }
    let snap = snapshot(server.stats_port);
    assert!(snap.sessions.is_empty(), "{:?}", snap.sessions);
}

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
            let own: Vec<_> = s.streams.iter().filter(|st| !st.peer_end).collect();
            s.state == State::Running
                && own.len() == 4
                && s.bytes_received > 0
                && own.iter().all(|st| st.tcp.is_some())
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
    assert_eq!(session.direction, EngineDirection::Receive);
    assert!(session.peer.starts_with("127.0.0.1:"));
    assert!(session
        .streams
        .iter()
        .all(|s| s.peer_end || s.direction == EngineDirection::Receive));
    // This engine's own sockets carry their addresses (the exporter's tcp
    // collector skips them); the client's reported ends carry none.
    assert_eq!(session.local, Some(server.addr()));
    for st in &session.streams {
        if st.peer_end {
            assert_eq!((&st.local, &st.peer), (&None, &None), "{st:?}");
        } else {
            assert_eq!(st.local, Some(server.addr()), "{st:?}");
            assert!(
                st.peer.as_deref().unwrap().starts_with("127.0.0.1:"),
                "{st:?}"
            );
            assert_ne!(st.peer.as_deref(), Some(session.peer.as_str()), "{st:?}");
        }
    }

    // The series view (what the exporter asks for): the same session and
    // streams, no stream addresses, no receiving end's TCP_INFO.
    let (status, body) = http_get(server.stats_port, "/v1/sessions?view=series");
    assert_eq!(status, 200, "{body}");
    let lean: longhaul_stats_api::Snapshot = serde_json::from_str(&body).unwrap();
    let s = lean.sessions.iter().find(|s| s.id == session.id).unwrap();
    assert_eq!((&s.local, &s.peer), (&session.local, &session.peer));
    assert_eq!(s.streams.iter().filter(|st| !st.peer_end).count(), 4);
    for st in &s.streams {
        assert_eq!((&st.local, &st.peer), (&None, &None), "{st:?}");
        assert_eq!(
            st.tcp.is_some(),
            st.direction == EngineDirection::Send && st.peer_end,
            "{st:?}"
        );
    }
    assert!(!lean.engine.admission[0]
        .address
        .as_deref()
        .unwrap_or("")
        .is_empty());
    // The rows view (what the exporter asks for now): the same session with
    // each stream end an array, no keys; the streams list is empty.
    let (status, body) = http_get(server.stats_port, "/v1/sessions?view=rows");
    assert_eq!(status, 200, "{body}");
    let rows: serde_json::Value = serde_json::from_str(&body).unwrap();
    let r = rows["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == session.id.as_str())
        .unwrap();
    assert_eq!(r["streams"], serde_json::json!([]));
    let ends = r["stream_rows"].as_array().unwrap();
    // This engine's 4 receiving ends, and the client's sending ends it reported.
    assert_eq!(
        ends.iter().filter(|e| e[1] == "receive").count(),
        4,
        "{body}"
    );
    for end in ends {
        let end = end.as_array().unwrap();
        let sending = end[1] == "send";
        assert!(sending || end[1] == "receive", "{end:?}");
        assert!(end[0].is_u64() && end[2].is_u64(), "{end:?}");
        // Only the client's sending ends carry TCP_INFO (5 fields).
        assert_eq!(end.len(), if sending { 4 } else { 3 }, "{end:?}");
        if sending {
            assert_eq!(end[3].as_array().map(Vec::len), Some(5), "{end:?}");
        }
    }
    let (status, body) = http_get(server.stats_port, "/v1/sessions?view=everything");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown view"), "{body}");

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

/// The server's stats API lists the client's end of every stream too
/// (`peer_end: true`, reported over the control connection while the run lasts),
/// so the sending side's TCP_INFO is visible whichever end sends: the
/// client (default), the server (`--reverse`) or both (`--bidir`).
#[test]
fn stats_api_shows_both_ends_of_every_stream_whichever_end_sends() {
    for (flag, streams_per_direction) in [("", 3u32), ("--reverse", 3), ("--bidir", 2)] {
        let server = Server::start(&[]);
        let addr = server.addr();
        let streams = streams_per_direction.to_string();
        let mut args = vec![
            "send",
            "--to",
            &addr,
            "--streams",
            &streams,
            "--time",
            "4",
            "--json",
        ];
        if !flag.is_empty() {
            args.push(flag);
        }
        let connections = if flag == "--bidir" {
            2 * streams_per_direction
        } else {
            streams_per_direction
        };
        let sender = spawn(&args);
        let t = Instant::now();
        // Live: both ends of each connection, opposite directions, and the
        // sending end's TCP_INFO counting what it sent.
        let session = loop {
            let snap = snapshot(server.stats_port);
            let found = snap.sessions.into_iter().find(|s| {
                s.state == State::Running
                    && s.streams.len() == 2 * connections as usize
                    && s.streams.iter().all(|st| {
                        st.bytes > 0
                            && st.tcp.is_some_and(|tcp| {
                                st.direction != EngineDirection::Send || tcp.segs_out > 0
                            })
                    })
            });
            if let Some(s) = found {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{flag}: no running session with both ends of its streams"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        for id in 0..connections {
            let ends: Vec<_> = session.streams.iter().filter(|s| s.id == id).collect();
            assert_eq!(ends.len(), 2, "{flag}: stream {id}: {ends:?}");
            assert_ne!(ends[0].peer_end, ends[1].peer_end, "{flag}: {ends:?}");
            assert_ne!(ends[0].direction, ends[1].direction, "{flag}: {ends:?}");
        }
        let server_sends = session
            .streams
            .iter()
            .any(|s| !s.peer_end && s.direction == EngineDirection::Send);
        assert_eq!(
            server_sends,
            !flag.is_empty(),
            "{flag}: {:?}",
            session.streams
        );
        let client_sends = session
            .streams
            .iter()
            .any(|s| s.peer_end && s.direction == EngineDirection::Send);
        assert_eq!(client_sends, flag != "--reverse", "{flag}");
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(
            session.peer_host.as_deref(),
            Some(hostname.trim()),
            "{flag}"
        );

        let out = sender.wait(RUN_TIMEOUT);
        assert_eq!(out.code, Some(0), "{flag}: {}", out.stderr);
        // After the end the client's final figures (its Done) are listed:
        // each connection's two ends agree on the bytes.
        let t = Instant::now();
        loop {
            let snap = snapshot(server.stats_port);
            let s = &snap.sessions[0];
            if s.state == State::Finished {
                for id in 0..connections {
                    let bytes: Vec<u64> = s
                        .streams
                        .iter()
                        .filter(|st| st.id == id)
                        .map(|st| st.bytes)
                        .collect();
                    assert_eq!(bytes.len(), 2, "{flag}");
                    assert_eq!(bytes[0], bytes[1], "{flag}: stream {id}");
                }
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "session not finished");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The admission counters of both listening ports, once a garbage
/// connection and one session (or iperf3 test) went through each.
#[test]
fn stats_api_counts_what_each_port_did_with_its_connections() {
    let iperf3_port = free_port();
    let iperf3_addr = format!("127.0.0.1:{iperf3_port}");
    let server = Server::start(&["--iperf3-listen", &iperf3_addr]);
    let admission = |listener: &str| {
        snapshot(server.stats_port)
            .engine
            .admission
            .into_iter()
            .find(|a| a.listener == listener)
    };
    // The control port is watched from the moment it accepts.
    let t = Instant::now();
    while admission("longhaul").is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no admission counters"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    {
        use std::io::Write;
        let mut stranger = std::net::TcpStream::connect(server.addr()).unwrap();
        stranger.write_all(&[0xff; 64]).unwrap();
    }
    ok(&["send", "--to", &server.addr(), "--bytes", "1M"]);
    ok(&[
        "send",
        "--protocol",
        "iperf3",
        "--to",
        &iperf3_addr,
        "--bytes",
        "1M",
    ]);
    // Each lists the address it listens on: every socket there is the
    // engine's (the exporter's tcp collector leaves them to it).
    let want = |listener: &str, address: &str, accepted, admitted, garbage| {
        longhaul_stats_api::Admission {
            listener: listener.into(),
            address: Some(address.into()),
            accepted,
            admitted,
            evicted: 0,
            expired: 0,
            garbage,
            refused: Default::default(),
            auth_failed: Default::default(),
        }
    };
    // longhaul: the stranger (garbage), the session's control connection
    // (admitted) and its one stream; iperf3: the test's control
    // connection (admitted) and its stream.
    let t = Instant::now();
    loop {
        let (ours, iperf3) = (admission("longhaul"), admission("iperf3"));
        if ours == Some(want("longhaul", &server.addr(), 3, 1, 1))
            && iperf3 == Some(want("iperf3", &iperf3_addr, 2, 1, 0))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "admission counters: {ours:?} {iperf3:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
