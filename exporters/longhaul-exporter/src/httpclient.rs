//! GET from the engine's stats API with ureq (docs/http.md): one deadline
//! for connect + request + response, so a hung engine cannot hold a
//! scrape, and a bounded answer, so a confused one cannot eat the host's
//! memory.

use std::time::Duration;

use anyhow::{bail, Context};
use ureq::http::Uri;

/// Answers larger than this are refused: 1,000 streams of JSON are ~300 KB,
/// so 64 MiB means something is wrong.
const MAX_BODY: u64 = 64 << 20;

/// An `http://host:port/prefix` URL (`--engine.url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path prefix without trailing slash ("" for none).
    pub prefix: String,
}

impl Url {
    /// Reads `s`, which must be plain `http://` (no TLS stack is built in)
    /// without query or fragment.
    pub fn parse(s: &str) -> Result<Url, String> {
        let uri: Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err("only http:// URLs are supported".into());
        }
        let host = uri.host().filter(|h| !h.is_empty()).ok_or("missing host")?;
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
        let after_host = authority.rsplit_once(']').map_or(authority, |(_, r)| r);
        if let Some((_, port)) = after_host.rsplit_once(':') {
            port.parse::<u16>()
                .map_err(|_| format!("bad port {port:?}"))?;
        }
        if uri.query().is_some() {
            return Err("no query string allowed".into());
        }
        Ok(Url {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: uri.port_u16().unwrap_or(80),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// The URL of `path` under the prefix.
    fn join(&self, path: &str) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}{}{path}", self.port, self.prefix)
    }
}

/// GETs `url.prefix + path` and returns the body of a 200 answer, all
/// within `timeout`.
pub fn get(url: &Url, path: &str, timeout: Duration) -> anyhow::Result<Vec<u8>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .user_agent(concat!("longhaul-exporter/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let mut answer = agent
        .get(url.join(path))
        .header("Accept", "application/json")
        .call()
        .map_err(|e| match e {
            ureq::Error::Timeout(_) => anyhow::anyhow!("no complete answer within {timeout:?}"),
            other => anyhow::Error::new(other),
        })?;
    let status = answer.status();
    if status != 200 {
        bail!("HTTP status {status}");
    }
    answer
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::Timeout(_) => anyhow::anyhow!("no complete answer within {timeout:?}"),
            ureq::Error::BodyExceedsLimit(_) => {
                anyhow::anyhow!("answer larger than {MAX_BODY} bytes")
            }
            other => anyhow::Error::new(other),
        })
        .context("reading the answer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:7401").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("127.0.0.1", 7401, "")
        );
        let u = Url::parse("http://[::1]:9/api/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("::1", 9, "/api")
        );
        assert_eq!(u.join("/v1/sessions"), "http://[::1]:9/api/v1/sessions");
        assert_eq!(Url::parse("http://h").unwrap().port, 80);
        for bad in [
            "https://x",
            "http://",
            "http://h:x",
            "x",
            "ftp://x",
            "http://h/?q=1",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }
}
