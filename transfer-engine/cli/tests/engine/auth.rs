//! Tokens, the challenge-response and protocol versions.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use longhaul_engine::auth::Token;
use longhaul_engine::connection::Connection;
use longhaul_engine::messages::{Challenge, Hello, Message};
use longhaul_stats_api::AuthFailed;

use crate::support::*;

/// The control port's failed logins, once they read `want` (within 10 s).
fn wait_for_auth_failures(server: &Server, want: AuthFailed) {
    let t = Instant::now();
    loop {
        let got = snapshot(server.stats_port)
            .engine
            .admission
            .into_iter()
            .find(|a| a.listener == "longhaul")
            .map(|a| a.auth_failed)
            .unwrap_or_default();
        if got == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "failed logins {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
    wait_for_auth_failures(
        &server,
        AuthFailed {
            bad_version: 1,
            ..AuthFailed::default()
        },
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
    wait_for_auth_failures(
        &server,
        AuthFailed {
            bad_proof: 1,
            ..AuthFailed::default()
        },
    );
    let v = send_json(&server.addr(), &["--bytes", "1M"]);
    assert_eq!(v["bytes"].as_u64(), Some(1 << 20));
}

/// A guesser: 100 handshakes with a wrong token from one address, 8 at a
/// time. Each is counted as a bad token on the stats API (before, only
/// `accepted` rose), and past the first 10 they are slowed down to 10 a
/// second whatever the parallelism (before, 100 took 1.1 s). A client
/// with the right token from the same address is admitted promptly
/// afterwards: its proof holds, so it waits for no budget.
#[test]
fn wrong_tokens_are_counted_and_slowed_and_the_right_one_gets_in_promptly() {
    const TRIES: usize = 100;
    let good = token_file("good-guessed", "correct horse battery staple");
    let server = Server::start(&["--token-file", &good]);
    let wrong = Token::from_bytes(b"a guess");
    let tried = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                while tried.fetch_add(1, Ordering::Relaxed) < TRIES {
                    let sock = TcpStream::connect(server.addr()).unwrap();
                    let mut conn = Connection::new(sock).unwrap();
                    let err =
                        longhaul_engine::handshake::client_authenticate(&mut conn, Some(&wrong))
                            .err()
                            .expect("a wrong token is refused");
                    assert!(err.to_string().contains("wrong token"), "{err}");
                }
            });
        }
    });
    let took = started.elapsed();
    wait_for_auth_failures(
        &server,
        AuthFailed {
            bad_token: TRIES as u64,
            ..AuthFailed::default()
        },
    );
    // 10 at once, then 10 a second: the other 90 take 9 s.
    assert!(
        took >= Duration::from_secs(8),
        "{TRIES} wrong tokens in {took:?}: nothing slowed them down"
    );
    let t = Instant::now();
    let v = send_json(&server.addr(), &["--bytes", "1M", "--token-file", &good]);
    assert_eq!(v["bytes"].as_u64(), Some(1 << 20));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the right token waited {:?}",
        t.elapsed()
    );
}
