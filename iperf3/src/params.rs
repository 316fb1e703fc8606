//! The test an iperf3 client asks for: the parameter block it sends after
//! `PARAM_EXCHANGE` ([`Params`]), read leniently (numbers as integers or
//! floats, unknown keys of newer clients ignored), written as an iperf3
//! client writes it, and checked against a server's limits
//! ([`ServerLimits`]) with the iperf3 error a refused client prints.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::messages::{Direction, Mode, SessionRequest};

use super::wire::ErrorCode;

/// Streams per direction iperf3 allows (its MAX_STREAMS).
pub(crate) const MAX_PARALLEL: u32 = 128;
/// Largest TCP block (`-l`) iperf3 allows: 1 MiB.
pub(crate) const MAX_TCP_BLOCK: u64 = 1 << 20;
/// Default TCP block of iperf3: 128 KiB.
pub(crate) const DEFAULT_TCP_BLOCK: u64 = 128 << 10;
/// UDP datagram payload limits: the 16-byte header at least, what fits in
/// one IPv4 datagram at most.
pub(crate) const MIN_UDP_BLOCK: u64 = 16;
pub(crate) const MAX_UDP_BLOCK: u64 = 65_535 - 8 - 20;
/// Default UDP payload when the client names none (iperf3 sends one always).
pub(crate) const DEFAULT_UDP_BLOCK: u64 = 1460;
/// Largest socket buffer (`-w`) iperf3 allows: 512 MiB.
pub(crate) const MAX_WINDOW: u64 = 512 << 20;
/// Largest MSS (`-M`) iperf3 allows.
pub(crate) const MAX_MSS: u64 = 9 * 1024;
/// iperf3's own longest test: a day.
pub const MAX_TIME: u64 = 86_400;

/// The transport of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
    Sctp,
}

/// The parameters of one test, as the client sends them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    pub(crate) transport: Transport,
    /// Seconds at the start that do not count (`-O`).
    pub(crate) omit: u64,
    /// Seconds of the test (`-t`); 0 with `-n`/`-k`, or for "forever".
    pub(crate) time: u64,
    /// Bytes to send per direction (`-n`), 0 if not given.
    pub(crate) bytes: u64,
    /// Blocks to send per direction (`-k`), 0 if not given.
    pub(crate) blocks: u64,
    /// TCP_MAXSEG (`-M`), 0 if not given.
    pub(crate) mss: u64,
    pub(crate) nodelay: bool,
    /// Streams per direction (`-P`).
    pub(crate) parallel: u32,
    pub(crate) reverse: bool,
    pub(crate) bidirectional: bool,
    /// SO_SNDBUF/SO_RCVBUF (`-w`), 0 for the kernel's autotuning.
    pub(crate) window: u64,
    /// Block (TCP write) or datagram payload (UDP) size (`-l`), 0 if not given.
    pub(crate) len: u64,
    /// Target rate per stream in bits/s (`-b`), 0 for unlimited.
    pub(crate) bandwidth: u64,
    /// Socket pacing rate per stream in bits/s (`--fq-rate`).
    pub(crate) fqrate: u64,
    /// IP TOS / traffic class byte (`-S`).
    pub(crate) tos: u64,
    /// IPv6 flow label (`-L`).
    pub(crate) flowlabel: u64,
    /// TCP congestion control (`-C`).
    pub(crate) congestion: Option<String>,
    /// The client wants the server's output in the results (`--get-server-output`).
    pub(crate) get_server_output: bool,
    /// 64-bit UDP sequence numbers (`--udp-counters-64bit`).
    pub(crate) udp_counters_64bit: bool,
    /// Don't-fragment on UDP (`--dont-fragment`).
    pub(crate) dont_fragment: bool,
    /// RSA-encrypted credentials (`--username`).
    pub(crate) authtoken: Option<String>,
    pub(crate) client_version: Option<String>,
    /// iperf3's free text (`--extra-data`). `campaign=NAME run=NAME` in it
    /// names the campaign and run of the test ([`Params::run_names`]), as
    /// `longhaul send --protocol iperf3 --campaign NAME --run NAME` writes it.
    pub(crate) extra_data: Option<String>,
    /// Keys we read but do not act on, for the log: `server_affinity`,
    /// `title`, `zerocopy`, ...
    pub(crate) ignored: Vec<String>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            transport: Transport::Tcp,
            omit: 0,
            time: 10,
            bytes: 0,
            blocks: 0,
            mss: 0,
            nodelay: false,
            parallel: 1,
            reverse: false,
            bidirectional: false,
            window: 0,
            len: 0,
            bandwidth: 0,
            fqrate: 0,
            tos: 0,
            flowlabel: 0,
            congestion: None,
            get_server_output: false,
            udp_counters_64bit: false,
            dont_fragment: false,
            authtoken: None,
            client_version: None,
            extra_data: None,
            ignored: Vec::new(),
        }
    }
}

/// A number as iperf3 reads it: integer or float, negative or absurd
/// values clamped to 0..=u64::MAX.
fn number(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    Some(if f.is_nan() || f <= 0.0 {
        0
    } else if f >= u64::MAX as f64 {
        u64::MAX
    } else {
        f as u64
    })
}

/// Keys of iperf3's parameter block we know and have no use for.
const KNOWN_IGNORED: &[&str] = &[
    "server_affinity",
    "title",
    "zerocopy",
    "repeating_payload",
    "pacing_timer",
    "burst",
    "congestion_used",
];

impl Params {
    /// Reads a client's parameter block. iperf3 tests keys by presence
    /// (`"reverse": true`), and so do we; a number where a number belongs,
    /// else the block is refused naming the key.
    pub(crate) fn from_json(v: &Value) -> Result<Params, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "the parameters are not a JSON object".to_string())?;
        let mut p = Params {
            time: 0,
            ..Params::default()
        };
        let num = |key: &str| -> Result<Option<u64>, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => number(v)
                    .map(Some)
                    .ok_or_else(|| format!("parameter \"{key}\" is not a number: {v}")),
            }
        };
        let text = |key: &str| -> Result<Option<String>, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(format!("parameter \"{key}\" is not a string: {v}")),
            }
        };
        p.transport = if obj.contains_key("sctp") {
            Transport::Sctp
        } else if obj.contains_key("udp") {
            Transport::Udp
        } else {
            Transport::Tcp
        };
        p.omit = num("omit")?.unwrap_or(0);
        p.time = num("time")?.unwrap_or(0);
        p.bytes = num("num")?.unwrap_or(0);
        p.blocks = num("blockcount")?.unwrap_or(0);
        p.mss = num("MSS")?.unwrap_or(0);
        p.nodelay = obj.contains_key("nodelay");
        p.parallel = num("parallel")?.unwrap_or(1).min(u32::MAX as u64) as u32;
        p.reverse = obj.contains_key("reverse");
        p.bidirectional = obj.contains_key("bidirectional");
        p.window = num("window")?.unwrap_or(0);
        p.len = num("len")?.unwrap_or(0);
        p.bandwidth = num("bandwidth")?.unwrap_or(0);
        p.fqrate = num("fqrate")?.unwrap_or(0);
        p.tos = num("TOS")?.unwrap_or(0);
        p.flowlabel = num("flowlabel")?.unwrap_or(0);
        p.congestion = text("congestion")?.filter(|c| !c.is_empty());
        p.get_server_output = obj.contains_key("get_server_output");
        p.udp_counters_64bit = obj.contains_key("udp_counters_64bit");
        p.dont_fragment = num("dont_fragment")?.unwrap_or(0) != 0;
        p.authtoken = text("authtoken")?;
        p.client_version = text("client_version")?;
        p.extra_data = text("extra_data")?;
        p.ignored = KNOWN_IGNORED
            .iter()
            .filter(|k| obj.contains_key(**k))
            .map(|k| k.to_string())
            .collect();
        Ok(p)
    }

    /// The block as an iperf3 3.12 client writes it.
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        match self.transport {
            Transport::Tcp => m.insert("tcp".into(), json!(true)),
            Transport::Udp => m.insert("udp".into(), json!(true)),
            Transport::Sctp => m.insert("sctp".into(), json!(true)),
        };
        m.insert("omit".into(), json!(self.omit));
        m.insert("time".into(), json!(self.time));
        m.insert("num".into(), json!(self.bytes));
        m.insert("blockcount".into(), json!(self.blocks));
        if self.mss > 0 {
            m.insert("MSS".into(), json!(self.mss));
        }
        if self.nodelay {
            m.insert("nodelay".into(), json!(true));
        }
        m.insert("parallel".into(), json!(self.parallel));
        if self.reverse {
            m.insert("reverse".into(), json!(true));
        }
        if self.bidirectional {
            m.insert("bidirectional".into(), json!(true));
        }
        for (key, v) in [
            ("window", self.window),
            ("len", self.len),
            ("bandwidth", self.bandwidth),
            ("fqrate", self.fqrate),
            ("TOS", self.tos),
            ("flowlabel", self.flowlabel),
        ] {
            if v > 0 {
                m.insert(key.into(), json!(v));
            }
        }
        if let Some(cc) = &self.congestion {
            m.insert("congestion".into(), json!(cc));
        }
        if self.get_server_output {
            m.insert("get_server_output".into(), json!(1));
        }
        if self.udp_counters_64bit {
            m.insert("udp_counters_64bit".into(), json!(1));
        }
        if self.dont_fragment {
            m.insert("dont_fragment".into(), json!(1));
        }
        if let Some(t) = &self.authtoken {
            m.insert("authtoken".into(), json!(t));
        }
        if let Some(extra) = &self.extra_data {
            m.insert("extra_data".into(), json!(extra));
        }
        m.insert(
            "client_version".into(),
            json!(self.client_version.as_deref().unwrap_or(CLIENT_VERSION)),
        );
        Value::Object(m)
    }

    /// The direction as the client sees it (engine terms).
    pub(crate) fn direction(&self) -> Direction {
        if self.bidirectional {
            Direction::Bidir
        } else if self.reverse {
            Direction::Receive
        } else {
            Direction::Send
        }
    }

    /// The block size in use: `len`, or iperf3's default for the transport.
    pub(crate) fn block(&self) -> u64 {
        match (self.len, self.transport) {
            (0, Transport::Udp) => DEFAULT_UDP_BLOCK,
            (0, _) => DEFAULT_TCP_BLOCK,
            (n, _) => n,
        }
    }

    /// Bytes per direction the test ends at (`-n`, or `-k` blocks), if any.
    pub(crate) fn byte_limit(&self) -> Option<u64> {
        if self.bytes > 0 {
            Some(self.bytes)
        } else if self.blocks > 0 {
            Some(self.blocks.saturating_mul(self.block()))
        } else {
            None
        }
    }

    /// Total rate the client asks for, both directions, bits/s (0: unlimited).
    pub(crate) fn requested_rate(&self) -> u64 {
        let directions = if self.bidirectional { 2 } else { 1 };
        self.bandwidth
            .saturating_mul(self.parallel as u64)
            .saturating_mul(directions)
    }

    /// The `extra_data` that names a campaign and a run.
    pub(crate) fn extra_data_of(campaign: Option<&str>, run: Option<&str>) -> Option<String> {
        let words: Vec<String> = [("campaign", campaign), ("run", run)]
            .into_iter()
            .filter_map(|(key, name)| name.map(|n| format!("{key}={n}")))
            .collect();
        (!words.is_empty()).then(|| words.join(" "))
    }

    /// The campaign and run `extra_data` names (`campaign=NAME run=NAME`,
    /// each optional, in any order): plain names only
    /// ([`longhaul_stats_api::check_name`]); anything else in the text, or a
    /// name that is not plain, names nothing (iperf3's extra data is any
    /// client's free text; the test runs all the same).
    pub(crate) fn run_names(&self) -> (Option<String>, Option<String>) {
        let (mut campaign, mut run) = (None, None);
        let Some(text) = self.extra_data.as_deref() else {
            return (None, None);
        };
        for word in text.split_ascii_whitespace() {
            let slot = match word.split_once('=') {
                Some(("campaign", name)) => (&mut campaign, name),
                Some(("run", name)) => (&mut run, name),
                _ => return (None, None),
            };
            if longhaul_stats_api::check_name(slot.1).is_err() {
                return (None, None);
            }
            *slot.0 = Some(slot.1.to_string());
        }
        (campaign, run)
    }

    /// The test's stream layout in the engine's terms: iperf3 connects a
    /// bidirectional test's client-to-server streams first, as the engine
    /// numbers them. Used for roles and the `-n` split; the data phase's
    /// length is the iperf3 end's business.
    pub(crate) fn shape(&self) -> SessionRequest {
        let (campaign, run) = self.run_names();
        SessionRequest {
            mode: Mode::Memory,
            direction: self.direction(),
            streams: self.parallel,
            bytes: self.byte_limit(),
            seconds: Some(self.time as f64),
            buffer: self.window,
            cc: self.congestion.clone(),
            rate_bps: (self.bandwidth > 0)
                .then(|| self.bandwidth.saturating_mul(self.parallel as u64)),
            mode_params: None,
            client_host: None,
            campaign,
            run,
        }
    }
}

/// The version we claim as a client: the iperf3 release whose behaviour we
/// follow and test against.
pub(crate) const CLIENT_VERSION: &str = "3.12";

/// What a server allows an iperf3 test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerLimits {
    /// Longest test, omitted seconds included (`-t` + `-O`).
    pub max_duration: Duration,
    /// Highest total rate of a test (both directions), bits/s; 0: none.
    pub max_rate_bps: u64,
}

/// A refused test: what the client is told and what the log says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) code: ErrorCode,
    pub(crate) why: String,
}

impl Refusal {
    fn new(code: ErrorCode, why: impl Into<String>) -> Refusal {
        Refusal {
            code,
            why: why.into(),
        }
    }
}

impl Params {
    /// Whether the server runs this test, or which iperf3 error refuses it.
    pub(crate) fn check(&self, limits: &ServerLimits) -> Result<(), Refusal> {
        if self.transport == Transport::Sctp {
            return Err(Refusal::new(
                ErrorCode::NoSctp,
                "SCTP tests are not supported",
            ));
        }
        if self.parallel == 0 || self.parallel > MAX_PARALLEL {
            return Err(Refusal::new(
                ErrorCode::NumStreams,
                format!(
                    "{} streams asked, 1 to {MAX_PARALLEL} allowed",
                    self.parallel
                ),
            ));
        }
        match self.transport {
            Transport::Udp
                if self.len > 0 && !(MIN_UDP_BLOCK..=MAX_UDP_BLOCK).contains(&self.len) =>
            {
                return Err(Refusal::new(
                    ErrorCode::UdpBlockSize,
                    format!("UDP datagrams of {} bytes", self.len),
                ))
            }
            Transport::Tcp if self.len > MAX_TCP_BLOCK => {
                return Err(Refusal::new(
                    ErrorCode::BlockSize,
                    format!("TCP blocks of {} bytes", self.len),
                ))
            }
            _ => {}
        }
        if self.window > MAX_WINDOW {
            return Err(Refusal::new(
                ErrorCode::BufSize,
                format!("a {}-byte socket buffer", self.window),
            ));
        }
        if self.mss > MAX_MSS {
            return Err(Refusal::new(
                ErrorCode::Mss,
                format!("an MSS of {}", self.mss),
            ));
        }
        if self.flowlabel > 0 {
            return Err(Refusal::new(
                ErrorCode::Unimplemented,
                "IPv6 flow labels (-L) are not supported",
            ));
        }
        let duration = self.time.saturating_add(self.omit);
        if self.time > MAX_TIME || duration > limits.max_duration.as_secs() {
            return Err(Refusal::new(
                ErrorCode::Duration,
                format!(
                    "a test of {duration} s (with omitted seconds); this server allows {} s",
                    limits.max_duration.as_secs()
                ),
            ));
        }
        let rate = self.requested_rate();
        if limits.max_rate_bps > 0 && rate > limits.max_rate_bps {
            return Err(Refusal::new(
                ErrorCode::TotalRate,
                format!(
                    "{rate} bit/s asked in all; this server allows {} bit/s",
                    limits.max_rate_bps
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ServerLimits {
        ServerLimits {
            max_duration: Duration::from_secs(3600),
            max_rate_bps: 0,
        }
    }

    #[test]
    fn a_debian_3_12_block_reads_as_sent() {
        // As Debian's iperf3 3.12 sends it for `-c ... -t 1 -P 2 -w 2M -C cubic -O 1`.
        let v: Value = serde_json::from_str(
            r#"{"tcp":true,"omit":1,"time":1,"num":0,"blockcount":0,"parallel":2,
                "window":2097152,"len":131072,"pacing_timer":1000,"congestion":"cubic",
                "client_version":"3.12","some_future_key":{"x":1}}"#,
        )
        .unwrap();
        let p = Params::from_json(&v).unwrap();
        assert_eq!(p.transport, Transport::Tcp);
        assert_eq!((p.omit, p.time, p.parallel, p.window), (1, 1, 2, 2 << 20));
        assert_eq!(p.congestion.as_deref(), Some("cubic"));
        assert_eq!(p.direction(), Direction::Send);
        assert_eq!(p.ignored, vec!["pacing_timer".to_string()]);
        assert!(p.check(&limits()).is_ok());
        // Written back and read again: the same test.
        let again = Params::from_json(&p.to_json()).unwrap();
        assert_eq!((again.time, again.parallel, again.window), (1, 2, 2 << 20));
    }

    /// `extra_data` names a test's campaign and run as our client writes
    /// it; any other text, or names that are not plain, name nothing.
    #[test]
    fn extra_data_names_the_campaign_and_run() {
        let named = |extra: &str| {
            let v = serde_json::json!({"tcp": true, "extra_data": extra});
            Params::from_json(&v).unwrap().shape()
        };
        let ours = Params::extra_data_of(Some("fig5"), Some("a-to-b")).unwrap();
        assert_eq!(ours, "campaign=fig5 run=a-to-b");
        let shape = named(&ours);
        assert_eq!(
            (shape.campaign.as_deref(), shape.run.as_deref()),
            (Some("fig5"), Some("a-to-b"))
        );
        assert_eq!(named("run=r1").run.as_deref(), Some("r1"));
        for other in [
            "my notes",
            "campaign=a b",
            "campaign=../x",
            "run=r1 owner=me",
            "",
        ] {
            let shape = named(other);
            assert_eq!((shape.campaign, shape.run), (None, None), "{other:?}");
        }
        let client = Params {
            extra_data: Params::extra_data_of(Some("fig5"), None),
            ..Params::default()
        };
        assert_eq!(client.to_json()["extra_data"], "campaign=fig5");
        assert!(Params::default().to_json().get("extra_data").is_none());
    }

    #[test]
    fn numbers_may_be_floats_and_limits_derive_from_blocks() {
        let v = serde_json::json!({"udp": true, "time": 2.0, "blockcount": 10, "len": 1000,
            "bandwidth": 1e9, "reverse": true, "parallel": 3});
        let p = Params::from_json(&v).unwrap();
        assert_eq!(p.transport, Transport::Udp);
        assert_eq!(p.byte_limit(), Some(10_000));
        assert_eq!(p.requested_rate(), 3_000_000_000);
        assert_eq!(p.direction(), Direction::Receive);
        let bad = serde_json::json!({"tcp": true, "time": "ten"});
        assert!(Params::from_json(&bad).unwrap_err().contains("\"time\""));
    }

    #[test]
    fn limits_refuse_with_iperf3_codes() {
        let check = |v: Value, l: ServerLimits| Params::from_json(&v).unwrap().check(&l);
        let code = |r: Result<(), Refusal>| r.unwrap_err().code;
        assert_eq!(
            code(check(serde_json::json!({"sctp": true}), limits())),
            ErrorCode::NoSctp
        );
        assert_eq!(
            code(check(
                serde_json::json!({"tcp": true, "parallel": 129}),
                limits()
            )),
            ErrorCode::NumStreams
        );
        assert_eq!(
            code(check(
                serde_json::json!({"tcp": true, "time": 3601}),
                limits()
            )),
            ErrorCode::Duration
        );
        assert_eq!(
            code(check(
                serde_json::json!({"tcp": true, "time": 3000, "omit": 601}),
                limits()
            )),
            ErrorCode::Duration
        );
        let capped = ServerLimits {
            max_rate_bps: 1_000_000_000,
            ..limits()
        };
        assert_eq!(
            code(check(
                serde_json::json!({"udp": true, "bandwidth": 600_000_000u64, "parallel": 2}),
                capped
            )),
            ErrorCode::TotalRate
        );
        assert!(check(
            serde_json::json!({"udp": true, "bandwidth": 500_000_000u64, "parallel": 2}),
            capped
        )
        .is_ok());
        assert_eq!(
            code(check(
                serde_json::json!({"udp": true, "len": 70000}),
                limits()
            )),
            ErrorCode::UdpBlockSize
        );
        assert_eq!(
            code(check(
                serde_json::json!({"tcp": true, "flowlabel": 5}),
                limits()
            )),
            ErrorCode::Unimplemented
        );
    }
}
