//! The `longhaul` binary: parses the command line, runs the subcommand and
//! maps errors to the exit codes of DESIGN.md (0 ok, 1 transfer failed,
//! 2 usage error). Everything else lives in the libraries.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use longhaul::args::{Cli, Command};
use longhaul::send_display;
use longhaul_engine::iperf3::Iperf3Server;
use longhaul_engine::server::Server;

fn run(cli: Cli) -> anyhow::Result<()> {
    // A 1024-stream session is over a thousand sockets on each end.
    let _ = longhaul_admission::raise_open_files_limit();
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut out = stdout.lock();
    match cli.command {
        Command::MemcpyBench => {
            let bps = longhaul_engine::membench::memcpy_bandwidth(
                longhaul_engine::membench::BUFFER_LEN,
                5,
            );
            writeln!(out, "{bps:.0}")?;
        }
        Command::Serve(args) => {
            args.workers.apply("serve")?;
            let iperf3 = args.iperf3_options()?;
            let server = Server::bind(args.options())?;
            writeln!(
                out,
                "listening on {}, stats on {}",
                server.local_addr(),
                server.stats_addr()
            )?;
            if let Some(opts) = iperf3 {
                let iperf3 = Iperf3Server::bind(opts, server.registry())?;
                writeln!(out, "iperf3 on {}", iperf3.local_addr())?;
                iperf3.spawn()?;
            }
            out.flush()?;
            drop(out);
            server.run()?;
        }
        Command::Send(args) => {
            args.run.workers.apply("send")?;
            send_display::send(&args, &mut out, terminal)?
        }
        Command::Get(args) => {
            args.run.workers.apply("get")?;
            send_display::get(&args, &mut out, terminal)?
        }
        Command::Sweep(args) => {
            args.workers.apply("sweep")?;
            let json = args.json;
            let done = longhaul_science::sweep::run(&args.options())?;
            if json {
                writeln!(out, "{}", longhaul_science::sweep::to_json(&done))?;
            } else {
                writeln!(out, "{}", longhaul_science::sweep::human(&done))?;
            }
        }
        Command::Advise(args) => {
            let json = args.json;
            let advice = longhaul_science::advise::run(&args.options())?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&advice)?)?;
            } else {
                writeln!(out, "{}", advice.human())?;
            }
        }
        Command::Report(args) => {
            let path = longhaul_science::report::run(&args.options())?;
            writeln!(out, "report written to {}", path.display())?;
        }
    }
    Ok(())
}

/// A usage error: said with a pointer to the help, exit code 2.
fn usage(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("longhaul: {e}\n(see longhaul --help)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    // Help and version exit 0; usage errors print clap's message (with a
    // suggestion for a misspelt flag) and exit 2.
    let cli = Cli::try_parse().unwrap_or_else(|e| e.exit());
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(e) = err.downcast_ref::<clap::Error>() {
                e.exit();
            }
            // A science command's own errors (Prometheus, its files) are
            // not a transfer's; a transfer it ran reports as `send` would.
            let science = err.downcast_ref::<longhaul_science::Error>();
            let engine = match science {
                Some(longhaul_science::Error::Transfer(e)) => Some(e),
                _ => err.downcast_ref::<longhaul_engine::Error>(),
            };
            match (engine, science) {
                (Some(e @ longhaul_engine::Error::Usage(_)), _) => usage(e),
                (_, Some(e @ longhaul_science::Error::Usage(_))) => usage(e),
                (Some(e), _) => {
                    eprintln!("longhaul: transfer failed: {e}");
                    ExitCode::from(e.exit_code() as u8)
                }
                (None, Some(e)) => {
                    eprintln!("longhaul: {e}");
                    ExitCode::from(e.exit_code() as u8)
                }
                (None, None) => {
                    eprintln!("longhaul: transfer failed: {err:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
