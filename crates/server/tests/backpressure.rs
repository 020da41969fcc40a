//! Backpressure end to end: with a tiny per-connection in-flight cap, a
//! client that pipelines far more requests than the cap gets every one answered; the
//! server stops reading its socket instead of rejecting (no `Overloaded`). Once the shard
//! is overloaded, the cap answers the excess `Overloaded` instead, but a client that does
//! not read its answers is still stopped: memory stays bounded.

use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

mod support;

use support::node::{query, TestNode};

/// Reads one frame's stream and opcode.
fn read_frame(s: &mut std::net::TcpStream) -> (i16, u8) {
    let (stream, opcode, _) = support::node::read_frame(s);
    (stream, opcode)
}

#[test]
fn overloaded_the_cap_rejects_but_a_client_that_does_not_read_is_still_stopped() {
    // One request executes at a time, 5 ms each: 8 in flight on the connection are a
    // standing queue, and CoDel (1 ms / 20 ms) soon calls the shard overloaded.
    let node = TestNode::start(|c| {
        c.max_inflight_per_connection = 8;
        c.test_only_service_delay = Some(Duration::from_millis(5));
        let defaults = sluice_server::AdmissionConfig::default();
        let mut codel = defaults.codel;
        codel.target = Duration::from_millis(1);
        codel.slough = Duration::from_millis(2);
        codel.interval = Duration::from_millis(20);
        let mut concurrency = defaults.concurrency;
        (concurrency.initial, concurrency.min, concurrency.max) = (1, 1, 1);
        c.admission = Some(sluice_server::AdmissionConfig {
            codel,
            concurrency,
            ..defaults
        });
    });
    let mut s = node.connect();
    // Pipeline without ever reading, until the socket stops taking bytes.
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut chunk = Vec::new();
    for stream in 1..=1_000i16 {
        chunk.extend(query(stream, "SELECT key FROM system.local"));
    }
    let mut sent = 0usize;
    let stopped = loop {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break true,
        }
        if sent > 1 << 30 {
            break false;
        }
    };
    let m = &node.server().metrics()[0];
    let rejected = m.rejected_overloaded.load(Relaxed);
    assert!(
        stopped,
        "the server kept reading a client that reads nothing"
    );
    assert!(
        rejected > 100,
        "over the cap while overloaded: Overloaded ({rejected})"
    );
    // What it answered is bounded by the outbox cap (plus the kernel's buffers): an
    // `Overloaded` frame is over 40 bytes, so 8 MiB hold under 210,000 of them.
    let requests = sent / (chunk.len() / 1_000);
    assert!(
        rejected < 400_000,
        "{rejected} rejections for {requests} requests sent"
    );
    assert!(
        m.backpressure_pauses.load(Relaxed) > 0 || requests > rejected as usize,
        "the rest waits unread"
    );
    // The client reads again: answers flow, each one an answer to something it sent.
    for _ in 0..1_000 {
        let (stream, opcode) = read_frame(&mut s);
        assert!((1..=1_000).contains(&stream) && (opcode == 0x08 || opcode == 0x00));
    }
}

#[test]
fn over_the_in_flight_cap_the_socket_waits_and_nothing_is_rejected() {
    let node = TestNode::start(|config| {
        config.max_inflight_per_connection = 4;
        // Each request waits 1 ms, so it stays in flight: one that finishes at once runs in
        // the reader and frees its slot before the next frame is read.
        config.test_only_service_delay = Some(Duration::from_millis(1));
        // Backpressure alone: a shard starved of CPU by its neighbours (other tests, a busy
        // CI machine) must not count as overloaded here, which would turn the cap into
        // rejections.
        config.admission = Some(sluice_server::AdmissionConfig {
            lag_probe_interval: Duration::ZERO,
            reject_over_cap: false,
            ..Default::default()
        });
    });
    let mut s = node.connect();

    let mut batch = Vec::new();
    for stream in 1..=200i16 {
        batch.extend(query(stream, "SELECT * FROM system_schema.columns"));
    }
    s.write_all(&batch).unwrap();
    let mut answered = std::collections::HashSet::new();
    for _ in 0..200 {
        let (stream, opcode) = read_frame(&mut s);
        assert_eq!(opcode, 0x08, "stream {stream} answered with a result");
        answered.insert(stream);
    }
    assert_eq!(answered.len(), 200, "every stream answered exactly once");
    let m = &node.server().metrics()[0];
    assert!(
        m.backpressure_pauses.load(Relaxed) > 0,
        "the reader waited for in-flight slots"
    );
    assert_eq!(
        m.errors_with_code(0x1001),
        0,
        "backpressure, not Overloaded"
    );
}

#[test]
fn requests_left_in_the_kernel_during_a_pause_are_not_counted_as_queued() {
    // Request bodies may hold 100 bytes in flight, and each request takes 150 ms. A request
    // that reaches the kernel while the reader waits for room waits in the client's queue
    // by design: once the reader resumes it is admitted as new, not shed for the 100 ms and
    // more it spent unread (CoDel's longest queue delay).
    let node = TestNode::start(|c| {
        c.max_inflight_bytes_per_connection = 100;
        c.test_only_service_delay = Some(Duration::from_millis(150));
        let defaults = sluice_server::AdmissionConfig::default();
        let mut concurrency = defaults.concurrency;
        (concurrency.initial, concurrency.min, concurrency.max) = (2, 2, 2);
        c.admission = Some(sluice_server::AdmissionConfig {
            concurrency,
            lag_probe_interval: Duration::ZERO,
            reject_over_cap: false,
            ..defaults
        });
    });
    let mut s = node.connect();
    // Each write leaves at once (Nagle would hold the later ones until the first is acked).
    s.set_nodelay(true).unwrap();
    // Bodies of 80, 50 and 35 bytes: the first two do not fit together, the last two do.
    let select = "SELECT key FROM system.local";
    let padded = |body: usize| format!("{select}{}", " ".repeat(body - 7 - select.len()));
    s.write_all(&query(1, &padded(80))).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // Read, then held by the reader until the first answer frees its bytes.
    s.write_all(&query(2, &padded(50))).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // Left in the kernel until then, and it fits beside the second at once.
    s.write_all(&query(3, select)).unwrap();
    let mut answered = std::collections::HashSet::new();
    for _ in 0..3 {
        let (stream, opcode) = read_frame(&mut s);
        assert_eq!(opcode, 0x08, "stream {stream} answered with a result");
        answered.insert(stream);
    }
    assert_eq!(answered.len(), 3);
    let m = &node.server().metrics()[0];
    assert!(m.backpressure_pauses.load(Relaxed) > 0, "the reader paused");
    assert_eq!(m.errors_with_code(0x1001), 0, "nothing turned away");
}
