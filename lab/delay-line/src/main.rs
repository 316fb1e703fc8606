//! `longhaul-delay`: thin dispatcher over the library; maps errors to exit
//! codes (0 ok, 1 failure, 2 usage).

use longhaul_delay::cli::{self, Command};
use longhaul_delay::{probe, run, Error};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match cli::parse(&args) {
        Ok(Command::Help) => {
            println!("{}", cli::USAGE);
            Ok(())
        }
        Ok(Command::Run(cfg)) => run::run(&cfg),
        Ok(Command::Echo { listen }) => probe::echo(listen),
        Ok(Command::Probe { config, json }) => probe::probe(&config).and_then(|s| {
            println!("{}", if json { s.to_json() } else { s.to_text() });
            if s.received == 0 {
                return Err(Error::Io {
                    what: "probe",
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no replies"),
                });
            }
            Ok(())
        }),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        eprintln!("longhaul-delay: {e}");
        if matches!(e, Error::Usage(_)) {
            eprintln!("{}", cli::USAGE);
            std::process::exit(2);
        }
        std::process::exit(1);
    }
}
