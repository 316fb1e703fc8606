//! Messages mode: the data plane of the fabric-under-load measurements.
//!
//! A messages session moves fixed-length messages client -> server on each
//! stream, in one of two patterns (`SessionRequest::mode_params`, see
//! [`MessagesParams`]):
//!
//! - `rr` (request/response): the client writes one message of `length`
//!   bytes and waits for the server's [`ACK_LEN`]-byte acknowledgement (the
//!   message's sequence number) before writing the next. The time from the
//!   first byte written to the acknowledgement read is the message's
//!   latency: one message one way plus a small reply back, so at small
//!   lengths it is the round trip and at large ones it adds the transfer
//!   time of `length` bytes. Both data sockets set TCP_NODELAY, so no Nagle
//!   or delayed-ACK timer hides in the numbers.
//! - `stream`: the client writes messages back to back (one `send` per
//!   message), the server reads each message with its own `recv` loop into
//!   a buffer (one copy, as an application would). Throughput per length
//!   and CPU time per message come from this pattern.
//!
//! Every stream measures the CPU time its worker thread spends in the
//! stream's own turns (CLOCK_THREAD_CPUTIME_ID), so the per-message
//! overhead is not polluted by background load running in the same
//! processes (`sweep --load`), even on the same data workers.
//! Byte counters are the engine's usual ones, so both ends still check the
//! per-stream totals.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::datapath::{
    would_block, DataPlane, Grant, Limit, ModeReport, Progress, SendBudget, Sink, Source, StreamIo,
};
use crate::error::{Error, Result};
use crate::messages::{Direction, SessionRequest};

/// Bytes of the server's acknowledgement in `rr`: the message's sequence
/// number, little endian. Small enough to be one segment at any MSS.
pub const ACK_LEN: usize = 8;

/// Largest message. Each worker holds one message (sender) or up to
/// [`RECV_BUF`] of it (receiver); 64 MiB covers the fabric tests' 1 MB with
/// room, and keeps 1024 streams from asking for absurd memory.
pub const MAX_MESSAGE_LEN: u64 = 64 << 20;

/// Receive buffer of the server's sink: messages longer than this are read
/// in several `recv` calls.
const RECV_BUF: usize = 1 << 20;

/// Request/response or streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Rr,
    Stream,
}

/// `SessionRequest::mode_params` of a messages session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesParams {
    pub pattern: Pattern,
    /// Message length, bytes.
    pub length: u64,
}

impl MessagesParams {
    /// Reads and checks the parameters of a request (the server's side).
    pub(crate) fn from_request(req: &SessionRequest) -> Result<MessagesParams> {
        let p: MessagesParams = req
            .mode_params
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| {
                Error::Protocol("messages mode needs mode_params {pattern, length}".into())
            })?;
        p.check(req)
    }

    /// Checks the parameters against the request they go with.
    pub(crate) fn check(self, req: &SessionRequest) -> Result<MessagesParams> {
        if self.length == 0 || self.length > MAX_MESSAGE_LEN {
            return Err(Error::Usage(format!(
                "message length must be between 1 and {MAX_MESSAGE_LEN} bytes, got {}",
                self.length
            )));
        }
        if req.direction != Direction::Send {
            return Err(Error::Usage(
                "messages mode runs client -> server only (no --reverse/--bidir)".into(),
            ));
        }
        Ok(self)
    }

    pub(crate) fn to_value(self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// What one end's workers measured, merged over streams.
#[derive(Debug, Default)]
struct Tally {
    messages: u64,
    thread_cpu_seconds: f64,
    /// `rr` latencies, nanoseconds (client only).
    latencies_ns: Vec<u64>,
}

/// The plane of a messages session; the same type serves both ends.
pub(crate) struct MessagesPlane {
    params: MessagesParams,
    tally: Arc<Mutex<Tally>>,
}

impl MessagesPlane {
    /// The plane of checked parameters (see [`MessagesParams::check`]).
    pub(crate) fn new(params: MessagesParams) -> MessagesPlane {
        MessagesPlane {
            params,
            tally: Arc::new(Mutex::new(Tally::default())),
        }
    }
}

/// CPU time of the calling thread, seconds.
pub(crate) fn thread_cpu_seconds() -> f64 {
    // SAFETY: zeroed timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub(crate) fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 10.0).round() / 100.0
}

impl DataPlane for MessagesPlane {
    fn source(&self, _stream_id: u32) -> Result<Box<dyn Source>> {
        Ok(Box::new(MessageSource {
            params: self.params,
            message: vec![0x5a; self.params.length as usize],
            tally: self.tally.clone(),
            started: false,
            sent: 0,
            written: 0,
            want: 0,
            since: Instant::now(),
            ack: None,
            ack_buf: [0; ACK_LEN],
            messages: 0,
            latencies: Vec::new(),
            cpu: 0.0,
        }))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Ok(Box::new(MessageSink {
            params: self.params,
            buf: vec![0; (self.params.length as usize).min(RECV_BUF)],
            tally: self.tally.clone(),
            started: false,
            got: 0,
            ack: None,
            messages: 0,
            cpu: 0.0,
        }))
    }

    fn summary(&self) -> Result<Option<Value>> {
        let mut t = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        t.latencies_ns.sort_unstable();
        let per_message_us = if t.messages > 0 {
            t.thread_cpu_seconds / t.messages as f64 * 1e6
        } else {
            0.0
        };
        let mut v = json!({
            "pattern": self.params.pattern,
            "length": self.params.length,
            "messages": t.messages,
            "thread_cpu_seconds": (t.thread_cpu_seconds * 1e6).round() / 1e6,
            "cpu_us_per_message": (per_message_us * 1000.0).round() / 1000.0,
        });
        if !t.latencies_ns.is_empty() {
            let l = &t.latencies_ns;
            let mean = l.iter().sum::<u64>() / l.len() as u64;
            v["latency_us"] = json!({
                "count": l.len(),
                "min": us(l[0]),
                "p50": us(quantile(l, 0.50)),
                "p90": us(quantile(l, 0.90)),
                "p99": us(quantile(l, 0.99)),
                "max": us(l[l.len() - 1]),
                "mean": us(mean),
            });
        }
        Ok(Some(v))
    }

    fn mode_params(&self) -> Option<Value> {
        Some(self.params.to_value())
    }

    /// The `messages` field: the client's (sender's) and the server's
    /// (receiver's) summaries.
    fn report(&self, local: Option<&Value>, remote: Option<&Value>) -> ModeReport {
        ModeReport {
            messages: Some(json!({ "sender": local, "receiver": remote })),
            ..ModeReport::default()
        }
    }
}

struct MessageSource {
    params: MessagesParams,
    message: Vec<u8>,
    tally: Arc<Mutex<Tally>>,
    started: bool,
    sent: u64,
    /// Bytes of the current message written, and its length (short only
    /// when `--bytes` ends mid-message).
    written: usize,
    want: usize,
    /// When the current message's first byte went out.
    since: Instant,
    /// `rr`: acknowledgement bytes read so far, while one is due.
    ack: Option<usize>,
    ack_buf: [u8; ACK_LEN],
    messages: u64,
    latencies: Vec<u64>,
    cpu: f64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what.to_string(), e)
}

impl MessageSource {
    fn step(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress> {
        let rr = self.params.pattern == Pattern::Rr;
        first_turn(&mut self.started, rr, io)?;
        let len = self.params.length as usize;
        let mut moved = 0;
        loop {
            if let Some(got) = self.ack.as_mut() {
                match (&mut &*io.sock).read(&mut self.ack_buf[*got..]) {
                    Ok(0) => {
                        return Err(io_err("waiting for the acknowledgement")(
                            std::io::ErrorKind::UnexpectedEof.into(),
                        ))
                    }
                    Ok(n) => *got += n,
                    Err(e) if would_block(&e) => return Ok(Progress::readable()),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_err("waiting for the acknowledgement")(e)),
                }
                if *got == ACK_LEN {
                    self.ack = None;
                    self.latencies.push(self.since.elapsed().as_nanos() as u64);
                }
                continue;
            }
            if self.written == 0 {
                if moved >= io.allowance {
                    return Ok(Progress::Yield);
                }
                self.want = match budget.limit {
                    Limit::Bytes(total) => {
                        (total.saturating_sub(self.sent)).min(len as u64) as usize
                    }
                    _ => len,
                };
            }
            let piece = match budget.grant(self.sent, self.want - self.written) {
                Grant::Send(n) => n,
                Grant::WaitUntil(t) => return Ok(Progress::at(t)),
                Grant::Done => return Ok(Progress::Done),
                Grant::Full => return Ok(budget.until_writable()),
            };
            if self.written == 0 {
                self.since = Instant::now();
            }
            let from = self.written;
            let n = match (&mut &*io.sock).write(&self.message[from..from + piece]) {
                Ok(n) => n,
                Err(e) if would_block(&e) => return Ok(budget.until_writable()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("sending a message")(e)),
            };
            self.written += n;
            self.sent += n as u64;
            moved += n;
            io.moved(n as u64);
            budget.spent(n);
            if self.written < self.want {
                continue;
            }
            self.written = 0;
            if self.want < len {
                return Ok(Progress::Done); // --bytes ended mid-message: no ack for it
            }
            self.messages += 1;
            if rr {
                self.ack = Some(0);
            }
        }
    }
}

impl Source for MessageSource {
    fn send(&mut self, io: &StreamIo<'_>, budget: &mut SendBudget) -> Result<Progress> {
        let cpu_start = thread_cpu_seconds();
        let p = self.step(io, budget);
        self.cpu += thread_cpu_seconds() - cpu_start;
        if let Ok(Progress::Done) = p {
            let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
            tally.messages += self.messages;
            tally.thread_cpu_seconds += self.cpu;
            tally.latencies_ns.append(&mut self.latencies);
        }
        p
    }
}

struct MessageSink {
    params: MessagesParams,
    buf: Vec<u8>,
    tally: Arc<Mutex<Tally>>,
    started: bool,
    /// Bytes of the current message received.
    got: u64,
    /// `rr`: an acknowledgement being written, and how much of it went out.
    ack: Option<([u8; ACK_LEN], usize)>,
    messages: u64,
    cpu: f64,
}

/// On a stream's first turn: request/response turns off Nagle, so a small
/// message or acknowledgement leaves at once.
fn first_turn(started: &mut bool, rr: bool, io: &StreamIo<'_>) -> Result<()> {
    if !*started {
        *started = true;
        if rr {
            io.sock
                .set_nodelay(true)
                .map_err(io_err("setting TCP_NODELAY"))?;
        }
    }
    Ok(())
}

impl MessageSink {
    fn step(&mut self, io: &StreamIo<'_>) -> Result<Progress> {
        let rr = self.params.pattern == Pattern::Rr;
        first_turn(&mut self.started, rr, io)?;
        let len = self.params.length;
        let mut moved = 0;
        loop {
            if let Some((ack, sent)) = self.ack.as_mut() {
                match (&mut &*io.sock).write(&ack[*sent..]) {
                    Ok(n) => *sent += n,
                    Err(e) if would_block(&e) => return Ok(Progress::writable()),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_err("acknowledging a message")(e)),
                }
                if *sent == ACK_LEN {
                    self.ack = None;
                }
                continue;
            }
            if moved >= io.allowance {
                return Ok(Progress::Yield);
            }
            let want = ((len - self.got) as usize).min(self.buf.len());
            let n = match (&mut &*io.sock).read(&mut self.buf[..want]) {
                Ok(0) => return Ok(Progress::Done),
                Ok(n) => n,
                Err(e) if would_block(&e) => return Ok(Progress::readable()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("receiving a message", e)),
            };
            self.got += n as u64;
            moved += n;
            io.moved(n as u64);
            if self.got == len {
                self.got = 0;
                self.messages += 1;
                if rr {
                    self.ack = Some((self.messages.to_le_bytes(), 0));
                }
            }
        }
    }
}

impl Sink for MessageSink {
    fn receive(&mut self, io: &StreamIo<'_>) -> Result<Progress> {
        let cpu_start = thread_cpu_seconds();
        let p = self.step(io);
        self.cpu += thread_cpu_seconds() - cpu_start;
        if let Ok(Progress::Done) = p {
            let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
            tally.messages += self.messages;
            tally.thread_cpu_seconds += self.cpu;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 50);
        assert_eq!(quantile(&v, 0.99), 99);
        assert_eq!(quantile(&v, 1.0), 100);
        assert_eq!(quantile(&[7], 0.99), 7);
        assert_eq!(quantile(&[], 0.5), 0);
    }
}
