//! `longhaul-delay`: thin dispatcher over the library; maps errors to exit
//! codes (0 ok, 1 failure, 2 usage).

use longhaul_delay::cli::{self, Command};
use longhaul_delay::{probe, run, Error};

fn main() {
    // Help and version exit 0; clap's usage errors exit 2.
    let parsed = cli::parse(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let result = parsed.and_then(|command| match command {
        Command::Run(cfg) => run::run(&cfg),
        Command::Echo { listen } => probe::echo(listen),
        Command::Probe { config, json } => probe::probe(&config).and_then(|s| {
            println!("{}", if json { s.to_json() } else { s.to_text() });
            if s.received == 0 {
                return Err(Error::Io {
                    what: "probe",
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no replies"),
                });
            }
            Ok(())
        }),
    });
    if let Err(e) = result {
        eprintln!("longhaul-delay: {e}");
        if matches!(e, Error::Usage(_)) {
            eprintln!("(see longhaul-delay --help)");
            std::process::exit(2);
        }
        std::process::exit(1);
    }
}
