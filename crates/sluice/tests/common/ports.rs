//! Free loopback ports for test servers, shared by the integration tests of `sluice` and of
//! `sluice-bench` (which includes this file by path).

use std::net::TcpListener;

/// A free TCP port on 127.0.0.1, drawn below Linux's ephemeral range (32768..) so that the
/// client sockets of tests running in parallel cannot take it between this check and the
/// server's bind (still racy between two tests; [`Node::start`] retries on a clash).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) << 20
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of (seed, n): spread over 20000..32000.
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let port = 20_000 + ((z ^ (z >> 31)) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000 after 1000 tries")
}
