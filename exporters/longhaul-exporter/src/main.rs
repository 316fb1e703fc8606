//! `longhaul-exporter`: parses flags, binds, serves. Exit codes: 0 after a
//! clean shutdown (SIGTERM/SIGINT), 1 when it cannot start or serve, 2 on
//! a usage error.

use std::process::ExitCode;
use std::sync::Arc;

use longhaul_exporter::cli::{self, Command};
use longhaul_exporter::collector::Exporter;
use longhaul_exporter::{http, log};

fn main() -> ExitCode {
    let cfg = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(cfg)) => cfg,
        Ok(Command::Help) => {
            print!("{}", cli::help_text());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("longhaul-exporter {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("longhaul-exporter: {e}\nTry 'longhaul-exporter --help'.");
            return ExitCode::from(2);
        }
    };
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn run(cfg: &cli::Config) -> anyhow::Result<()> {
    // The HTTP pools, not the default descriptor limit, decide how many
    // clients are held.
    let _ = longhaul_admission::raise_open_files_limit();
    let exporter = Arc::new(Exporter::new(cfg)?);
    let listener = http::bind(&cfg.listen_address)?;
    // Tests and scripts parse this line to find a port-0 listener.
    log(&format!(
        "listening on {} (collectors: {})",
        listener.local_addr()?,
        cfg.collectors.join(", ")
    ));
    http::serve(listener, exporter, cfg.max_requests)?;
    Ok(())
}
