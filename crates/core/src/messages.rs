//! Every message of the control connection, enumerated in one place.
//!
//! A message travels as one [`Frame`]: the type byte is [`MessageType`], the
//! payload is the message body as compact JSON (bodies are small and sent a
//! handful of times per session, so readability and forward compatibility
//! beat a hand-packed layout; the bulk data never goes through here).
//!
//! Handshake and session, in order:
//!
//! ```text
//! client                                   server
//!   Hello {version, client_nonce}   ->
//!                                   <-   Challenge {version, server_nonce, token_required}
//!   Auth {proof}                    ->
//!                                   <-   AuthOk {proof}
//!   SessionRequest {...}            ->
//!                                   <-   SessionAccepted {session_id, attach_key?}
//!   (data connections attach, see crate::attach)
//!   Start                           ->
//!   ... data ...
//!   StreamsReport {streams}         ->   (every REPORT_PERIOD while the data phase runs)
//!   Done {streams, cpu}             <->  Done {streams, cpu}   (each end, when its workers end)
//! ```
//!
//! `StreamsReport` makes the client's end of every stream visible on the
//! server's stats API while the run lasts (`longhaul send` has no stats API of
//! its own): its bytes and TCP_INFO, so the sending side's congestion window
//! and retransmits reach Prometheus whichever end sends (docs/visibility.md).
//!
//! Instead of `SessionRequest`, a client may send `Ping {seq, limits}` any
//! number of times; the server answers each with `Pong {seq, limits?}`
//! (`longhaul advise`: RTT over the control connection and the server's
//! socket buffer limits).
//!
//! Either end may send `Error {code, message}` at any point and close.
//! `ModeData` carries mode-specific messages (disk mode's manifests) as JSON.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::frame::Frame;

/// Type byte of each message. Codes 0x40..=0x7f are reserved for
/// mode-specific extensions (see [`Message::ModeData`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageType {
    Hello = 0x01,
    Challenge = 0x02,
    Auth = 0x03,
    AuthOk = 0x04,
    SessionRequest = 0x05,
    SessionAccepted = 0x06,
    Start = 0x07,
    Done = 0x08,
    Error = 0x09,
    /// `longhaul advise`: RTT probe (and the server's socket buffer limits).
    Ping = 0x0a,
    Pong = 0x0b,
    /// The client's streams (bytes and TCP_INFO) during the data phase.
    StreamsReport = 0x0c,
    ModeData = 0x40,
}

impl MessageType {
    pub(crate) fn from_byte(b: u8) -> Option<MessageType> {
        use MessageType::*;
        Some(match b {
            0x01 => Hello,
            0x02 => Challenge,
            0x03 => Auth,
            0x04 => AuthOk,
            0x05 => SessionRequest,
            0x06 => SessionAccepted,
            0x07 => Start,
            0x08 => Done,
            0x09 => Error,
            0x0a => Ping,
            0x0b => Pong,
            0x0c => StreamsReport,
            0x40 => ModeData,
            _ => return None,
        })
    }
}

/// Transfer mode of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Memory,
    Disk,
    /// Fixed-length messages, request/response or streamed
    /// (the engine's `planes::messages`).
    Messages,
}

/// Direction of a session as the client (`longhaul send`) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client sends, server receives (default).
    Send,
    /// Server sends, client receives (`--reverse`).
    Receive,
    /// Both at once, N streams each way (`--bidir`).
    Bidir,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    /// 32 random bytes, hex.
    pub client_nonce: String,
    pub software: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Challenge {
    pub version: u32,
    /// 32 random bytes, hex.
    pub server_nonce: String,
    /// The server has a token and will check [`Auth::proof`].
    pub token_required: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Auth {
    /// HMAC proof of the token (hex), absent when the client has no token.
    pub proof: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthOk {
    /// The server's proof that it knows the token too (hex), absent when
    /// the server runs without a token.
    pub proof: Option<String>,
}

/// What the client asks for. Everything both ends need to run the streams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRequest {
    pub mode: Mode,
    pub direction: Direction,
    /// Streams per direction (bidir opens twice as many connections).
    pub streams: u32,
    /// Exact payload bytes per direction (`--bytes`), split across streams.
    pub bytes: Option<u64>,
    /// Duration of the data phase (`--time`), when `bytes` is absent.
    pub seconds: Option<f64>,
    /// SO_SNDBUF/SO_RCVBUF for every data socket, bytes.
    pub buffer: u64,
    /// TCP_CONGESTION for every data socket.
    pub cc: Option<String>,
    /// Total pacing rate per direction across its streams, bits/s.
    pub rate_bps: Option<u64>,
    /// Mode-specific parameters (disk mode: destination, file list, ...).
    #[serde(default)]
    pub mode_params: Option<serde_json::Value>,
    /// The client's host name, so the server's stats API (and the alerts
    /// built on it) can name both hosts of the session.
    #[serde(default)]
    pub client_host: Option<String>,
    /// The campaign this session is a run of, and the run (`--campaign`,
    /// `--run`): plain names ([`longhaul_stats_api::check_name`]), kept with
    /// the session on the server's stats API. Optional, like `client_host`:
    /// a server from before them ignores them, one after them refuses a
    /// session that names anything but plain names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionAccepted {
    /// 16 random bytes, hex; carried by every attach header.
    pub session_id: String,
    /// Key for the attach proofs (hex). Only sent when there is no token; with
    /// a token both ends derive it and it never crosses the wire.
    pub attach_key: Option<String>,
}

/// CPU use of one end over its data phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    /// Whole machine, from /proc/stat deltas, percent of all CPUs.
    pub user_pct: f64,
    pub system_pct: f64,
    pub softirq_pct: f64,
    pub iowait_pct: f64,
    /// The longhaul process itself (getrusage), CPU seconds.
    pub process_user_seconds: f64,
    pub process_system_seconds: f64,
    /// CPUs in /proc/stat, to turn percentages into cores.
    pub cpus: u32,
    /// [`crate::cpu::kernel_boot_id`] of this end: equal on both ends when
    /// they share one kernel (containers on one host, loopback), and then
    /// both percentages above are the same machine's. 0 from peers that do
    /// not send it.
    #[serde(default)]
    pub kernel_boot_id: u64,
}

/// The end-of-data report of one stream, from the end that sent `Done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    pub(crate) id: u32,
    /// Whether this end sent or received on the stream.
    pub(crate) role: Role,
    pub bytes: u64,
    /// Last TCP_INFO sample of this end's socket.
    pub(crate) tcp: Option<longhaul_stats_api::TcpInfo>,
}

/// What one end did on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Send,
    Receive,
}

/// The client's end of every stream, sent periodically during the data phase
/// (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamsReport {
    pub(crate) streams: Vec<StreamReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub streams: Vec<StreamReport>,
    pub(crate) cpu: CpuReport,
    /// Wall seconds of this end's data phase.
    pub seconds: f64,
    /// Mode-specific summary (disk mode: files), merged into the JSON output.
    #[serde(default)]
    pub mode_summary: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMessage {
    /// [`crate::Error::code`] of the failure.
    pub(crate) code: String,
    pub(crate) message: String,
}

/// `longhaul advise`'s probe, sent instead of `SessionRequest` after
/// `AuthOk` (any number of times; the server answers each with [`Pong`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ping {
    pub seq: u64,
    /// Ask for the server's socket buffer limits in the answer.
    #[serde(default)]
    pub limits: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pong {
    pub seq: u64,
    #[serde(default)]
    pub limits: Option<SocketLimits>,
}

/// A host's socket buffer limits (sysctls, bytes). `None` where the file
/// could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SocketLimits {
    /// net.core.rmem_max: cap of SO_RCVBUF.
    pub rmem_max: Option<u64>,
    /// net.core.wmem_max: cap of SO_SNDBUF.
    pub wmem_max: Option<u64>,
    /// net.ipv4.tcp_rmem: min, default, max (autotuning).
    pub tcp_rmem: Option<[u64; 3]>,
    /// net.ipv4.tcp_wmem: min, default, max (autotuning).
    pub tcp_wmem: Option<[u64; 3]>,
}

/// A control message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Hello(Hello),
    Challenge(Challenge),
    Auth(Auth),
    AuthOk(AuthOk),
    SessionRequest(SessionRequest),
    SessionAccepted(SessionAccepted),
    Start,
    Done(Box<Done>),
    Error(ErrorMessage),
    Ping(Ping),
    Pong(Pong),
    StreamsReport(StreamsReport),
    /// Mode-specific message; the JSON shape belongs to the mode.
    ModeData(serde_json::Value),
}

fn body<T: Serialize>(kind: MessageType, value: &T) -> Result<Frame> {
    Ok(Frame {
        kind: kind as u8,
        payload: serde_json::to_vec(value)
            .map_err(|e| Error::Protocol(format!("encoding {kind:?}: {e}")))?,
    })
}

fn parse<T: for<'de> Deserialize<'de>>(kind: MessageType, payload: &[u8]) -> Result<T> {
    serde_json::from_slice(payload)
        .map_err(|e| Error::Protocol(format!("malformed {kind:?} message: {e}")))
}

impl Message {
    pub fn kind(&self) -> MessageType {
        match self {
            Message::Hello(_) => MessageType::Hello,
            Message::Challenge(_) => MessageType::Challenge,
            Message::Auth(_) => MessageType::Auth,
            Message::AuthOk(_) => MessageType::AuthOk,
            Message::SessionRequest(_) => MessageType::SessionRequest,
            Message::SessionAccepted(_) => MessageType::SessionAccepted,
            Message::Start => MessageType::Start,
            Message::Done(_) => MessageType::Done,
            Message::Error(_) => MessageType::Error,
            Message::Ping(_) => MessageType::Ping,
            Message::Pong(_) => MessageType::Pong,
            Message::StreamsReport(_) => MessageType::StreamsReport,
            Message::ModeData(_) => MessageType::ModeData,
        }
    }

    /// Message -> frame.
    pub fn to_frame(&self) -> Result<Frame> {
        let k = self.kind();
        match self {
            Message::Hello(m) => body(k, m),
            Message::Challenge(m) => body(k, m),
            Message::Auth(m) => body(k, m),
            Message::AuthOk(m) => body(k, m),
            Message::SessionRequest(m) => body(k, m),
            Message::SessionAccepted(m) => body(k, m),
            Message::Start => Ok(Frame {
                kind: k as u8,
                payload: Vec::new(),
            }),
            Message::Done(m) => body(k, m),
            Message::Error(m) => body(k, m),
            Message::Ping(m) => body(k, m),
            Message::Pong(m) => body(k, m),
            Message::StreamsReport(m) => body(k, m),
            Message::ModeData(m) => body(k, m),
        }
    }

    /// Frame -> message; unknown types and malformed bodies are protocol errors.
    pub fn from_frame(frame: &Frame) -> Result<Message> {
        let Some(k) = MessageType::from_byte(frame.kind) else {
            return Err(Error::Protocol(format!(
                "unknown message type 0x{:02x}",
                frame.kind
            )));
        };
        let p = &frame.payload[..];
        Ok(match k {
            MessageType::Hello => Message::Hello(parse(k, p)?),
            MessageType::Challenge => Message::Challenge(parse(k, p)?),
            MessageType::Auth => Message::Auth(parse(k, p)?),
            MessageType::AuthOk => Message::AuthOk(parse(k, p)?),
            MessageType::SessionRequest => Message::SessionRequest(parse(k, p)?),
            MessageType::SessionAccepted => Message::SessionAccepted(parse(k, p)?),
            MessageType::Start => Message::Start,
            MessageType::Done => Message::Done(Box::new(parse(k, p)?)),
            MessageType::Error => Message::Error(parse(k, p)?),
            MessageType::Ping => Message::Ping(parse(k, p)?),
            MessageType::Pong => Message::Pong(parse(k, p)?),
            MessageType::StreamsReport => Message::StreamsReport(parse(k, p)?),
            MessageType::ModeData => Message::ModeData(parse(k, p)?),
        })
    }

    /// An `Error` message carrying a library error.
    pub(crate) fn error(err: &Error) -> Message {
        Message::Error(ErrorMessage {
            code: err.code().to_string(),
            message: err.detail(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = vec![
            Message::Hello(Hello {
                version: 1,
                client_nonce: "ab".into(),
                software: "x".into(),
            }),
            Message::Start,
            Message::SessionRequest(SessionRequest {
                mode: Mode::Memory,
                direction: Direction::Bidir,
                streams: 4,
                bytes: Some(10),
                seconds: None,
                buffer: 2 << 20,
                cc: Some("cubic".into()),
                rate_bps: None,
                mode_params: None,
                client_host: Some("xfer-a".into()),
                campaign: Some("fig5".into()),
                run: Some("a-to-b".into()),
            }),
            Message::StreamsReport(StreamsReport {
                streams: vec![StreamReport {
                    id: 0,
                    role: Role::Send,
                    bytes: 1 << 30,
                    tcp: Some(longhaul_stats_api::TcpInfo {
                        cwnd_bytes: 2 << 20,
                        retransmits: 12,
                        segs_out: 90_000,
                        ..Default::default()
                    }),
                }],
            }),
            Message::ModeData(serde_json::json!({"files": []})),
            Message::Ping(Ping {
                seq: 3,
                limits: true,
            }),
            Message::Pong(Pong {
                seq: 3,
                limits: Some(SocketLimits {
                    rmem_max: Some(4 << 20),
                    tcp_rmem: Some([4096, 131072, 6 << 20]),
                    ..SocketLimits::default()
                }),
            }),
        ];
        for m in msgs {
            let f = m.to_frame().unwrap();
            assert_eq!(Message::from_frame(&f).unwrap(), m);
        }
    }

    #[test]
    fn unknown_type_is_protocol_error() {
        let f = Frame {
            kind: 0xee,
            payload: vec![],
        };
        assert!(matches!(Message::from_frame(&f), Err(Error::Protocol(_))));
    }
}
