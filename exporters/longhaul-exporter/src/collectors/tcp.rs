//! `tcp` collector: kernel TCP_INFO for every socket whose local or remote
//! port is in `--collector.tcp.ports`, whichever process owns it (longhaul,
//! FDT, iperf3, xrootd), via sock_diag. Flows are labelled `local` and
//! `remote` ("IP:PORT", "[v6]:PORT"); beyond `--collector.tcp.max-flows`
//! the rest are summed into local="other",remote="other".

use crate::collector::{Collector, CollectorSpec};
use crate::config::Config;
use crate::metrics::Family;
use crate::ports::PortRanges;
use crate::sock_diag::{self, TcpSocket};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "tcp",
    default_enabled: true,
    help: "kernel TCP_INFO for sockets on the configured ports (any process)",
    new,
};

fn new(cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(TcpCollector {
        ports: cfg.tcp_ports.clone(),
        max_flows: cfg.max_flows,
    }))
}

pub struct TcpCollector {
    ports: PortRanges,
    max_flows: usize,
}

/// The kernel's "no pacing limit" value of tcpi_pacing_rate.
const UNLIMITED_PACING: u64 = u64::MAX;

impl Collector for TcpCollector {
    fn update(&self, out: &mut Vec<Family>) -> anyhow::Result<()> {
        let mut socks: Vec<TcpSocket> = sock_diag::tcp_sockets()
            .map_err(|e| anyhow::anyhow!("sock_diag dump failed: {e}"))?
            .into_iter()
            .filter(|s| self.ports.contains(s.local.port()) || self.ports.contains(s.remote.port()))
            .filter(|s| s.info.is_some())
            .collect();
        socks.sort_by_key(|s| (s.local, s.remote));
        out.extend(families(&socks, self.max_flows));
        Ok(())
    }
}

fn addr_label(a: &std::net::SocketAddr) -> String {
    a.to_string()
}

/// Builds the tcp families from sockets (all with info), capped.
pub fn families(socks: &[TcpSocket], max_flows: usize) -> Vec<Family> {
    let mut acked = Family::counter(
        "longhaul_tcp_bytes_acked_total",
        "Bytes the peer acknowledged on this TCP flow (tcpi_bytes_acked).",
    );
    let mut received = Family::counter(
        "longhaul_tcp_bytes_received_total",
        "Bytes received on this TCP flow (tcpi_bytes_received).",
    );
    let mut rtt = Family::gauge(
        "longhaul_tcp_rtt_seconds",
        "Smoothed round-trip time of the TCP flow (mean for the \"other\" flows).",
    );
    let mut retrans = Family::counter(
        "longhaul_tcp_retransmits_total",
        "Segments retransmitted on the TCP flow (tcpi_total_retrans).",
    );
    let mut cwnd = Family::gauge(
        "longhaul_tcp_cwnd_bytes",
        "Congestion window of the TCP flow in bytes (snd_cwnd x snd_mss; sum for \"other\").",
    );
    let mut pacing = Family::gauge(
        "longhaul_tcp_pacing_rate_bytes",
        "Pacing rate of the TCP flow in bytes per second (absent when unlimited; sum for \"other\").",
    );
    let mut other = (0u64, 0u64, 0f64, 0u64, 0u64, 0u64, 0u32);
    let n_other = socks.len().saturating_sub(max_flows);
    for (i, s) in socks.iter().enumerate() {
        let Some(info) = s.info else { continue };
        let cwnd_bytes = u64::from(info.snd_cwnd) * u64::from(info.snd_mss);
        let pace = info.pacing_rate.filter(|&p| p != UNLIMITED_PACING);
        if i >= max_flows {
            other.0 += info.bytes_acked.unwrap_or(0);
            other.1 += info.bytes_received.unwrap_or(0);
            other.2 += f64::from(info.rtt_us);
            other.3 += u64::from(info.total_retrans);
            other.4 += cwnd_bytes;
            other.5 += pace.unwrap_or(0);
            other.6 += 1;
            continue;
        }
        let local = addr_label(&s.local);
        let remote = addr_label(&s.remote);
        let l = [("local", local.as_str()), ("remote", remote.as_str())];
        if let Some(v) = info.bytes_acked {
            acked.push_u64(&l, v);
        }
        if let Some(v) = info.bytes_received {
            received.push_u64(&l, v);
        }
        rtt.push(&l, f64::from(info.rtt_us) / 1e6);
        retrans.push_u64(&l, u64::from(info.total_retrans));
        cwnd.push_u64(&l, cwnd_bytes);
        if let Some(p) = pace {
            pacing.push_u64(&l, p);
        }
    }
    if n_other > 0 && other.6 > 0 {
        let l = [("local", "other"), ("remote", "other")];
        acked.push_u64(&l, other.0);
        received.push_u64(&l, other.1);
        rtt.push(&l, other.2 / f64::from(other.6) / 1e6);
        retrans.push_u64(&l, other.3);
        cwnd.push_u64(&l, other.4);
        pacing.push_u64(&l, other.5);
    }
    vec![acked, received, rtt, retrans, cwnd, pacing]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock_diag::TcpInfo;

    fn sock(lport: u16, rport: u16) -> TcpSocket {
        TcpSocket {
            local: format!("127.0.0.1:{lport}").parse().unwrap(),
            remote: format!("[::1]:{rport}").parse().unwrap(),
            state: 1,
            info: Some(TcpInfo {
                snd_mss: 1000,
                rtt_us: 2000,
                snd_cwnd: 10,
                total_retrans: 1,
                pacing_rate: Some(u64::MAX),
                bytes_acked: Some(5),
                bytes_received: Some(7),
            }),
        }
    }

    #[test]
    fn flows_beyond_the_cap_are_summed() {
        let socks: Vec<_> = (0..4).map(|i| sock(7400, 50000 + i)).collect();
        let fams = families(&socks, 2);
        let acked = &fams[0];
        assert_eq!(acked.samples.len(), 3);
        assert_eq!(acked.samples[0].labels[1].1, "[::1]:50000");
        assert_eq!(acked.samples[2].labels[0].1, "other");
        assert_eq!(acked.samples[2].value, 10.0);
        assert_eq!(fams[4].samples[0].value, 10_000.0, "cwnd in bytes");
        assert_eq!(fams[2].samples[0].value, 0.002, "rtt in seconds");
        assert_eq!(fams[5].samples.len(), 1, "unlimited pacing is not a number");
    }
}
