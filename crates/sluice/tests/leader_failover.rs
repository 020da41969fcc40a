//! The transaction log after its Raft leader dies: three `sluice serve` processes on
//! 127.0.0.1-3 (RF 3), two clients per node running two-partition transfers through the log,
//! then `kill -9` of the node that leads the metadata group. Measured: the time from the kill
//! to the first transfer sent after it and acknowledged through a surviving node. Each client
//! moves one unit back and forth between two accounts of its own, so no transfer conflicts
//! with another and the pair's sum is checked at the end on every surviving node.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::cluster::{create_simple_keyspace, eventually, session_without_retries};
use common::cluster::{without_colours, Ports, ServeNode, LEADERSHIP_LINE};

use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

const NODES: u8 = 3;
const CLIENTS_PER_NODE: usize = 2;
const START_BALANCE: i64 = 100;
/// Load before the kill.
const WARM_UP: Duration = Duration::from_secs(3);
/// The most the survivors may take to acknowledge again (a debug build on a loaded machine).
const RESUME_BOUND: Duration = Duration::from_secs(3);
/// How long the test waits for any acknowledgement after the kill before giving up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(15);
/// The server's default write timeout, which transactions get.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The transfer of one unit from account `from` to `to`: one LET, an IF, two UPDATEs.
fn transfer(from: usize, to: usize) -> String {
    format!(
        "BEGIN TRANSACTION\n\
         \x20 LET src = (SELECT balance FROM lf.acct WHERE id = {from});\n\
         \x20 IF src.balance >= 1 THEN\n\
         \x20   UPDATE lf.acct SET balance = balance - 1 WHERE id = {from};\n\
         \x20   UPDATE lf.acct SET balance = balance + 1 WHERE id = {to};\n\
         \x20 END IF\n\
         COMMIT TRANSACTION"
    )
}

/// Whether the server answered Write_timeout.
fn is_write_timeout(error: &ExecutionError) -> bool {
    matches!(
        error,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::WriteTimeout { .. },
            _
        ))
    )
}

/// The balances of accounts `a` and `b`, read by one read-only transaction.
async fn pair_balances(session: &Session, a: usize, b: usize) -> (i64, i64) {
    let text = format!(
        "BEGIN TRANSACTION\n\
         \x20 LET x = (SELECT balance FROM lf.acct WHERE id = {a});\n\
         \x20 LET y = (SELECT balance FROM lf.acct WHERE id = {b});\n\
         \x20 SELECT x.balance, y.balance;\n\
         COMMIT TRANSACTION"
    );
    let rows = session
        .query_unpaged(text, &[])
        .await
        .expect("read the pair")
        .into_rows_result()
        .expect("rows");
    let (x, y) = rows
        .first_row::<(Option<i64>, Option<i64>)>()
        .expect("one row of two bigints");
    (x.expect("balance a"), y.expect("balance b"))
}

/// Each node's logged role lines, if it logged one.
fn leadership_lines(nodes: &[ServeNode]) -> Vec<(u8, Vec<String>)> {
    nodes
        .iter()
        .map(|n| {
            let lines = n
                .output()
                .lines()
                .filter(|l| l.contains(LEADERSHIP_LINE))
                .map(without_colours)
                .collect();
            (n.index, lines)
        })
        .collect()
}

/// The one node whose latest role line says it leads, if exactly one does.
fn leader_of(nodes: &[ServeNode]) -> Option<u8> {
    let leaders: Vec<u8> = leadership_lines(nodes)
        .into_iter()
        .filter(|(_, lines)| lines.last().is_some_and(|l| l.contains("state=Leader")))
        .map(|(index, _)| index)
        .collect();
    match leaders[..] {
        [leader] => Some(leader),
        _ => None,
    }
}

/// `since_epoch` as the UTC time of day, as the nodes' logs print it (HH:MM:SS.micros).
fn time_of_day(since_epoch: Duration) -> String {
    let seconds = since_epoch.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        since_epoch.subsec_micros()
    )
}

/// One acknowledged transfer: the node it went through, when it was sent and answered.
#[derive(Clone, Copy)]
struct Ack {
    node: u8,
    sent: Instant,
    answered: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_through_the_survivors_resume_soon_after_the_leader_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(NODES);
    let mut nodes: Vec<ServeNode> = (1..=NODES)
        .map(|i| ServeNode::start(dir.path(), i, ports, &[]).0)
        .collect();
    let mut sessions = Vec::new();
    for i in 1..=NODES {
        sessions.push(Arc::new(session_without_retries(ports.cql_of(i)).await));
    }
    create_simple_keyspace(&sessions[0], "lf", 3).await;
    sessions[0]
        .query_unpaged(
            "CREATE TABLE lf.acct (id int PRIMARY KEY, balance bigint)",
            &[],
        )
        .await
        .unwrap();
    let clients = usize::from(NODES) * CLIENTS_PER_NODE;
    let accounts = 2 * clients;
    // The opening balances go through the log, so every node holds them.
    let mut opening = String::from("BEGIN TRANSACTION\n");
    for id in 0..accounts {
        opening.push_str(&format!(
            "  INSERT INTO lf.acct (id, balance) VALUES ({id}, {START_BALANCE});\n"
        ));
    }
    opening.push_str("COMMIT TRANSACTION");
    sessions[0].query_unpaged(opening, &[]).await.unwrap();
    for session in &sessions {
        eventually("every node reads the opening balances", || async {
            session
                .query_unpaged("SELECT balance FROM lf.acct WHERE id = 0", &[])
                .await
                .ok()
                .and_then(|r| r.into_rows_result().ok())
                .is_some_and(|r| r.rows_num() == 1)
        })
        .await;
    }
    let mut leader = None;
    eventually("one node leads the metadata group", || {
        leader = leader_of(&nodes);
        std::future::ready(leader.is_some())
    })
    .await;
    let leader = leader.unwrap();

    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    // How long each transfer answered Write_timeout took, as its client saw it.
    let timeouts: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for client in 0..clients {
        let node = (client % usize::from(NODES)) as u8 + 1;
        let session = Arc::clone(&sessions[usize::from(node) - 1]);
        let (acks, stop, killed) = (Arc::clone(&acks), Arc::clone(&stop), Arc::clone(&killed));
        let timeouts = Arc::clone(&timeouts);
        workers.push(tokio::spawn(async move {
            let (a, b) = (2 * client, 2 * client + 1);
            let mut forward = true;
            while !stop.load(Ordering::Relaxed) {
                if node == leader && killed.load(Ordering::Relaxed) {
                    return;
                }
                let text = if forward {
                    transfer(a, b)
                } else {
                    transfer(b, a)
                };
                let sent = Instant::now();
                match session.query_unpaged(text, &[]).await {
                    Ok(_) => {
                        let answered = Instant::now();
                        acks.lock().unwrap().push(Ack {
                            node,
                            sent,
                            answered,
                        });
                        forward = !forward;
                    }
                    // A timeout around the kill, or the killed node's connection: try again.
                    Err(error) => {
                        if is_write_timeout(&error) {
                            timeouts.lock().unwrap().push(sent.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                }
            }
        }));
    }

    tokio::time::sleep(WARM_UP).await;
    let elections_before = leadership_lines(&nodes)
        .iter()
        .map(|(_, lines)| lines.len())
        .sum::<usize>();
    let acked_before = acks.lock().unwrap().len();
    assert_eq!(
        leader_of(&nodes),
        Some(leader),
        "the leader changed under load before the kill"
    );
    killed.store(true, Ordering::Relaxed);
    nodes[usize::from(leader) - 1].kill9();
    let killed_at = Instant::now();
    let killed_wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();

    // The first transfer sent after the kill and acknowledged through a survivor.
    let resumed = loop {
        let first = acks
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.node != leader && a.sent >= killed_at)
            .map(|a| a.answered)
            .min();
        if let Some(answered) = first {
            break answered - killed_at;
        }
        assert!(
            killed_at.elapsed() < GIVE_UP_AFTER,
            "no transfer acknowledged within {GIVE_UP_AFTER:?} of the kill"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Also the first of any acknowledgement after the kill (possibly sent before it).
    let first_any = acks
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.node != leader && a.answered >= killed_at)
        .map(|a| a.answered - killed_at)
        .min()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("a client ends")
            .unwrap();
    }
    let acked_after = acks.lock().unwrap().len() - acked_before;

    eprintln!(
        "leader node {leader} killed at {} UTC; {acked_before} transfers before, \
         {acked_after} after; the first sent after the kill was acknowledged {:.3} s after it \
         (the first acknowledgement of any: {:.3} s); {elections_before} role lines before the \
         kill",
        time_of_day(killed_wall),
        resumed.as_secs_f64(),
        first_any.as_secs_f64(),
    );
    let timeouts = timeouts.lock().unwrap().clone();
    let slowest_timeout = timeouts.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} transfers answered Write_timeout, the slowest after {:.3} s",
        timeouts.len(),
        slowest_timeout.as_secs_f64()
    );
    for (index, lines) in leadership_lines(&nodes) {
        if index != leader {
            for line in lines.iter().rev().take(4).rev() {
                eprintln!("node {index}: {line}");
            }
        }
    }
    // With RUST_LOG=sluice_internode=debug the nodes also log when a connection is lost.
    for node in nodes.iter().filter(|n| n.index != leader) {
        for line in node
            .output()
            .lines()
            .filter(|l| l.contains("internode connection lost"))
        {
            eprintln!("node {}: {}", node.index, without_colours(line));
        }
    }
    assert!(acked_before > 5, "too few transfers before the kill");
    // The server answers at the request's deadline (the 2 s write timeout), never later; the
    // margin is the client's own scheduling on a loaded machine.
    assert!(
        slowest_timeout < WRITE_TIMEOUT + Duration::from_secs(1),
        "a Write_timeout came {slowest_timeout:?} after its request"
    );
    assert!(
        resumed < RESUME_BOUND,
        "the survivors acknowledged again only {resumed:?} after the kill"
    );

    // No transfer was applied in part: every pair still sums to its opening total, as every
    // survivor reads it.
    for node in (1..=NODES).filter(|n| *n != leader) {
        let session = &sessions[usize::from(node) - 1];
        for client in 0..clients {
            let (x, y) = pair_balances(session, 2 * client, 2 * client + 1).await;
            assert_eq!(
                x + y,
                2 * START_BALANCE,
                "node {node}, accounts {} and {}",
                2 * client,
                2 * client + 1
            );
        }
    }
}
