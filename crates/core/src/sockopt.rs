//! Socket options of data streams and TCP_INFO sampling.
//!
//! Thin, checked wrappers over setsockopt/getsockopt. Buffer sizes are read
//! back because Linux silently caps them at net.core.wmem_max/rmem_max (the
//! lesson of Solaris' tcp_max_buf: a transfer tuned for 2 MB windows that
//! runs with 208 KB ones is slow for no visible reason).

use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd};

use longhaul_stats_api::TcpInfo;
use longhaul_tcp_info::TcpInfo as RawTcpInfo;

use crate::error::{Error, Result};

/// SO_MAX_PACING_RATE (asm-generic/socket.h); not exported by every libc
/// version we build against.
const SO_MAX_PACING_RATE: libc::c_int = 47;

/// Where the kernel lists the congestion control algorithms it has.
pub(crate) const AVAILABLE_CC_PATH: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
/// The algorithms a process without CAP_NET_ADMIN may choose.
pub(crate) const ALLOWED_CC_PATH: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

pub(crate) fn setsockopt<T>(
    sock: &impl AsRawFd,
    level: i32,
    name: i32,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: `value` points to a live T and we pass its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// getsockopt(2) into a `T`: the value and the length the kernel wrote.
fn getsockopt<T: Default>(
    sock: &impl AsRawFd,
    level: i32,
    name: i32,
) -> std::io::Result<(T, usize)> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: value/len describe a T owned by this frame.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok((value, len as usize))
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) fn getsockopt_int(sock: &impl AsRawFd, level: i32, name: i32) -> std::io::Result<i32> {
    getsockopt::<libc::c_int>(sock, level, name).map(|(v, _)| v)
}

/// Sets SO_SNDBUF and SO_RCVBUF to `bytes`. Returns a warning when the kernel
/// capped either (it reports twice the usable size; we compare halves).
pub fn set_buffers(sock: &impl AsRawFd, bytes: u64) -> Result<Option<String>> {
    let want = bytes.min(i32::MAX as u64) as libc::c_int;
    let mut capped = Vec::new();
    for (name, opt, sysctl) in [
        ("SO_SNDBUF", libc::SO_SNDBUF, "net.core.wmem_max"),
        ("SO_RCVBUF", libc::SO_RCVBUF, "net.core.rmem_max"),
    ] {
        setsockopt(sock, libc::SOL_SOCKET, opt, &want)
            .map_err(|e| Error::io(format!("setting {name}"), e))?;
        let got = getsockopt_int(sock, libc::SOL_SOCKET, opt)
            .map_err(|e| Error::io(format!("reading {name}"), e))?;
        if (got / 2) < want {
            capped.push(format!(
                "{name} capped at {} bytes (asked {want}); raise {sysctl}",
                got / 2
            ));
        }
    }
    Ok((!capped.is_empty()).then(|| format!("warning: {}", capped.join("; "))))
}

/// Where the kernel names the congestion control new sockets start with.
pub(crate) const DEFAULT_CC_PATH: &str = "/proc/sys/net/ipv4/tcp_congestion_control";

/// The congestion control a server's listener gives the sockets it accepts,
/// so that the one a session asks for (or the machine's default), set once
/// the session is known, is all they run. A socket whose handshake ran BBR
/// keeps BBR's pacing after a switch to another algorithm; Reno sets nothing
/// up that outlives it, is built into every kernel and allowed to every
/// process.
pub(crate) const NEUTRAL_CC: &str = "reno";

/// Makes `listener` hand out sockets that start as [`NEUTRAL_CC`], so that
/// what a server sets on each once its session is known (the session's
/// choice or [`default_cc`]) is the only congestion control it ever ran.
/// Returns the server's log line when the kernel refuses: sessions then
/// still get what they ask for, on top of the default's start (BBR's pacing
/// stays on), as with iperf3's own server.
pub fn start_accepted_as_neutral(listener: &TcpListener) -> Option<String> {
    set_cc(listener, NEUTRAL_CC).err().map(|e| {
        format!("warning: accepted sockets start with the default congestion control: {e}")
    })
}

/// The machine's default congestion control.
pub fn default_cc() -> Result<String> {
    let text = std::fs::read_to_string(DEFAULT_CC_PATH)
        .map_err(|e| Error::io(format!("reading {DEFAULT_CC_PATH}"), e))?;
    match text.trim() {
        "" => Err(Error::Unsupported(format!("{DEFAULT_CC_PATH} is empty"))),
        name => Ok(name.to_string()),
    }
}

/// The kernel's available congestion control algorithms.
pub(crate) fn available_cc() -> Vec<String> {
    std::fs::read_to_string(AVAILABLE_CC_PATH)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Error unless this process can use `alg`: the kernel must have it, and a
/// process without CAP_NET_ADMIN may only pick the allowed ones. Tried on an
/// unconnected socket, so a server refuses a session it could not serve
/// before any stream connects.
pub fn check_cc(alg: &str) -> Result<()> {
    let available = available_cc();
    if !available.is_empty() && !available.iter().any(|a| a == alg) {
        return Err(Error::Unsupported(format!(
            "unknown congestion control '{alg}'; available ({AVAILABLE_CC_PATH}): {}",
            available.join(" ")
        )));
    }
    // SAFETY: plain socket(2); the descriptor is owned (and closed) below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Ok(()); // cannot probe (no sockets left?): set_cc reports it per stream
    }
    // SAFETY: fd is a new descriptor nobody else owns.
    let probe = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    set_cc(&probe, alg)
}

/// Sets TCP_CONGESTION.
pub fn set_cc(sock: &impl AsRawFd, alg: &str) -> Result<()> {
    let name = alg.as_bytes();
    // SAFETY: name points to alg's bytes and we pass its length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EPERM) {
        let allowed = std::fs::read_to_string(ALLOWED_CC_PATH).unwrap_or_default();
        return Err(Error::Unsupported(format!(
            "congestion control '{alg}' is not allowed for this unprivileged process; allowed \
             ({ALLOWED_CC_PATH}): {}; add it with sysctl net.ipv4.tcp_allowed_congestion_control",
            allowed.trim()
        )));
    }
    Err(Error::Unsupported(format!(
        "cannot set congestion control '{alg}' ({err}); available ({AVAILABLE_CC_PATH}): {}",
        available_cc().join(" ")
    )))
}

/// The TCP congestion control a socket uses (TCP_CONGESTION).
pub fn get_cc(sock: &impl AsRawFd) -> Option<String> {
    let mut name = [0u8; 32];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: name/len describe a local buffer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let text = &name[..(len as usize).min(name.len())];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// Sets TCP_MAXSEG (an MSS cap; on a connected socket it bounds what this
/// end sends).
pub fn set_mss(sock: &impl AsRawFd, mss: u32) -> Result<()> {
    setsockopt(
        sock,
        libc::IPPROTO_TCP,
        libc::TCP_MAXSEG,
        &(mss as libc::c_int),
    )
    .map_err(|e| Error::io("setting TCP_MAXSEG", e))
}

/// Sets the IP TOS byte (IPv4) or traffic class (IPv6) of a socket.
pub fn set_tos(sock: &impl AsRawFd, ipv6: bool, tos: u8) -> Result<()> {
    let (level, name) = if ipv6 {
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TOS)
    };
    setsockopt(sock, level, name, &(tos as libc::c_int))
        .map_err(|e| Error::io("setting the IP TOS byte", e))
}

/// Sets SO_MAX_PACING_RATE in bytes per second. TCP paces by itself when no
/// fq qdisc is present (since Linux 4.13), so this works on our kernels too.
pub fn set_max_pacing_rate(sock: &impl AsRawFd, bytes_per_second: u64) -> Result<()> {
    setsockopt(
        sock,
        libc::SOL_SOCKET,
        SO_MAX_PACING_RATE,
        &bytes_per_second,
    )
    .map_err(|e| Error::io("setting SO_MAX_PACING_RATE", e))
}

/// SO_RCVLOWAT: the bytes a receiving socket queues before it reports
/// itself readable (Linux caps it at half the receive buffer; end of
/// stream and a closing receive window report readable regardless).
pub fn set_rcvlowat(sock: &impl AsRawFd, bytes: usize) -> Result<()> {
    let value = bytes.clamp(1, i32::MAX as usize) as libc::c_int;
    setsockopt(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &value)
        .map_err(|e| Error::io("setting SO_RCVLOWAT", e))
}

/// The receive buffer the kernel gave a socket (SO_RCVBUF as read back:
/// twice what was asked, the second half for its bookkeeping).
pub(crate) fn rcvbuf(sock: &impl AsRawFd) -> Option<usize> {
    buffer_size(sock, libc::SO_RCVBUF)
}

/// SO_SNDBUF or SO_RCVBUF as the kernel reports it.
fn buffer_size(sock: &impl AsRawFd, name: libc::c_int) -> Option<usize> {
    getsockopt_int(sock, libc::SOL_SOCKET, name)
        .ok()
        .map(|v| v.max(0) as usize)
}

/// TCP_NOTSENT_LOWAT: the most data a sending socket holds that it has not
/// sent yet; past it, writes stop and the socket is not writable (epoll
/// reports it again below half). 0 goes back to the machine's default
/// (net.ipv4.tcp_notsent_lowat: no limit unless a site set one).
pub(crate) fn set_notsent_lowat(sock: &impl AsRawFd, bytes: u64) -> Result<()> {
    let value = bytes.min(u64::from(u32::MAX)) as libc::c_uint;
    setsockopt(sock, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, &value)
        .map_err(|e| Error::io("setting TCP_NOTSENT_LOWAT", e))
}

/// SO_MAX_PACING_RATE in bytes per second, `None` when unlimited (the
/// default) or unknown.
pub(crate) fn max_pacing_rate(sock: &impl AsRawFd) -> Option<u64> {
    // The kernel writes the 64-bit rate when given 8 bytes, else 32 bits.
    let (value, len) = getsockopt::<u64>(sock, libc::SOL_SOCKET, SO_MAX_PACING_RATE).ok()?;
    let unlimited = if len == std::mem::size_of::<u64>() {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    };
    let value = value & unlimited;
    (value != unlimited).then_some(value)
}

/// The bytes a socket holds that it has not sent yet (SIOCOUTQNSD):
/// what TCP_NOTSENT_LOWAT compares with its limit.
pub(crate) fn notsent(sock: &impl AsRawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQNSD writes one int through the pointer.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCOUTQNSD, &mut n) };
    (rc == 0).then(|| n.max(0) as u64)
}

/// The bytes a socket holds that the peer has not acknowledged yet, sent
/// or not (SIOCOUTQ, which Linux numbers as TIOCOUTQ).
pub(crate) fn unacked(sock: &impl AsRawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    (rc == 0).then(|| n.max(0) as u64)
}

/// Whether the peer has acknowledged everything written to the socket
/// (nothing [`unacked`]): a periodic message (a keep-alive, a report, a
/// ping's answer) is only worth sending, or taking, once the last one was
/// taken in.
pub fn drained(sock: &impl AsRawFd) -> bool {
    unacked(sock).is_none_or(|n| n == 0)
}

/// Sets one of SO_SNDBUF or SO_RCVBUF (`which`) to `bytes`, as asked, with
/// no check of what the kernel made of it ([`set_buffers`] sets both and
/// warns of a cap): a small window on purpose.
pub fn set_buffer(sock: &impl AsRawFd, which: libc::c_int, bytes: usize) -> std::io::Result<()> {
    let want = bytes.min(i32::MAX as usize) as libc::c_int;
    setsockopt(sock, libc::SOL_SOCKET, which, &want)
}

/// The send buffer the kernel gave a socket (SO_SNDBUF as read back).
pub(crate) fn sndbuf(sock: &impl AsRawFd) -> Option<usize> {
    buffer_size(sock, libc::SO_SNDBUF)
}

/// The bytes the peer has acknowledged on the socket (tcpi_bytes_acked);
/// `None` where the kernel does not report it.
pub(crate) fn bytes_acked(sock: &impl AsRawFd) -> Option<u64> {
    RawTcpInfo::of_socket(sock.as_raw_fd())?.bytes_acked
}

/// The smoothed round trip of a socket (tcpi_rtt, microseconds). On a
/// socket that only receives it is the handshake's: TCP samples the round
/// trip from acknowledged data, and such a socket sends none.
pub(crate) fn rtt_us(sock: &impl AsRawFd) -> Option<u32> {
    RawTcpInfo::of_socket(sock.as_raw_fd()).map(|i| i.rtt_us)
}

/// Samples TCP_INFO (the fields of [`longhaul_tcp_info::TcpInfo`]).
/// Returns `None` if the socket is gone or the kernel is too old to report
/// every field we use (delivery rate: Linux 4.9).
pub(crate) fn tcp_info(sock: &impl AsRawFd) -> Option<TcpInfo> {
    let info = RawTcpInfo::of_socket(sock.as_raw_fd())?;
    Some(TcpInfo {
        rtt_us: info.rtt_us,
        rttvar_us: info.rttvar_us,
        cwnd_bytes: info.cwnd_bytes(),
        retransmits: u64::from(info.total_retrans),
        pacing_rate_bps: info.pacing_rate?.saturating_mul(8),
        delivery_rate_bps: info.delivery_rate?.saturating_mul(8),
        bytes_acked: info.bytes_acked?,
        segs_out: u64::from(info.data_segs_out?),
    })
}

/// `tcpi_bytes_acked + tcpi_bytes_received` of a socket: everything it
/// has moved either way, as TCP counts it.
pub(crate) fn tcp_progress(sock: &impl AsRawFd) -> Option<u64> {
    let info = RawTcpInfo::of_socket(sock.as_raw_fd())?;
    Some(info.bytes_acked?.wrapping_add(info.bytes_received?))
}

/// Test support: sockets accepted from a [`start_accepted_as_neutral`]
/// listener (for the crates above through the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod neutral {
    use super::*;
    use std::net::TcpStream;

    /// The listener, the machine's default congestion control and another
    /// algorithm every kernel has.
    pub fn listener() -> (TcpListener, String, &'static str) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(start_accepted_as_neutral(&listener), None);
        let default = default_cc().unwrap();
        let other = if default == "reno" { "bbr" } else { "reno" };
        (listener, default, other)
    }

    /// One connection to `listener`: (client end, accepted end), the
    /// accepted end checked to have started as [`NEUTRAL_CC`], not as the
    /// default (BBR here, whose start would leave its pacing on).
    pub fn accept(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(get_cc(&accepted).as_deref(), Some(NEUTRAL_CC));
        (client, accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_info_of_a_loopback_connection() {
        let (c, _s) = longhaul_testkit::loopback_pair();
        let info = tcp_info(&c).expect("TCP_INFO");
        assert!(info.cwnd_bytes > 0);
        assert!(set_buffers(&c, 64 << 10).unwrap().is_none());
        assert!(set_cc(&c, "no-such-cc").is_err());
    }

    #[test]
    fn tcp_info_counts_what_a_sender_sent() {
        use std::io::{Read, Write};
        let (mut c, mut s) = longhaul_testkit::loopback_pair();
        let sent = vec![7u8; 200_000];
        c.write_all(&sent).unwrap();
        let mut got = vec![0u8; sent.len()];
        s.read_exact(&mut got).unwrap();
        // The receiver read everything, so it has been acknowledged (loopback
        // ACKs arrive within microseconds; allow a few).
        let mut info = tcp_info(&c).unwrap();
        for _ in 0..100 {
            if info.bytes_acked >= sent.len() as u64 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            info = tcp_info(&c).unwrap();
        }
        assert!(info.bytes_acked >= sent.len() as u64, "{info:?}");
        assert!(info.segs_out >= 1, "{info:?}");
        assert_eq!(
            tcp_info(&s).unwrap().segs_out,
            0,
            "the receiver sent no data"
        );
    }

    #[test]
    fn the_pacing_rate_reads_back_and_unlimited_is_none() {
        let (c, _s) = longhaul_testkit::loopback_pair();
        assert_eq!(max_pacing_rate(&c), None);
        set_max_pacing_rate(&c, 11_250).unwrap();
        assert_eq!(max_pacing_rate(&c), Some(11_250));
    }

    #[test]
    fn unsent_bytes_are_what_the_peer_has_no_window_for() {
        use std::io::Write;
        let (mut c, s) = longhaul_testkit::loopback_pair();
        set_buffers(&c, 1 << 20).unwrap();
        set_buffers(&s, 64 << 10).unwrap();
        assert_eq!(notsent(&c), Some(0));
        // The peer never reads: once its window is full, whatever the
        // sender still takes stays unsent.
        c.set_nonblocking(true).unwrap();
        let chunk = vec![1u8; 64 << 10];
        let mut written = 0u64;
        while let Ok(n) = c.write(&chunk) {
            written += n as u64;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let unsent = notsent(&c).unwrap();
        let acked = tcp_info(&c).unwrap().bytes_acked;
        assert!(unsent > 0 && unsent < written, "{unsent} of {written}");
        // tcpi_bytes_acked counts the SYN too.
        assert!(
            unsent + acked <= written + 1,
            "{unsent} + {acked} of {written}"
        );
    }
}
