//! What a test does when the machine lacks something it needs (root, a
//! tmpfs, network namespaces, a congestion control the kernel allows only
//! to root): it calls [`cannot_run`] and returns.
//!
//! By default that is a failure: CI runs as root on a machine that has all
//! of it, so a test that cannot run there is a broken test, not a skipped
//! one, and `cargo test` never reports success for work it did not do. On
//! a developer's machine without root, `LONGHAUL_ALLOW_SKIP=1 cargo test`
//! turns these failures into a `skipped: <why>` line on stderr.
//!
//! Also the setup that many crates' socket tests share: [`loopback_pair`].

/// The environment variable that allows skipping.
pub const ALLOW_SKIP: &str = "LONGHAUL_ALLOW_SKIP";

/// Whether skipping is allowed here ([`ALLOW_SKIP`] set, not `0`).
pub fn skipping_allowed() -> bool {
    std::env::var_os(ALLOW_SKIP).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The calling test cannot run here because `why`. Panics (the test
/// fails), unless skipping is allowed; then prints `skipped: <why>` and
/// returns, and the caller returns too.
#[track_caller]
pub fn cannot_run(why: &str) {
    if skipping_allowed() {
        eprintln!("skipped: {why}");
        return;
    }
    panic!("this test cannot run here: {why} (set {ALLOW_SKIP}=1 to skip such tests on a machine without it)");
}

/// The directory of the package whose test runs now, as `cargo test` says
/// when it runs the test (`CARGO_MANIFEST_DIR` in its environment), not as
/// it was when the test was built (`env!`): cargo reuses a test binary built
/// from another checkout of the same sources when they share a target
/// directory (CI's clone and a developer's tree under one
/// `CARGO_TARGET_DIR`), and the built-in path would then name the other
/// checkout's fixtures, or a checkout since removed.
pub fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .expect("CARGO_MANIFEST_DIR: run the tests with cargo test")
}

/// A connected TCP pair over loopback: the connecting end, then the
/// accepted one (its listener is gone; sockets tests configure themselves).
pub fn loopback_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("listener address");
    let connecting = std::net::TcpStream::connect(addr).expect("connect over loopback");
    let (accepted, _) = listener.accept().expect("accept over loopback");
    (connecting, accepted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test touches the variable, so no other test sees it change.
    #[test]
    fn a_loopback_pair_is_connected_end_to_end() {
        use std::io::{Read, Write};
        let (mut a, mut b) = loopback_pair();
        assert_eq!(a.local_addr().unwrap(), b.peer_addr().unwrap());
        a.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn a_test_that_cannot_run_fails_unless_skipping_is_allowed() {
        std::env::remove_var(ALLOW_SKIP);
        let failed = std::panic::catch_unwind(|| cannot_run("no tmpfs"));
        let message = failed.expect_err("must fail by default");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            text.contains("no tmpfs") && text.contains(ALLOW_SKIP),
            "{text}"
        );
        std::env::set_var(ALLOW_SKIP, "0");
        assert!(std::panic::catch_unwind(|| cannot_run("x")).is_err());
        std::env::set_var(ALLOW_SKIP, "1");
        cannot_run("no tmpfs");
        std::env::remove_var(ALLOW_SKIP);
    }
}

/// A TCP connection to `to` from the local address `from` (another
/// loopback address: "another source"); std has no bind-then-connect.
pub fn connect_from(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let addr = |a: std::net::SocketAddr| {
        let std::net::SocketAddr::V4(v4) = a else {
            panic!("IPv4 only")
        };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        }
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket we own, bound and connected with valid addresses.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = std::net::TcpStream::from_raw_fd(fd);
        let (f, t) = (addr(from), addr(to));
        if libc::bind(fd, &f as *const _ as *const libc::sockaddr, len) != 0
            || libc::connect(fd, &t as *const _ as *const libc::sockaddr, len) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

#[cfg(feature = "tls")]
pub mod tls;
