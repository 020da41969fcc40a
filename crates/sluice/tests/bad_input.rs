//! Bad input: thousands of random and truncated frames, oversized lengths, wrong opcodes
//! and invalid UTF-8 on many raw connections at once. The server answers protocol errors
//! or closes only the offending connection, never crashes, and a well-behaved client
//! keeps being served meanwhile.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{frame, query, read_frame, startup, Node};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scylla::client::session_builder::SessionBuilder;

/// Reads whole frames until `stream` is answered; returns (opcode, error code if ERROR).
fn read_answer(s: &mut TcpStream, stream: i16) -> Option<(u8, Option<u32>)> {
    loop {
        let (st, op, code, _) = read_frame(s)?;
        if st == stream {
            return Some((op, code));
        }
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Specific malformed inputs whose answer is known.
fn deterministic_cases(addr: SocketAddr) {
    // Unsupported protocol version: ProtocolError on the same stream, v4 header.
    let mut s = connect(addr);
    s.write_all(&frame(0x42, 7, 0x05, &[])).unwrap();
    let mut h = [0u8; 9];
    s.read_exact(&mut h).unwrap();
    assert_eq!(h[0], 0x84);
    assert_eq!(i16::from_be_bytes([h[2], h[3]]), 7);
    assert_eq!(h[4], 0x00);
    let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(&body[..4], &[0, 0, 0, 0x0A]);
    assert!(String::from_utf8_lossy(&body).contains("unsupported protocol version"));

    // Invalid UTF-8 query text after STARTUP: ProtocolError, and the connection still works.
    let mut s = connect(addr);
    s.write_all(&startup()).unwrap();
    assert_eq!(read_answer(&mut s, 1), Some((0x02, None)));
    s.write_all(&query(2, b"SELECT \xff\xfe FROM system.local"))
        .unwrap();
    assert_eq!(read_answer(&mut s, 2), Some((0x00, Some(0x0A))));
    s.write_all(&query(3, b"SELECT key FROM system.local"))
        .unwrap();
    assert_eq!(
        read_answer(&mut s, 3).map(|a| a.0),
        Some(0x08),
        "connection still serves"
    );

    // A request before STARTUP: ProtocolError.
    let mut s = connect(addr);
    s.write_all(&query(5, b"SELECT key FROM system.local"))
        .unwrap();
    assert_eq!(read_answer(&mut s, 5), Some((0x00, Some(0x0A))));

    // Oversized length: ProtocolError, then the connection is closed.
    let mut s = connect(addr);
    let mut f = frame(4, 9, 0x07, &[]);
    f[5..9].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    s.write_all(&f).unwrap();
    assert_eq!(read_answer(&mut s, 9), Some((0x00, Some(0x0A))));
    let mut rest = Vec::new();
    assert_eq!(
        s.read_to_end(&mut rest).unwrap_or(0),
        0,
        "closed after an oversized frame"
    );

    // A response opcode sent as a request: ProtocolError.
    let mut s = connect(addr);
    s.write_all(&frame(4, 11, 0x08, &[0, 0, 0, 1])).unwrap();
    assert_eq!(read_answer(&mut s, 11), Some((0x00, Some(0x0A))));
}

/// A byte stream to the node: plain TCP or TLS.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// A TCP connection with the fuzzer's timeouts (short reads: the answers are drained, not
/// awaited).
fn fuzz_socket(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
    Some(s)
}

fn plain(addr: SocketAddr) -> Option<Box<dyn Conn>> {
    fuzz_socket(addr).map(|s| Box::new(s) as Box<dyn Conn>)
}

/// Random garbage on one connection: random bytes, random bodies behind valid headers,
/// truncated frames, bad lengths and opcodes. Returns the number of frames sent.
fn fuzz_connection(connect: &dyn Fn() -> Option<Box<dyn Conn>>, seed: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let Some(mut s) = connect() else {
        return 0;
    };
    let mut sent = 0;
    if rng.random_bool(0.5) {
        let _ = s.write_all(&startup());
    }
    for _ in 0..rng.random_range(5..40) {
        let stream = rng.random_range(0..100i16);
        let f = match rng.random_range(0..7) {
            0 => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
            1 => {
                let body: Vec<u8> = (0..rng.random_range(0..200))
                    .map(|_| rng.random())
                    .collect();
                frame(
                    4,
                    stream,
                    [0x01, 0x05, 0x07, 0x09, 0x0A, 0x0B, 0x0D, 0x0F][rng.random_range(0..8)],
                    &body,
                )
            }
            2 => {
                let mut f = query(stream, b"SELECT * FROM system.local");
                f.truncate(rng.random_range(1..f.len()));
                f
            }
            3 => {
                let mut f = frame(4, stream, 0x07, &[]);
                f[5..9].copy_from_slice(&rng.random::<u32>().to_be_bytes());
                f
            }
            4 => frame(4, stream, rng.random_range(0x10..=0xff), &[1, 2, 3]),
            5 => {
                let bad: Vec<u8> = (0..rng.random_range(1..50))
                    .map(|_| rng.random_range(0x80..=0xff))
                    .collect();
                query(stream, &bad)
            }
            _ => frame(rng.random_range(0..=0xff), stream, 0x05, &[]),
        };
        if s.write_all(&f).is_err() {
            break;
        }
        sent += 1;
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_never_crashes_the_server_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(&dir.path().join("data"), 2, &["--durability", "periodic"]);
    let addr = node.addr;
    let session = SessionBuilder::new()
        .known_node(addr.to_string())
        .build()
        .await
        .expect("connect");
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let good = {
        let (ok, failed, stop) = (ok.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match session
                    .query_unpaged("SELECT key FROM system.local", &[])
                    .await
                {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let fuzz = tokio::task::spawn_blocking(move || {
        deterministic_cases(addr);
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                std::thread::spawn(move || {
                    (0..40u64)
                        .map(|c| fuzz_connection(&|| plain(addr), t * 1000 + c))
                        .sum::<u64>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>()
    });
    let frames = fuzz.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    good.await.unwrap();

    assert!(frames >= 2000, "only {frames} bad frames sent");
    assert!(node.alive(), "server died: {}", node.log());
    assert!(
        !node.log().contains("panicked"),
        "a panic was logged: {}",
        node.log()
    );
    assert!(
        ok.load(Ordering::Relaxed) > 10,
        "the good client was starved"
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "the good client saw errors"
    );
    // A fresh client still connects and is served.
    let fresh = SessionBuilder::new()
        .known_node(addr.to_string())
        .build()
        .await
        .unwrap();
    fresh
        .query_unpaged("SELECT key FROM system.local", &[])
        .await
        .unwrap();
    assert!(node.metric("sluice_protocol_closes_total", &[]) > 0.0);
}

/// The same garbage over TLS: every frame arrives through the TLS layer; a client that
/// speaks TLS properly keeps being served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_over_tls_never_crashes_the_server_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    common::certs::certificates(&certs);
    let mut flags = vec!["--durability".to_string(), "periodic".to_string()];
    flags.extend(common::certs::tls_flags(&certs, false));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut node = Node::start(&dir.path().join("data"), 2, &flags);
    let addr = node.addr;
    let config = common::certs::client_config(&certs, None);
    let tls = {
        let config = config.clone();
        move || -> Option<Box<dyn Conn>> {
            let sock = fuzz_socket(addr)?;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").ok()?;
            let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
            Some(Box::new(rustls::StreamOwned::new(conn, sock)))
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    // A well-behaved TLS client: STARTUP, then queries until the fuzzers are done.
    let good = {
        let (stop, tls) = (stop.clone(), tls.clone());
        std::thread::spawn(move || {
            let mut s = tls().expect("TLS connect");
            s.write_all(&startup()).unwrap();
            let mut served = 0u64;
            let answer = |s: &mut Box<dyn Conn>, stream: i16| -> u8 {
                loop {
                    let mut h = [0u8; 9];
                    match s.read_exact(&mut h) {
                        Ok(()) => {}
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            continue
                        }
                        Err(e) => panic!("the good TLS client lost its connection: {e}"),
                    }
                    let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
                    s.read_exact(&mut body).unwrap();
                    if i16::from_be_bytes([h[2], h[3]]) == stream {
                        return h[4];
                    }
                }
            };
            assert_eq!(answer(&mut s, 1), 0x02, "READY");
            let mut stream = 2i16;
            while !stop.load(Ordering::Relaxed) {
                s.write_all(&query(stream, b"SELECT key FROM system.local"))
                    .unwrap();
                assert_eq!(answer(&mut s, stream), 0x08, "RESULT");
                served += 1;
                stream = stream % 1000 + 2;
                std::thread::sleep(Duration::from_millis(5));
            }
            served
        })
    };
    let fuzz = tokio::task::spawn_blocking(move || {
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let tls = tls.clone();
                std::thread::spawn(move || {
                    (0..25u64)
                        .map(|c| fuzz_connection(&tls, t * 1000 + c))
                        .sum::<u64>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>()
    });
    let frames = fuzz.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let served = good
        .join()
        .expect("the good TLS client was served without error");
    assert!(frames >= 500, "only {frames} bad frames sent over TLS");
    assert!(node.alive(), "server died: {}", node.log());
    assert!(
        !node.log().contains("panicked"),
        "a panic was logged: {}",
        node.log()
    );
    assert!(
        served > 10,
        "the good TLS client was starved ({served} answers)"
    );
    assert!(node.metric("sluice_protocol_closes_total", &[]) > 0.0);
}
