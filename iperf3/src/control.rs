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
pub(crate) const MAX_RESULTS_LEN: usize = 1 << 20;

/// What the reader heard from the peer.
#[derive(Debug)]
pub(crate) enum Heard {
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
/// [`MAX_RESULTS_LEN`] bytes, then one more event (the protocol's last:
/// IPERF_DONE or CLIENT_TERMINATE, DISPLAY_RESULTS) and ends: nobody reads
/// the events of a test that is closing, so a peer's further bytes must
/// not pile up.
pub(crate) fn spawn_reader(
    stream: TcpStream,
    json_after: State,
    heard: Arc<dyn Fn(Heard) + Send + Sync>,
) -> Result<()> {
    std::thread::Builder::new()
        .name("iperf3-control".into())
        .spawn(move || {
            let mut r = BufReader::new(stream);
            let mut had_json = false;
            loop {
                let mut b = [0u8; 1];
                match r.read(&mut b) {
                    Ok(0) => return heard(Heard::Closed),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return heard(Heard::Failed(e.to_string())),
                }
                let state = State::from_byte(b[0]);
                heard(match state {
                    None => Heard::Unknown(b[0]),
                    Some(State::ServerError) => {
                        let mut codes = [0u8; 8];
                        match r.read_exact(&mut codes) {
                            Ok(()) => {
                                Heard::ServerError(ErrorCode::from_number(i32::from_be_bytes([
                                    codes[0], codes[1], codes[2], codes[3],
                                ])))
                            }
                            Err(e) => return heard(Heard::Failed(e.to_string())),
                        }
                    }
                    Some(s) => Heard::State(s),
                });
                if had_json {
                    return;
                }
                if state == Some(json_after) {
                    let block = wire::read_json(&mut r, MAX_RESULTS_LEN).map_err(|e| e.to_string());
                    let failed = block.is_err();
                    heard(Heard::Json(block));
                    if failed {
                        return;
                    }
                    had_json = true;
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::io("starting the iperf3 control reader", e))
}

/// Writes a state byte.
pub(crate) fn send_state(w: &mut &TcpStream, state: State) -> Result<()> {
    w.write_all(&[state.byte()])
        .map_err(|e| Error::io(format!("sending iperf3 state {state:?}"), e))
}

/// Writes `SERVER_ERROR` with an iperf3 error code (errno 0); failures are
/// ignored, the peer may be gone already.
pub(crate) fn send_server_error(w: &mut &TcpStream, code: ErrorCode) {
    let _ = w.write_all(&wire::server_error_bytes(code));
}

/// Writes a JSON block.
pub(crate) fn send_json(w: &mut &TcpStream, value: &Value) -> Result<()> {
    wire::write_json(w, value).map_err(|e| Error::io("sending an iperf3 JSON block", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc::{self, RecvTimeoutError};
    use std::time::{Duration, Instant};

    #[test]
    fn the_reader_ends_after_the_results_and_one_more_event() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (tx, events) = mpsc::channel();
        spawn_reader(
            server,
            State::TestEnd,
            Arc::new(move |h| {
                let _ = tx.send(h);
            }),
        )
        .unwrap();
        let mut w = &client;
        send_state(&mut w, State::TestEnd).unwrap();
        send_json(&mut w, &serde_json::json!({"streams": []})).unwrap();
        send_state(&mut w, State::IperfDone).unwrap();
        // A hostile client goes on: junk bytes and more TEST_ENDs, while it
        // keeps the connection open.
        let junk = client.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut bytes = vec![100u8; 1 << 20];
            for b in bytes.iter_mut().step_by(1000) {
                *b = State::TestEnd.byte();
            }
            let _ = (&junk).write_all(&bytes);
        });
        let mut heard = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(h) => heard.push(h),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the reader still runs, {} events heard", heard.len())
                }
            }
            assert!(heard.len() <= 3, "{} events heard", heard.len());
        }
        assert!(
            matches!(
                &heard[..],
                [
                    Heard::State(State::TestEnd),
                    Heard::Json(Ok(_)),
                    Heard::State(State::IperfDone)
                ]
            ),
            "{heard:?}"
        );
        drop(client);
    }
}
