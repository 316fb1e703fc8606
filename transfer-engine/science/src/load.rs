//! Background load for `longhaul sweep --load N`: N memory-mode streams to
//! the same server, in a session of their own, running until stopped.
//!
//! The load is a loop of back-to-back memory sessions of
//! [`LOAD_SESSION_SECONDS`] each (the gap between two is one handshake, a
//! few RTTs), so stopping it never waits longer than one such session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Error, Result};
use longhaul_engine::client::{self, SendOptions};
use longhaul_engine::planes::{Amount, Payload};

/// Length of one load session. Short enough that stopping is quick, long
/// enough that the handshake gaps are under 1% of the time.
pub const LOAD_SESSION_SECONDS: f64 = 3.0;

/// Time the load gets to ramp up before the first measurement.
pub const LOAD_RAMP_UP: Duration = Duration::from_millis(700);

/// A running background load.
pub struct Load {
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    /// Starts `opts.streams` memory-mode background streams (whatever
    /// `opts.payload` says) and waits [`LOAD_RAMP_UP`]. Fails when the first
    /// load session fails at once (refused, auth).
    pub fn start(mut opts: SendOptions) -> Result<Load> {
        opts.payload = Payload::Memory(Amount::Seconds(LOAD_SESSION_SECONDS));
        let stop = Arc::new(AtomicBool::new(false));
        let bytes = Arc::new(AtomicU64::new(0));
        let error = Arc::new(Mutex::new(None));
        let (s, b, e) = (stop.clone(), bytes.clone(), error.clone());
        let thread = std::thread::Builder::new()
            .name("sweep-load".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match client::run(&opts, None) {
                        Ok(r) => {
                            b.fetch_add(r.bytes, Ordering::Relaxed);
                        }
                        Err(err) => {
                            *e.lock().unwrap_or_else(|p| p.into_inner()) = Some(err.to_string());
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::io("starting the background load", e))?;
        let load = Load {
            stop,
            bytes,
            error,
            thread: Some(thread),
        };
        std::thread::sleep(LOAD_RAMP_UP);
        if let Some(e) = load.error() {
            return Err(Error::Failed(format!("background load failed: {e}")));
        }
        Ok(load)
    }

    /// The load's failure, if it failed (it then stopped).
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops the load (waits for the running session to end); returns the
    /// payload bytes the finished load sessions moved.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
