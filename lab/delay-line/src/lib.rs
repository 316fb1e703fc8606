//! longhaul-delay: a userspace WAN delay line for the lab router, for
//! kernels without netem.
//!
//! The router steers each site's traffic into a TUN device by policy routing
//! ([`routing`]); one thread per direction ([`forward`]) reads the packets
//! from that device, stamps them with the monotonic clock ([`clock`]),
//! decides their release time from the one-way delay and the bottleneck rate
//! or tail drops them when the bottleneck queue is full ([`schedule`]),
//! holds them in a preallocated ring ([`ring`]) and writes them to the other
//! TUN device ([`tun`]) when due, where the kernel forwards them on to the
//! other site. With `--offload`, [`frame`] reads the virtio-net header of TCP
//! super-packets to charge their true wire size. [`stats`] counts what happened and [`log`] writes it; [`probe`] is a UDP RTT check
//! for hosts without ping; [`run`] ties it all together from its
//! [`run::RunConfig`], which [`cli`] (clap) fills from the command line.
//!
//! ```text
//! site A --ethA--> [rule iif ethA -> tunA] --read--> delay+pace --write--> tunB --main table--> ethB --> site B
//! site A <--ethA-- [main table] <--write-- tunA <--delay+pace <--read-- [rule iif ethB -> tunB] <--ethB-- site B
//! ```

pub mod cli;
pub mod clock;
pub mod error;
pub mod forward;
pub mod frame;
pub mod probe;
pub mod ring;
pub mod routing;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod tun;

pub use error::{Error, Result};

/// Writes one line of the delay line's log to stderr (counters, warnings,
/// stopping, teardown): [`longhaul_units::log_line`], an RFC 3339 UTC
/// timestamp first, so the counters line up with the transfer's log when it
/// runs in a plain shell or a container. Errors that end the program stay
/// plain, as a command's.
pub fn log(msg: impl std::fmt::Display) {
    longhaul_units::log("longhaul-delay", msg);
}
