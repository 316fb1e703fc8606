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
    assert_eq!(session.direction, Direction::Receive);
    assert!(session.peer.starts_with("127.0.0.1:"));
    assert!(session
        .streams
        .iter()
        .all(|s| s.peer_end || s.direction == Direction::Receive));
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
                                st.direction != Direction::Send || tcp.segs_out > 0
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
            .any(|s| !s.peer_end && s.direction == Direction::Send);
        assert_eq!(
            server_sends,
            !flag.is_empty(),
            "{flag}: {:?}",
            session.streams
        );
        let client_sends = session
            .streams
            .iter()
            .any(|s| s.peer_end && s.direction == Direction::Send);
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
