//! `longhaul-exporter`: parses flags, binds, serves. Exit codes: 0 after a
//! clean shutdown (SIGTERM/SIGINT), 1 when it cannot start or serve, 2 on
//! a usage error.

use std::process::ExitCode;
use std::sync::Arc;

use longhaul_exporter::config::Config;
use longhaul_exporter::scrape::Exporter;
use longhaul_exporter::{cli, http, log};
use longhaul_web_config::WebConfig;

/// Blocks up to this size come from the heap, not from a mapping of their
/// own, and up to [`KEEP_FREED`] of freed heap stays with the process: a
/// collection allocates megabytes (the families, the encoded scrape) and
/// frees them, and glibc's defaults unmapped and faulted them back in every
/// scrape (half the time of building and encoding 10,000 streams' families;
/// scripts/bench-exporter). What stays is what the largest scrape needed.
const HEAP_BLOCKS_UP_TO: i32 = 32 << 20;
const KEEP_FREED: i32 = 64 << 20;
/// At most this many heaps (glibc's arenas): collections run on any of the
/// worker threads, and each thread's own arena would keep what its largest
/// collection freed. Measured with 4 scrapers at once at 10,000 streams
/// (scripts/bench-exporter): 24.8 MiB peak with glibc's default (8 per
/// core), 14.5 MiB with 2; one scraper 17.6 and 12.6 MiB.
const HEAPS: i32 = 2;

fn main() -> ExitCode {
    // SAFETY: mallopt only sets three of glibc's allocator parameters,
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_FREED);
        libc::mallopt(libc::M_ARENA_MAX, HEAPS);
    }
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
