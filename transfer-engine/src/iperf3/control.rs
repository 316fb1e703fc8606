//! An iperf3 control connection once the parameters are exchanged: a
//! reader thread that turns the peer's bytes into [`Heard`] events (state
//! bytes, the one JSON block that follows a given state, the error code
//! after `SERVER_ERROR`), and the writes of our side.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{Error, Result};

use super::wire::{self, ErrorCode, State};

/// Largest results block we read: 128 streams in each direction at ~200
/// bytes each, plus a server's text output, with room to spare.
pub const MAX_RESULTS_LEN: usize = 1 << 20;

/// What the reader heard from the peer.
#[derive(Debug)]
pub enum Heard {
    State(State),
    /// A byte that is no iperf3 state.
    Unknown(u8),
    /// The JSON block after the reader's trigger state.
    Json(std::result::Result<Value, String>),
    /// `SERVER_ERROR` and its code.
    ServerError(ErrorCode),
    /// The peer closed the connection.
    Closed,
    /// Reading failed.
    Failed(String),
}

/// Reads `stream` on a thread of its own until it ends, handing every
/// event to `heard`. After `json_after` (TEST_END on a server,
/// EXCHANGE_RESULTS on a client) it reads one JSON block of at most
/// [`MAX_RESULTS_LEN`] bytes.
pub fn spawn_reader(
    stream: TcpStream,
    json_after: State,
    heard: Arc<dyn Fn(Heard) + Send + Sync>,
) -> Result<()> {
    std::thread::Builder::new()
        .name("iperf3-control".into())
        .spawn(move || {
            let mut r = BufReader::new(stream);
            loop {
                let mut b = [0u8; 1];
                match r.read(&mut b) {
                    Ok(0) => return heard(Heard::Closed),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return heard(Heard::Failed(e.to_string())),
                }
                let Some(state) = State::from_byte(b[0]) else {
                    heard(Heard::Unknown(b[0]));
                    continue;
                };
                if state == State::ServerError {
                    let mut codes = [0u8; 8];
                    let code = match r.read_exact(&mut codes) {
                        Ok(()) => i32::from_be_bytes([codes[0], codes[1], codes[2], codes[3]]),
                        Err(e) => return heard(Heard::Failed(e.to_string())),
                    };
                    heard(Heard::ServerError(ErrorCode::from_number(code)));
                    continue;
                }
                heard(Heard::State(state));
                if state == json_after {
                    let block = wire::read_json(&mut r, MAX_RESULTS_LEN).map_err(|e| e.to_string());
                    let failed = block.is_err();
                    heard(Heard::Json(block));
                    if failed {
                        return;
                    }
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::io("starting the iperf3 control reader", e))
}

/// Writes a state byte.
pub fn send_state(w: &mut &TcpStream, state: State) -> Result<()> {
    w.write_all(&[state.byte()])
        .map_err(|e| Error::io(format!("sending iperf3 state {state:?}"), e))
}

/// Writes `SERVER_ERROR` with an iperf3 error code (errno 0); failures are
/// ignored, the peer may be gone already.
pub fn send_server_error(w: &mut &TcpStream, code: ErrorCode) {
    let _ = w.write_all(&wire::server_error_bytes(code));
}

/// Writes a JSON block.
pub fn send_json(w: &mut &TcpStream, value: &Value) -> Result<()> {
    wire::write_json(w, value).map_err(|e| Error::io("sending an iperf3 JSON block", e))
}
