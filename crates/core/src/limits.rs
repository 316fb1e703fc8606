//! The named timeouts and limits of the protocol and its sessions, each
//! with why it has its value. Every layer takes its bounds from here, so
//! a reader finds them in one place.

use std::time::Duration;

/// Connecting to the server. A WAN path answers a SYN within a few RTTs;
/// 10 s covers slow paths and a busy server's accept queue.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Each handshake step (and the first bytes of any new connection). Long
/// enough for a 200 ms RTT path under load, short enough that a half-open
/// connection frees its slot quickly.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The patience of control-message writes, on both ends
/// (`Connection::set_write_timeout`): a peer that takes in less than
/// `connection::MIN_TAKEN_IN` of a message over this long fails the send.
/// A client that reads nothing the server writes (frozen, or pinging
/// without reading the answers) fails its session, so the session's slot
/// and data sockets are freed; a server that stops reading fails the client
/// instead of holding it in the middle of its manifest. As long as
/// [`DATA_IDLE_TIMEOUT`], the same patience.
pub const CONTROL_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// From `SessionAccepted` until every data connection has attached and the
/// client said `Start`. 1024 connections over a long path take a while.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// A data stream with no progress for this long is dead: the session's
/// watchdog ([`WATCHDOG_PERIOD`]) fails it, naming the stream. Progress is
/// anything TCP moved on the socket (payload, keep-alives), so a paced or
/// idle-but-alive stream is not dead. TCP's own retransmission timeout
/// gives up after ~15 min; a test campaign wants to know much sooner.
pub const DATA_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the watchdog looks at every stream's progress; the idle
/// timeout fires within this much of [`DATA_IDLE_TIMEOUT`].
pub const WATCHDOG_PERIOD: Duration = Duration::from_millis(500);

/// SO_RCVTIMEO/SO_SNDTIMEO of data sockets while they still block: the
/// attach exchange of a new data connection. Once the data workers run a
/// stream its socket is non-blocking and the watchdog alone bounds it;
/// longer than [`DATA_IDLE_TIMEOUT`] so the watchdog would speak first.
pub(crate) const DATA_SOCKET_TIMEOUT: Duration = Duration::from_secs(45);

/// After the data phase: a sending stream waiting for the receiver to close
/// its side, and each end waiting for the peer's `Done`. The peer only has
/// to finish draining its buffers.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the client reports its streams to the server during the data
/// phase. Well inside any scrape interval (the lab scrapes every 5 s); a
/// report costs about 250 bytes per stream.
pub const REPORT_PERIOD: Duration = Duration::from_secs(1);

/// Streams per direction. Beyond ~1000 sockets per session the gain is nil
/// and we would run into file descriptor limits.
pub const MAX_STREAMS: u32 = 1024;

/// Largest SO_SNDBUF/SO_RCVBUF we ask for (the kernel caps lower anyway).
pub const MAX_BUFFER: u64 = 1 << 30;

/// Default socket buffer: the FDT campaigns' 2 MB.
pub const DEFAULT_BUFFER: u64 = 2 << 20;

/// Default duration of a memory-to-memory run, as iperf3.
pub const DEFAULT_SECONDS: f64 = 10.0;

/// Longest `--time` (365 days). A bound, not a policy: the run's end instant
/// (start + seconds) must fit an `Instant`, and a peer's request must not be
/// able to panic the session's thread with 1e19 s.
pub(crate) const MAX_SECONDS: f64 = 365.0 * 86_400.0;

// Admission of new connections on the control port and the iperf3 port
// (docs/threat-model.md explains each value).

/// From accept to the peer's proof of who it is (the token; an iperf3
/// client's parameters and credentials), in total, however the bytes
/// trickle in. A handshake is two round trips: 10 s covers a 1 s RTT path
/// under load.
pub const ADMISSION_DEADLINE: Duration = Duration::from_secs(10);

/// Connections waiting for their first message (a Hello frame or an attach
/// header). They cost a descriptor and at most ~1 KiB each in one epoll
/// thread, so the pool is large: 4,096 of them are ~5 MiB.
pub(crate) const WAITING_CAPACITY: usize = 4096;

/// One source's share of the waiting pool: a whole 1024-stream session's
/// data connections fit, with room to spare.
pub(crate) const WAITING_PER_SOURCE: usize = 1024;

/// Control connections between Hello and the token proof, each on a thread
/// of its own (a real client spends a round trip here).
pub const HANDSHAKING_CAPACITY: usize = 256;

/// One source's share of the handshaking pool.
pub(crate) const HANDSHAKING_PER_SOURCE: usize = 64;

/// Failed proofs (a wrong token, wrong iperf3 credentials) one source may
/// have at once before it is slowed down (`longhaul_admission::budget`):
/// a client with a mistyped token retries a few times and is told why.
pub(crate) const FAILED_PROOF_BURST: u32 = 10;

/// Failed proofs one source may have per second past the burst: its
/// handshakes wait for their turn to have a proof checked (within the
/// admission deadline). A guesser got 100 wrong-token handshakes through
/// in 1.1 s; now 100 take 9 s, from any number of connections. Honest
/// clients never wait: a proof that holds gives its turn back. (A token is
/// 256 bits of HMAC key: guessing is hopeless anyway; the budget keeps a
/// guesser from making us spend CPU, an RSA decryption per iperf3 try, and
/// log lines at will.)
pub(crate) const FAILED_PROOFS_PER_SECOND: f64 = 10.0;

/// The admission pools and deadline of a listening port, from the limits
/// above.
pub fn admission_settings() -> longhaul_admission::Settings {
    longhaul_admission::Settings {
        waiting: longhaul_admission::Limits {
            capacity: WAITING_CAPACITY,
            per_source: WAITING_PER_SOURCE,
        },
        handshaking: longhaul_admission::Limits {
            capacity: HANDSHAKING_CAPACITY,
            per_source: HANDSHAKING_PER_SOURCE,
        },
        deadline: ADMISSION_DEADLINE,
        proofs: longhaul_admission::ProofLimits {
            burst: FAILED_PROOF_BURST,
            per_second: FAILED_PROOFS_PER_SECOND,
        },
    }
}
