//! `tls_server_config`: rustls' server configuration, with a certificate
//! that is read again when its files change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use longhaul_http_serve::rustls;
use rustls::crypto::ring::{default_provider, sign::any_supported_type};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use yaml_rust2::Yaml;

/// How often, at most, the certificate's files are looked at again.
const RECHECK: Duration = Duration::from_secs(1);

/// `tls_server_config`, and the certificate file it serves; None when it
/// names no certificate and no key.
pub(crate) fn server_config(
    value: &Yaml,
    dir: &Path,
) -> Result<Option<(Arc<ServerConfig>, PathBuf)>, String> {
    let mut cert_file = String::new();
    let mut key_file = String::new();
    let mut client_auth = String::new();
    let mut client_ca_file = String::new();
    let mut min_version = String::new();
    let mut max_version = String::new();
    for (key, value) in crate::mapping(value, "tls_server_config")? {
        let what = format!("tls_server_config.{key}");
        let slot = match key.as_str() {
            "cert_file" => &mut cert_file,
            "key_file" => &mut key_file,
            "client_auth_type" => &mut client_auth,
            "client_ca_file" => &mut client_ca_file,
            "min_version" => &mut min_version,
            "max_version" => &mut max_version,
            "cert"
            | "key"
            | "client_ca"
            | "cipher_suites"
            | "curve_preferences"
            | "prefer_server_cipher_suites"
            | "client_allowed_sans" => return Err(crate::unsupported(&what)),
            other => return Err(crate::unknown(other, "tls_server_config")),
        };
        *slot = crate::text(value, &what)?;
    }
    match (cert_file.is_empty(), key_file.is_empty()) {
        (true, true) if client_auth.is_empty() && client_ca_file.is_empty() => return Ok(None),
        (true, _) => return Err("tls_server_config: cert_file is missing".into()),
        (_, true) => return Err("tls_server_config: key_file is missing".into()),
        _ => {}
    }
    let versions = versions(&min_version, &max_version)?;
    let verifier = client_verifier(&client_auth, &client_ca_file, dir)?;
    let cert_file = dir.join(cert_file);
    let resolver = Reloading::new(cert_file.clone(), dir.join(key_file))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some((Arc::new(config), cert_file)))
}

fn versions(
    min: &str,
    max: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let rank = |v: &str, default: u8, what: &str| match v {
        "" => Ok(default),
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => Err(format!(
            "tls_server_config.{what}: {v} is not offered (rustls speaks TLS 1.2 and 1.3)"
        )),
        _ => Err(format!(
            "tls_server_config.{what}: {v:?} is not TLS12 or TLS13"
        )),
    };
    let (lo, hi) = (rank(min, 12, "min_version")?, rank(max, 13, "max_version")?);
    if lo > hi {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    Ok(
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (lo..=hi).contains(v))
            .map(|(_, p)| p)
            .collect(),
    )
}

fn client_verifier(
    kind: &str,
    ca_file: &str,
    dir: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let optional = match kind {
        "" | "NoClientCert" if ca_file.is_empty() => {
            return Ok(WebPkiClientVerifier::no_client_auth())
        }
        "" | "NoClientCert" => {
            return Err(format!(
                "tls_server_config: client_ca_file is set but client_auth_type is {:?}: \
                 say RequireAndVerifyClientCert or VerifyClientCertIfGiven",
                if kind.is_empty() {
                    "NoClientCert"
                } else {
                    kind
                }
            ))
        }
        "RequireAndVerifyClientCert" => false,
        "VerifyClientCertIfGiven" => true,
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(format!(
                "tls_server_config.client_auth_type {kind}: accepts certificates nobody verified; \
                 not supported by this server"
            ))
        }
        other => {
            return Err(format!(
                "tls_server_config.client_auth_type: unknown {other:?} (NoClientCert, \
             VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            ))
        }
    };
    if ca_file.is_empty() {
        return Err(format!(
            "tls_server_config: client_auth_type {kind} needs client_ca_file"
        ));
    }
    let path = dir.join(ca_file);
    let mut roots = RootCertStore::empty();
    for cert in certificates(&path)? {
        roots
            .add(cert)
            .map_err(|e| format!("client_ca_file {}: {e}", path.display()))?;
    }
    let builder =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::new(default_provider()));
    let builder = if optional {
        builder.allow_unauthenticated()
    } else {
        builder
    };
    builder
        .build()
        .map_err(|e| format!("client_ca_file {}: {e}", path.display()))
}

/// The PEM certificates of a file, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The certificate chain and key of two files, checked to belong together.
fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let signer = any_supported_type(&der).map_err(|e| format!("{}: {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        format!(
            "{} and {} do not belong together: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(Arc::new(certified))
}

/// Serves the certificate of two files, read again after they change.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    served: Arc<CertifiedKey>,
    /// The files' modification times when `served` was read.
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
    /// Why the files as they are now cannot be served (logged once).
    unusable: Option<String>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Reloading {
    fn new(cert: PathBuf, key: PathBuf) -> Result<Reloading, String> {
        let stamp = (modified(&cert), modified(&key));
        let served = certified_key(&cert, &key)?;
        Ok(Reloading {
            cert,
            key,
            state: Mutex::new(Current {
                served,
                stamp,
                checked: Instant::now(),
                unusable: None,
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut now = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if now.checked.elapsed() >= RECHECK {
            now.checked = Instant::now();
            let stamp = (modified(&self.cert), modified(&self.key));
            if stamp != now.stamp {
                // A renewal that cannot be used yet (a file half written)
                // is tried again at the next look.
                match certified_key(&self.cert, &self.key) {
                    Ok(k) => {
                        now.served = k;
                        now.stamp = stamp;
                        now.unusable = None;
                    }
                    Err(e) if now.unusable.as_ref() != Some(&e) => {
                        eprintln!(
                            "web config: keeping the certificate in service, its renewal cannot be used: {e}"
                        );
                        now.unusable = Some(e);
                    }
                    Err(_) => {}
                }
            }
        }
        now.served.clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}
