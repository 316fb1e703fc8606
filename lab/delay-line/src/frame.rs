//! What a TUN read returns and what it costs on the emulated wire.
//!
//! Without offload a frame is one IP packet and its wire size is its length.
//! With offload (`--offload`) a frame is a 10-byte `virtio_net_hdr` followed
//! by an IP packet that may be a GSO super-packet: one TCP header in front of
//! up to 64 KB of payload that the kernel will cut into `gso_size` segments
//! later. On the wire each segment carries its own IP and TCP headers, so the
//! pacer charges `len + (segments - 1) * headers`.

use crate::tun::VNET_HDR_LEN;

/// `virtio_net_hdr.gso_type` values (ECN bit masked off).
const GSO_NONE: u8 = 0;
const GSO_ECN: u8 = 0x80;
const IPPROTO_TCP: u8 = 6;

/// IP + TCP header length of a TCP packet, if `ip` is one we can parse.
fn tcp_headers_len(ip: &[u8]) -> Option<usize> {
    let (l3, proto) = match ip.first()? >> 4 {
        4 => ((*ip.first()? & 0x0f) as usize * 4, *ip.get(9)?),
        6 => (40, *ip.get(6)?),
        _ => return None,
    };
    if proto != IPPROTO_TCP {
        return None;
    }
    let doff = (*ip.get(l3 + 12)? >> 4) as usize * 4;
    Some(l3 + doff)
}

/// The IP packet inside a frame.
pub fn packet(frame: &[u8], offload: bool) -> &[u8] {
    if offload {
        frame.get(VNET_HDR_LEN..).unwrap_or(&[])
    } else {
        frame
    }
}

/// Bytes the frame occupies on the emulated wire (sum of the IP packets it
/// stands for).
pub fn wire_len(frame: &[u8], offload: bool) -> usize {
    if !offload {
        return frame.len();
    }
    let ip = packet(frame, true);
    let gso_type = frame.get(1).copied().unwrap_or(GSO_NONE) & !GSO_ECN;
    let gso_size = match frame.get(4..6) {
        Some(b) => u16::from_ne_bytes([b[0], b[1]]) as usize,
        None => 0,
    };
    if gso_type == GSO_NONE || gso_size == 0 {
        return ip.len();
    }
    let Some(headers) = tcp_headers_len(ip).filter(|&h| h < ip.len()) else {
        return ip.len();
    };
    let segments = (ip.len() - headers).div_ceil(gso_size);
    ip.len() + segments.saturating_sub(1) * headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4(payload: usize) -> Vec<u8> {
        let mut ip = vec![0u8; 20 + 32 + payload];
        ip[0] = 0x45;
        ip[9] = IPPROTO_TCP;
        ip[20 + 12] = 8 << 4; // 32-byte TCP header (timestamps)
        ip
    }

    fn with_hdr(gso_type: u8, gso_size: u16, ip: &[u8]) -> Vec<u8> {
        let mut frame = vec![0u8; VNET_HDR_LEN];
        frame[1] = gso_type;
        frame[4..6].copy_from_slice(&gso_size.to_ne_bytes());
        frame.extend_from_slice(ip);
        frame
    }

    #[test]
    fn plain_frames_cost_their_length() {
        assert_eq!(wire_len(&tcp4(1448), false), 1500);
        assert_eq!(wire_len(&with_hdr(GSO_NONE, 0, &tcp4(100)), true), 152);
    }

    #[test]
    fn gso_frames_cost_every_segment_header() {
        // 44 segments of 1448 bytes behind one 52-byte header: on the wire
        // that is 44 packets of 1500 bytes.
        let ip = tcp4(44 * 1448);
        assert_eq!(wire_len(&with_hdr(1, 1448, &ip), true), 44 * 1500);
        // A short last segment.
        let ip = tcp4(2 * 1448 + 100);
        assert_eq!(
            wire_len(&with_hdr(1 | GSO_ECN, 1448, &ip), true),
            2 * 1500 + 152
        );
        assert_eq!(packet(&with_hdr(1, 1448, &ip), true), ip.as_slice());
    }

    #[test]
    fn tcp6_headers() {
        let mut ip = vec![0u8; 40 + 20 + 2 * 1000];
        ip[0] = 0x60;
        ip[6] = IPPROTO_TCP;
        ip[40 + 12] = 5 << 4;
        assert_eq!(wire_len(&with_hdr(4, 1000, &ip), true), 2 * 1060);
    }
}
