//! `certificates` collector: when each certificate the host serves with
//! expires, so an alert can say so two weeks before
//! (`LonghaulCertificateExpiresSoon`). It reads the certificate of the
//! exporter's own `--web.config.file` and the PEM files of
//! `--collector.certificates.files` (the other servers' of the host, which
//! site.yml lists), every certificate of each file (the host's, then its
//! chain), afresh each collection: a renewal shows at the next scrape.
//!
//! What a file can make it spend is bounded: at most [`MAX_FILE_BYTES`]
//! read, [`MAX_PER_FILE`] certificates, subjects cut at
//! [`MAX_SUBJECT_CHARS`]. A file that cannot be read or holds no
//! certificate fails the collector (its cause logged once); the other
//! files' series are still exported.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use x509_cert::der::Decode;
use x509_cert::Certificate;

use crate::collector::{Collector, CollectorSpec, Round};
use crate::config::Config;
use crate::metrics::Family;

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "certificates",
    default_enabled: true,
    help: "expiry of the certificates this host serves with (PEM files)",
    new,
};

/// A certificate file is a few KiB; more is not one.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Certificates read from one file (a host's, then its chain).
pub const MAX_PER_FILE: usize = 8;
/// Longest subject label.
pub const MAX_SUBJECT_CHARS: usize = 256;

fn new(cfg: &Config) -> anyhow::Result<Box<dyn Collector>> {
    Ok(Box::new(Certificates {
        files: cfg.certificate_files.clone(),
    }))
}

struct Certificates {
    files: Vec<PathBuf>,
}

/// One certificate of a file.
struct Found {
    position: usize,
    subject: String,
    not_after: u64,
}

fn read(path: &PathBuf) -> anyhow::Result<Vec<Found>> {
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut pem))
        .with_context(|| format!("{}", path.display()))?;
    let mut found = Vec::new();
    for (position, der) in CertificateDer::pem_slice_iter(&pem)
        .take(MAX_PER_FILE)
        .enumerate()
    {
        let der = der.with_context(|| format!("{}: PEM", path.display()))?;
        let cert = Certificate::from_der(&der)
            .map_err(|e| anyhow::anyhow!("{}: certificate {position}: {e}", path.display()))?;
        let tbs = &cert.tbs_certificate;
        let mut subject = tbs.subject.to_string();
        if subject.chars().count() > MAX_SUBJECT_CHARS {
            subject = subject.chars().take(MAX_SUBJECT_CHARS).collect();
        }
        found.push(Found {
            position,
            subject,
            not_after: tbs.validity.not_after.to_unix_duration().as_secs(),
        });
    }
    if found.is_empty() {
        bail!("{}: no PEM certificate in it", path.display());
    }
    Ok(found)
}

impl Collector for Certificates {
    fn update(&self, _round: &Round, out: &mut Vec<Family>) -> anyhow::Result<()> {
        let mut expiry = Family::gauge(
            "longhaul_certificate_not_after_timestamp_seconds",
            "When the certificate stops being valid (Unix time), by file and position in it (0: the host's own)",
        );
        let mut failed = Vec::new();
        for path in &self.files {
            match read(path) {
                Ok(certs) => {
                    let file = path.display().to_string();
                    for c in certs {
                        expiry.push_u64(
                            &[
                                ("file", &file),
                                ("position", &c.position.to_string()),
                                ("subject", &c.subject),
                            ],
                            c.not_after,
                        );
                    }
                }
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        if !expiry.is_empty() {
            out.push(expiry);
        }
        if !failed.is_empty() {
            bail!("{}", failed.join("; "));
        }
        Ok(())
    }
}
