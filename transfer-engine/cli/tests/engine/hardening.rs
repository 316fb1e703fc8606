//! Unlucky peers: a peer that stops (SIGSTOP) is detected by the data idle
//! timeout the docs promise, with one clean message; a client that reads
//! nothing of its control connection loses its session slot.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use longhaul_engine::connection::connect_prepared;
use longhaul_engine::limits::DATA_IDLE_TIMEOUT;
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
    let started = Instant::now();
    loop {
        let out = run(&["send", "--to", &server.addr(), "--bytes", "1M"]);
        if out.code == Some(0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the session slot is still held {:?} after the pings began: {}",
            started.elapsed(),
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        server.wait_log("Ping before the answer", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    drop(pinger);
}
