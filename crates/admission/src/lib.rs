//! Admission of TCP connections before they prove who they are, for any
//! protocol: the engine's control/data port today, its iperf3-compatible
//! port and the HTTP endpoints (through `longhaul-http-serve`) use it too.
//!
//! - [`pending`]: the bounded pool itself: per-source and global limits that
//!   evict the oldest entries of the biggest source instead of refusing
//!   newcomers, and a deadline per entry.
//! - [`lobby`]: the accept loop built on it: an epoll thread holds
//!   connections until their first message is complete, then a handshake
//!   runs (inline or on a thread) under one total deadline, and only an
//!   admitted connection leaves the pools.
//! - [`slots`]: the scarce slots an admitted connection takes (sessions,
//!   tests), with a share per source.
//! - [`budget`]: a per-source budget of failed proofs, which slows a
//!   guesser down.
//! - [`nofile`]: raising the open-file limit, so the pools' limits, not the
//!   process's descriptor table, decide what is held.
//!
//! docs/threat-model.md explains the limits and why they have the values
//! their users give them.

pub mod budget;
pub mod lobby;
pub mod nofile;
pub mod pending;
pub mod slots;

pub use budget::{ProofBudget, ProofLimits, ProofTurn};
pub use lobby::{
    Arrival, AuthFailure, Counters, FirstMessage, Lobby, Protocol, Reporter, Settings, Ticket,
    TooLate,
};
pub use nofile::raise_open_files_limit;
pub use pending::{EntryId, Limits, PendingSet, SourceKey};
pub use slots::{Refusal, Slot, Slots};
