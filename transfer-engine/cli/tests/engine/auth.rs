//! Tokens, the challenge-response and protocol versions.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use longhaul_engine::connection::Connection;
use longhaul_engine::messages::{Challenge, Hello, Message};

use crate::support::*;

#[test]
fn right_token_works_wrong_token_is_refused() {
    let good = token_file("good", "correct horse battery staple");
    let bad = token_file("bad", "wrong");
    let server = Server::start(&["--token-file", &good]);
    let v = send_json(&server.addr(), &["--bytes", "1M", "--token-file", &good]);
    assert_eq!(v["bytes"].as_u64(), Some(1 << 20));

    let out = run(&[
        "send",
        "--to",
        &server.addr(),
        "--bytes",
        "1M",
        "--token-file",
        &bad,
    ]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("auth"), "{}", out.stderr);
    assert_eq!(
        out.stderr.trim().lines().count(),
        1,
        "one-line error: {}",
        out.stderr
    );

    let out = run(&["send", "--to", &server.addr(), "--bytes", "1M"]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("auth"), "{}", out.stderr);
}

#[test]
fn server_rejects_a_newer_protocol_version_and_keeps_serving() {
    let server = Server::start(&[]);
    let mut conn = Connection::new(TcpStream::connect(server.addr()).unwrap()).unwrap();
    conn.set_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.send(&Message::Hello(Hello {
        version: 99,
        client_nonce: "00".repeat(32),
        software: "future".into(),
    }))
    .unwrap();
    let err = conn.recv().unwrap_err();
    assert!(
        err.to_string().contains("protocol version mismatch"),
        "{err}"
    );
    let v = send_json(&server.addr(), &["--bytes", "1M"]);
    assert_eq!(v["bytes"].as_u64(), Some(1 << 20));
}

#[test]
fn client_reports_a_server_with_another_protocol_version() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        let mut conn = Connection::with_prefix(sock, Vec::new()).unwrap();
        let _hello = conn.recv().unwrap();
        conn.send(&Message::Challenge(Challenge {
            version: longhaul_engine::PROTOCOL_VERSION + 1,
            server_nonce: "11".repeat(32),
            token_required: false,
        }))
        .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let out = run(&["send", "--to", &addr, "--bytes", "1M"]);
    fake.join().unwrap();
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("protocol version mismatch"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_random_connection_cannot_attach_to_a_session() {
    let server = Server::start(&[]);
    // Attach header with the right magic but an unknown session and bad proof.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    let mut header = b"LHDA".to_vec();
    header.extend_from_slice(&[0x42; 60]);
    s.write_all(&header).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = [0u8; 1];
    let got = std::io::Read::read(&mut s, &mut reply).unwrap();
    assert!(got == 0 || reply[0] == longhaul_engine::attach::ATTACH_REJECTED);
    assert!(server.wait_log("rejected data connection", Duration::from_secs(5)));
    let v = send_json(&server.addr(), &["--bytes", "1M"]);
    assert_eq!(v["bytes"].as_u64(), Some(1 << 20));
}
