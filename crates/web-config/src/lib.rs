//! The web configuration file of Prometheus' own servers
//! (`--web.config.file`: the format Prometheus, Alertmanager and
//! node_exporter read), for longhaul's HTTP servers: TLS through rustls and
//! basic authentication with bcrypt hashes.
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: /etc/longhaul/tls/host.crt   # PEM, leaf first, then chain
//!   key_file: /etc/longhaul/tls/host.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: /etc/longhaul/tls/ca.crt       # with it
//!   min_version: TLS12                             # or TLS13
//! basic_auth_users:
//!   prometheus: $2b$12$...                         # bcrypt
//! ```
//!
//! As in Prometheus' servers: relative paths are read from the file's
//! directory; no `cert_file` and no `key_file` means plain HTTP; an
//! unknown key is an error. Keys of the format this server does not
//! implement (`cipher_suites`, `curve_preferences`, inline `cert`/`key`,
//! `client_allowed_sans`, `http_server_config.headers`, the client-auth
//! types that accept an unverified certificate) are refused by name rather
//! than ignored. The certificate and key are read again when their files
//! change (checked at most once a second, on new connections), so a
//! renewed certificate is served without a restart; a renewal that cannot
//! be read leaves the previous one in service and is logged.

mod auth;
mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul_http_serve::rustls::ServerConfig;
use yaml_rust2::{Yaml, YamlLoader};

pub use auth::{guard, BasicAuth};

/// A web configuration file, read and checked.
pub struct WebConfig {
    /// None: plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// The certificate file served (with TLS).
    pub cert_file: Option<PathBuf>,
    /// None: no authentication.
    pub auth: Option<Arc<BasicAuth>>,
}

/// What is wrong with a web configuration file.
#[derive(Debug, thiserror::Error)]
#[error("web config {}: {what}", path.display())]
pub struct Error {
    pub path: PathBuf,
    pub what: String,
}

impl WebConfig {
    /// No TLS, no authentication: what a server without a file serves.
    pub fn open() -> WebConfig {
        WebConfig {
            tls: None,
            cert_file: None,
            auth: None,
        }
    }

    /// Reads and checks `path`, and the certificate, key and CA files it
    /// names.
    pub fn load(path: &Path) -> Result<WebConfig, Error> {
        let fail = |what: String| Error {
            path: path.to_path_buf(),
            what,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        parse(&text, dir).map_err(fail)
    }
}

/// Parses the file's text; paths in it are relative to `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<WebConfig, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    if docs.len() > 1 {
        return Err("more than one YAML document".into());
    }
    let mut config = WebConfig::open();
    let Some(top) = docs.into_iter().next() else {
        return Ok(config);
    };
    for (key, value) in mapping(&top, "the file")? {
        match key.as_str() {
            "tls_server_config" => {
                if let Some((tls, cert_file)) = tls::server_config(value, dir)? {
                    config.tls = Some(tls);
                    config.cert_file = Some(cert_file);
                }
            }
            "basic_auth_users" => config.auth = auth::users(value)?,
            "http_server_config" => http_server_config(value)?,
            other => return Err(unknown(other, "the file")),
        }
    }
    Ok(config)
}

/// `http_server_config`: only `http2`, which changes nothing here (these
/// servers speak HTTP/1.1, which every Prometheus scrapes with).
fn http_server_config(value: &Yaml) -> Result<(), String> {
    for (key, value) in mapping(value, "http_server_config")? {
        match key.as_str() {
            "http2" => {
                if !matches!(value, Yaml::Boolean(_) | Yaml::Null) {
                    return Err("http_server_config.http2: not true or false".into());
                }
            }
            "headers" => return Err(unsupported("http_server_config.headers")),
            other => return Err(unknown(other, "http_server_config")),
        }
    }
    Ok(())
}

/// A mapping's entries with their keys as text; null is empty.
fn mapping<'a>(value: &'a Yaml, what: &str) -> Result<Vec<(String, &'a Yaml)>, String> {
    match value {
        Yaml::Null => Ok(Vec::new()),
        Yaml::Hash(h) => h
            .iter()
            .map(|(k, v)| match k {
                Yaml::String(s) => Ok((s.clone(), v)),
                // `1234:` is a user name to Prometheus' servers too.
                Yaml::Integer(i) => Ok((i.to_string(), v)),
                other => Err(format!("{what}: a key is not text: {other:?}")),
            })
            .collect(),
        _ => Err(format!("{what}: not a mapping")),
    }
}

/// A text value (null: empty).
fn text(value: &Yaml, what: &str) -> Result<String, String> {
    match value {
        Yaml::Null => Ok(String::new()),
        Yaml::String(s) => Ok(s.clone()),
        _ => Err(format!("{what}: not text")),
    }
}

fn unknown(key: &str, within: &str) -> String {
    format!("{within}: unknown key {key:?}")
}

fn unsupported(key: &str) -> String {
    format!("{key} is part of Prometheus' format but not supported by this server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_null_files_serve_plain_http_without_auth() {
        for text in ["", "---\n", "tls_server_config:\nbasic_auth_users:\n"] {
            let c = parse(text, Path::new(".")).unwrap();
            assert!(c.tls.is_none() && c.auth.is_none(), "{text:?}");
        }
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        let e = parse("tls_server_confg: {}\n", Path::new("."))
            .err()
            .unwrap();
        assert!(e.contains("unknown key \"tls_server_confg\""), "{e}");
        let e = parse("tls_server_config:\n  cert_fil: x\n", Path::new("."))
            .err()
            .unwrap();
        assert!(
            e.contains("tls_server_config: unknown key \"cert_fil\""),
            "{e}"
        );
        let e = parse("http_server_config:\n  headers: {}\n", Path::new("."))
            .err()
            .unwrap();
        assert!(e.contains("headers is part of Prometheus' format"), "{e}");
        let e = parse("- a\n", Path::new(".")).err().unwrap();
        assert!(e.contains("not a mapping"), "{e}");
        let e = parse("a: [\n", Path::new(".")).err().unwrap();
        assert!(e.contains("not YAML"), "{e}");
    }
}
