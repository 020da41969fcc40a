//! TLS for client connections, on rustls: a server configuration built from PEM files,
//! client-certificate verification when a CA is given, and a holder whose configuration the
//! binary's SIGHUP handler replaces (new handshakes use the new files; open connections keep
//! theirs).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The PEM files of the client TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// The server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates that client certificates must chain to; None = no client certs.
    pub client_ca: Option<PathBuf>,
}

/// Why TLS could not be configured (start-up and reload only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

fn err(path: &Path, what: &str, e: impl std::fmt::Display) -> TlsError {
    TlsError(format!("{}: {what}: {e}", path.display()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(path, "cannot read certificates", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(path, "bad certificate", e))?;
    if certs.is_empty() {
        return Err(err(
            path,
            "no certificate",
            "the file has no CERTIFICATE block",
        ));
    }
    Ok(certs)
}

/// Builds a rustls server configuration from the PEM files.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| err(&files.key, "cannot read the private key", e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| err(ca, "bad CA certificate", e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| err(ca, "client verifier", e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| err(&files.cert, "certificate and key do not match", e))?;
    Ok(Arc::new(config))
}

/// The current TLS configuration, replaceable while the server runs.
#[derive(Debug)]
pub struct ReloadableTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl ReloadableTls {
    /// Loads the files once; a failure here stops start-up.
    pub fn load(files: TlsFiles) -> Result<ReloadableTls, TlsError> {
        let config = server_config(&files)?;
        Ok(ReloadableTls {
            files,
            current: RwLock::new(config),
        })
    }

    /// Re-reads the files; on failure the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = server_config(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// An acceptor for one new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current())
    }

    /// The files it reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the server side of the handshake, bounded by `timeout`. A client that speaks
/// plaintext CQL fails at its first bytes (a CQL frame is no TLS record), so it is closed
/// at once rather than left waiting.
pub async fn accept<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    timeout: Duration,
) -> std::io::Result<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}

#[cfg(test)]
pub(crate) mod test_certs {
    //! Certificates generated at test time with the `openssl` tool (no key is committed).

    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// A CA, a server certificate for 127.0.0.1, a client certificate from the CA and one
    /// self-signed client certificate the CA did not sign.
    pub struct Certs {
        pub dir: tempfile::TempDir,
    }

    impl Certs {
        pub fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl tool runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn key(dir: &Path, name: &str) {
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                name,
            ],
        );
    }

    fn signed(dir: &Path, name: &str, cn: &str, ext: &str) {
        key(dir, &format!("{name}.key"));
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        let subj = format!("/CN={cn}");
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &subj,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }

    pub fn generate() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        key(d, "ca.key");
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=sluice test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        signed(
            d,
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        signed(d, "client", "app", "extendedKeyUsage=clientAuth\n");
        key(d, "rogue.key");
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "rogue.key",
                "-out",
                "rogue.pem",
                "-days",
                "2",
                "-subj",
                "/CN=rogue",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                "extendedKeyUsage=clientAuth",
            ],
        );
        Certs { dir }
    }
}

#[cfg(test)]
mod tests {
    use super::test_certs::{generate, Certs};
    use super::*;
    use rustls::pki_types::ServerName;
    use rustls::ClientConfig;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn files(c: &Certs, client_ca: bool) -> TlsFiles {
        TlsFiles {
            cert: c.path("server.pem"),
            key: c.path("server.key"),
            client_ca: client_ca.then(|| c.path("ca.pem")),
        }
    }

    fn client(c: &Certs, identity: Option<&str>) -> tokio_rustls::TlsConnector {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in certificates(&c.path("ca.pem")).unwrap() {
            roots.add(cert).unwrap();
        }
        let b = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            Some(name) => b
                .with_client_auth_cert(
                    certificates(&c.path(&format!("{name}.pem"))).unwrap(),
                    PrivateKeyDer::from_pem_file(c.path(&format!("{name}.key"))).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// Accepts one connection with `tls`, echoes 4 bytes over TLS; returns the outcome.
    async fn serve_one(listener: &TcpListener, tls: &ReloadableTls) -> std::io::Result<()> {
        let (sock, _) = listener.accept().await?;
        let mut s = accept(&tls.acceptor(), sock, Duration::from_secs(5)).await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        s.write_all(&buf).await?;
        s.flush().await
    }

    async fn try_client(
        addr: std::net::SocketAddr,
        connector: tokio_rustls::TlsConnector,
    ) -> std::io::Result<[u8; 4]> {
        let sock = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut s = connector.connect(name, sock).await?;
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn handshake_and_client_certificates() {
        let certs = generate();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();

        // Without a client CA, any client that trusts the server connects.
        let tls = ReloadableTls::load(files(&certs, false)).unwrap();
        let (server, client_result) = tokio::join!(
            serve_one(&listener, &tls),
            try_client(addr, client(&certs, None))
        );
        server.unwrap();
        assert_eq!(&client_result.unwrap(), b"ping");

        // With a client CA: the CA's client certificate is accepted...
        let tls = ReloadableTls::load(files(&certs, true)).unwrap();
        let (server, client_result) = tokio::join!(
            serve_one(&listener, &tls),
            try_client(addr, client(&certs, Some("client")))
        );
        server.unwrap();
        assert_eq!(&client_result.unwrap(), b"ping");
        // ...no certificate is refused...
        let (server, client_result) = tokio::join!(
            serve_one(&listener, &tls),
            try_client(addr, client(&certs, None))
        );
        assert!(server.is_err());
        assert!(client_result.is_err());
        // ...and so is a certificate the CA did not sign.
        let (server, client_result) = tokio::join!(
            serve_one(&listener, &tls),
            try_client(addr, client(&certs, Some("rogue")))
        );
        let e = server.unwrap_err().to_string();
        assert!(e.contains("UnknownIssuer") || e.contains("issuer"), "{e}");
        assert!(client_result.is_err());
    }

    #[tokio::test]
    async fn plaintext_client_is_closed_at_once() {
        let certs = generate();
        let tls = ReloadableTls::load(files(&certs, false)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = async {
            let mut s = TcpStream::connect(addr).await.unwrap();
            // A CQL v4 OPTIONS frame.
            s.write_all(&[0x04, 0, 0, 1, 0x05, 0, 0, 0, 0])
                .await
                .unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            // The server answers with a TLS alert at most, then closes: EOF or reset.
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
                .await
                .expect("the server closed the connection");
            started.elapsed()
        };
        let (server, waited) = tokio::join!(serve_one(&listener, &tls), client);
        assert!(server.is_err(), "a plaintext client fails the handshake");
        assert!(waited < Duration::from_secs(1), "closed after {waited:?}");
    }

    #[tokio::test]
    async fn reload_replaces_the_configuration_and_keeps_it_on_error() {
        let certs = generate();
        let tls = ReloadableTls::load(files(&certs, false)).unwrap();
        let before = tls.current();
        tls.reload().unwrap();
        assert!(!Arc::ptr_eq(&before, &tls.current()), "a new configuration");
        let kept = tls.current();
        std::fs::write(certs.path("server.pem"), b"not a certificate").unwrap();
        assert!(tls.reload().is_err());
        assert!(Arc::ptr_eq(&kept, &tls.current()), "the old one stays");
        assert!(ReloadableTls::load(files(&certs, false)).is_err());
    }

    #[test]
    fn missing_files_and_mismatched_keys_are_errors() {
        let certs = generate();
        let mut f = files(&certs, false);
        f.key = certs.path("client.key");
        let e = server_config(&f).unwrap_err();
        assert!(e.0.contains("do not match"), "{e}");
        f.key = certs.path("nope.key");
        assert!(server_config(&f).is_err());
    }
}
