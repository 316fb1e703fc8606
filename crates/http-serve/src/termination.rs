//! SIGTERM and SIGINT through tokio's signal handling, for a program that
//! serves with this crate and stops on either (the exporter): no handler of
//! its own, no self-pipe.
//!
//! [`Termination::listen`] takes both signals over before the server starts,
//! so one that comes early is kept rather than killing the process with the
//! default action; [`Termination::wait`] blocks until one has come.

use std::io;

use tokio::runtime::Runtime;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGTERM and SIGINT, taken over; see the module's documentation.
pub struct Termination {
    runtime: Runtime,
    terminate: Signal,
    interrupt: Signal,
}

impl Termination {
    /// Takes SIGTERM and SIGINT over from now on (a runtime of one thread,
    /// the calling one, once [`Termination::wait`] runs).
    pub fn listen() -> io::Result<Termination> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let (terminate, interrupt) = {
            let _inside = runtime.enter();
            (
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
            )
        };
        Ok(Termination {
            runtime,
            terminate,
            interrupt,
        })
    }

    /// Blocks until SIGTERM or SIGINT has come since [`Termination::listen`];
    /// names the one that came.
    pub fn wait(self) -> &'static str {
        let Termination {
            runtime,
            mut terminate,
            mut interrupt,
        } = self;
        runtime.block_on(async {
            tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            }
        })
    }
}
