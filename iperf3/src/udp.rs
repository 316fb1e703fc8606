//! UDP tests (`iperf3 -u`): the datagram header, the receiver's loss,
//! order and jitter accounting, a paced sending loop and a receiving loop,
//! and the server's UDP port, which turns "connect" datagrams into one
//! connected socket per stream.
//!
//! Every datagram starts with the sender's clock (seconds and
//! microseconds, 32 bits each, big-endian) and a sequence number counting
//! from 1 (32 bits, or 64 with `--udp-counters-64bit`). The receiver counts
//! a gap in the sequence as lost datagrams and a datagram from the past as
//! out of order (taking one loss back), and keeps the jitter of RFC 1889
//! (A.8): the mean deviation of the transit time, smoothed by 1/16, in
//! seconds. Only differences of the two clocks enter it, so they need not
//! agree.
//!
//! A UDP stream is opened by the client sending the 4-byte connect message
//! to the server's port (the TCP port's number). The server answers from a
//! socket bound to the same port and connected to the client's address:
//! the kernel then delivers that client's datagrams to it rather than to
//! the port's unconnected socket. Many tests run at once, so the port
//! needs to know which test a connect message belongs to: its source
//! address must be that of a test's control connection, and only one test
//! per client address may be opening UDP streams at a time (the others
//! wait their turn, [`UdpPort::expect`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::datapath::Limit;
use crate::pacer::Pacer;
use crate::registry::DatagramStream;

use super::wire;

/// Bytes of the header with 32-bit sequence numbers.
pub(crate) const HEADER_LEN: usize = 12;
/// With `--udp-counters-64bit`.
pub(crate) const WIDE_HEADER_LEN: usize = 16;

/// How often blocking UDP calls come back to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Socket buffer of UDP data sockets when the client names none: a burst
/// of a few hundred datagrams at 1 Gb/s fits.
const DEFAULT_UDP_BUFFER: usize = 4 << 20;

/// How long a test waits for its turn to open UDP streams from its
/// client's address (another test from there is opening its own).
pub(crate) const TURN_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes the header into the start of `buf` (which is at least a header
/// long).
pub(crate) fn write_header(buf: &mut [u8], clock: Duration, seq: u64, wide: bool) {
    let secs = clock.as_secs() as u32;
    let usecs = clock.subsec_micros();
    buf[0..4].copy_from_slice(&secs.to_be_bytes());
    buf[4..8].copy_from_slice(&usecs.to_be_bytes());
    if wide {
        buf[8..16].copy_from_slice(&seq.to_be_bytes());
    } else {
        buf[8..12].copy_from_slice(&(seq as u32).to_be_bytes());
    }
}

/// Reads a header: (sender clock in seconds, sequence number).
pub(crate) fn read_header(buf: &[u8], wide: bool) -> Option<(f64, u64)> {
    let len = if wide { WIDE_HEADER_LEN } else { HEADER_LEN };
    if buf.len() < len {
        return None;
    }
    let word = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let clock = word(0) as f64 + word(4) as f64 / 1e6;
    let seq = if wide {
        u64::from_be_bytes(buf[8..16].try_into().expect("8 bytes"))
    } else {
        word(8) as u64
    };
    Some((clock, seq))
}

/// A receiving UDP stream's figures, as iperf3 reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReceiveStats {
    pub(crate) bytes: u64,
    pub(crate) datagrams: u64,
    /// Highest sequence number seen (iperf3's "packets" of a receiver).
    pub(crate) highest: u64,
    /// Datagrams missing from the sequence (iperf3's "errors").
    pub(crate) lost: i64,
    pub(crate) out_of_order: u64,
    /// Seconds.
    pub(crate) jitter: f64,
    prev_transit: Option<f64>,
}

impl ReceiveStats {
    /// Accounts one datagram of `len` bytes sent at `sent` (sender clock)
    /// and received at `arrived` (our clock), both in seconds.
    pub(crate) fn record(&mut self, len: usize, seq: u64, sent: f64, arrived: f64) {
        self.bytes += len as u64;
        self.datagrams += 1;
        if seq > self.highest {
            if seq > self.highest + 1 {
                self.lost += (seq - self.highest - 1) as i64;
            }
            self.highest = seq;
        } else {
            self.out_of_order += 1;
            if self.lost > 0 {
                self.lost -= 1;
            }
        }
        let transit = arrived - sent;
        let prev = self.prev_transit.replace(transit).unwrap_or(transit);
        self.jitter += ((transit - prev).abs() - self.jitter) / 16.0;
    }
}

/// Our clock for datagram headers: monotonic, like iperf3's.
fn clock(origin: Instant) -> Duration {
    origin.elapsed()
}

/// Sets a UDP data socket's buffers: `window` if the client gave one, else
/// enough for bursts.
pub(crate) fn set_buffers(sock: &UdpSocket, window: u64) -> io::Result<()> {
    let bytes = if window > 0 {
        window.min(i32::MAX as u64) as libc::c_int
    } else {
        DEFAULT_UDP_BUFFER as libc::c_int
    };
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: an int option of the size we pass, on an open socket.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets don't-fragment (IPv4 path MTU discovery "do") on a UDP socket.
pub(crate) fn set_dont_fragment(sock: &UdpSocket) -> io::Result<()> {
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: an int option of the size we pass, on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What a sending UDP stream needs to know.
pub(crate) struct SendPlan {
    pub(crate) block: usize,
    pub(crate) wide: bool,
    /// Per-stream rate, bits/s.
    pub(crate) rate_bps: u64,
    pub(crate) limit: Limit,
    pub(crate) stop: Arc<AtomicBool>,
}

/// Sends datagrams until the plan's limit or stop flag, paced at its rate.
/// A datagram the kernel has no buffer for is retried; a refused one (the
/// peer's port is gone) ends the stream with an error.
pub(crate) fn send_loop(
    sock: &UdpSocket,
    plan: &SendPlan,
    counters: &DatagramStream,
) -> io::Result<()> {
    let origin = Instant::now();
    let pacer = (plan.rate_bps > 0).then(|| Pacer::new(plan.rate_bps));
    let mut buf = vec![0u8; plan.block.max(WIDE_HEADER_LEN)];
    for (i, b) in buf.iter_mut().enumerate().skip(WIDE_HEADER_LEN) {
        *b = (i as u8) | 1;
    }
    let buf = &mut buf[..plan.block];
    let mut seq = 0u64;
    let mut sent = 0u64;
    loop {
        if plan.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match plan.limit {
            Limit::Bytes(total) if sent >= total => return Ok(()),
            Limit::Until(t) if Instant::now() >= t => return Ok(()),
            _ => {}
        }
        if let Some(p) = &pacer {
            let slot = p.reserve(buf.len());
            // At a tiny rate the slot may be days away: wait in steps of
            // [`POLL`], so stop (and the time limit) end the stream on time.
            loop {
                if plan.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let now = Instant::now();
                if matches!(plan.limit, Limit::Until(t) if now >= t) {
                    return Ok(());
                }
                let wait = slot.saturating_duration_since(now);
                if wait.is_zero() {
                    break;
                }
                std::thread::sleep(wait.min(POLL));
            }
        }
        seq += 1;
        write_header(buf, clock(origin), seq, plan.wide);
        match sock.send(buf) {
            Ok(n) => {
                sent += n as u64;
                counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                counters.datagrams.fetch_add(1, Ordering::Relaxed);
            }
            Err(e)
                if e.raw_os_error() == Some(libc::ENOBUFS)
                    || e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                seq -= 1;
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Receives datagrams until `stop`, accounting them into `stats` while
/// `counting` is set (iperf3 counts only while the test runs).
pub(crate) fn receive_loop(
    sock: &UdpSocket,
    block: usize,
    wide: bool,
    counting: &AtomicBool,
    stop: &AtomicBool,
    stats: &Mutex<ReceiveStats>,
    counters: &DatagramStream,
) -> io::Result<()> {
    sock.set_read_timeout(Some(POLL))?;
    let origin = Instant::now();
    // One byte more than a datagram may carry, so an oversized one shows.
    let mut buf = vec![0u8; block.max(WIDE_HEADER_LEN) + 1];
    while !stop.load(Ordering::Relaxed) {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            // ICMP port unreachable from an earlier send: not ours to judge.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(e),
        };
        if !counting.load(Ordering::Relaxed) {
            continue;
        }
        let Some((sent, seq)) = read_header(&buf[..n], wide) else {
            continue;
        };
        // Both clocks start at an arbitrary zero; only differences matter.
        let arrived = clock(origin).as_secs_f64();
        stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(n, seq, sent, arrived);
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        counters.datagrams.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// A UDP socket bound to `addr` with SO_REUSEADDR, so a port's unconnected
/// socket and its connected per-stream sockets can share the address.
pub(crate) fn bind_shared(addr: SocketAddr) -> io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the descriptor is owned right below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: an int option on our socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let (sa, len) = sockaddr(addr);
    // SAFETY: sa holds a sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// A test waiting for its UDP streams.
struct Waiter {
    /// Our address the client's control connection reached: the streams'
    /// sockets answer from it.
    local: IpAddr,
    streams: Sender<UdpSocket>,
    wanted: usize,
}

/// The server's UDP port (see the module documentation).
pub(crate) struct UdpPort {
    socket: UdpSocket,
    port: u16,
    waiting: Mutex<HashMap<IpAddr, Waiter>>,
    turn: Condvar,
}

/// A test's claim on its client address's UDP streams; dropping it lets
/// the next test from that address open its streams.
pub(crate) struct Expectation<'a> {
    port: &'a UdpPort,
    client: IpAddr,
    pub(crate) streams: Receiver<UdpSocket>,
}

impl Drop for Expectation<'_> {
    fn drop(&mut self) {
        self.port
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.client);
        self.port.turn.notify_all();
    }
}

impl UdpPort {
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpPort> {
        let socket = bind_shared(addr)?;
        let port = socket.local_addr()?.port();
        Ok(UdpPort {
            socket,
            port,
            waiting: Mutex::new(HashMap::new()),
            turn: Condvar::new(),
        })
    }

    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Waits for `client`'s turn (up to [`TURN_TIMEOUT`]) and registers a
    /// test that wants `wanted` streams from it, answering from `local`.
    pub(crate) fn expect(
        &self,
        client: IpAddr,
        local: IpAddr,
        wanted: usize,
    ) -> Result<Expectation<'_>, String> {
        let deadline = Instant::now() + TURN_TIMEOUT;
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        while waiting.contains_key(&client) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "another test from {client} kept opening UDP streams for {} s",
                    TURN_TIMEOUT.as_secs()
                ));
            }
            waiting = self
                .turn
                .wait_timeout(waiting, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let (tx, rx) = mpsc::channel();
        waiting.insert(
            client,
            Waiter {
                local,
                streams: tx,
                wanted,
            },
        );
        Ok(Expectation {
            port: self,
            client,
            streams: rx,
        })
    }

    /// Answers connect messages forever (a thread of its own). Datagrams
    /// from addresses no test waits for are dropped without an answer.
    pub(crate) fn run(&self, log: &(dyn Fn(String) + Sync)) {
        let mut buf = [0u8; 64];
        loop {
            let (n, from) = match self.socket.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log(format!("iperf3 UDP port: {e}"));
                    std::thread::sleep(POLL);
                    continue;
                }
            };
            let Some(reply) = wire::udp_connect_reply(&buf[..n]) else {
                continue;
            };
            // A dual-stack port hears IPv4 clients as IPv4-mapped; the
            // stream's socket is IPv4 then (`local`), and so is its peer.
            let from = SocketAddr::new(canonical(from.ip()), from.port());
            let client = from.ip();
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            let Some(w) = waiting.get_mut(&client) else {
                continue;
            };
            if w.wanted == 0 {
                continue;
            }
            match self.open_stream(w.local, from, &reply) {
                Ok(sock) => {
                    w.wanted -= 1;
                    let _ = w.streams.send(sock);
                }
                Err(e) => log(format!("iperf3 UDP stream from {from}: {e}")),
            }
        }
    }

    fn open_stream(&self, local: IpAddr, peer: SocketAddr, reply: &[u8]) -> io::Result<UdpSocket> {
        let sock = bind_shared(SocketAddr::new(local, self.port))?;
        sock.connect(peer)?;
        sock.send(reply)?;
        Ok(sock)
    }
}

/// An address as a source key: IPv4-mapped IPv6 as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Opens one UDP stream to a server, as an iperf3 client does: connect,
/// send the connect message, wait for the reply (skipping up to a few
/// data datagrams that may overtake it in a reverse test).
pub(crate) fn connect_stream(
    server: SocketAddr,
    window: u64,
    timeout: Duration,
) -> io::Result<UdpSocket> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(bind)?;
    set_buffers(&sock, window)?;
    sock.connect(server)?;
    sock.send(&wire::UDP_CONNECT_MSG.to_ne_bytes())?;
    sock.set_read_timeout(Some(timeout))?;
    let mut buf = vec![0u8; 65_536];
    for _ in 0..3 {
        let n = sock.recv(&mut buf)?;
        if wire::is_udp_connect_reply(&buf[..n]) {
            return Ok(sock);
        }
    }
    Err(io::Error::other("no UDP connect reply from the server"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Role;

    #[test]
    fn headers_round_trip_in_both_widths() {
        let mut b = [0u8; 32];
        write_header(&mut b, Duration::new(7, 123_456_000), 42, false);
        assert_eq!(read_header(&b, false), Some((7.123456, 42)));
        write_header(&mut b, Duration::new(1, 0), 1 << 40, true);
        assert_eq!(read_header(&b, true), Some((1.0, 1 << 40)));
        assert_eq!(read_header(&b[..11], false), None);
    }

    #[test]
    fn loss_order_and_jitter_as_iperf3_counts_them() {
        let mut s = ReceiveStats::default();
        // 1, 2, then 5 (3 and 4 missing), then 4 late.
        s.record(100, 1, 0.000, 1.000);
        s.record(100, 2, 0.001, 1.001);
        s.record(100, 5, 0.004, 1.004);
        assert_eq!((s.highest, s.lost, s.out_of_order), (5, 2, 0));
        s.record(100, 4, 0.003, 1.010);
        assert_eq!((s.highest, s.lost, s.out_of_order), (5, 1, 1));
        assert_eq!(s.bytes, 400);
        // Constant transit so far except the late one: jitter is its 7 ms / 16.
        assert!((s.jitter - 0.007 / 16.0).abs() < 1e-9, "{}", s.jitter);
    }

    #[test]
    fn a_connected_socket_takes_its_peers_datagrams_from_the_shared_port() {
        let port = Arc::new(UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let addr = port.local_addr().unwrap();
        let runner = port.clone();
        std::thread::spawn(move || runner.run(&|_| {}));
        let me: IpAddr = "127.0.0.1".parse().unwrap();
        let exp = port.expect(me, me, 2).unwrap();
        let a = connect_stream(addr, 0, Duration::from_secs(5)).unwrap();
        let b = connect_stream(addr, 0, Duration::from_secs(5)).unwrap();
        let sa = exp.streams.recv_timeout(Duration::from_secs(5)).unwrap();
        let sb = exp.streams.recv_timeout(Duration::from_secs(5)).unwrap();
        a.send(b"to-a").unwrap();
        b.send(b"to-b").unwrap();
        let mut buf = [0u8; 16];
        sa.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        sb.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = sa.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"to-a");
        let n = sb.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"to-b");
        // A third stream from the same client is not wanted: no answer.
        assert!(connect_stream(addr, 0, Duration::from_millis(300)).is_err());
        drop(exp);
        // The next test from this address gets its turn at once.
        assert!(port.expect(me, me, 1).is_ok());
    }

    #[test]
    fn paced_datagrams_arrive_counted() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        rx.connect(tx.local_addr().unwrap()).unwrap();
        let plan = SendPlan {
            block: 1000,
            wide: false,
            rate_bps: 8_000_000, // 1 MB/s: 100 datagrams take ~100 ms
            limit: Limit::Bytes(100_000),
            stop: Arc::new(AtomicBool::new(false)),
        };
        // The receiver runs while the datagrams arrive: waiting until all
        // 100 were sent could overflow its socket buffer.
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = stop.clone();
        let receiver = std::thread::spawn(move || {
            let stats = Mutex::new(ReceiveStats::default());
            let got = DatagramStream::new(0, Role::Receive);
            let counting = AtomicBool::new(true);
            receive_loop(&rx, 1000, false, &counting, &stop, &stats, &got).unwrap();
            stats.into_inner().unwrap()
        });
        let sent = DatagramStream::new(0, Role::Send);
        let started = Instant::now();
        send_loop(&tx, &plan, &sent).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(70));
        assert_eq!(sent.datagrams.load(Ordering::Relaxed), 100);
        std::thread::sleep(Duration::from_millis(300));
        stopper.store(true, Ordering::Relaxed);
        let s = receiver.join().unwrap();
        assert_eq!((s.datagrams, s.highest, s.lost), (100, 100, 0));
    }

    #[test]
    fn a_sender_waiting_for_a_far_slot_stops_at_once() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        // 1 bit/s: the second 65507-byte datagram is due in six days.
        let plan = SendPlan {
            block: 65_507,
            wide: false,
            rate_bps: 1,
            limit: Limit::Until(Instant::now() + Duration::from_secs(3600)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let stop = plan.stop.clone();
        let sent = Arc::new(DatagramStream::new(0, Role::Send));
        let counters = sent.clone();
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            let r = send_loop(&tx, &plan, &counters);
            // The socket is closed when the loop returns.
            drop(tx);
            let _ = done_tx.send(r.is_ok());
        });
        let first = Instant::now() + Duration::from_secs(5);
        while sent.datagrams.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < first, "the first datagram was not sent");
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(done.recv_timeout(Duration::from_secs(2)), Ok(true));
        assert_eq!(sent.datagrams.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_dual_stack_port_opens_streams_for_ipv4_clients() {
        let port = Arc::new(UdpPort::bind("[::]:0".parse().unwrap()).unwrap());
        let v4 = SocketAddr::new(
            "127.0.0.1".parse().unwrap(),
            port.local_addr().unwrap().port(),
        );
        let runner = port.clone();
        let said = Arc::new(Mutex::new(Vec::new()));
        let log = said.clone();
        std::thread::spawn(move || runner.run(&|line| log.lock().unwrap().push(line)));
        // As the server registers an IPv4 client reaching [::]: both canonical.
        let me: IpAddr = "127.0.0.1".parse().unwrap();
        let exp = port.expect(me, me, 1).unwrap();
        let client = connect_stream(v4, 0, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}; the port said {:?}", said.lock().unwrap()));
        let stream = exp.streams.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(stream.peer_addr().unwrap(), client.local_addr().unwrap());
        client.send(b"data").unwrap();
        let mut buf = [0u8; 16];
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = stream.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"data");
    }
}
