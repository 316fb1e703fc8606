//! Unlucky peers on the data path: a peer that stops (SIGSTOP) is detected
//! by the data idle timeout the docs promise, with one clean message.

use std::time::{Duration, Instant};

use longhaul_engine::limits::DATA_IDLE_TIMEOUT;

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
