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
//! Every worker measures its own thread CPU time
//! (CLOCK_THREAD_CPUTIME_ID), so the per-message overhead is not polluted
//! by background load running in the same processes (`sweep --load`).
//! Byte counters are the engine's usual ones, so both ends still check the
//! per-stream totals.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::datapath::{DataPlane, ModeReport, SendBudget, Sink, Source};
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
    pub fn from_request(req: &SessionRequest) -> Result<MessagesParams> {
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
    pub fn check(self, req: &SessionRequest) -> Result<MessagesParams> {
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

    pub fn to_value(self) -> Value {
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
pub struct MessagesPlane {
    params: MessagesParams,
    tally: Arc<Mutex<Tally>>,
}

impl MessagesPlane {
    /// The plane of checked parameters (see [`MessagesParams::check`]).
    pub fn new(params: MessagesParams) -> MessagesPlane {
        MessagesPlane {
            params,
            tally: Arc::new(Mutex::new(Tally::default())),
        }
    }
}

/// CPU time of the calling thread, seconds.
pub fn thread_cpu_seconds() -> f64 {
    // SAFETY: zeroed timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
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
        }))
    }

    fn sink(&self, _stream_id: u32) -> Result<Box<dyn Sink>> {
        Ok(Box::new(MessageSink {
            params: self.params,
            buf: vec![0; (self.params.length as usize).min(RECV_BUF)],
            tally: self.tally.clone(),
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
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what.to_string(), e)
}

impl Source for MessageSource {
    fn pump(&mut self, sock: &TcpStream, budget: &SendBudget, counter: &AtomicU64) -> Result<u64> {
        let rr = self.params.pattern == Pattern::Rr;
        if rr {
            sock.set_nodelay(true)
                .map_err(io_err("setting TCP_NODELAY"))?;
        }
        let cpu_start = thread_cpu_seconds();
        let len = self.params.length as usize;
        let mut sent = 0u64;
        let mut messages = 0u64;
        let mut latencies = Vec::new();
        let mut ack = [0u8; ACK_LEN];
        let mut w = sock;
        loop {
            let want = budget.next_chunk(sent, len);
            if want == 0 {
                break;
            }
            if let Some(p) = &budget.pacer {
                p.acquire(want);
            }
            let t = Instant::now();
            w.write_all(&self.message[..want])
                .map_err(io_err("sending a message"))?;
            sent += want as u64;
            counter.fetch_add(want as u64, Ordering::Relaxed);
            if want < len {
                break; // a --bytes budget ended mid-message: no ack for it
            }
            messages += 1;
            if rr {
                w.read_exact(&mut ack)
                    .map_err(io_err("waiting for the acknowledgement"))?;
                latencies.push(t.elapsed().as_nanos() as u64);
            }
        }
        let cpu = thread_cpu_seconds() - cpu_start;
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        tally.messages += messages;
        tally.thread_cpu_seconds += cpu;
        tally.latencies_ns.extend(latencies);
        Ok(sent)
    }
}

struct MessageSink {
    params: MessagesParams,
    buf: Vec<u8>,
    tally: Arc<Mutex<Tally>>,
}

impl Sink for MessageSink {
    fn drain(&mut self, sock: &TcpStream, counter: &AtomicU64) -> Result<u64> {
        let rr = self.params.pattern == Pattern::Rr;
        if rr {
            sock.set_nodelay(true)
                .map_err(io_err("setting TCP_NODELAY"))?;
        }
        let cpu_start = thread_cpu_seconds();
        let len = self.params.length;
        let mut total = 0u64;
        let mut messages = 0u64;
        let mut r = sock;
        'messages: loop {
            let mut got = 0u64;
            while got < len {
                let want = ((len - got) as usize).min(self.buf.len());
                let n = match r.read(&mut self.buf[..want]) {
                    Ok(0) => break 'messages,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::io("receiving a message", e)),
                };
                got += n as u64;
                total += n as u64;
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
            messages += 1;
            if rr {
                r.write_all(&messages.to_le_bytes())
                    .map_err(io_err("acknowledging a message"))?;
            }
        }
        let cpu = thread_cpu_seconds() - cpu_start;
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        tally.messages += messages;
        tally.thread_cpu_seconds += cpu;
        Ok(total)
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
