//! The `longhaul` command line: the top layer over the engine
//! (`longhaul-engine`) and campaign science (`longhaul-science`).
//!
//! - [`args`]: the subcommands and flags (clap), and the options they make.
//! - [`send_display`]: what `send` shows while it runs (interval lines, a
//!   progress bar on a terminal) and when it ends.
//!
//! `main.rs` dispatches and maps errors to exit codes. xtask builds shell
//! completions and man pages from [`args::Cli`].

pub mod args;
pub mod send_display;
