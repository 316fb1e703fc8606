//! `longhaul-exporter`: parses flags, binds, serves. Exit codes: 0 after a
//! clean shutdown (SIGTERM/SIGINT), 1 when it cannot start or serve, 2 on
//! a usage error.

use std::process::ExitCode;
use std::sync::Arc;

use longhaul_exporter::config::Config;
use longhaul_exporter::scrape::Exporter;
use longhaul_exporter::{cli, http, log};
use longhaul_web_config::WebConfig;

fn main() -> ExitCode {
    // Help and version exit 0, usage errors 2 (clap's message, with a
    // suggestion for a misspelt flag).
    let cfg = cli::parse(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn run(cfg: &Config) -> anyhow::Result<()> {
    // The HTTP pools, not the default descriptor limit, decide how many
    // clients are held.
    let _ = longhaul_admission::raise_open_files_limit();
    let web = match &cfg.web_config {
        Some(path) => WebConfig::load(path)?,
        None => WebConfig::open(),
    };
    let mut cfg = cfg.clone();
    cfg.certificate_files.extend(web.cert_file.clone());
    let cfg = &cfg;
    let exporter = Arc::new(Exporter::new(cfg)?);
    let listener = http::bind(&cfg.listen_address)?;
    // Tests and scripts parse this line to find a port-0 listener.
    log(&format!(
        "listening on {} ({}, collectors: {})",
        listener.local_addr()?,
        match (&web.tls, &web.auth) {
            (Some(_), Some(_)) => "https, basic auth",
            (Some(_), None) => "https",
            (None, Some(_)) => "http, basic auth",
            (None, None) => "http",
        },
        cfg.collectors.join(", ")
    ));
    http::serve(listener, exporter, web, cfg.max_requests)?;
    Ok(())
}
