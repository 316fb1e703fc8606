//! Stable series for short-lived TCP connections: the `tcp` collector's
//! bookkeeping between scrapes.
//!
//! Labelling each connection by its addresses would create new series for
//! every connection (ephemeral ports) forever. Instead a connection belongs to
//! a *group*, (remote host, configured port range), whose series live as long
//! as the peer talks to us:
//!
//! - counters (bytes acknowledged and received, retransmits) are per group:
//!   what the group's closed connections had moved when they were last seen,
//!   plus the live connections' own counters, so they never go down when a
//!   connection ends (bytes a connection moved after the last scrape before
//!   it closed are not seen);
//! - per-connection gauges (RTT, cwnd, pacing rate) carry a `flow` label that
//!   is a *slot*, "0", "1", ..., reused when a connection ends, and capped in
//!   total (`--collector.tcp.max-flows`); connections without a slot are
//!   summed (cwnd, pacing) or averaged (RTT) into flow="other";
//! - at most [`MAX_REMOTES`] peers have a `remote` label of their own, and
//!   one source (an IPv4 address or an IPv6 /64, as
//!   [`longhaul_admission::SourceKey`] counts them) at most
//!   [`SOURCE_SHARE`] of them; the rest share remote="other". A peer's label
//!   is free as soon as it has no connection: a new peer that needs a label
//!   when none is left takes the one idle longest (its series go), so short
//!   connections of strangers cannot hold the labels that real flows need.
//!   A label nobody needs stays, and goes after [`IDLE_EVICTION`] without a
//!   connection.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use longhaul_admission::SourceKey;

use crate::metrics::Family;
use crate::sock_diag::TcpInfo;

/// Distinct peers with their own `remote` label; the rest share "other".
pub const MAX_REMOTES: usize = 256;
/// `remote` labels one source may hold: an eighth, so a host with a whole
/// IPv6 /64 to open connections from cannot take the labels other peers'
/// flows need.
pub const SOURCE_SHARE: usize = MAX_REMOTES / 8;
/// A group without connections this long is dropped with its series.
pub const IDLE_EVICTION: Duration = Duration::from_secs(3600);
/// Label value of what is beyond a cap.
pub const OTHER: &str = "other";

/// The stable identity of a connection: who, and on which configured ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// The peer's IP address ("10.0.0.2", "2001:db8::1"), or "other".
    pub remote: String,
    /// The configured port range the connection matched ("7400-7499").
    pub ports: String,
}

/// One connection: its addresses and its socket cookie (a later connection
/// with the same addresses is another one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowKey {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub cookie: u64,
}

/// A connection seen in this scrape.
#[derive(Debug, Clone)]
pub struct Observed {
    pub group: GroupKey,
    pub flow: FlowKey,
    pub info: TcpInfo,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    acked: u64,
    received: u64,
    retransmits: u64,
}

impl Counters {
    fn of(info: &TcpInfo) -> Counters {
        Counters {
            acked: info.bytes_acked.unwrap_or(0),
            received: info.bytes_received.unwrap_or(0),
            retransmits: u64::from(info.total_retrans),
        }
    }

    fn add(&mut self, other: Counters) {
        self.acked += other.acked;
        self.received += other.received;
        self.retransmits += other.retransmits;
    }
}

#[derive(Debug)]
struct Flow {
    slot: Option<usize>,
    info: TcpInfo,
}

/// One flow's labels' `flow` and its RTT (µs), window and pacing rate.
type PerFlow = (String, f64, u64, Option<u64>);

#[derive(Debug, Default)]
struct Group {
    /// Counters of the connections that ended, as last seen.
    closed: Counters,
    flows: BTreeMap<FlowKey, Flow>,
    /// When the last connection ended (None while there are connections).
    idle_since: Option<Instant>,
}

impl Group {
    fn lowest_free_slot(&self) -> usize {
        let used: BTreeSet<usize> = self.flows.values().filter_map(|f| f.slot).collect();
        (0..).find(|i| !used.contains(i)).expect("a free slot")
    }

    /// Each slotted connection's round-trip time (µs), congestion window and
    /// pacing rate by its slot, in slot order, then the rest as one "other"
    /// (mean RTT, summed window and rates).
    fn per_flow(&self) -> Vec<PerFlow> {
        let mut slotted: Vec<(usize, &TcpInfo)> = self
            .flows
            .values()
            .filter_map(|f| Some((f.slot?, &f.info)))
            .collect();
        slotted.sort_by_key(|(slot, _)| *slot);
        let mut per_flow: Vec<PerFlow> = slotted
            .into_iter()
            .map(|(slot, info)| {
                (
                    slot.to_string(),
                    f64::from(info.rtt_us),
                    info.cwnd_bytes(),
                    pacing_rate(info),
                )
            })
            .collect();
        let others: Vec<&TcpInfo> = self
            .flows
            .values()
            .filter(|f| f.slot.is_none())
            .map(|f| &f.info)
            .collect();
        if !others.is_empty() {
            let rates: Vec<u64> = others.iter().filter_map(|i| pacing_rate(i)).collect();
            per_flow.push((
                OTHER.into(),
                others.iter().map(|i| f64::from(i.rtt_us)).sum::<f64>() / others.len() as f64,
                others.iter().map(|i| i.cwnd_bytes()).sum(),
                (!rates.is_empty()).then(|| rates.iter().sum()),
            ));
        }
        per_flow
    }
}

/// Every group and connection the collector knows, across scrapes.
#[derive(Debug)]
pub struct FlowBook {
    groups: BTreeMap<GroupKey, Group>,
    max_flows: usize,
}

/// The kernel's "no pacing limit" value of tcpi_pacing_rate.
const UNLIMITED_PACING: u64 = u64::MAX;

impl FlowBook {
    pub fn new(max_flows: usize) -> FlowBook {
        FlowBook {
            groups: BTreeMap::new(),
            max_flows,
        }
    }

    /// Whether this connection is already counted (a connection once counted
    /// stays counted until it ends, so its group's counters never go down).
    pub fn knows(&self, flow: &FlowKey) -> bool {
        self.groups.values().any(|g| g.flows.contains_key(flow))
    }

    /// Takes this scrape's connections: ended ones move their counters into
    /// their group's closed total and free their slot, new ones get the
    /// lowest free slot while the cap allows.
    pub fn update(&mut self, observed: Vec<Observed>, now: Instant) {
        let mut seen: BTreeMap<GroupKey, BTreeMap<FlowKey, TcpInfo>> = BTreeMap::new();
        let connected: BTreeSet<String> = observed.iter().map(|o| o.group.remote.clone()).collect();
        let mut labels = Labels::of(&self.groups);
        for o in observed {
            let other = GroupKey {
                remote: OTHER.into(),
                ports: o.group.ports.clone(),
            };
            // A connection stays in the group it was counted in.
            let counted_in_other = self
                .groups
                .get(&other)
                .is_some_and(|g| g.flows.contains_key(&o.flow));
            let group =
                if !counted_in_other && self.label(&o.group.remote, &mut labels, &connected, now) {
                    o.group
                } else {
                    other
                };
            seen.entry(group).or_default().insert(o.flow, o.info);
        }
        // Ended connections first, so their slots are free for new ones.
        for (key, group) in self.groups.iter_mut() {
            let live = seen.get(key);
            let ended: Vec<FlowKey> = group
                .flows
                .keys()
                .filter(|f| !live.is_some_and(|l| l.contains_key(f)))
                .copied()
                .collect();
            for f in ended {
                let flow = group.flows.remove(&f).expect("listed above");
                group.closed.add(Counters::of(&flow.info));
            }
        }
        let mut slotted: usize = self
            .groups
            .values()
            .map(|g| g.flows.values().filter(|f| f.slot.is_some()).count())
            .sum();
        for (key, flows) in seen {
            let group = self.groups.entry(key).or_default();
            for (f, info) in flows {
                match group.flows.get_mut(&f) {
                    Some(flow) => flow.info = info,
                    None => {
                        group.flows.insert(f, Flow { slot: None, info });
                    }
                }
            }
        }
        // Slots for connections without one (new ones, or ones a full cap
        // left out earlier), lowest first, in address order.
        for group in self.groups.values_mut() {
            let waiting: Vec<FlowKey> = group
                .flows
                .iter()
                .filter(|(_, f)| f.slot.is_none())
                .map(|(k, _)| *k)
                .collect();
            for f in waiting {
                if slotted >= self.max_flows {
                    break;
                }
                let slot = group.lowest_free_slot();
                group.flows.get_mut(&f).expect("listed above").slot = Some(slot);
                slotted += 1;
            }
        }
        for group in self.groups.values_mut() {
            group.idle_since = match (group.flows.is_empty(), group.idle_since) {
                (false, _) => None,
                (true, None) => Some(now),
                (true, since) => since,
            };
        }
        self.groups.retain(|_, g| {
            g.idle_since
                .is_none_or(|since| now.duration_since(since) < IDLE_EVICTION)
        });
    }

    /// Whether `remote` has, or now gets, a label of its own: within the
    /// total and its source's share, or in place of a peer without
    /// connections (its source's own first when the share is spent, else
    /// the one idle longest), whose groups go.
    fn label(
        &mut self,
        remote: &str,
        labels: &mut Labels,
        connected: &BTreeSet<String>,
        now: Instant,
    ) -> bool {
        if labels.by_remote.contains_key(remote) {
            return true;
        }
        let Some(source) = source_of(remote) else {
            return false;
        };
        let full = labels.of_source(source) >= SOURCE_SHARE;
        if full || labels.by_remote.len() >= MAX_REMOTES {
            let last_seen = |r: &str| {
                self.groups
                    .iter()
                    .filter(|(k, _)| k.remote == r)
                    .map(|(_, g)| g.idle_since.unwrap_or(now))
                    .max()
                    .unwrap_or(now)
            };
            let victim = labels
                .by_remote
                .iter()
                .filter(|(r, s)| !connected.contains(*r) && (!full || **s == source))
                .min_by_key(|(r, _)| last_seen(r))
                .map(|(r, _)| r.clone());
            let Some(victim) = victim else {
                return false;
            };
            self.groups.retain(|k, _| k.remote != victim);
            labels.remove(&victim);
        }
        labels.add(remote, source);
        true
    }

    /// The collector's families for the current state.
    pub fn families(&self) -> Vec<Family> {
        let mut connections = Family::gauge(
            "longhaul_tcp_connections",
            "Open TCP connections with this peer on this configured port range.",
        );
        let mut acked = Family::counter(
            "longhaul_tcp_bytes_acked_total",
            "Bytes the peer acknowledged on connections with it on this port range \
             (tcpi_bytes_acked; ended connections as last seen).",
        );
        let mut received = Family::counter(
            "longhaul_tcp_bytes_received_total",
            "Bytes received on connections with this peer on this port range (tcpi_bytes_received).",
        );
        let mut retrans = Family::counter(
            "longhaul_tcp_retransmits_total",
            "Segments retransmitted on connections with this peer on this port range \
             (tcpi_total_retrans).",
        );
        let mut rtt = Family::gauge(
            "longhaul_tcp_rtt_seconds",
            "Smoothed round-trip time of one connection (flow = a reused slot; mean for \"other\").",
        );
        let mut cwnd = Family::gauge(
            "longhaul_tcp_cwnd_bytes",
            "Congestion window of one connection in bytes (snd_cwnd x snd_mss; sum for \"other\").",
        );
        let mut pacing = Family::gauge(
            "longhaul_tcp_pacing_rate_bytes_per_second",
            "Pacing rate of one connection in bytes per second (absent when unlimited; sum for \"other\").",
        );
        let mut pacing_old = Family::gauge(
            "longhaul_tcp_pacing_rate_bytes",
            "DEPRECATED, removed in the next release: use longhaul_tcp_pacing_rate_bytes_per_second \
             (same value).",
        );
        for (key, group) in &self.groups {
            let g = [
                ("remote", key.remote.as_str()),
                ("ports", key.ports.as_str()),
            ];
            let mut total = group.closed;
            for flow in group.flows.values() {
                total.add(Counters::of(&flow.info));
            }
            connections.push_u64(&g, group.flows.len() as u64);
            acked.push_u64(&g, total.acked);
            received.push_u64(&g, total.received);
            retrans.push_u64(&g, total.retransmits);

            let per_flow = group.per_flow();
            for (flow, rtt_us, cwnd_b, rate) in per_flow {
                let l = [
                    ("remote", key.remote.as_str()),
                    ("ports", key.ports.as_str()),
                    ("flow", flow.as_str()),
                ];
                rtt.push(&l, rtt_us / 1e6);
                cwnd.push_u64(&l, cwnd_b);
                if let Some(r) = rate {
                    pacing.push_u64(&l, r);
                    pacing_old.push_u64(&l, r);
                }
            }
        }
        vec![
            connections,
            acked,
            received,
            retrans,
            rtt,
            cwnd,
            pacing,
            pacing_old,
        ]
    }
}

/// The peers holding a `remote` label, and how many each source holds.
struct Labels {
    by_remote: BTreeMap<String, SourceKey>,
    per_source: HashMap<SourceKey, usize>,
}

impl Labels {
    fn of(groups: &BTreeMap<GroupKey, Group>) -> Labels {
        let mut l = Labels {
            by_remote: BTreeMap::new(),
            per_source: HashMap::new(),
        };
        for k in groups.keys().filter(|k| k.remote != OTHER) {
            if !l.by_remote.contains_key(&k.remote) {
                if let Some(s) = source_of(&k.remote) {
                    l.add(&k.remote, s);
                }
            }
        }
        l
    }

    fn of_source(&self, s: SourceKey) -> usize {
        self.per_source.get(&s).copied().unwrap_or(0)
    }

    fn add(&mut self, remote: &str, s: SourceKey) {
        self.by_remote.insert(remote.to_string(), s);
        *self.per_source.entry(s).or_default() += 1;
    }

    fn remove(&mut self, remote: &str) {
        if let Some(s) = self.by_remote.remove(remote) {
            if let Some(n) = self.per_source.get_mut(&s) {
                *n -= 1;
            }
        }
    }
}

fn source_of(remote: &str) -> Option<SourceKey> {
    remote.parse::<IpAddr>().ok().map(SourceKey::of)
}

fn pacing_rate(info: &TcpInfo) -> Option<u64> {
    info.pacing_rate.filter(|&p| p != UNLIMITED_PACING)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(acked: u64, rtt_us: u32) -> TcpInfo {
        TcpInfo {
            snd_mss: 1000,
            rtt_us,
            snd_cwnd: 10,
            total_retrans: 1,
            pacing_rate: Some(UNLIMITED_PACING),
            bytes_acked: Some(acked),
            bytes_received: Some(7),
            ..TcpInfo::default()
        }
    }

    fn seen(remote: &str, port: u16, cookie: u64, acked: u64) -> Observed {
        Observed {
            group: GroupKey {
                remote: remote.into(),
                ports: "5201".into(),
            },
            flow: FlowKey {
                local: "10.0.0.1:5201".parse().unwrap(),
                remote: format!("{remote}:{port}").parse().unwrap(),
                cookie,
            },
            info: info(acked, 2000 * cookie as u32),
        }
    }

    fn family<'a>(fams: &'a [Family], name: &str) -> &'a Family {
        fams.iter().find(|f| f.name == name).unwrap()
    }

    fn labels(f: &Family) -> Vec<Vec<String>> {
        f.samples()
            .iter()
            .map(|s| s.labels.iter().map(|(_, v)| v.clone()).collect())
            .collect()
    }

    #[test]
    fn new_connections_reuse_the_series_of_ended_ones() {
        let mut book = FlowBook::new(64);
        let t0 = Instant::now();
        book.update(
            vec![
                seen("10.0.0.2", 40000, 1, 100),
                seen("10.0.0.2", 40001, 2, 50),
            ],
            t0,
        );
        let first = book.families();
        // Both connections end; two new ones (new ports, new cookies) start.
        book.update(
            vec![seen("10.0.0.2", 40002, 3, 5), seen("10.0.0.2", 40003, 4, 6)],
            t0,
        );
        let second = book.families();
        for name in [
            "longhaul_tcp_bytes_acked_total",
            "longhaul_tcp_rtt_seconds",
            "longhaul_tcp_connections",
        ] {
            assert_eq!(
                labels(family(&first, name)),
                labels(family(&second, name)),
                "{name}: no new series for new connections"
            );
        }
        assert_eq!(
            labels(family(&second, "longhaul_tcp_rtt_seconds")),
            [["10.0.0.2", "5201", "0"], ["10.0.0.2", "5201", "1"]]
        );
        // Ended connections' bytes stay in the counter: it never goes down.
        let acked = |f: &[Family]| family(f, "longhaul_tcp_bytes_acked_total").samples()[0].value;
        assert_eq!(acked(&first), 150.0);
        assert_eq!(acked(&second), 150.0 + 11.0);
        assert_eq!(
            family(&second, "longhaul_tcp_retransmits_total").samples()[0].value,
            4.0
        );
    }

    #[test]
    fn connections_beyond_the_cap_are_summed_into_other() {
        let mut book = FlowBook::new(2);
        let t0 = Instant::now();
        book.update(
            (1..=4u64)
                .map(|i| seen("10.0.0.2", 40000 + i as u16, i, 5))
                .collect(),
            t0,
        );
        let fams = book.families();
        let rtt = family(&fams, "longhaul_tcp_rtt_seconds");
        assert_eq!(
            labels(rtt),
            [
                ["10.0.0.2", "5201", "0"],
                ["10.0.0.2", "5201", "1"],
                ["10.0.0.2", "5201", "other"]
            ]
        );
        // cookies 3 and 4: 6 ms and 8 ms -> 7 ms
        assert!((rtt.samples()[2].value - 0.007).abs() < 1e-12);
        assert_eq!(
            family(&fams, "longhaul_tcp_cwnd_bytes").samples()[2].value,
            20_000.0
        );
        assert!(
            family(&fams, "longhaul_tcp_pacing_rate_bytes_per_second")
                .samples()
                .is_empty(),
            "unlimited pacing is not a number"
        );
        assert_eq!(
            family(&fams, "longhaul_tcp_connections").samples()[0].value,
            4.0
        );
        // One ends: a waiting connection takes its slot.
        book.update(
            (2..=4)
                .map(|i| seen("10.0.0.2", 40000 + i as u16, i, 5))
                .collect(),
            t0,
        );
        let rtt = family(&book.families(), "longhaul_tcp_rtt_seconds").clone();
        assert_eq!(labels(&rtt).len(), 3);
        assert_eq!(rtt.samples()[0].value, 0.006, "cookie 3 took slot 0");
    }

    #[test]
    fn many_peers_share_remote_other_and_idle_groups_go() {
        let mut book = FlowBook::new(4096);
        let t0 = Instant::now();
        let peers: Vec<Observed> = (0..MAX_REMOTES as u32 + 10)
            .map(|i| {
                seen(
                    &format!("10.1.{}.{}", i / 250, i % 250 + 1),
                    40000,
                    u64::from(i),
                    1,
                )
            })
            .collect();
        book.update(peers, t0);
        let fams = book.families();
        let groups = labels(family(&fams, "longhaul_tcp_connections"));
        assert_eq!(groups.len(), MAX_REMOTES + 1);
        assert!(groups.contains(&vec!["other".to_string(), "5201".to_string()]));
        book.update(vec![], t0 + Duration::from_secs(10));
        assert_eq!(
            family(&book.families(), "longhaul_tcp_connections")
                .samples()
                .len(),
            MAX_REMOTES + 1,
            "idle groups keep their counters for a while"
        );
        book.update(vec![], t0 + Duration::from_secs(10) + IDLE_EVICTION);
        assert!(family(&book.families(), "longhaul_tcp_connections")
            .samples()
            .is_empty());
    }
}
