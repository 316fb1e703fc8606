//! Unlucky peers: a peer that stops (SIGSTOP) is detected by the data idle
//! timeout the docs promise, with one clean message; a client that reads
//! nothing of its control connection, or trickles its request, loses its
//! session slot.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use longhaul_engine::connection::connect_prepared;
use longhaul_engine::frame::{Frame, HEADER_LEN};
use longhaul_engine::limits::{DATA_IDLE_TIMEOUT, HANDSHAKE_TIMEOUT};
use longhaul_engine::messages::{Message, Ping};

use crate::support::*;

#[test]
fn a_stopped_server_fails_the_sender_after_the_idle_timeout() {
    let server = Server::start(&[]);
    let sender = spawn(&[
        "send",
        "--to",
        &server.addr(),
        "--streams",
        "2",
        "--time",
        "300",
        "--interval",
        "0.2",
    ]);
    sender.wait_until_flowing();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(server.pid() as i32, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    let out = sender.wait(Duration::from_secs(120));
    let took = stopped.elapsed();
    // SAFETY: as above; let the server go again so it can be killed.
    unsafe { libc::kill(server.pid() as i32, libc::SIGCONT) };
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        took >= DATA_IDLE_TIMEOUT - Duration::from_secs(2)
            && took <= DATA_IDLE_TIMEOUT + Duration::from_secs(10),
        "the sender gave up after {took:?}, the idle timeout is {DATA_IDLE_TIMEOUT:?}: {}",
        out.stderr
    );
    let err = out.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("timeout"), "{err}");
    assert!(err.contains("no data moved for 30 s"), "{err}");
    // No repeated prefixes ("sending: sending: ...").
    for word in ["sending:", "receiving:", "stream "] {
        assert!(err.matches(word).count() <= 1, "{err}");
    }
}

#[test]
fn a_client_that_pings_without_reading_loses_its_session_slot() {
    let server = Server::start(&["--max-sessions", "1"]);
    // Set before it connects: a receive buffer of a few KiB, and segments
    // of 536 bytes, so the server sizes its send buffer for a slow path
    // (as on a WAN) instead of loopback's 64 KiB segments. The server's
    // answers back up at once.
    let addr = server.addr().parse().unwrap();
    let (sock, ()) = connect_prepared(addr, |fd| {
        for (level, name, value) in [
            (libc::SOL_SOCKET, libc::SO_RCVBUF, 4096),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG, 536),
        ] {
            let value: libc::c_int = value;
            // SAFETY: setsockopt on a socket we own, with a c_int value.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    level,
                    name,
                    (&value as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "setsockopt {name}");
        }
        Ok(())
    })
    .unwrap();
    let mut conn = authenticate(sock).unwrap();
    // Pings, none of the answers read: they would fill the server's send
    // buffer, and it would wait to write while holding the only slot.
    let pinger = std::thread::spawn(move || {
        for seq in 0..longhaul_engine::probe::MAX_PINGS {
            if conn
                .send(&Message::Ping(Ping { seq, limits: true }))
                .is_err()
            {
                break;
            }
        }
        conn
    });
    slot_comes_back_within(&server, Duration::from_secs(15));
    assert!(
        server.wait_log("Ping before the answer", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    drop(pinger);
}

/// Runs a session until one succeeds, that is until the server gave back
/// its only slot; fails once `patience` is spent.
fn slot_comes_back_within(server: &Server, patience: Duration) {
    let started = Instant::now();
    loop {
        let out = run(&["send", "--to", &server.addr(), "--bytes", "1M"]);
        if out.code == Some(0) {
            return;
        }
        assert!(
            started.elapsed() < patience,
            "the session slot is still held {:?} on: {}",
            started.elapsed(),
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_client_that_trickles_its_request_loses_its_session_slot() {
    let server = Server::start(&["--max-sessions", "1"]);
    let sock = std::net::TcpStream::connect(server.addr()).unwrap();
    let conn = authenticate(sock).unwrap();
    // A 64 KiB frame, its header and then a byte a second: each read
    // brings something well inside the 10 s handshake timeout, but the
    // message would take 18 hours.
    let frame = Frame {
        kind: 1,
        payload: vec![b' '; 64 << 10],
    }
    .encode()
    .unwrap();
    let mut raw = conn.socket().try_clone().unwrap();
    raw.write_all(&frame[..HEADER_LEN]).unwrap();
    let trickler = std::thread::spawn(move || {
        for b in &frame[HEADER_LEN..HEADER_LEN + 40] {
            if raw.write_all(std::slice::from_ref(b)).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        false
    });
    slot_comes_back_within(&server, HANDSHAKE_TIMEOUT + Duration::from_secs(5));
    assert!(
        server.wait_log("no answer in time", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    assert!(trickler.join().unwrap(), "the server never cut the trickle");
    drop(conn);
}
