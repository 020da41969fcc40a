//! Certificates made at test time with the `openssl` tool (no key is committed), and TLS
//! client configurations that trust them.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

pub fn openssl(dir: &Path, args: &[&str]) {
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

pub fn key(dir: &Path, name: &str) {
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

/// `name.pem` / `name.key` signed by the CA in `dir`, with these extensions.
pub fn signed(dir: &Path, name: &str, cn: &str, ext: &str) {
    key(dir, &format!("{name}.key"));
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
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
            &format!("/CN={cn}"),
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

/// A CA, a server certificate for 127.0.0.1, a client certificate from the CA and a
/// self-signed client certificate nobody trusts.
pub fn certificates(dir: &Path) {
    key(dir, "ca.key");
    openssl(
        dir,
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
            "/CN=test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    signed(
        dir,
        "server",
        "localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    signed(dir, "client", "app", "extendedKeyUsage=clientAuth\n");
    key(dir, "rogue.key");
    openssl(
        dir,
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
}

/// A client configuration trusting the CA in `dir`, presenting `identity`'s certificate.
pub fn client_config(dir: &Path, identity: Option<&str>) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match identity {
        Some(name) => b
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(dir.join(format!("{name}.pem")))
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

/// The flags that turn TLS on with the certificates in `dir`.
pub fn tls_flags(dir: &Path, client_ca: bool) -> Vec<String> {
    let mut v = vec![
        "--tls-cert".to_string(),
        dir.join("server.pem").display().to_string(),
        "--tls-key".to_string(),
        dir.join("server.key").display().to_string(),
    ];
    if client_ca {
        v.push("--tls-client-ca".into());
        v.push(dir.join("ca.pem").display().to_string());
    }
    v
}
