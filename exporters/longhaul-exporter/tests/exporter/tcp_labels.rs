//! The tcp collector's `remote` labels against strangers (issue 46), with
//! real sockets in a network namespace of the test's own (so no other
//! process's sockets on the watched port count, and a whole IPv6 /64 can be
//! made local): short connections from one source cannot take the labels,
//! and labels of peers without connections are free for a real flow.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;

use longhaul_exporter::collector::Round;
use longhaul_exporter::config::Config;
use longhaul_exporter::flows::{MAX_REMOTES, SOURCE_SHARE};
use longhaul_exporter::metrics::Family;
use longhaul_exporter::scrape::COLLECTORS;

/// Runs `f` on a thread of its own in a new network namespace with
/// loopback up and 2001:db8:7::/64 and 2001:db8:9::/64 local (any address
/// in them can be bound). Returns false if this machine cannot.
fn in_own_netns(f: impl FnOnce() + Send + 'static) -> bool {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) of this thread's network namespace; the thread
        // is ours and ends with the test.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return false;
        }
        for args in [
            &["link", "set", "lo", "up"][..],
            &[
                "-6",
                "route",
                "add",
                "local",
                "2001:db8:7::/64",
                "dev",
                "lo",
            ],
            &[
                "-6",
                "route",
                "add",
                "local",
                "2001:db8:9::/64",
                "dev",
                "lo",
            ],
        ] {
            // A child inherits the namespace of the thread that forks it.
            let out = Command::new("ip")
                .args(args)
                .output()
                .expect("ip (iproute2)");
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        }
        f();
        true
    })
    .join()
    .expect("the test in its namespace")
}

fn collector(port: u16) -> Box<dyn longhaul_exporter::collector::Collector> {
    let cfg = Config {
        tcp_ports: port.to_string().parse().unwrap(),
        ..Config::default()
    };
    let spec = COLLECTORS.iter().find(|c| c.name == "tcp").unwrap();
    (spec.new)(&cfg).unwrap()
}

fn remotes(c: &dyn longhaul_exporter::collector::Collector) -> Vec<String> {
    let mut out: Vec<Family> = Vec::new();
    c.update(&Round::new(None), &mut out).unwrap();
    out.iter()
        .find(|f| f.name == "longhaul_tcp_connections")
        .unwrap()
        .samples()
        .iter()
        .map(|s| s.labels[0].1.clone())
        .collect()
}

/// Connects from `from` to the listener (at `to_ip`); the accepted end is
/// returned too.
fn connect(listener: &TcpListener, to_ip: &str, from: IpAddr) -> (TcpStream, TcpStream) {
    let to = SocketAddr::new(
        to_ip.parse().unwrap(),
        listener.local_addr().unwrap().port(),
    );
    let sock = match from {
        IpAddr::V4(_) => socket2_v4(),
        IpAddr::V6(_) => socket2_v6(),
    };
    bind_and_connect(sock, SocketAddr::new(from, 0), to);
    // SAFETY: the descriptor is a connected socket we own.
    let client = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(sock) };
    let (accepted, _) = listener.accept().unwrap();
    (client, accepted)
}

fn socket2_v4() -> i32 {
    // SAFETY: plain socket(2).
    unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) }
}

fn socket2_v6() -> i32 {
    // SAFETY: plain socket(2).
    unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) }
}

fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid; we fill one variant.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = &mut ss as *mut _ as *mut libc::sockaddr_in;
            // SAFETY: sockaddr_storage is large enough for sockaddr_in.
            unsafe {
                (*sin).sin_family = libc::AF_INET as u16;
                (*sin).sin_port = v4.port().to_be();
                (*sin).sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = &mut ss as *mut _ as *mut libc::sockaddr_in6;
            // SAFETY: sockaddr_storage is large enough for sockaddr_in6.
            unsafe {
                (*sin6).sin6_family = libc::AF_INET6 as u16;
                (*sin6).sin6_port = v6.port().to_be();
                (*sin6).sin6_addr.s6_addr = v6.ip().octets();
            }
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn bind_and_connect(fd: i32, from: SocketAddr, to: SocketAddr) {
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    let (src, slen) = sockaddr(from);
    let (dst, dlen) = sockaddr(to);
    let on: libc::c_int = 1;
    // SAFETY: valid socket and addresses of the given lengths. IPv6 binds
    // an address of a local route (not one on an interface) only with
    // IP_FREEBIND.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_IP,
            libc::IP_FREEBIND,
            &on as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(
            libc::bind(fd, &src as *const _ as *const libc::sockaddr, slen),
            0,
            "bind {from}: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::connect(fd, &dst as *const _ as *const libc::sockaddr, dlen),
            0,
            "connect {from} -> {to}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// 300 short connections from one source (addresses of one IPv6 /64) on a
/// watched port, then a long-lived flow from another source: the flow has
/// a `remote` label of its own, while the 300 are open and after they
/// closed. Then single-connection peers of 255 sources take every label and
/// go, and a new flow still gets its own label. Before, the first 256 took every
/// label for an hour and the flow was counted under remote="other".
#[test]
fn short_connections_from_one_source_cannot_take_a_real_flows_remote_label() {
    let ran = in_own_netns(|| {
        let listener = TcpListener::bind("[::]:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = collector(port);
        let stranger: Vec<IpAddr> = (1..=300u16)
            .map(|i| format!("2001:db8:7::1:{i:x}").parse().unwrap())
            .collect();
        let mut held: Vec<_> = stranger
            .iter()
            .map(|ip| connect(&listener, "2001:db8:7::ffff", *ip))
            .collect();
        remotes(&*c);
        let flow_from: IpAddr = "2001:db8:9::5".parse().unwrap();
        let flow = connect(&listener, "2001:db8:7::ffff", flow_from);
        let seen = remotes(&*c);
        assert!(seen.contains(&flow_from.to_string()), "{seen:?}");
        let own = seen.iter().filter(|r| r.starts_with("2001:db8:7:")).count();
        assert_eq!(own, SOURCE_SHARE, "one /64 holds its share: {seen:?}");
        assert!(seen.contains(&"other".to_string()), "{seen:?}");
        held.clear();
        let seen = remotes(&*c);
        assert!(seen.contains(&flow_from.to_string()), "{seen:?}");

        // 255 sources, one short connection each, and 127.0.0.1 (the
        // clients' ends have it as their remote): every label taken...
        let listener4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let port4 = listener4.local_addr().unwrap().port();
        let c = collector(port4);
        let peers: Vec<IpAddr> = (0..MAX_REMOTES as u32 - 1)
            .map(|i| {
                format!("127.1.{}.{}", i / 200, i % 200 + 1)
                    .parse()
                    .unwrap()
            })
            .collect();
        let held: Vec<_> = peers
            .iter()
            .map(|ip| connect(&listener4, "127.0.0.1", *ip))
            .collect();
        let seen = remotes(&*c);
        assert_eq!(seen.len(), MAX_REMOTES, "{seen:?}");
        assert!(!seen.contains(&"other".to_string()), "{seen:?}");
        drop(held);
        // ...and free once their connections are gone (closed sockets in
        // TIME_WAIT have no TCP_INFO and are not counted).
        let later: IpAddr = "127.0.0.2".parse().unwrap();
        let _flow4 = connect(&listener4, "127.0.0.1", later);
        let seen = remotes(&*c);
        assert!(seen.contains(&later.to_string()), "{seen:?}");
        assert!(!seen.contains(&"other".to_string()), "{seen:?}");
        drop(flow);
    });
    if !ran {
        longhaul_testkit::cannot_run(
            "no network namespace of our own (needs root: unshare CLONE_NEWNET)",
        );
    }
}
