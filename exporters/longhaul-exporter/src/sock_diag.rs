//! TCP sockets of every process via netlink NETLINK_SOCK_DIAG (inet_diag),
//! with `struct tcp_info` (INET_DIAG_INFO) for each, the way `ss -ti` gets
//! them. Raw libc netlink: one dump request per address family, answers
//! parsed with explicit offsets and bounds checks (older kernels send a
//! shorter tcp_info; missing fields read as absent, never out of bounds).
//!
//! Layouts from linux/netlink.h, linux/inet_diag.h, linux/sock_diag.h and
//! linux/tcp.h (all stable kernel ABI).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_INFO: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// struct inet_diag_req_v2: family, protocol, ext, pad (4) + states (4) + sockid (48).
const REQ_LEN: usize = 56;
/// struct inet_diag_msg: 4 bytes + sockid (48) + expires, rqueue, wqueue, uid, inode (20).
const DIAG_MSG_LEN: usize = 72;
/// Receive buffer: the kernel fills up to ~32 KiB per recv for dumps.
const RECV_BUF: usize = 64 * 1024;

/// TCP states worth reporting: everything with a live connection. LISTEN
/// has no peer and TIME_WAIT/CLOSE sockets carry no tcp_info.
const STATES: u32 = (1 << 1) // ESTABLISHED
    | (1 << 2) // SYN_SENT
    | (1 << 3) // SYN_RECV
    | (1 << 4) // FIN_WAIT1
    | (1 << 5) // FIN_WAIT2
    | (1 << 8) // CLOSE_WAIT
    | (1 << 9) // LAST_ACK
    | (1 << 11); // CLOSING

/// One TCP socket and the tcp_info fields the exporter reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    /// The socket's inode (idiag_inode); 0 once the socket is closed (a
    /// FIN_WAIT1 or LAST_ACK socket that still sends has none).
    pub inode: u32,
    /// The socket's cookie (idiag_cookie): the kernel's id of the socket
    /// for its whole life, closed or not. Tells a new connection from an
    /// old one that had the same addresses (the inode cannot: it turns 0
    /// at close, and the same connection looked new).
    pub cookie: u64,
    pub info: Option<TcpInfo>,
}

pub use longhaul_tcp_info::TcpInfo;

/// Dumps all TCP sockets (IPv4 and IPv6) in the reporting states.
pub fn tcp_sockets() -> io::Result<Vec<TcpSocket>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        dump(family as u8, &mut out)?;
    }
    Ok(out)
}

fn dump(family: u8, out: &mut Vec<TcpSocket>) -> io::Result<()> {
    // SAFETY: plain socket(2) call; the fd is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    set_recv_timeout(&sock)?;

    let mut req = [0u8; NLMSG_HDRLEN + REQ_LEN];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes()); // seq
    let body = &mut req[NLMSG_HDRLEN..];
    body[0] = family;
    body[1] = libc::IPPROTO_TCP as u8;
    body[2] = 1 << (INET_DIAG_INFO - 1); // idiag_ext
    body[4..8].copy_from_slice(&STATES.to_ne_bytes());

    // SAFETY: zeroed sockaddr_nl is valid; nl_family set below.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: buffer and address are valid for the given lengths.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }

    let mut buf = vec![0u8; RECV_BUF];
    loop {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        if parse_messages(&buf[..n as usize], out)? {
            return Ok(());
        }
    }
}

/// A dump that stalls must not hold the scrape forever.
fn set_recv_timeout(sock: &OwnedFd) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: tv is a valid timeval for the call's duration.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Parses one datagram of netlink messages; true when the dump is done.
pub fn parse_messages(mut b: &[u8], out: &mut Vec<TcpSocket>) -> io::Result<bool> {
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0) as usize;
        let kind = u16_at(b, 4);
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated netlink message",
            ));
        }
        let payload = &b[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = if payload.len() >= 4 {
                    -(u32_at(payload, 0) as i32)
                } else {
                    0
                };
                if errno == 0 {
                    return Ok(true); // an ACK
                }
                return Err(io::Error::from_raw_os_error(errno));
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some(s) = parse_diag_msg(payload) {
                    out.push(s);
                }
            }
            _ => {}
        }
        b = &b[align4(len).min(b.len())..];
    }
    Ok(false)
}

fn parse_diag_msg(p: &[u8]) -> Option<TcpSocket> {
    if p.len() < DIAG_MSG_LEN {
        return None;
    }
    let family = p[0];
    let state = p[1];
    // sockid at 4: sport(be16), dport(be16), src[16], dst[16], if, cookie[2]
    let sport = u16::from_be_bytes([p[4], p[5]]);
    let dport = u16::from_be_bytes([p[6], p[7]]);
    let addr = |o: usize| -> Option<IpAddr> {
        match i32::from(family) {
            libc::AF_INET => Some(IpAddr::V4(Ipv4Addr::new(
                p[o],
                p[o + 1],
                p[o + 2],
                p[o + 3],
            ))),
            libc::AF_INET6 => {
                let a: [u8; 16] = p[o..o + 16].try_into().ok()?;
                let v6 = Ipv6Addr::from(a);
                // Dual-stack sockets talking IPv4 show as ::ffff:a.b.c.d.
                Some(match v6.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(v6),
                })
            }
            _ => None,
        }
    };
    let local = SocketAddr::new(addr(8)?, sport);
    let remote = SocketAddr::new(addr(24)?, dport);
    // idiag_cookie: two host-order u32s, low word first.
    let cookie_lo = u32::from_ne_bytes(p[44..48].try_into().ok()?);
    let cookie_hi = u32::from_ne_bytes(p[48..52].try_into().ok()?);
    let cookie = u64::from(cookie_hi) << 32 | u64::from(cookie_lo);
    // After the sockid: expires, rqueue, wqueue, uid, then the inode.
    let inode = u32::from_ne_bytes(p[68..72].try_into().ok()?);
    let mut info = None;
    let mut attrs = &p[DIAG_MSG_LEN..];
    while attrs.len() >= 4 {
        let alen = u16_at(attrs, 0) as usize;
        let atype = u16_at(attrs, 2);
        if alen < 4 || alen > attrs.len() {
            break;
        }
        if atype & 0x3fff == INET_DIAG_INFO {
            info = TcpInfo::parse(&attrs[4..alen]);
        }
        attrs = &attrs[align4(alen).min(attrs.len())..];
    }
    Some(TcpSocket {
        local,
        remote,
        state,
        inode,
        cookie,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn sees_a_loopback_connection_with_tcp_info() {
        let (mut client, mut server) = longhaul_testkit::loopback_pair();
        let port = server.local_addr().unwrap().port();
        client.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        server.read_exact(&mut got).unwrap();
        let socks = tcp_sockets().unwrap();
        let client_side = socks
            .iter()
            .find(|s| s.remote.port() == port && s.local == client.local_addr().unwrap())
            .expect("client socket in the dump");
        let info = client_side.info.expect("tcp_info requested");
        assert!(info.snd_mss > 0 && info.snd_cwnd > 0);
        assert!(info.bytes_acked.unwrap() >= 100_000, "{info:?}");
        let server_side = socks
            .iter()
            .find(|s| s.local.port() == port && s.remote == client.local_addr().unwrap())
            .expect("server socket in the dump");
        assert!(client_side.inode != 0 && client_side.inode != server_side.inode);
        assert!(client_side.cookie != 0 && client_side.cookie != server_side.cookie);
        assert!(server_side.info.unwrap().bytes_received.unwrap() >= 100_000);
    }

    /// A socket closed with data still unsent lives on (FIN_WAIT1) with
    /// inode 0 but the same cookie: the flow book keys connections by
    /// cookie, so it is not taken for a new connection (whose bytes were
    /// then added to the old one's: the counters doubled at close).
    #[test]
    fn a_socket_closed_with_unsent_data_keeps_its_cookie() {
        let (client, server) = longhaul_testkit::loopback_pair();
        let port = server.local_addr().unwrap().port();
        let local = client.local_addr().unwrap();
        // The server reads nothing: the client's writes fill both buffers.
        client.set_nonblocking(true).unwrap();
        let chunk = [1u8; 65536];
        let mut sent = 0usize;
        while let Ok(n) = (&client).write(&chunk) {
            sent += n;
        }
        assert!(sent > 0);
        let find = || {
            tcp_sockets()
                .unwrap()
                .into_iter()
                .find(|s| s.local == local && s.remote.port() == port)
        };
        let before = find().expect("the client's socket");
        assert!(before.inode != 0 && before.cookie != 0);
        drop(client);
        let after = find().expect("the closed socket still sending");
        assert_eq!(after.inode, 0, "{after:?}");
        assert_eq!(after.cookie, before.cookie);
        drop(server);
    }

    #[test]
    fn sees_ipv6_loopback_connections() {
        let Ok(listener) = TcpListener::bind("[::1]:0") else {
            return; // IPv6 disabled on this host: nothing to see.
        };
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(("::1", port)).unwrap();
        let _server = listener.accept().unwrap();
        let socks = tcp_sockets().unwrap();
        let local = client.local_addr().unwrap();
        assert!(local.is_ipv6());
        assert!(
            socks
                .iter()
                .any(|s| s.local == local && s.remote.port() == port),
            "[::1] client socket missing from the dump"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        assert!(parse_messages(&[0xff; 20], &mut out).is_err());
        assert!(!parse_messages(&[1, 2, 3], &mut out).unwrap());
        assert!(parse_diag_msg(&[0; 10]).is_none());
        assert!(TcpInfo::parse(&[0; 50]).is_none());
        let short = TcpInfo::parse(&[0; 104]).unwrap();
        assert_eq!(short.bytes_acked, None);
    }
}
