//! `struct tcp_info` (linux/tcp.h), as the kernel hands it out through
//! `getsockopt(TCP_INFO)` and through sock_diag's `INET_DIAG_INFO`.
//!
//! The struct is a stable ABI whose fields are only ever appended, so it is
//! read by explicit offsets with bounds checks: an older kernel sends a
//! shorter struct, and the fields it does not have read as absent, never
//! out of bounds. The first fields (up to `tcpi_total_retrans`) exist on
//! every kernel we run on; a buffer too short for them is no tcp_info.

use std::os::fd::RawFd;

/// Byte offsets of the fields we read.
mod offset {
    pub const SND_MSS: usize = 16;
    pub const RTT: usize = 68;
    pub const RTTVAR: usize = 72;
    pub const SND_CWND: usize = 80;
    pub const TOTAL_RETRANS: usize = 100;
    pub const PACING_RATE: usize = 104;
    pub const BYTES_ACKED: usize = 120;
    pub const BYTES_RECEIVED: usize = 128;
    pub const DATA_SEGS_OUT: usize = 156;
    pub const DELIVERY_RATE: usize = 160;
}

/// What a `getsockopt(TCP_INFO)` asks for: more than any kernel's struct
/// holds today (the kernel copies what it has and says how much).
const ASK: usize = 512;

/// The fields of `struct tcp_info` longhaul reports. The `Option`s are
/// fields appended in later kernels (pacing rate 3.15+, bytes counters
/// 4.1+ and 4.2+, data_segs_out 4.6+, delivery rate 4.9+).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// tcpi_snd_mss, bytes.
    pub snd_mss: u32,
    /// tcpi_rtt, microseconds (smoothed).
    pub rtt_us: u32,
    /// tcpi_rttvar, microseconds.
    pub rttvar_us: u32,
    /// tcpi_snd_cwnd, segments.
    pub snd_cwnd: u32,
    /// tcpi_total_retrans, segments over the connection's life.
    pub total_retrans: u32,
    /// tcpi_pacing_rate, bytes/s (`u64::MAX`: no limit).
    pub pacing_rate: Option<u64>,
    /// tcpi_bytes_acked.
    pub bytes_acked: Option<u64>,
    /// tcpi_bytes_received.
    pub bytes_received: Option<u64>,
    /// tcpi_data_segs_out: segments that carried data (retransmits too).
    pub data_segs_out: Option<u32>,
    /// tcpi_delivery_rate, bytes/s.
    pub delivery_rate: Option<u64>,
}

impl TcpInfo {
    /// Reads a `struct tcp_info` of `b.len()` bytes; `None` when it is too
    /// short to hold even the fields every kernel has.
    pub fn parse(b: &[u8]) -> Option<TcpInfo> {
        let u32_at = |o: usize| {
            b.get(o..o + 4)
                .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
        };
        let u64_at = |o: usize| {
            b.get(o..o + 8)
                .map(|s| u64::from_ne_bytes(s.try_into().expect("8 bytes")))
        };
        Some(TcpInfo {
            snd_mss: u32_at(offset::SND_MSS)?,
            rtt_us: u32_at(offset::RTT)?,
            rttvar_us: u32_at(offset::RTTVAR)?,
            snd_cwnd: u32_at(offset::SND_CWND)?,
            total_retrans: u32_at(offset::TOTAL_RETRANS)?,
            pacing_rate: u64_at(offset::PACING_RATE),
            bytes_acked: u64_at(offset::BYTES_ACKED),
            bytes_received: u64_at(offset::BYTES_RECEIVED),
            data_segs_out: u32_at(offset::DATA_SEGS_OUT),
            delivery_rate: u64_at(offset::DELIVERY_RATE),
        })
    }

    /// The congestion window in bytes (snd_cwnd x snd_mss).
    pub fn cwnd_bytes(&self) -> u64 {
        u64::from(self.snd_cwnd) * u64::from(self.snd_mss)
    }

    /// The socket's tcp_info (`getsockopt(TCP_INFO)`); `None` if the
    /// descriptor is not a TCP socket (any more) or the kernel answers
    /// with too little.
    pub fn of_socket(fd: RawFd) -> Option<TcpInfo> {
        let mut buf = [0u8; ASK];
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: buf and len describe a local buffer the kernel fills up
        // to len bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return None;
        }
        TcpInfo::parse(&buf[..(len as usize).min(ASK)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn short_structs_lose_the_late_fields_only() {
        let mut b = vec![0u8; 168];
        b[offset::SND_MSS..offset::SND_MSS + 4].copy_from_slice(&1448u32.to_ne_bytes());
        b[offset::SND_CWND..offset::SND_CWND + 4].copy_from_slice(&10u32.to_ne_bytes());
        b[offset::DELIVERY_RATE..offset::DELIVERY_RATE + 8]
            .copy_from_slice(&125_000u64.to_ne_bytes());
        let full = TcpInfo::parse(&b).unwrap();
        assert_eq!(full.cwnd_bytes(), 14_480);
        assert_eq!(full.delivery_rate, Some(125_000));
        let old = TcpInfo::parse(&b[..112]).unwrap();
        assert_eq!(
            (old.pacing_rate, old.bytes_acked, old.delivery_rate),
            (Some(0), None, None)
        );
        assert_eq!(TcpInfo::parse(&b[..103]), None);
        assert_eq!(TcpInfo::parse(&[]), None);
    }

    #[test]
    fn a_loopback_connection_counts_what_it_sent() {
        let (mut c, mut s) = longhaul_testkit::loopback_pair();
        c.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).unwrap();
        // The receiver's ACKs may trail its read by a moment.
        let mut info = TcpInfo::of_socket(c.as_raw_fd()).unwrap();
        for _ in 0..100 {
            if info.bytes_acked == Some(100_001) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            info = TcpInfo::of_socket(c.as_raw_fd()).unwrap();
        }
        // bytes_acked counts the SYN as one byte.
        assert_eq!(info.bytes_acked, Some(100_001));
        assert!(info.snd_mss > 0 && info.snd_cwnd > 0 && info.data_segs_out.unwrap() > 0);
        let peer = TcpInfo::of_socket(s.as_raw_fd()).unwrap();
        assert_eq!(peer.bytes_received, Some(100_000));
        assert_eq!(peer.data_segs_out, Some(0), "the receiver sent no data");
        assert_eq!(TcpInfo::of_socket(-1), None);
    }
}
