//! Misbehaving peers: garbage, silence, disconnects and kills. The server
//! must stay up and keep serving; the surviving end must report failure.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use longhaul_engine::frame::FRAME_MAGIC;

use crate::support::*;

fn session_succeeds(server: &Server) {
    let v = send_json(&server.addr(), &["--streams", "2", "--bytes", "2M"]);
    assert_eq!(v["bytes"].as_u64(), Some(2 << 20));
}

#[test]
fn garbage_on_the_control_port_does_not_take_the_server_down() {
    let mut server = Server::start(&[]);
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // A frame with our magic but an absurd length.
    let mut s2 = TcpStream::connect(server.addr()).unwrap();
    let mut frame = FRAME_MAGIC.to_vec();
    frame.push(1);
    frame.extend_from_slice(&u32::MAX.to_be_bytes());
    s2.write_all(&frame).unwrap();
    // A well-framed message of an unknown type.
    let mut s3 = TcpStream::connect(server.addr()).unwrap();
    let mut frame = FRAME_MAGIC.to_vec();
    frame.push(0xee);
    frame.extend_from_slice(&3u32.to_be_bytes());
    frame.extend_from_slice(b"xyz");
    s3.write_all(&frame).unwrap();
    assert!(
        server.wait_log("garbage", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    assert!(server.is_running());
    session_succeeds(&server);
    drop((s, s2, s3));
}

#[test]
fn half_open_and_mid_handshake_disconnects_do_not_block_others() {
    let server = Server::start(&[]);
    // Connects and says nothing, held open across the next session.
    let _silent = TcpStream::connect(server.addr()).unwrap();
    // Says half a header, then nothing.
    let mut half = TcpStream::connect(server.addr()).unwrap();
    half.write_all(b"LH").unwrap();
    // Starts a handshake and disconnects.
    {
        let mut c = longhaul_engine::connection::Connection::new(
            TcpStream::connect(server.addr()).unwrap(),
        )
        .unwrap();
        c.send(&longhaul_engine::messages::Message::Hello(
            longhaul_engine::messages::Hello {
                version: longhaul_engine::PROTOCOL_VERSION,
                client_nonce: "ab".repeat(32),
                software: "test".into(),
            },
        ))
        .unwrap();
    }
    let t = Instant::now();
    session_succeeds(&server);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn killed_sender_is_reported_failed_by_the_server() {
    let server = Server::start(&[]);
    let mut sender = spawn(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "4",
        "--time",
        "30",
        "--interval",
        "0.2",
    ]);
    sender.wait_until_flowing();
    sender.child.kill().unwrap(); // SIGKILL
    let _ = sender.child.wait();
    assert!(
        server.wait_log("failed", Duration::from_secs(10)),
        "server did not report the session failed: {}",
        server.stderr()
    );
    let snap = snapshot(server.stats_port);
    assert_eq!(snap.engine.sessions_failed_total, 1);
    assert!(snap
        .sessions
        .iter()
        .any(|s| s.state == longhaul_stats_api::State::Failed));
    session_succeeds(&server);
}

#[test]
fn killed_server_is_reported_failed_by_the_sender() {
    for reverse in [false, true] {
        let mut server = Server::start(&[]);
        let mut args = vec![
            "send".to_string(),
            "--to".into(),
            server.addr(),
            "--streams".into(),
            "3".into(),
            "--time".into(),
            "30".into(),
            "--interval".into(),
            "0.2".into(),
        ];
        if reverse {
            args.push("--reverse".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sender = spawn(&args);
        sender.wait_until_flowing();
        server.kill();
        let out = sender.wait(Duration::from_secs(15));
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        assert!(out.stderr.contains("peer aborted"), "{}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
}

#[test]
fn a_full_server_says_busy_and_recovers() {
    let server = Server::start(&["--max-sessions", "1"]);
    let long = spawn(&["send", "--to", &server.addr(), "--time", "3", "--json"]);
    // Wait until the first session holds the only slot.
    let t = Instant::now();
    while !snapshot(server.stats_port)
        .sessions
        .iter()
        .any(|s| s.state == longhaul_stats_api::State::Running)
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "first session never ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run(&["send", "--to", &server.addr(), "--bytes", "1M"]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("busy"), "{}", out.stderr);
    assert_eq!(long.wait(RUN_TIMEOUT).code, Some(0));
    session_succeeds(&server);
}
