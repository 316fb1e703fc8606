//! Unlucky peers: a peer that stops (SIGSTOP) is detected by the data idle
//! timeout the docs promise, with one clean message; a client that reads
//! nothing of its control connection, or trickles its request, loses its
//! session slot.

use std::io::Write;
use std::time::{Duration, Instant};

use longhaul_engine::connection::connect_prepared;
use longhaul_engine::frame::{Frame, HEADER_LEN};
use longhaul_engine::limits::{DATA_IDLE_TIMEOUT, HANDSHAKE_TIMEOUT};
use longhaul_engine::messages::{Message, Ping};
use longhaul_engine::sockopt;

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
    let sock = connect_with_small_window(&server);
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

/// A control connection to `server` whose receive buffer is a few KiB, with
/// segments of 536 bytes (both set before it connects), so the server
/// sizes its send buffer for a slow path (as on a WAN) instead of
/// loopback's 64 KiB segments: what the server writes and the client does
/// not read backs up at once.
fn connect_with_small_window(server: &Server) -> std::net::TcpStream {
    let addr = server.addr().parse().unwrap();
    let (sock, ()) = connect_prepared(addr, |fd| {
        sockopt::set_buffer(&fd, libc::SO_RCVBUF, 4096).unwrap();
        sockopt::set_mss(&fd, 536)
    })
    .unwrap();
    sock
}

/// `n` empty files with names of 32 bytes in `dir` (created): about 150
/// bytes of manifest each.
fn empty_files(dir: &std::path::Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        std::fs::File::create(dir.join(format!("a-file-with-a-longish-name-{i:05}"))).unwrap();
    }
}

/// A pull client that asks for a tree of 20,000 files and reads none of
/// the server's offer (about 3 MB of manifest): the server's write of it
/// gives up once the client took in less than 64 KiB over the control
/// connection's send patience (CONTROL_WRITE_TIMEOUT) and the only session
/// slot comes back; before, each write had its own SO_SNDTIMEO and the
/// slot was still held at 50 s.
#[test]
fn a_puller_that_reads_no_offer_loses_its_session_slot() {
    use longhaul_engine::limits::CONTROL_WRITE_TIMEOUT;
    use longhaul_engine::messages::Direction;

    let t = Scratch::new("unread-offer");
    empty_files(&t.path().join("root/tree"), 20_000);
    let root = t.path().join("root");
    let server = Server::start(&["--max-sessions", "1", "--root", root.to_str().unwrap()]);
    let mut conn = authenticate(connect_with_small_window(&server)).unwrap();
    let asked = Instant::now();
    conn.send(&Message::SessionRequest(disk_request(
        Direction::Receive,
        serde_json::json!({"paths": ["tree"], "checksum": false,
            "io_workers_per_device": 1, "direct": false}),
    )))
    .unwrap();
    slot_comes_back_within(&server, CONTROL_WRITE_TIMEOUT + Duration::from_secs(20));
    let took = asked.elapsed();
    assert!(
        took >= CONTROL_WRITE_TIMEOUT - Duration::from_secs(2),
        "the slot came back after {took:?}, before the send timeout: the offer fit in the \
         buffers, so this tested nothing: {}",
        server.stderr()
    );
    assert!(
        server.wait_log("took in less than 64 KiB in 30 s", Duration::from_secs(5)),
        "{}",
        server.stderr()
    );
    drop(conn);
}

/// A server that freezes while a client sends its manifest (a proxy passes
/// the handshake and the first 64 KiB the client sends, then passes nothing
/// more either way, as a SIGSTOPped server or a hung host would; the
/// manifest of 30,000 files is about 4.5 MB): the client fails after the
/// control connection's send deadline, naming it, instead of waiting to
/// write for ever.
#[test]
fn a_client_whose_server_freezes_during_its_manifest_fails_on_time() {
    use longhaul_engine::limits::CONTROL_WRITE_TIMEOUT;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let t = Scratch::new("unread-manifest");
    let tree = t.path().join("tree");
    empty_files(&tree, 30_000);
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let server = Server::start(&["--root", root.to_str().unwrap()]);
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    // A receive window of a few KiB: the client's manifest backs up in its
    // own send buffer at once.
    sockopt::set_buffer(&proxy, libc::SO_RCVBUF, 4096).unwrap();
    let proxy_addr = proxy.local_addr().unwrap().to_string();
    let upstream = server.addr();
    let frozen = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        let (client, _) = proxy.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let (mut from_server, mut to_client) =
            (server.try_clone().unwrap(), client.try_clone().unwrap());
        let stop = frozen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = from_server.read(&mut buf).unwrap_or(0);
                if n == 0 || stop.load(Ordering::SeqCst) {
                    break;
                }
                if to_client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            // Frozen: what the server says from here on is never passed.
            std::thread::sleep(CONTROL_WRITE_TIMEOUT * 3);
            drop(to_client);
        });
        let (mut from_client, mut to_server) = (client, server);
        let mut passed = 0;
        let mut buf = [0u8; 4096];
        while passed < 64 << 10 {
            let n = from_client.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return;
            }
            to_server.write_all(&buf[..n]).unwrap();
            passed += n;
        }
        frozen.store(true, Ordering::SeqCst);
        // Read nothing more; hold both ends open until the client gives up.
        std::thread::sleep(CONTROL_WRITE_TIMEOUT * 3);
        drop((from_client, to_server));
    });
    let started = Instant::now();
    let out = spawn(&["send", "--to", &proxy_addr, tree.to_str().unwrap()])
        .wait(CONTROL_WRITE_TIMEOUT + Duration::from_secs(30));
    let took = started.elapsed();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("took in less than 64 KiB in 30 s"),
        "{}",
        out.stderr
    );
    assert!(
        took >= CONTROL_WRITE_TIMEOUT - Duration::from_secs(2),
        "failed after {took:?}, before the send deadline: {}",
        out.stderr
    );
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
