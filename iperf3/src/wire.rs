//! iperf3's bytes on the control connection: the cookie, the one-byte test
//! states, the length-prefixed JSON blocks, and the error codes a server
//! sends after `SERVER_ERROR` (with the text an iperf3 client prints for
//! each). docs/iperf3.md describes the exchange these pieces make up.
//!
//! Everything here was written from iperf3's public documentation and from
//! watching Debian's iperf3 3.12 on loopback; the numbers are iperf3's.

use std::io::{self, Read, Write};

use serde_json::Value;

/// Bytes of a cookie on the wire: 36 printable characters and a NUL. The
/// client sends it first on the control connection and on every data
/// connection; it names the test.
pub(crate) const COOKIE_LEN: usize = 37;

/// The characters iperf3 (3.2 and later) draws its cookies from. Older
/// clients used other printable characters, which we accept as well.
const COOKIE_CHARS: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A test's cookie (36 characters, without the NUL).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Cookie([u8; COOKIE_LEN - 1]);

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A cookie lets its holder attach streams to the test: never logged.
        f.write_str("Cookie(..)")
    }
}

/// What the first bytes of a connection are, as a cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CookieCheck {
    /// Fine so far; more bytes are needed.
    Incomplete,
    Valid(Cookie),
    /// Not an iperf3 cookie, and why.
    Invalid(String),
}

impl Cookie {
    /// A fresh random cookie, as an iperf3 client makes one.
    pub(crate) fn random() -> Cookie {
        let bytes = longhaul_core::auth::random_bytes::<{ COOKIE_LEN - 1 }>();
        let mut c = [0u8; COOKIE_LEN - 1];
        for (slot, b) in c.iter_mut().zip(bytes) {
            *slot = COOKIE_CHARS[(b % 32) as usize];
        }
        Cookie(c)
    }

    /// Checks the bytes received so far against a cookie's shape:
    /// printable ASCII up to the 36th byte, then a NUL.
    pub(crate) fn check(received: &[u8]) -> CookieCheck {
        for (i, &b) in received.iter().take(COOKIE_LEN).enumerate() {
            let fine = if i == COOKIE_LEN - 1 {
                b == 0
            } else {
                b.is_ascii_graphic()
            };
            if !fine {
                return CookieCheck::Invalid(format!(
                    "byte {i} is 0x{b:02x}: not an iperf3 cookie (36 printable characters and a NUL)"
                ));
            }
        }
        if received.len() < COOKIE_LEN {
            return CookieCheck::Incomplete;
        }
        let mut c = [0u8; COOKIE_LEN - 1];
        c.copy_from_slice(&received[..COOKIE_LEN - 1]);
        CookieCheck::Valid(Cookie(c))
    }

    /// The 37 bytes on the wire.
    pub(crate) fn to_wire(self) -> [u8; COOKIE_LEN] {
        let mut w = [0u8; COOKIE_LEN];
        w[..COOKIE_LEN - 1].copy_from_slice(&self.0);
        w
    }

    /// The cookie as text (iperf3 prints it in its JSON `start` object).
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

/// The one-byte states of the control connection (a signed char in
/// iperf3). The server announces each step; the client answers with
/// `TEST_END`, `IPERF_DONE` or `CLIENT_TERMINATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    TestStart,
    TestRunning,
    TestEnd,
    ParamExchange,
    CreateStreams,
    ServerTerminate,
    ClientTerminate,
    ExchangeResults,
    DisplayResults,
    IperfStart,
    IperfDone,
    /// The server refuses the test ("the server is busy running a test").
    AccessDenied,
    /// The server failed; two big-endian 32-bit numbers follow: iperf3's
    /// error code ([`ErrorCode`]) and an errno.
    ServerError,
}

impl State {
    pub(crate) fn byte(self) -> u8 {
        let v: i8 = match self {
            State::TestStart => 1,
            State::TestRunning => 2,
            State::TestEnd => 4,
            State::ParamExchange => 9,
            State::CreateStreams => 10,
            State::ServerTerminate => 11,
            State::ClientTerminate => 12,
            State::ExchangeResults => 13,
            State::DisplayResults => 14,
            State::IperfStart => 15,
            State::IperfDone => 16,
            State::AccessDenied => -1,
            State::ServerError => -2,
        };
        v as u8
    }

    pub(crate) fn from_byte(b: u8) -> Option<State> {
        Some(match b as i8 {
            1 => State::TestStart,
            2 => State::TestRunning,
            4 => State::TestEnd,
            9 => State::ParamExchange,
            10 => State::CreateStreams,
            11 => State::ServerTerminate,
            12 => State::ClientTerminate,
            13 => State::ExchangeResults,
            14 => State::DisplayResults,
            15 => State::IperfStart,
            16 => State::IperfDone,
            -1 => State::AccessDenied,
            -2 => State::ServerError,
            _ => return None,
        })
    }
}

/// iperf3's error codes (`i_errno`) that a server sends after
/// `SERVER_ERROR`, the ones we send or name. The client looks the number
/// up in its own table and prints that text: an unknown number prints as
/// "int_errno=N", so we only send numbers every iperf3 3.x knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    Duration,
    NumStreams,
    BlockSize,
    BufSize,
    Mss,
    Omit,
    Unimplemented,
    NoSctp,
    UdpBlockSize,
    TotalRate,
    RecvParams,
    Message,
    ClientTerm,
    AccessDenied,
    SetCongestion,
    AuthTest,
    NoMessage,
    StreamRead,
    StreamWrite,
    StreamId,
    RecvResults,
    Other(i32),
}

impl ErrorCode {
    pub(crate) fn number(self) -> i32 {
        match self {
            ErrorCode::Duration => 5,
            ErrorCode::NumStreams => 6,
            ErrorCode::BlockSize => 7,
            ErrorCode::BufSize => 8,
            ErrorCode::Mss => 10,
            ErrorCode::Omit => 12,
            ErrorCode::Unimplemented => 13,
            ErrorCode::NoSctp => 18,
            ErrorCode::UdpBlockSize => 20,
            ErrorCode::TotalRate => 27,
            ErrorCode::RecvParams => 114,
            ErrorCode::RecvResults => 117,
            ErrorCode::Message => 110,
            ErrorCode::ClientTerm => 119,
            ErrorCode::AccessDenied => 121,
            ErrorCode::SetCongestion => 134,
            ErrorCode::AuthTest => 142,
            ErrorCode::NoMessage => 144,
            ErrorCode::StreamWrite => 205,
            ErrorCode::StreamRead => 206,
            ErrorCode::StreamId => 208,
            ErrorCode::Other(n) => n,
        }
    }

    pub(crate) fn from_number(n: i32) -> ErrorCode {
        [
            ErrorCode::Duration,
            ErrorCode::NumStreams,
            ErrorCode::BlockSize,
            ErrorCode::BufSize,
            ErrorCode::Mss,
            ErrorCode::Omit,
            ErrorCode::Unimplemented,
            ErrorCode::NoSctp,
            ErrorCode::UdpBlockSize,
            ErrorCode::TotalRate,
            ErrorCode::RecvParams,
            ErrorCode::RecvResults,
            ErrorCode::Message,
            ErrorCode::ClientTerm,
            ErrorCode::AccessDenied,
            ErrorCode::SetCongestion,
            ErrorCode::AuthTest,
            ErrorCode::NoMessage,
            ErrorCode::StreamWrite,
            ErrorCode::StreamRead,
            ErrorCode::StreamId,
        ]
        .into_iter()
        .find(|c| c.number() == n)
        .unwrap_or(ErrorCode::Other(n))
    }

    /// What iperf3 3.12 prints for the code (after "iperf3: error - ").
    pub(crate) fn text(self) -> String {
        match self {
            ErrorCode::Duration => "test duration too long (maximum = 86400 seconds)".into(),
            ErrorCode::NumStreams => "number of parallel streams too large (maximum = 128)".into(),
            ErrorCode::BlockSize => "block size too large (maximum = 1048576 bytes)".into(),
            ErrorCode::BufSize => "socket buffer size too large (maximum = 536870912 bytes)".into(),
            ErrorCode::Mss => "TCP MSS too large (maximum = 9216 bytes)".into(),
            ErrorCode::Omit => "bogus value for --omit".into(),
            ErrorCode::Unimplemented => "an option you are trying to set is not implemented yet".into(),
            ErrorCode::NoSctp => "no SCTP support available".into(),
            ErrorCode::UdpBlockSize => {
                "block size invalid (minimum = 16 bytes, maximum = 65507 bytes)".into()
            }
            ErrorCode::TotalRate => "total required bandwidth is larger than server limit".into(),
            ErrorCode::RecvParams => "unable to receive parameters from client".into(),
            ErrorCode::RecvResults => "unable to receive results".into(),
            ErrorCode::Message => "received an unknown control message".into(),
            ErrorCode::ClientTerm => "the client has terminated".into(),
            ErrorCode::AccessDenied => "the server is busy running a test. try again later".into(),
            ErrorCode::SetCongestion => {
                "unable to set TCP_CONGESTION: Supplied congestion control algorithm not supported on this host".into()
            }
            ErrorCode::AuthTest => "test authorization failed".into(),
            ErrorCode::NoMessage => "idle timeout for receiving data".into(),
            ErrorCode::StreamWrite => "unable to write to stream socket".into(),
            ErrorCode::StreamRead => "unable to read from stream socket".into(),
            ErrorCode::StreamId => "stream has an invalid id".into(),
            ErrorCode::Other(n) => format!("int_errno={n}"),
        }
    }
}

/// The 9 bytes of a `SERVER_ERROR`: the state, the code, errno 0.
pub(crate) fn server_error_bytes(code: ErrorCode) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[0] = State::ServerError.byte();
    b[1..5].copy_from_slice(&code.number().to_be_bytes());
    b
}

/// Why a JSON block could not be read.
#[derive(Debug)]
pub(crate) enum JsonError {
    /// The announced length is beyond what this block may hold.
    TooLong { announced: u64, max: usize },
    /// The connection ended or failed inside the block.
    Io(io::Error),
    /// The bytes are not a JSON object.
    NotJson(String),
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::TooLong { announced, max } => write!(
                f,
                "a JSON block of {announced} bytes announced; at most {max} are accepted"
            ),
            JsonError::Io(e) => write!(f, "reading a JSON block: {e}"),
            JsonError::NotJson(e) => write!(f, "the JSON block is not a JSON object: {e}"),
        }
    }
}

/// Reads one JSON block: a 4-byte big-endian length, then that many bytes
/// of JSON. A length above `max` is refused before anything is allocated;
/// the buffer grows only with the bytes that really arrive.
pub(crate) fn read_json(r: &mut impl Read, max: usize) -> Result<Value, JsonError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(JsonError::Io)?;
    let announced = u32::from_be_bytes(len) as u64;
    if announced > max as u64 {
        return Err(JsonError::TooLong { announced, max });
    }
    let mut body = Vec::new();
    r.take(announced)
        .read_to_end(&mut body)
        .map_err(JsonError::Io)?;
    if body.len() as u64 != announced {
        return Err(JsonError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the connection ended after {} of {announced} bytes",
                body.len()
            ),
        )));
    }
    let value: Value =
        serde_json::from_slice(&body).map_err(|e| JsonError::NotJson(e.to_string()))?;
    if !value.is_object() {
        return Err(JsonError::NotJson("not an object".into()));
    }
    Ok(value)
}

/// Writes one JSON block (length, then the JSON on one line).
pub(crate) fn write_json(w: &mut impl Write, value: &Value) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    let len =
        u32::try_from(body.len()).map_err(|_| io::Error::other("JSON block larger than 4 GiB"))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    w.write_all(&out)
}

/// The datagram an iperf3 client sends to open a UDP stream: the number
/// 0x36373839 ("6789") in the client's byte order, or, from clients before
/// 3.1, 123456789.
pub(crate) const UDP_CONNECT_MSG: u32 = 0x3637_3839;
const LEGACY_UDP_CONNECT_MSG: u32 = 123_456_789;
/// The server's answer: 0x39383736 ("9876"), or 987654321 for old clients.
pub(crate) const UDP_CONNECT_REPLY: u32 = 0x3938_3736;
const LEGACY_UDP_CONNECT_REPLY: u32 = 987_654_321;

/// The reply to a UDP connect datagram, in the byte order the client used
/// (it compares the reply as a number in its own order), or `None` if the
/// datagram is not a connect message.
pub(crate) fn udp_connect_reply(datagram: &[u8]) -> Option<[u8; 4]> {
    let b: [u8; 4] = datagram.try_into().ok()?;
    for (msg, reply) in [
        (UDP_CONNECT_MSG, UDP_CONNECT_REPLY),
        (LEGACY_UDP_CONNECT_MSG, LEGACY_UDP_CONNECT_REPLY),
    ] {
        if b == msg.to_be_bytes() {
            return Some(reply.to_be_bytes());
        }
        if b == msg.to_le_bytes() {
            return Some(reply.to_le_bytes());
        }
    }
    None
}

/// Whether a datagram is a connect reply, in either byte order.
pub(crate) fn is_udp_connect_reply(datagram: &[u8]) -> bool {
    let Ok(b) = <[u8; 4]>::try_from(datagram) else {
        return false;
    };
    [UDP_CONNECT_REPLY, LEGACY_UDP_CONNECT_REPLY]
        .iter()
        .any(|r| b == r.to_be_bytes() || b == r.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_as_signed_bytes() {
        for s in [
            State::TestStart,
            State::TestEnd,
            State::ParamExchange,
            State::CreateStreams,
            State::ExchangeResults,
            State::DisplayResults,
            State::IperfDone,
            State::AccessDenied,
            State::ServerError,
            State::ClientTerminate,
        ] {
            assert_eq!(State::from_byte(s.byte()), Some(s));
        }
        assert_eq!(State::AccessDenied.byte(), 0xff);
        assert_eq!(State::ServerError.byte(), 0xfe);
        assert_eq!(State::from_byte(3), None);
    }

    #[test]
    fn cookies_are_checked_byte_by_byte() {
        let c = Cookie::random();
        let wire = c.to_wire();
        assert_eq!(Cookie::check(&wire), CookieCheck::Valid(c));
        assert_eq!(Cookie::check(&wire[..10]), CookieCheck::Incomplete);
        assert_eq!(c.as_str().len(), 36);
        assert!(matches!(
            Cookie::check(b"GET / HTTP/1.1\r\n"),
            CookieCheck::Invalid(_)
        ));
        let mut no_nul = wire;
        no_nul[36] = b'x';
        assert!(matches!(Cookie::check(&no_nul), CookieCheck::Invalid(_)));
        assert_ne!(Cookie::random(), c);
    }

    #[test]
    fn json_blocks_are_length_prefixed_and_bounded() {
        let v = serde_json::json!({"tcp": true, "parallel": 2});
        let mut buf = Vec::new();
        write_json(&mut buf, &v).unwrap();
        assert_eq!(&buf[..4], &(buf.len() as u32 - 4).to_be_bytes());
        assert_eq!(read_json(&mut &buf[..], 1024).unwrap(), v);
        // 1 GiB announced: refused before reading or allocating it.
        let mut huge = (1u32 << 30).to_be_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(matches!(
            read_json(&mut &huge[..], 65536),
            Err(JsonError::TooLong { announced, .. }) if announced == 1 << 30
        ));
        // Truncated.
        assert!(matches!(
            read_json(&mut &buf[..buf.len() - 3], 1024),
            Err(JsonError::Io(_))
        ));
        // Not an object.
        let mut arr = Vec::new();
        write_json(&mut arr, &serde_json::json!([1])).unwrap();
        assert!(matches!(
            read_json(&mut &arr[..], 1024),
            Err(JsonError::NotJson(_))
        ));
    }

    #[test]
    fn udp_connect_replies_in_the_clients_byte_order() {
        // An x86 client writes its host-order number: bytes "9876".
        assert_eq!(udp_connect_reply(b"9876"), Some(*b"6789"));
        assert_eq!(udp_connect_reply(b"6789"), Some(*b"9876"));
        assert!(is_udp_connect_reply(b"6789") && is_udp_connect_reply(b"9876"));
        assert_eq!(
            udp_connect_reply(&123_456_789u32.to_le_bytes()),
            Some(987_654_321u32.to_le_bytes())
        );
        assert_eq!(udp_connect_reply(b"abcd"), None);
        assert_eq!(udp_connect_reply(b"98765"), None);
    }

    #[test]
    fn error_codes_name_what_the_client_prints() {
        assert_eq!(ErrorCode::AuthTest.number(), 142);
        assert_eq!(ErrorCode::from_number(142), ErrorCode::AuthTest);
        assert_eq!(ErrorCode::AuthTest.text(), "test authorization failed");
        assert_eq!(ErrorCode::from_number(9999).text(), "int_errno=9999");
        let b = server_error_bytes(ErrorCode::TotalRate);
        assert_eq!(b[0] as i8, -2);
        assert_eq!(i32::from_be_bytes([b[1], b[2], b[3], b[4]]), 27);
    }
}
