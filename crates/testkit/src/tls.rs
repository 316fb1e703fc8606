//! Tests of TLS servers: a certificate authority made for the test (rcgen),
//! certificates it issues, and an HTTPS client (rustls) that sends one raw
//! request and reads the whole answer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A certificate authority that lives as long as the test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, in PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Writes `NAME.crt` and `NAME.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write certificate");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses), good for
    /// servers and clients, valid until rcgen's far default (year 4096).
    pub fn issue(&self, names: &[&str]) -> Issued {
        self.issue_until(names, None)
    }

    /// The same, valid until `not_after` (Unix seconds) when given.
    pub fn issue_until(&self, names: &[&str], not_after: Option<i64>) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("certificate parameters");
        if let Some(t) = not_after {
            params.not_after = time::OffsetDateTime::from_unix_timestamp(t).expect("a time");
        }
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A client that trusts this CA only, presenting `identity` if given.
    pub fn client(&self, identity: Option<&Issued>) -> Arc<ClientConfig> {
        self.client_speaking(identity, rustls::DEFAULT_VERSIONS)
    }

    /// The same, offering only `versions` of TLS.
    pub fn client_speaking(
        &self,
        identity: Option<&Issued>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem().as_bytes()).expect("CA PEM"))
            .expect("CA into roots");
        let builder = ClientConfig::builder_with_provider(Arc::new(default_provider()))
            .with_protocol_versions(versions)
            .expect("protocol versions")
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some(id) => {
                let chain = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("client chain");
                let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).expect("client key");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("client certificate")
            }
        };
        Arc::new(config)
    }
}

/// Sends `request` over TLS to `addr`, checking the server's certificate
/// for `name`, and reads the answer until the server closes. An error when
/// the connection or the handshake fails (a certificate the client does
/// not trust, or none where the server wants one).
pub fn https(
    addr: SocketAddr,
    name: &str,
    config: Arc<ClientConfig>,
    request: &[u8],
) -> std::io::Result<String> {
    https_over(TcpStream::connect(addr)?, name, config, request)
}

/// The same over a connection already made (from another source address:
/// [`crate::connect_from`]).
pub fn https_over(
    tcp: TcpStream,
    name: &str,
    config: Arc<ClientConfig>,
    request: &[u8],
) -> std::io::Result<String> {
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))?;
    let conn = ClientConnection::new(config, server_name).map_err(std::io::Error::other)?;
    tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(20)))?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(request)?;
    tls.flush()?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // A server that closes without close_notify after its answer.
        Err(e) if e.kind() == ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}
