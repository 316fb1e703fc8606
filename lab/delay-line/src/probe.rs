//! A round-trip probe, so the delay line can be verified on hosts without
//! `ping` (the lab images and this CI machine have no iputils). `probe`
//! sends one request at a time, waits for its reply, and reports
//! min/mean/p50/p99/max RTT like ping's summary.
//!
//! Two transports: ICMP echo over a raw socket (`--icmp`, needs root or
//! CAP_NET_RAW; the far end's kernel answers, so no program has to be
//! scheduled there: this is what ping measures) and UDP to the `echo`
//! subcommand (no privileges, but the echo process's wake-up is included).

use crate::clock::now_ns;
use crate::error::{Error, Result};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Marks our datagrams so stray packets are not counted.
const MAGIC: u32 = 0x4c48_444c; // "LHDL"
/// magic (4) + sequence (8) + send time (8).
const PROBE_LEN: usize = 20;

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// Echoes every datagram back to its sender, forever.
pub fn echo(listen: SocketAddr) -> Result<()> {
    let socket = UdpSocket::bind(listen).map_err(io_err("binding the echo socket"))?;
    crate::log(format_args!(
        "echo: listening on {}",
        socket.local_addr().map_err(io_err("local address"))?
    ));
    let mut buf = [0u8; 2048];
    loop {
        let (n, from) = socket
            .recv_from(&mut buf)
            .map_err(io_err("receiving a probe"))?;
        // A failed reply is the prober's loss to count, not ours to die on.
        let _ = socket.send_to(&buf[..n], from);
    }
}

/// Probe settings.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub to: SocketAddr,
    pub count: u32,
    pub interval: Duration,
    pub timeout: Duration,
    /// ICMP echo instead of UDP (the port of `to` is then ignored).
    pub icmp: bool,
}

/// Round-trip statistics in seconds.
#[derive(Debug, Clone, Default)]
pub struct ProbeSummary {
    pub sent: u32,
    pub received: u32,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl ProbeSummary {
    fn from_samples(sent: u32, mut rtts: Vec<f64>) -> Self {
        rtts.sort_by(f64::total_cmp);
        let n = rtts.len();
        if n == 0 {
            return ProbeSummary {
                sent,
                ..Default::default()
            };
        }
        let pct = |p: f64| rtts[((p * (n - 1) as f64).round() as usize).min(n - 1)];
        ProbeSummary {
            sent,
            received: n as u32,
            min: rtts[0],
            mean: rtts.iter().sum::<f64>() / n as f64,
            p50: pct(0.5),
            p99: pct(0.99),
            max: rtts[n - 1],
        }
    }

    /// The RTTs in milliseconds: min, mean, p50, p99, max.
    fn rtts_ms(&self) -> [f64; 5] {
        [self.min, self.mean, self.p50, self.p99, self.max].map(|s| s * 1e3)
    }

    /// One JSON object, RTTs in milliseconds.
    pub fn to_json(&self) -> String {
        let [min, mean, p50, p99, max] = self.rtts_ms();
        format!(
            "{{\"sent\":{},\"received\":{},\"rtt_ms\":{{\"min\":{min:.3},\"mean\":{mean:.3},\"p50\":{p50:.3},\"p99\":{p99:.3},\"max\":{max:.3}}}}}",
            self.sent, self.received,
        )
    }

    /// ping-style summary line.
    pub fn to_text(&self) -> String {
        let [min, mean, p50, p99, max] = self.rtts_ms();
        format!(
            "{} sent, {} received; rtt min/mean/p50/p99/max = {min:.3}/{mean:.3}/{p50:.3}/{p99:.3}/{max:.3} ms",
            self.sent, self.received,
        )
    }
}

/// Builds a probe payload: magic, sequence, send time.
fn payload(seq: u64, sent_at: u64) -> [u8; PROBE_LEN] {
    let mut msg = [0u8; PROBE_LEN];
    msg[..4].copy_from_slice(&MAGIC.to_be_bytes());
    msg[4..12].copy_from_slice(&seq.to_be_bytes());
    msg[12..20].copy_from_slice(&sent_at.to_be_bytes());
    msg
}

/// The send time in a reply's payload, if it is ours and answers `seq`.
fn matching_send_time(reply: &[u8], seq: u64) -> Option<u64> {
    (reply.len() == PROBE_LEN
        && reply[..4] == MAGIC.to_be_bytes()
        && reply[4..12] == seq.to_be_bytes())
    .then(|| u64::from_be_bytes(reply[12..20].try_into().expect("8 bytes")))
}

/// Internet checksum (RFC 1071) of an ICMP message.
fn icmp_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_HEADER: usize = 8;

enum Transport {
    Udp(UdpSocket),
    Icmp {
        fd: OwnedFd,
        to: libc::sockaddr_in,
        id: u16,
    },
}

impl Transport {
    fn open(config: &ProbeConfig) -> Result<Transport> {
        if !config.icmp {
            let bind: SocketAddr = if config.to.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal address")
            } else {
                "[::]:0".parse().expect("literal address")
            };
            let socket = UdpSocket::bind(bind).map_err(io_err("binding the probe socket"))?;
            socket
                .connect(config.to)
                .map_err(io_err("connecting the probe socket"))?;
            return Ok(Transport::Udp(socket));
        }
        let IpAddr::V4(v4) = config.to.ip() else {
            return Err(Error::Usage(
                "probe --icmp supports IPv4 targets only".into(),
            ));
        };
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            )
        };
        if raw < 0 {
            return Err(Error::Io {
                what: "opening a raw ICMP socket (needs root or CAP_NET_RAW)",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_in is plain data; zero is a valid starting value.
        let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        to.sin_family = libc::AF_INET as libc::sa_family_t;
        to.sin_addr.s_addr = u32::from(v4).to_be();
        Ok(Transport::Icmp {
            fd,
            to,
            id: (std::process::id() & 0xffff) as u16,
        })
    }

    fn send(&self, seq: u64, sent_at: u64) {
        let body = payload(seq, sent_at);
        // Send errors (e.g. unreachable) show up as lost probes.
        match self {
            Transport::Udp(socket) => {
                let _ = socket.send(&body);
            }
            Transport::Icmp { fd, to, id } => {
                let mut msg = [0u8; ICMP_HEADER + PROBE_LEN];
                msg[0] = ICMP_ECHO_REQUEST;
                msg[4..6].copy_from_slice(&id.to_be_bytes());
                msg[6..8].copy_from_slice(&(seq as u16).to_be_bytes());
                msg[ICMP_HEADER..].copy_from_slice(&body);
                let sum = icmp_checksum(&msg);
                msg[2..4].copy_from_slice(&sum.to_be_bytes());
                // SAFETY: valid buffer and sockaddr_in of the stated size.
                unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        msg.as_ptr().cast(),
                        msg.len(),
                        0,
                        (to as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    )
                };
            }
        }
    }

    /// Waits until `deadline` (monotonic ns) for the reply to `seq`;
    /// returns its send time.
    fn receive(&self, seq: u64, deadline: u64) -> Result<Option<u64>> {
        let mut buf = [0u8; 1500];
        loop {
            let now = now_ns();
            if now >= deadline {
                return Ok(None);
            }
            let wait = Duration::from_nanos(deadline - now);
            match self {
                Transport::Udp(socket) => {
                    socket
                        .set_read_timeout(Some(wait))
                        .map_err(io_err("setting the probe timeout"))?;
                    if let Ok(n) = socket.recv(&mut buf) {
                        if let Some(t0) = matching_send_time(&buf[..n], seq) {
                            return Ok(Some(t0));
                        }
                    }
                }
                Transport::Icmp { fd, id, .. } => {
                    if !crate::clock::wait_readable(fd.as_raw_fd(), wait.as_nanos() as u64)
                        .map_err(io_err("waiting for an ICMP reply"))?
                    {
                        continue;
                    }
                    // SAFETY: buf is a valid writable buffer.
                    let n = unsafe {
                        libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                    };
                    if n <= 0 {
                        continue;
                    }
                    // Raw IPv4 sockets deliver the IP header too.
                    let packet = &buf[..n as usize];
                    let ihl = (packet[0] & 0x0f) as usize * 4;
                    let Some(icmp) = packet.get(ihl..) else {
                        continue;
                    };
                    if icmp.len() == ICMP_HEADER + PROBE_LEN
                        && icmp[0] == ICMP_ECHO_REPLY
                        && icmp[4..6] == id.to_be_bytes()
                    {
                        if let Some(t0) = matching_send_time(&icmp[ICMP_HEADER..], seq) {
                            return Ok(Some(t0));
                        }
                    }
                }
            }
        }
    }
}

/// Sends `count` probes, one at a time, and summarizes their RTTs.
pub fn probe(config: &ProbeConfig) -> Result<ProbeSummary> {
    let transport = Transport::open(config)?;
    let mut rtts = Vec::with_capacity(config.count as usize);
    for seq in 0..config.count as u64 {
        let sent_at = now_ns();
        transport.send(seq, sent_at);
        let deadline = sent_at + config.timeout.as_nanos() as u64;
        if let Some(t0) = transport.receive(seq, deadline)? {
            rtts.push((now_ns() - t0) as f64 / 1e9);
        }
        if seq + 1 < config.count as u64 {
            std::thread::sleep(config.interval);
        }
    }
    Ok(ProbeSummary::from_samples(config.count, rtts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_known_echo_request() {
        // type 8, code 0, id 1, seq 1, no payload: checksum 0xf7fd.
        let msg = [8, 0, 0, 0, 0, 1, 0, 1];
        assert_eq!(icmp_checksum(&msg), 0xf7fd);
        let mut with_sum = msg;
        with_sum[2..4].copy_from_slice(&0xf7fdu16.to_be_bytes());
        assert_eq!(icmp_checksum(&with_sum), 0);
    }

    #[test]
    fn summary_percentiles() {
        let s = ProbeSummary::from_samples(5, vec![0.004, 0.001, 0.003, 0.002, 0.005]);
        assert_eq!(s.received, 5);
        assert_eq!(s.min, 0.001);
        assert_eq!(s.p50, 0.003);
        assert_eq!(s.max, 0.005);
        assert!((s.mean - 0.003).abs() < 1e-12);
        assert!(s.to_json().contains("\"p50\":3.000"));
    }

    #[test]
    fn probe_against_loopback_echo() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok((n, from)) = server.recv_from(&mut buf) {
                let _ = server.send_to(&buf[..n], from);
            }
        });
        let summary = probe(&ProbeConfig {
            to: addr,
            count: 5,
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(1),
            icmp: false,
        })
        .unwrap();
        assert_eq!(summary.received, 5);
        assert!(summary.max < 0.5);
    }
}
