//! The `longhaul` binary: parses the command line, runs the subcommand and
//! maps errors to the exit codes of DESIGN.md (0 ok, 1 transfer failed,
//! 2 usage error). Everything else lives in the library.

use std::io::Write;
use std::process::ExitCode;

use longhaul::cli::{self, Command};
use longhaul::server::Server;

fn run() -> anyhow::Result<()> {
    // A 1024-stream session is over a thousand sockets on each end.
    let _ = longhaul_admission::raise_open_files_limit();
    match cli::parse(std::env::args().skip(1).collect())? {
        Command::Help => println!("{}", cli::USAGE),
        Command::Version => println!("longhaul {}", longhaul::SOFTWARE_VERSION),
        Command::MemcpyBench => {
            let bps = longhaul::membench::memcpy_bandwidth(longhaul::membench::BUFFER_LEN, 5);
            println!("{bps:.0}");
        }
        Command::Serve(opts) => {
            let server = Server::bind(opts)?;
            println!(
                "listening on {}, stats on {}",
                server.local_addr(),
                server.stats_addr()
            );
            std::io::stdout().flush()?;
            server.run()?;
        }
        Command::Science(cmd) => {
            let stdout = std::io::stdout();
            longhaul::science::run(&cmd, &mut stdout.lock())?;
        }
        Command::Send(opts) => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let report = longhaul::client::run(&opts, &mut out)?;
            if opts.json {
                writeln!(out, "{}", serde_json::to_string(&report)?)?;
            } else {
                writeln!(out, "{}", report.human())?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => match err.downcast_ref::<longhaul::Error>() {
            Some(e @ longhaul::Error::Usage(_)) => {
                eprintln!("longhaul: {e}");
                if !e.to_string().starts_with("usage:") {
                    eprintln!("(see longhaul --help)");
                }
                ExitCode::from(2)
            }
            Some(e) => {
                eprintln!("longhaul: transfer failed: {e}");
                ExitCode::from(e.exit_code() as u8)
            }
            None => {
                eprintln!("longhaul: transfer failed: {err:#}");
                ExitCode::from(1)
            }
        },
    }
}
