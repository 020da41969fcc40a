//! Round trips per second and latency percentiles over loopback, with and without a saturated
//! Bulk class:
//! `cargo run --release -p sluice-internode --example roundtrip [seconds] [bulk bytes/s]`
//! (the Bulk byte-rate budget defaults to none).
//!
//! Two messengers run in this process (127.0.0.1 calls 127.0.0.2, which echoes 64-byte bodies
//! on the Requests class). Each phase runs closed-loop callers for the given time; the Bulk
//! phases add one task that keeps the Bulk queue full of 256 KiB one-way messages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_internode::{ConnectionClass, Messenger, MessengerConfig};

const ECHO: u16 = 100;
const BULK: u16 = 200;

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let bulk_rate: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(Duration::from_secs(seconds), bulk_rate));
}

struct Phase {
    calls: u64,
    errors: u64,
    latencies: Vec<Duration>,
    pings: Vec<Duration>,
    bulk_bytes: u64,
}

async fn run(duration: Duration, bulk_rate: u64) {
    let mut config = MessengerConfig::new("bench", 1, "127.0.0.1:0".parse().unwrap());
    config.outbound_bytes_per_second[ConnectionClass::Bulk.index()] = bulk_rate;
    let a = Arc::new(Messenger::bind(config).await.expect("bind 127.0.0.1"));
    let b = Messenger::bind(MessengerConfig::new(
        "bench",
        2,
        "127.0.0.2:0".parse().unwrap(),
    ))
    .await
    .expect("bind 127.0.0.2");
    let mut requests = b.take_inbound(ConnectionClass::Requests).unwrap();
    tokio::spawn(async move {
        while let Some(message) = requests.recv().await {
            let body = message.body.clone();
            message.reply(body);
        }
    });
    let mut bulk = b.take_inbound(ConnectionClass::Bulk).unwrap();
    tokio::spawn(async move { while bulk.recv().await.is_some() {} });
    let peer = b.local_addr();

    println!("| callers | bulk | round trips/s | p50 | p99 | p99.9 | errors | ping p50 | ping p99 | bulk MB/s |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for callers in [1usize, 16, 64] {
        for with_bulk in [false, true] {
            let phase = run_phase(&a, peer, callers, with_bulk, duration).await;
            let mut latencies = phase.latencies;
            latencies.sort();
            let mut pings = phase.pings;
            pings.sort();
            println!(
                "| {callers} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {:.0} |",
                if with_bulk { "saturated" } else { "idle" },
                phase.calls as f64 / duration.as_secs_f64(),
                micros(percentile(&latencies, 0.5)),
                micros(percentile(&latencies, 0.99)),
                micros(percentile(&latencies, 0.999)),
                phase.errors,
                micros(percentile(&pings, 0.5)),
                micros(percentile(&pings, 0.99)),
                phase.bulk_bytes as f64 / duration.as_secs_f64() / 1e6,
            );
        }
    }
}

async fn run_phase(
    a: &Arc<Messenger>,
    peer: std::net::SocketAddr,
    callers: usize,
    with_bulk: bool,
    duration: Duration,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let bulk_before = a.metrics().class(ConnectionClass::Bulk).bytes_out;
    let bulk_task = with_bulk.then(|| {
        let (a, stop) = (a.clone(), stop.clone());
        tokio::spawn(async move {
            let body = Bytes::from(vec![0u8; 256 * 1024]);
            while !stop.load(Ordering::Relaxed) {
                let deadline = Instant::now() + Duration::from_secs(5);
                match a.send_oneway(peer, ConnectionClass::Bulk, BULK, body.clone(), deadline) {
                    Ok(()) => tokio::task::yield_now().await,
                    Err(_) => tokio::time::sleep(Duration::from_micros(200)).await,
                }
            }
        })
    });
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (a, stop) = (a.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let body = Bytes::from(vec![7u8; 64]);
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let deadline = start + Duration::from_secs(1);
                match a
                    .call(
                        peer,
                        ConnectionClass::Requests,
                        ECHO,
                        body.clone(),
                        deadline,
                    )
                    .await
                {
                    Ok(_) => latencies.push(start.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let pinger = {
        let (a, stop) = (a.clone(), stop.clone());
        tokio::spawn(async move {
            let mut pings = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(rtt) = a.ping(peer, Instant::now() + Duration::from_secs(1)).await {
                    pings.push(rtt);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            pings
        })
    };
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut phase = Phase {
        calls: 0,
        errors: 0,
        latencies: Vec::new(),
        pings: pinger.await.unwrap(),
        bulk_bytes: a.metrics().class(ConnectionClass::Bulk).bytes_out - bulk_before,
    };
    for task in tasks {
        let (latencies, errors) = task.await.unwrap();
        phase.calls += latencies.len() as u64;
        phase.errors += errors;
        phase.latencies.extend(latencies);
    }
    if let Some(task) = bulk_task {
        task.await.unwrap();
    }
    phase
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn micros(d: Duration) -> String {
    format!("{} us", d.as_micros())
}
