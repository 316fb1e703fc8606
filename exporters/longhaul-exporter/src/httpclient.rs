//! GET from the engine's stats API with ureq (docs/http.md): one deadline
//! for connect + request + response, so a hung engine cannot hold a
//! scrape; the answer is handed out as a reader, which the caller reads
//! through a bounded window (stats.rs), so a confused engine cannot eat the
//! host's memory.

use std::time::Duration;

use std::io::Read;

use ureq::http::Uri;

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

/// An answer other than 200, by its status.
#[derive(Debug, thiserror::Error)]
#[error("HTTP status {0}")]
pub struct Status(pub u16);

/// The status of a failed [`open`] that was answered, if it was.
pub fn status(e: &anyhow::Error) -> Option<u16> {
    e.chain()
        .find_map(|c| c.downcast_ref::<Status>())
        .map(|s| s.0)
}

/// GETs `url.prefix + path` and returns the body of a 200 answer as a
/// reader, all within `timeout` (reading the body included); the caller
/// bounds how much it reads.
pub fn open(url: &Url, path: &str, timeout: Duration) -> anyhow::Result<impl Read> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .user_agent(concat!("longhaul-exporter/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let answer = agent
        .get(url.join(path))
        .header("Accept", "application/json")
        .call()
        .map_err(|e| match e {
            ureq::Error::Timeout(_) => anyhow::anyhow!("no complete answer within {timeout:?}"),
            other => anyhow::Error::new(other),
        })?;
    let status = answer.status();
    if status != 200 {
        return Err(Status(status.as_u16()).into());
    }
    Ok(answer.into_body().into_reader())
}

/// Whether a read of an [`open`] body failed on the deadline.
pub fn timed_out(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
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
