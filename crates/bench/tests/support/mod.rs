//! What the bench's integration tests share: the `sluice` binary under test and a node's
//! `/metrics` page.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `sluice` executable under test: `SLUICE_BIN`, else the one beside the test's own
/// directory (`target/<profile>/deps/<test>-<hash>` -> `target/<profile>/sluice`).
pub fn sluice_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("test executable");
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("sluice"))
        .expect("target directory");
    assert!(
        p.exists(),
        "no sluice binary at {}: run `cargo build -p sluice` first or set SLUICE_BIN",
        p.display()
    );
    p
}

/// The text of the `/metrics` page served at `addr`.
pub fn metrics_text(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}
