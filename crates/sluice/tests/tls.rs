//! TLS on the CQL listener against the real binary: certificates generated at test time
//! with the `openssl` tool, a TLS client speaking CQL, client certificates accepted and
//! refused, a plaintext client closed at once, bad frames over TLS, and SIGHUP reload.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::certs::{certificates, signed, tls_flags};
use common::{frame, query, startup, Node};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn connector(dir: &Path, identity: Option<&str>) -> TlsConnector {
    TlsConnector::from(common::certs::client_config(dir, identity))
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls_connect(node: &Node, c: &TlsConnector) -> std::io::Result<Tls> {
    let sock = TcpStream::connect(node.addr).await?;
    c.connect(ServerName::try_from("127.0.0.1").unwrap(), sock)
        .await
}

/// One answer: (opcode, error code if ERROR); None when the connection ends.
async fn answer<S: AsyncRead + Unpin>(s: &mut S) -> Option<(u8, Option<u32>)> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).await.ok()?;
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.ok()?;
    let code = (h[4] == 0).then(|| u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    Some((h[4], code))
}

/// STARTUP then a query over `s`: READY, then a RESULT.
async fn speaks_cql(s: &mut Tls) {
    s.write_all(&startup()).await.unwrap();
    assert_eq!(answer(s).await, Some((0x02, None)), "READY");
    s.write_all(&query(2, "SELECT release_version FROM system.local"))
        .await
        .unwrap();
    assert_eq!(answer(s).await, Some((0x08, None)), "RESULT");
}

fn start(dir: &tempfile::TempDir, flags: &[String]) -> Node {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Node::start(&dir.path().join("data"), 1, &flags)
}

fn serial_of(s: &Tls) -> Vec<u8> {
    let (_, conn) = s.get_ref();
    conn.peer_certificates().unwrap()[0].as_ref().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_plaintext_refused_and_sighup_reload() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    certificates(&certs);
    let node = start(&dir, &tls_flags(&certs, false));
    let client = connector(&certs, None);

    let mut s = tls_connect(&node, &client).await.expect("TLS handshake");
    speaks_cql(&mut s).await;
    let first_cert = serial_of(&s);

    // A plaintext client on the TLS port is closed at once, not left hanging.
    let mut plain = TcpStream::connect(node.addr).await.unwrap();
    plain.write_all(&startup()).await.unwrap();
    let started = Instant::now();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "the plaintext client was left hanging");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(!sink.starts_with(&[0x84]), "no CQL answer in plaintext");

    // Garbage frames over TLS: a protocol error, this connection closed, the node alive.
    let mut g = tls_connect(&node, &client).await.unwrap();
    g.write_all(&startup()).await.unwrap();
    assert_eq!(answer(&mut g).await, Some((0x02, None)));
    g.write_all(&frame(4, 3, 0x07, &[0xff; 7])).await.unwrap();
    let (op, code) = answer(&mut g).await.expect("an error answer");
    assert_eq!(op, 0x00);
    assert!(code.is_some());
    g.write_all(&[0x42; 64]).await.unwrap();
    assert_eq!(
        answer(&mut g).await.map(|(_, c)| c),
        Some(Some(0x000A)),
        "protocol error"
    );
    assert!(answer(&mut g).await.is_none(), "closed after a bad header");
    let mut again = tls_connect(&node, &client).await.unwrap();
    speaks_cql(&mut again).await;

    // SIGHUP: new connections get the new certificate; the open one goes on.
    signed(
        &certs,
        "server",
        "localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let pid = node.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let mut renewed = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s2 = tls_connect(&node, &client).await.unwrap();
        if serial_of(&s2) != first_cert {
            renewed = Some(s2);
            break;
        }
    }
    let mut s2 = renewed.expect("the reloaded certificate is served");
    speaks_cql(&mut s2).await;
    s.write_all(&query(9, "SELECT release_version FROM system.local"))
        .await
        .unwrap();
    assert_eq!(
        answer(&mut s).await,
        Some((0x08, None)),
        "the old connection still works"
    );
    assert!(node.metric("sluice_tls_handshake_failures_total", &[]) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_accepted_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    certificates(&certs);
    let node = start(&dir, &tls_flags(&certs, true));

    let mut s = tls_connect(&node, &connector(&certs, Some("client")))
        .await
        .expect("CA-signed client");
    speaks_cql(&mut s).await;
    for refused in [None, Some("rogue")] {
        // TLS 1.3 reports the refusal after the client's side completes: at the first read.
        let outcome = match tls_connect(&node, &connector(&certs, refused)).await {
            Err(_) => None,
            Ok(mut s) => {
                let _ = s.write_all(&startup()).await;
                answer(&mut s).await
            }
        };
        assert_eq!(outcome, None, "{refused:?} was served");
    }
    assert!(node.metric("sluice_tls_handshake_failures_total", &[]) >= 2.0);
}
