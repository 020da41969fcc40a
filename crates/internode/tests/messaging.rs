//! Two messengers in one process on 127.0.0.1 and 127.0.0.2, over real TCP.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sluice_internode::frame::{encode_frame, FrameHeader, Kind, HEADER_LEN};
use sluice_internode::handshake::{decode_answer, Answer, Hello, ANSWER_LEN};
use sluice_internode::{
    CallError, ConnectionClass, FailureDetector, FailureDetectorConfig, Liveness, Messenger,
    MessengerConfig, Status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const CLUSTER: &str = "Test Cluster";
const ECHO: u16 = 100;
const SLOW: u16 = 101;
const BUDGET: u16 = 102;
const BULK: u16 = 200;

fn config(ip: &str, host_id: u128) -> MessengerConfig {
    MessengerConfig::new(CLUSTER, host_id, format!("{ip}:0").parse().unwrap())
}

async fn bounded<F: Future>(limit: Duration, test: F) -> F::Output {
    tokio::time::timeout(limit, test)
        .await
        .expect("test exceeded its time bound")
}

fn in_ms(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Serves the Requests class: ECHO answers its body, SLOW sleeps 300 ms first, BUDGET answers
/// the budget the frame carried in microseconds. Counts every message it runs.
fn serve_requests(messenger: &Messenger) -> Arc<AtomicU64> {
    let runs = Arc::new(AtomicU64::new(0));
    let mut queue = messenger.take_inbound(ConnectionClass::Requests).unwrap();
    let counted = runs.clone();
    tokio::spawn(async move {
        while let Some(message) = queue.recv().await {
            counted.fetch_add(1, Ordering::Relaxed);
            match message.verb {
                ECHO => {
                    let body = message.body.clone();
                    message.reply(body);
                }
                SLOW => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    message.reply(Bytes::from_static(b"slow"));
                }
                BUDGET => {
                    let micros = message.budget_on_arrival().as_micros() as u64;
                    message.reply(Bytes::copy_from_slice(&micros.to_be_bytes()));
                }
                _ => message.reply_status(Status::UnknownVerb),
            }
        }
    });
    runs
}

async fn pair() -> (Messenger, Messenger) {
    let a = Messenger::bind(config("127.0.0.1", 1)).await.unwrap();
    let b = Messenger::bind(config("127.0.0.2", 2)).await.unwrap();
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_in_both_directions() {
    bounded(Duration::from_secs(20), async {
        let (a, b) = pair().await;
        serve_requests(&a);
        serve_requests(&b);
        let reply = a
            .call(
                b.local_addr(),
                ConnectionClass::Requests,
                ECHO,
                Bytes::from_static(b"hello"),
                in_ms(2000),
            )
            .await;
        assert_eq!(reply.as_deref(), Ok(&b"hello"[..]));
        let reply = b
            .call(
                a.local_addr(),
                ConnectionClass::Requests,
                ECHO,
                Bytes::from_static(b"back"),
                in_ms(2000),
            )
            .await;
        assert_eq!(reply.as_deref(), Ok(&b"back"[..]));
        // A body of the maximum frame size crosses too; one byte more is refused locally.
        let big = Bytes::from(vec![7u8; 1 << 20]);
        let reply = a
            .call(
                b.local_addr(),
                ConnectionClass::Requests,
                ECHO,
                big.clone(),
                in_ms(5000),
            )
            .await;
        assert_eq!(reply, Ok(big));
        let metrics = a.metrics();
        assert_eq!(metrics.class(ConnectionClass::Requests).frames_out, 2);
        assert_eq!(metrics.class(ConnectionClass::Responses).frames_in, 2);
        assert_eq!(b.metrics().class(ConnectionClass::Responses).frames_out, 2);
        let unknown = a
            .call(
                b.local_addr(),
                ConnectionClass::Requests,
                999,
                Bytes::new(),
                in_ms(2000),
            )
            .await;
        assert_eq!(unknown, Err(CallError::UnknownVerb));
        let reserved = a
            .call(
                b.local_addr(),
                ConnectionClass::Requests,
                1,
                Bytes::new(),
                in_ms(2000),
            )
            .await;
        assert_eq!(reserved, Err(CallError::ReservedVerb));
        let wrong = a
            .call(
                b.local_addr(),
                ConnectionClass::Responses,
                ECHO,
                Bytes::new(),
                in_ms(2000),
            )
            .await;
        assert_eq!(wrong, Err(CallError::WrongClass));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remaining_budget_travels_in_the_frame() {
    bounded(Duration::from_secs(20), async {
        let (a, b) = pair().await;
        serve_requests(&b);
        for budget_ms in [50u64, 500, 5000] {
            let sent = Instant::now();
            let reply = a
                .call(
                    b.local_addr(),
                    ConnectionClass::Requests,
                    BUDGET,
                    Bytes::new(),
                    sent + Duration::from_millis(budget_ms),
                )
                .await
                .unwrap();
            let carried = u64::from_be_bytes(reply[..8].try_into().unwrap());
            let elapsed = sent.elapsed().as_micros() as u64;
            assert!(
                carried <= budget_ms * 1000,
                "carried {carried} us of {budget_ms} ms"
            );
            assert!(
                carried + elapsed >= budget_ms * 1000,
                "carried {carried} us + {elapsed} us round trip < {budget_ms} ms"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_expires_in_the_queue_is_not_run() {
    bounded(Duration::from_secs(20), async {
        let (a, b) = pair().await;
        let runs = serve_requests(&b);
        let peer = b.local_addr();
        let slow = a.call(
            peer,
            ConnectionClass::Requests,
            SLOW,
            Bytes::new(),
            in_ms(2000),
        );
        let quick = async {
            // Sent while the handler sleeps on SLOW: it waits in the queue past its 100 ms.
            tokio::time::sleep(Duration::from_millis(20)).await;
            a.call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(100),
            )
            .await
        };
        let (slow, quick) = tokio::join!(slow, quick);
        assert_eq!(slow.as_deref(), Ok(&b"slow"[..]));
        assert!(
            matches!(quick, Err(CallError::Timeout | CallError::Expired)),
            "{quick:?}"
        );
        // Let the handler loop reach the expired message.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 1, "only SLOW ran");
        assert_eq!(
            b.metrics().class(ConnectionClass::Requests).expired_inbound,
            1
        );
    })
    .await;
}

/// Opens a raw connection to `peer` and completes the handshake as `host_id`.
async fn raw_connection(
    peer: SocketAddr,
    class: ConnectionClass,
    cluster: &str,
) -> (TcpStream, Answer) {
    let mut stream = TcpStream::connect(peer).await.unwrap();
    let hello = Hello {
        class,
        host_id: 77,
        internode_addr: "127.0.0.3:7".parse().unwrap(),
        cluster_name: cluster.into(),
    };
    let mut buf = BytesMut::new();
    hello.encode(&mut buf);
    stream.write_all(&buf).await.unwrap();
    let mut answer = [0u8; ANSWER_LEN];
    stream.read_exact(&mut answer).await.unwrap();
    (stream, decode_answer(&answer).unwrap().0)
}

/// True if the peer closes `stream` within a second.
async fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_or_handshake_closes_only_that_connection() {
    bounded(Duration::from_secs(20), async {
        let (a, b) = pair().await;
        serve_requests(&b);
        let peer = b.local_addr();
        assert!(a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(2000)
            )
            .await
            .is_ok());

        // A frame with a bad magic.
        let (mut bad_magic, answer) =
            raw_connection(peer, ConnectionClass::Requests, CLUSTER).await;
        assert_eq!(answer, Answer::Accepted);
        bad_magic.write_all(&[0xFF; HEADER_LEN]).await.unwrap();
        assert!(closed_by_peer(&mut bad_magic).await);

        // A header claiming a body above the maximum: closed without the body being sent.
        let (mut too_large, _) = raw_connection(peer, ConnectionClass::Bulk, CLUSTER).await;
        let mut header = BytesMut::new();
        FrameHeader {
            kind: Kind::OneWay,
            verb: BULK,
            status: Status::Ok,
            id: 0,
            budget_micros: 1_000_000,
            length: u32::MAX,
        }
        .write(&mut header);
        too_large.write_all(&header).await.unwrap();
        assert!(closed_by_peer(&mut too_large).await);

        // A request on the Responses class.
        let (mut wrong_class, _) = raw_connection(peer, ConnectionClass::Responses, CLUSTER).await;
        let mut frame = BytesMut::new();
        encode_frame(
            FrameHeader {
                kind: Kind::Request,
                verb: ECHO,
                status: Status::Ok,
                id: 1,
                budget_micros: 1_000_000,
                length: 0,
            },
            &[],
            &mut frame,
        );
        wrong_class.write_all(&frame).await.unwrap();
        assert!(closed_by_peer(&mut wrong_class).await);

        // A garbage handshake.
        let mut garbage = TcpStream::connect(peer).await.unwrap();
        garbage.write_all(&[0xAB; 64]).await.unwrap();
        assert!(closed_by_peer(&mut garbage).await);

        // The messenger's own connection is untouched and still serves.
        for _ in 0..10 {
            let reply = a
                .call(
                    peer,
                    ConnectionClass::Requests,
                    ECHO,
                    Bytes::from_static(b"x"),
                    in_ms(2000),
                )
                .await;
            assert_eq!(reply.as_deref(), Ok(&b"x"[..]));
        }
        let metrics = b.metrics();
        assert_eq!(metrics.class(ConnectionClass::Requests).malformed_closes, 1);
        assert_eq!(metrics.class(ConnectionClass::Bulk).malformed_closes, 1);
        assert_eq!(
            metrics.class(ConnectionClass::Responses).malformed_closes,
            1
        );
        assert_eq!(metrics.handshake_failures, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_no_budget_left_is_not_run() {
    bounded(Duration::from_secs(20), async {
        let (_a, b) = pair().await;
        let runs = serve_requests(&b);
        let (mut raw, _) = raw_connection(b.local_addr(), ConnectionClass::Requests, CLUSTER).await;
        let mut frame = BytesMut::new();
        encode_frame(
            FrameHeader {
                kind: Kind::Request,
                verb: ECHO,
                status: Status::Ok,
                id: 1,
                budget_micros: 0,
                length: 0,
            },
            &[],
            &mut frame,
        );
        raw.write_all(&frame).await.unwrap();
        let start = Instant::now();
        while b.metrics().class(ConnectionClass::Requests).expired_inbound == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "expired frame not counted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 0);
        assert_eq!(
            b.metrics()
                .class(ConnectionClass::Requests)
                .malformed_closes,
            0
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_is_refused_at_the_handshake() {
    bounded(Duration::from_secs(20), async {
        let (_a, b) = pair().await;
        serve_requests(&b);
        let (mut raw, answer) =
            raw_connection(b.local_addr(), ConnectionClass::Control, "Other Cluster").await;
        assert_eq!(answer, Answer::ClusterMismatch);
        assert!(closed_by_peer(&mut raw).await);
        let stranger = Messenger::bind(MessengerConfig::new(
            "Other Cluster",
            3,
            "127.0.0.3:0".parse().unwrap(),
        ))
        .await
        .unwrap();
        let start = Instant::now();
        let reply = stranger
            .call(
                b.local_addr(),
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(2000),
            )
            .await;
        assert_eq!(reply, Err(CallError::PeerDown));
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "refusal took {:?}",
            start.elapsed()
        );
        assert_eq!(b.metrics().handshake_failures, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbound_queue_answers_overloaded_at_once() {
    bounded(Duration::from_secs(20), async {
        let a = Messenger::bind(config("127.0.0.1", 1)).await.unwrap();
        let mut b_config = config("127.0.0.2", 2);
        b_config.inbound_queue_len[ConnectionClass::Requests.index()] = 4;
        let b = Messenger::bind(b_config).await.unwrap();
        // Nobody takes B's Requests queue: four requests fill it.
        let peer = b.local_addr();
        let a = Arc::new(a);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let a = a.clone();
            calls.spawn(async move {
                let start = Instant::now();
                let result = a
                    .call(
                        peer,
                        ConnectionClass::Requests,
                        ECHO,
                        Bytes::new(),
                        in_ms(1000),
                    )
                    .await;
                (result, start.elapsed())
            });
        }
        let results = calls.join_all().await;
        let overloaded: Vec<_> = results
            .iter()
            .filter(|(r, _)| *r == Err(CallError::Overloaded))
            .collect();
        let timed_out = results
            .iter()
            .filter(|(r, _)| *r == Err(CallError::Timeout))
            .count();
        assert_eq!(overloaded.len(), 16, "{results:?}");
        assert_eq!(timed_out, 4);
        for (_, elapsed) in overloaded {
            assert!(
                *elapsed < Duration::from_millis(600),
                "overloaded after {elapsed:?}"
            );
        }
        assert_eq!(
            b.metrics()
                .class(ConnectionClass::Requests)
                .overloaded_replies,
            16
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_to_a_peer_are_bounded() {
    bounded(Duration::from_secs(20), async {
        let mut a_config = config("127.0.0.1", 1);
        a_config.max_calls_in_flight_per_peer = 2;
        let a = Arc::new(Messenger::bind(a_config).await.unwrap());
        let (b, c) = (
            Messenger::bind(config("127.0.0.2", 2)).await.unwrap(),
            Messenger::bind(config("127.0.0.3", 3)).await.unwrap(),
        );
        serve_requests(&c);
        // B never takes its queue: two calls stay in flight until their deadline.
        let peer = b.local_addr();
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move {
                    a.call(
                        peer,
                        ConnectionClass::Requests,
                        ECHO,
                        Bytes::new(),
                        in_ms(500),
                    )
                    .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let start = Instant::now();
        let third = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(500),
            )
            .await;
        assert_eq!(third, Err(CallError::TooManyInFlight));
        assert!(start.elapsed() < Duration::from_millis(50));
        // The bound is per peer: another peer is still reachable.
        assert!(a
            .call(
                c.local_addr(),
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(1000)
            )
            .await
            .is_ok());
        for call in waiting {
            assert_eq!(call.await.unwrap(), Err(CallError::Timeout));
        }
        // Timed-out calls leave the table: the peer takes calls again.
        let again = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(50),
            )
            .await;
        assert_eq!(again, Err(CallError::Timeout));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_outbound_queue_fails_fast() {
    bounded(Duration::from_secs(30), async {
        let mut a_config = config("127.0.0.1", 1);
        a_config.outbound_queue_bytes[ConnectionClass::Bulk.index()] = 1 << 20;
        let a = Messenger::bind(a_config).await.unwrap();
        // A peer that completes the handshake and then never reads: the socket buffers fill,
        // then the queue.
        let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let peer = listener.local_addr().unwrap();
        let stalled = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut hello = [0u8; sluice_internode::handshake::HELLO_FIXED_LEN + CLUSTER.len()];
            stream.read_exact(&mut hello).await.unwrap();
            stream
                .write_all(&sluice_internode::handshake::encode_answer(
                    Answer::Accepted,
                    2,
                ))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(stream);
        });
        let body = Bytes::from(vec![0u8; 64 * 1024]);
        let mut sent = 0usize;
        let refused = loop {
            let start = Instant::now();
            match a.send_oneway(
                peer,
                ConnectionClass::Bulk,
                BULK,
                body.clone(),
                in_ms(20_000),
            ) {
                Ok(()) => sent += 1,
                Err(error) => break (error, start.elapsed()),
            }
            assert!(sent < 2000, "128 MiB queued without a refusal");
            // Let the writer move what it can into the socket.
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert_eq!(refused.0, CallError::QueueFull);
        assert!(
            refused.1 < Duration::from_millis(50),
            "refusal took {:?}",
            refused.1
        );
        assert!(a.metrics().class(ConnectionClass::Bulk).queue_full >= 1);
        // Control to the same peer has its own queue and is not refused.
        assert!(a
            .send_oneway(
                peer,
                ConnectionClass::Control,
                BULK,
                Bytes::new(),
                in_ms(1000)
            )
            .is_ok());
        stalled.abort();
    })
    .await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_bulk_class_does_not_slow_control_pings() {
    bounded(Duration::from_secs(30), async {
        let mut a_config = config("127.0.0.1", 1);
        // A deep Bulk queue: anything that waited behind it would wait tens of milliseconds.
        a_config.outbound_queue_bytes[ConnectionClass::Bulk.index()] = 64 << 20;
        let a = Messenger::bind(a_config).await.unwrap();
        let b = Messenger::bind(config("127.0.0.2", 2)).await.unwrap();
        let peer = b.local_addr();
        // The default down_after: a pause of this process or of its runtime (the Bulk traffic
        // below shares the runtime's two threads with the detector) is not counted as silence.
        let detector = FailureDetector::start(&a, FailureDetectorConfig::default());
        detector.watch(peer);
        let mut changes = detector.subscribe();
        // B answers Bulk requests at once and drops Bulk one-way messages, so the connection
        // runs at full speed.
        let mut bulk_queue = b.take_inbound(ConnectionClass::Bulk).unwrap();
        tokio::spawn(async move {
            while let Some(message) = bulk_queue.recv().await {
                if !message.is_one_way() {
                    message.reply(Bytes::new());
                }
            }
        });
        let mut baseline = Vec::new();
        for _ in 0..50 {
            baseline.push(a.ping(peer, in_ms(1000)).await.unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        baseline.sort();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let a = Arc::new(a);
        let sender = {
            let (a, stop) = (a.clone(), stop.clone());
            tokio::spawn(async move {
                let body = Bytes::from(vec![1u8; 256 * 1024]);
                let mut refused = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match a.send_oneway(peer, ConnectionClass::Bulk, BULK, body.clone(), in_ms(5000)) {
                        Ok(()) => tokio::task::yield_now().await,
                        Err(_) => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        }
                    }
                }
                refused
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let bulk_before = a.metrics().class(ConnectionClass::Bulk).bytes_out;
        let started = Instant::now();
        let mut loaded = Vec::new();
        let mut behind_bulk = Vec::new();
        for i in 0..200 {
            loaded.push(a.ping(peer, in_ms(1000)).await.unwrap());
            if i % 10 == 0 {
                // The same tiny round trip on the Bulk class, for comparison.
                let start = Instant::now();
                if a.call(peer, ConnectionClass::Bulk, ECHO, Bytes::new(), in_ms(2000)).await.is_ok() {
                    behind_bulk.push(start.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let window = started.elapsed();
        let bulk_bytes = a.metrics().class(ConnectionClass::Bulk).bytes_out - bulk_before;
        stop.store(true, Ordering::Relaxed);
        let refused = sender.await.unwrap();
        loaded.sort();
        behind_bulk.sort();
        let p99 = percentile(&loaded, 0.99);
        let bulk_median = percentile(&behind_bulk, 0.5);
        println!(
            "ping rtt idle p50 {:?} p99 {:?}; with bulk p50 {:?} p99 {:?} max {:?}; bulk-class round trip p50 {bulk_median:?}; bulk {:.0} MB/s, {refused} sends refused",
            percentile(&baseline, 0.5),
            percentile(&baseline, 0.99),
            percentile(&loaded, 0.5),
            p99,
            loaded.last().unwrap(),
            bulk_bytes as f64 / window.as_secs_f64() / 1e6,
        );
        assert!(refused > 0, "the bulk queue never filled");
        assert!(bulk_bytes > 20 << 20, "bulk moved only {bulk_bytes} bytes");
        assert!(p99 < Duration::from_millis(100), "ping p99 {p99:?} under bulk load");
        // Medians, not the p99: one descheduling of the test on a shared machine moves a p99,
        // while a ping queued behind the Bulk class would move the whole distribution.
        let ping_median = percentile(&loaded, 0.5);
        assert!(
            ping_median < bulk_median,
            "control median {ping_median:?} is not below a bulk-class round trip {bulk_median:?}"
        );
        assert!(detector.is_up(peer));
        let mut downs = 0;
        while let Ok(change) = changes.try_recv() {
            if change.liveness == Liveness::Down {
                downs += 1;
            }
        }
        assert_eq!(downs, 0, "a busy peer was marked down");
    })
    .await;
}

enum NodeCommand {
    /// Block the node's only runtime thread, like SIGSTOP.
    Freeze(Duration),
    Stop,
}

/// A messenger on its own single-threaded runtime, so that the test can freeze it.
fn spawn_node(
    listen: SocketAddr,
    host_id: u128,
) -> (
    SocketAddr,
    mpsc::UnboundedSender<NodeCommand>,
    std::thread::JoinHandle<()>,
) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (command_tx, mut command_rx) = mpsc::unbounded_channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let messenger = Messenger::bind(MessengerConfig::new(CLUSTER, host_id, listen))
                .await
                .unwrap();
            serve_requests(&messenger);
            addr_tx.send(messenger.local_addr()).unwrap();
            while let Some(command) = command_rx.recv().await {
                match command {
                    NodeCommand::Freeze(duration) => std::thread::sleep(duration),
                    NodeCommand::Stop => break,
                }
            }
            messenger.shutdown().await;
        });
    });
    (addr_rx.recv().unwrap(), command_tx, thread)
}

async fn next_change(
    changes: &mut tokio::sync::broadcast::Receiver<sluice_internode::LivenessChange>,
    peer: SocketAddr,
) -> sluice_internode::LivenessChange {
    loop {
        let change = tokio::time::timeout(Duration::from_secs(5), changes.recv())
            .await
            .expect("no liveness change within 5 s")
            .unwrap();
        if change.peer == peer {
            return change;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_peer_is_marked_down_and_up_again() {
    bounded(Duration::from_secs(30), async {
        let a = Messenger::bind(config("127.0.0.1", 1)).await.unwrap();
        let (peer, commands, thread) = spawn_node("127.0.0.2:0".parse().unwrap(), 2);
        let detector = FailureDetector::start(&a, FailureDetectorConfig::default());
        let mut changes = detector.subscribe();
        detector.watch(peer);
        assert_eq!(next_change(&mut changes, peer).await.liveness, Liveness::Up);

        let frozen_at = Instant::now();
        commands
            .send(NodeCommand::Freeze(Duration::from_secs(3)))
            .unwrap();
        let down = next_change(&mut changes, peer).await;
        assert_eq!(down.liveness, Liveness::Down);
        let detection = down.at - frozen_at;
        assert!(
            detection < Duration::from_millis(2000),
            "down after {detection:?}"
        );
        // A call to the frozen peer ends at its deadline, not later.
        let start = Instant::now();
        let reply = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(200),
            )
            .await;
        assert_eq!(reply, Err(CallError::Timeout));
        assert!(start.elapsed() < Duration::from_millis(450));

        let up = next_change(&mut changes, peer).await;
        assert_eq!(up.liveness, Liveness::Up);
        let thawed_after = up.at - (frozen_at + Duration::from_secs(3));
        println!("frozen peer down after {detection:?}, up {thawed_after:?} after thawing");
        assert!(
            thawed_after < Duration::from_millis(1000),
            "up {thawed_after:?} after thawing"
        );
        assert!(a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(1000)
            )
            .await
            .is_ok());
        commands.send(NodeCommand::Stop).unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reconnected() {
    bounded(Duration::from_secs(30), async {
        let a = Messenger::bind(config("127.0.0.1", 1)).await.unwrap();
        let (peer, commands, thread) = spawn_node("127.0.0.2:0".parse().unwrap(), 2);
        let detector = FailureDetector::start(&a, FailureDetectorConfig::default());
        let mut changes = detector.subscribe();
        detector.watch(peer);
        assert_eq!(next_change(&mut changes, peer).await.liveness, Liveness::Up);
        assert!(a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(1000)
            )
            .await
            .is_ok());

        let stopped_at = Instant::now();
        commands.send(NodeCommand::Stop).unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
        let down = next_change(&mut changes, peer).await;
        assert_eq!(down.liveness, Liveness::Down);
        assert!(down.at - stopped_at < Duration::from_millis(2000));
        // With the peer gone, a call fails at once instead of waiting for its deadline.
        let start = Instant::now();
        let reply = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::new(),
                in_ms(2000),
            )
            .await;
        assert_eq!(reply, Err(CallError::PeerDown));
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "{:?}",
            start.elapsed()
        );

        let (again, commands, thread) = spawn_node(peer, 2);
        assert_eq!(again, peer);
        let restarted_at = Instant::now();
        let up = next_change(&mut changes, peer).await;
        assert_eq!(up.liveness, Liveness::Up);
        println!("restarted peer up after {:?}", up.at - restarted_at);
        assert!(up.at - restarted_at < Duration::from_millis(2000));
        let reply = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::from_static(b"again"),
                in_ms(1000),
            )
            .await;
        assert_eq!(reply.as_deref(), Ok(&b"again"[..]));
        commands.send(NodeCommand::Stop).unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
    })
    .await;
}

/// The `internode-echo` process, killed when the test ends however it ends.
struct EchoProcess(std::process::Child);

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(process: &EchoProcess, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(process.0.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_process_is_marked_down_and_up_after_sigcont() {
    bounded(Duration::from_secs(30), async {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(env!("CARGO_BIN_EXE_internode-echo"))
            .args(["127.0.0.2:0", "2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let process = EchoProcess(child);
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .unwrap();
            line
        })
        .await
        .unwrap();
        let peer: SocketAddr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();

        let a = Messenger::bind(config("127.0.0.1", 1)).await.unwrap();
        let detector = FailureDetector::start(&a, FailureDetectorConfig::default());
        let mut changes = detector.subscribe();
        detector.watch(peer);
        assert_eq!(next_change(&mut changes, peer).await.liveness, Liveness::Up);
        let reply = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::from_static(b"p"),
                in_ms(1000),
            )
            .await;
        assert_eq!(reply.as_deref(), Ok(&b"p"[..]));

        let stopped_at = Instant::now();
        signal(&process, "STOP");
        let down = next_change(&mut changes, peer).await;
        assert_eq!(down.liveness, Liveness::Down);
        let detection = down.at - stopped_at;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let continued_at = Instant::now();
        signal(&process, "CONT");
        let up = next_change(&mut changes, peer).await;
        assert_eq!(up.liveness, Liveness::Up);
        let recovery = up.at - continued_at;
        println!("SIGSTOP detected after {detection:?}; up {recovery:?} after SIGCONT");
        assert!(
            detection < Duration::from_millis(2000),
            "down after {detection:?}"
        );
        assert!(
            recovery < Duration::from_millis(1000),
            "up {recovery:?} after SIGCONT"
        );
        let reply = a
            .call(
                peer,
                ConnectionClass::Requests,
                ECHO,
                Bytes::from_static(b"q"),
                in_ms(1000),
            )
            .await;
        assert_eq!(reply.as_deref(), Ok(&b"q"[..]));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_byte_rate_budget_holds_and_refuses_the_excess() {
    bounded(Duration::from_secs(20), async {
        const RATE: u64 = 16_000_000;
        let mut a_config = config("127.0.0.1", 1);
        a_config.outbound_bytes_per_second[ConnectionClass::Bulk.index()] = RATE;
        let a = Arc::new(Messenger::bind(a_config).await.unwrap());
        let b = Messenger::bind(config("127.0.0.2", 2)).await.unwrap();
        let peer = b.local_addr();
        let mut bulk_queue = b.take_inbound(ConnectionClass::Bulk).unwrap();
        tokio::spawn(async move { while bulk_queue.recv().await.is_some() {} });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sender = {
            let (a, stop) = (a.clone(), stop.clone());
            tokio::spawn(async move {
                let body = Bytes::from(vec![1u8; 256 * 1024]);
                let mut refused = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match a.send_oneway(
                        peer,
                        ConnectionClass::Bulk,
                        BULK,
                        body.clone(),
                        in_ms(5000),
                    ) {
                        Ok(()) => tokio::task::yield_now().await,
                        Err(error) => {
                            assert_eq!(error, CallError::QueueFull);
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                refused
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = a.metrics().class(ConnectionClass::Bulk).bytes_out;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rate = (a.metrics().class(ConnectionClass::Bulk).bytes_out - before) as f64
            / started.elapsed().as_secs_f64();
        // Control is not paced: a ping still answers promptly.
        let ping = a.ping(peer, in_ms(1000)).await.unwrap();
        stop.store(true, Ordering::Relaxed);
        let refused = sender.await.unwrap();
        println!(
            "bulk paced at {:.1} MB/s of {} MB/s; {refused} sends refused; ping {ping:?}",
            rate / 1e6,
            RATE / 1_000_000
        );
        assert!(refused > 0);
        assert!(rate <= RATE as f64 * 1.1, "bulk ran at {rate:.0} B/s");
        assert!(rate >= RATE as f64 * 0.7, "bulk ran at only {rate:.0} B/s");
    })
    .await;
}

#[test]
fn sends_from_a_thread_outside_the_runtime_run_on_the_messengers_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (a, b, mut queue) = runtime.block_on(async {
        let (a, b) = pair().await;
        let queue = b.take_inbound(ConnectionClass::Bulk).unwrap();
        (a, b, queue)
    });
    // This thread has no runtime: the writer task must still start, on the messenger's.
    a.send_oneway(
        b.local_addr(),
        ConnectionClass::Bulk,
        BULK,
        Bytes::from_static(b"plain"),
        in_ms(2000),
    )
    .unwrap();
    let received = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), queue.recv()).await });
    let message = received.expect("nothing arrived within 5 s").unwrap();
    assert_eq!(&message.body[..], b"plain");
    assert!(message.is_one_way());
}

#[tokio::test]
async fn an_unspecified_listen_address_is_refused() {
    let refused = Messenger::bind(config("0.0.0.0", 1)).await;
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::InvalidInput)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_carry_heartbeats_both_ways() {
    bounded(Duration::from_secs(20), async {
        let (a, b) = pair().await;
        let peer = b.local_addr();
        let detector = FailureDetector::start(&a, FailureDetectorConfig::default());
        assert_eq!(detector.heartbeat(peer), None, "not watched");
        b.set_heartbeat(Bytes::from_static(b"version-1"));
        detector.watch(peer);
        while detector.heartbeat(peer).as_deref() != Some(&b"version-1"[..]) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A change is seen by the next pings.
        b.set_heartbeat(Bytes::from_static(b"version-2"));
        let changed = Instant::now();
        while detector.heartbeat(peer).as_deref() != Some(&b"version-2"[..]) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(changed.elapsed() < Duration::from_secs(2));
        // Pings carry the sender's heartbeat too: B learns A's without pinging.
        a.set_heartbeat(Bytes::from_static(b"from-a"));
        detector.ping_now();
        let sent = Instant::now();
        while b.peer_heartbeat(a.local_addr()).as_deref() != Some(&b"from-a"[..]) {
            assert!(
                sent.elapsed() < Duration::from_secs(2),
                "B never saw A's heartbeat"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The plain ping still answers its round trip.
        assert!(a.ping(peer, in_ms(1000)).await.is_ok());
    })
    .await;
}
