//! The coordinator over a fake transport: three engines in one process, the first one
//! coordinating, the others reached through a transport that can refuse, drop or answer.

use super::*;
use crate::coordinator::{
    requirement, Replica, ReplicaError, ReplicaFuture, ReplicaTransport, ReplicaVerb, Requirement,
    Tally, TargetState,
};
use proptest::prelude::*;
use sluice_ring::{Node, NodeState, Replication, Token, TokenMetadata};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use uuid::Uuid;

const TABLE_ID: &str = "7d3c5d36-1f4e-4e55-9f3c-2b0d8f7e6a11";

/// What a fake replica does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Runs it on its engine and answers.
    Serve,
    /// Answers at once that it refuses.
    Refuse,
    /// Never answers (the call times out at its deadline).
    Drop,
}

#[derive(Default)]
struct FakeTransport {
    replicas: Mutex<HashMap<Uuid, (Arc<Engine>, Behaviour)>>,
    /// (to, verb) of every request sent.
    sent: Mutex<Vec<(Uuid, ReplicaVerb)>>,
}

impl FakeTransport {
    fn set(&self, host: Uuid, behaviour: Behaviour) {
        if let Some(r) = self.replicas.lock().unwrap().get_mut(&host) {
            r.1 = behaviour;
        }
    }

    fn sent_to(&self, host: Uuid) -> usize {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(h, _)| *h == host)
            .count()
    }
}

impl ReplicaTransport for FakeTransport {
    fn send(
        &self,
        to: Replica,
        verb: ReplicaVerb,
        body: Bytes,
        deadline: Instant,
    ) -> ReplicaFuture {
        self.sent.lock().unwrap().push((to.host_id, verb));
        let Some((engine, behaviour)) = self.replicas.lock().unwrap().get(&to.host_id).cloned()
        else {
            return Box::pin(async { Err(ReplicaError::Unreachable) });
        };
        Box::pin(async move {
            match behaviour {
                Behaviour::Refuse => Err(ReplicaError::Refused),
                Behaviour::Drop => {
                    tokio::time::sleep_until(deadline.into()).await;
                    Err(ReplicaError::Timeout)
                }
                Behaviour::Serve => {
                    let result = match verb {
                        ReplicaVerb::Mutation => engine
                            .apply_replica_mutations(&body, deadline)
                            .await
                            .map(|()| Bytes::new()),
                        ReplicaVerb::Read => engine.replica_read(&body, deadline),
                        ReplicaVerb::Repair => engine
                            .apply_replica_repair(&body, deadline)
                            .await
                            .map(|()| Bytes::new()),
                        ReplicaVerb::Truncate => engine
                            .apply_replica_truncate(&body, deadline)
                            .map(|()| Bytes::new()),
                        ReplicaVerb::Select => {
                            engine.serve_forwarded_statement(&body, deadline).await
                        }
                        ReplicaVerb::Scan => engine.serve_scan(&body, deadline).await,
                        ReplicaVerb::Slice => engine.serve_slice(&body, deadline).await,
                    };
                    result.map_err(|_| ReplicaError::Refused)
                }
            }
        })
    }
}

fn host(i: u8) -> Uuid {
    Uuid::from_u128(0x1000 + u128::from(i))
}

fn ring_node(i: u8) -> Node {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, i));
    Node {
        host_id: host(i),
        cql_address: std::net::SocketAddr::new(ip, 9042),
        internode_address: std::net::SocketAddr::new(ip, 7000),
        dc: "datacenter1".into(),
        rack: format!("rack{i}"),
        tokens: vec![Token(i64::from(i) * (i64::MAX / 8))],
        state: NodeState::Normal,
    }
}

/// Three engines sharing one schema (same table id); the first coordinates.
struct Trio {
    nodes: Vec<H>,
    transport: Arc<FakeTransport>,
}

impl Trio {
    async fn new() -> Trio {
        let transport = Arc::new(FakeTransport::default());
        let mut nodes = Vec::new();
        for i in 1..=3u8 {
            let mut h = member(i);
            h.ok("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}").await;
            h.ok(&format!(
                "CREATE TABLE ks.t (pk int, ck int, v text, PRIMARY KEY (pk, ck)) WITH id = {TABLE_ID}"
            ))
            .await;
            if i > 1 {
                transport
                    .replicas
                    .lock()
                    .unwrap()
                    .insert(host(i), (h.engine.clone(), Behaviour::Serve));
            }
            nodes.push(h);
        }
        let ring = TokenMetadata::new((1..=3).map(ring_node).collect()).unwrap();
        nodes[0].engine.set_ring(Arc::new(ring));
        assert!(nodes[0].engine.set_replica_transport(transport.clone()));
        Trio { nodes, transport }
    }

    async fn run(
        &mut self,
        node: usize,
        q: &str,
        cl: Consistency,
    ) -> Result<ResultMessage, DetailedError> {
        self.run_with_deadline(node, q, cl, Duration::from_secs(5))
            .await
    }

    async fn run_with_deadline(
        &mut self,
        node: usize,
        q: &str,
        cl: Consistency,
        budget: Duration,
    ) -> Result<ResultMessage, DetailedError> {
        let h = &mut self.nodes[node];
        let p = h.engine.prepare(None, q)?;
        let mut ctx = h.ctx();
        ctx.deadline = Some(Instant::now() + budget);
        let params = QueryParameters {
            consistency: cl,
            ..QueryParameters::default()
        };
        h.engine.execute(&mut h.session, &p, &params, &ctx).await
    }

    /// The rows of `ks.t` partition 1 on one node, read locally at ONE.
    async fn local_rows(&mut self, node: usize) -> Vec<Vec<Option<Bytes>>> {
        self.nodes[node]
            .select("SELECT ck, v FROM ks.t WHERE pk = 1", vec![])
            .await
    }
}

fn error_of(r: Result<ResultMessage, DetailedError>) -> DbError {
    match r {
        Err(e) => e.error,
        Ok(r) => panic!("expected an error, got {r:?}"),
    }
}

#[tokio::test]
async fn a_write_reaches_every_replica_with_one_timestamp() {
    let mut trio = Trio::new().await;
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')",
        Consistency::All,
    )
    .await
    .unwrap();
    let mut writetimes = Vec::new();
    for node in 0..3 {
        let rows = trio.nodes[node]
            .select(
                "SELECT v, writetime(v) FROM ks.t WHERE pk = 1 AND ck = 1",
                vec![],
            )
            .await;
        assert_eq!(ctext(&rows[0][0]), "a", "node {node}");
        writetimes.push(cbig(&rows[0][1]));
    }
    assert!(
        writetimes.iter().all(|&w| w == writetimes[0]),
        "{writetimes:?}"
    );
    assert_eq!(trio.transport.sent_to(host(2)), 1);
    assert_eq!(trio.transport.sent_to(host(3)), 1);
}

#[tokio::test]
async fn refusals_fail_fast_and_silence_times_out_with_the_counts() {
    let mut trio = Trio::new().await;
    let insert = "INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'b')";
    // One refusal leaves a quorum.
    trio.transport.set(host(2), Behaviour::Refuse);
    trio.run(0, insert, Consistency::Quorum).await.unwrap();
    // Two refusals make QUORUM impossible: Write_failure at once, not a timeout.
    trio.transport.set(host(3), Behaviour::Refuse);
    let started = Instant::now();
    let e = error_of(trio.run(0, insert, Consistency::Quorum).await);
    // `received` is what had acknowledged when the second refusal came: the local write's
    // acknowledgement (it waits for storage) may come after both refusals, as in Cassandra.
    assert!(
        matches!(
            e,
            DbError::ReplicaWriteFailure {
                consistency: Consistency::Quorum,
                received: 0 | 1,
                block_for: 2,
                failures: 2,
                write_type: sluice_protocol::WriteType::Simple,
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // A replica that never answers: Write_timeout at the deadline with what was received.
    trio.transport.set(host(2), Behaviour::Serve);
    trio.transport.set(host(3), Behaviour::Drop);
    let started = Instant::now();
    let e = error_of(
        trio.run_with_deadline(0, insert, Consistency::All, Duration::from_millis(300))
            .await,
    );
    assert_eq!(
        e,
        DbError::WriteTimeout {
            consistency: Consistency::All,
            received: 2,
            block_for: 3,
            write_type: sluice_protocol::WriteType::Simple,
        }
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A batch's write type travels in its errors.
    let batch = "BEGIN UNLOGGED BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 3, 'c'); \
                 INSERT INTO ks.t (pk, ck, v) VALUES (2, 3, 'c'); APPLY BATCH";
    let e = error_of(
        trio.run_with_deadline(0, batch, Consistency::All, Duration::from_millis(200))
            .await,
    );
    assert!(
        matches!(
            e,
            DbError::WriteTimeout {
                write_type: sluice_protocol::WriteType::UnloggedBatch,
                received: 2,
                block_for: 3,
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_replica_marked_down_gets_nothing_and_too_few_is_unavailable() {
    let mut trio = Trio::new().await;
    trio.nodes[0].engine.set_node_up(host(3), false);
    let insert = "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')";
    let e = error_of(trio.run(0, insert, Consistency::All).await);
    assert_eq!(
        e,
        DbError::Unavailable {
            consistency: Consistency::All,
            required: 3,
            alive: 2,
        }
    );
    // Nothing was sent, and nothing was written locally either.
    assert_eq!(trio.transport.sent.lock().unwrap().len(), 0);
    assert!(trio.local_rows(0).await.is_empty());
    trio.run(0, insert, Consistency::Quorum).await.unwrap();
    assert_eq!(trio.transport.sent_to(host(3)), 0);
    assert_eq!(trio.local_rows(1).await.len(), 1);
    assert!(trio.local_rows(2).await.is_empty());
    // Reads: ALL is unavailable, QUORUM reads this node and node 2.
    let e = error_of(
        trio.run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::All)
            .await,
    );
    assert!(
        matches!(
            e,
            DbError::Unavailable {
                required: 3,
                alive: 2,
                ..
            }
        ),
        "{e:?}"
    );
    trio.run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::Quorum)
        .await
        .unwrap();
    // ANY is for writes only.
    let e = trio
        .run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::Any)
        .await
        .unwrap_err();
    assert_eq!(e.error, DbError::Invalid);
    assert!(e.message.contains("ANY"), "{}", e.message);
}

#[tokio::test]
async fn read_repair_keeps_the_newest_including_a_newer_tombstone() {
    let mut trio = Trio::new().await;
    // Everyone has (1, 1) = 'old' at 10.
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'old') USING TIMESTAMP 10",
        Consistency::All,
    )
    .await
    .unwrap();
    // Node 2 alone deletes it at 20; node 1 alone updates it at 15 and adds (1, 2).
    trio.nodes[1]
        .ok("DELETE FROM ks.t USING TIMESTAMP 20 WHERE pk = 1 AND ck = 1")
        .await;
    trio.transport.set(host(2), Behaviour::Refuse);
    trio.transport.set(host(3), Behaviour::Refuse);
    trio.run(
        0,
        "BEGIN UNLOGGED BATCH USING TIMESTAMP 15 \
         UPDATE ks.t SET v = 'newer' WHERE pk = 1 AND ck = 1; \
         INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'only on 1'); APPLY BATCH",
        Consistency::One,
    )
    .await
    .unwrap();
    trio.transport.set(host(2), Behaviour::Serve);
    trio.transport.set(host(3), Behaviour::Serve);
    // Node 3 is down, so a QUORUM read compares nodes 1 and 2.
    trio.nodes[0].engine.set_node_up(host(3), false);
    let rows = match trio
        .run(
            0,
            "SELECT ck, v FROM ks.t WHERE pk = 1",
            Consistency::Quorum,
        )
        .await
        .unwrap()
    {
        ResultMessage::Rows(r) => cells(&r),
        other => panic!("{other:?}"),
    };
    // The tombstone at 20 beats the update at 15: not resurrected.
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(cint(&rows[0][0]), 2);
    assert_eq!(trio.nodes[0].engine.read_repairs(), 1);
    // Both replicas now hold the same partition; node 3 was not touched.
    let raw = |h: &H| {
        h.engine
            .storage()
            .read_raw_partition(
                *uuid::Uuid::parse_str(TABLE_ID).unwrap().as_bytes(),
                sluice_types::token::murmur3_token(&1i32.to_be_bytes()),
                &1i32.to_be_bytes(),
            )
            .unwrap()
    };
    assert_eq!(raw(&trio.nodes[0]), raw(&trio.nodes[1]));
    assert_eq!(trio.local_rows(1).await.len(), 1);
    assert_eq!(trio.local_rows(2).await.len(), 1);
    // A second read finds them equal: no further repair.
    trio.run(
        0,
        "SELECT ck, v FROM ks.t WHERE pk = 1",
        Consistency::Quorum,
    )
    .await
    .unwrap();
    assert_eq!(trio.nodes[0].engine.read_repairs(), 1);
    // A refusing replica makes the read fail fast; a silent one times out.
    trio.transport.set(host(2), Behaviour::Refuse);
    let e = error_of(
        trio.run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::Quorum)
            .await,
    );
    assert_eq!(
        e,
        DbError::ReplicaReadFailure {
            consistency: Consistency::Quorum,
            received: 1,
            block_for: 2,
            failures: 1,
            data_present: true,
        }
    );
    trio.transport.set(host(2), Behaviour::Drop);
    let e = error_of(
        trio.run_with_deadline(
            0,
            "SELECT v FROM ks.t WHERE pk = 1",
            Consistency::Quorum,
            Duration::from_millis(200),
        )
        .await,
    );
    assert_eq!(
        e,
        DbError::ReadTimeout {
            consistency: Consistency::Quorum,
            received: 1,
            block_for: 2,
            data_present: true,
        }
    );
    // ONE reads locally with no message.
    let before = trio.transport.sent.lock().unwrap().len();
    trio.run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::One)
        .await
        .unwrap();
    assert_eq!(trio.transport.sent.lock().unwrap().len(), before);
}

#[tokio::test]
async fn replicas_refuse_malformed_bodies_unknown_tables_and_expired_work() {
    let trio = Trio::new().await;
    let engine = &trio.nodes[1].engine;
    let later = Instant::now() + Duration::from_secs(5);
    assert!(matches!(
        engine
            .apply_replica_mutations(&Bytes::from_static(b"\x01\xff"), later)
            .await,
        Err(crate::coordinator::ReplicaRefusal::Malformed(_))
    ));
    let m = sluice_storage::Mutation {
        table: [9; 16],
        token: 0,
        partition_key: Bytes::from_static(b"k"),
        partition_deletion: Some(1),
        range_deletions: vec![],
        static_row: None,
        rows: vec![],
    };
    let body = crate::replica_msg::encode_mutations(&[&m], 0);
    assert_eq!(
        engine.apply_replica_mutations(&body, later).await,
        Err(crate::coordinator::ReplicaRefusal::UnknownTable)
    );
    let mut m = m;
    m.table = *uuid::Uuid::parse_str(TABLE_ID).unwrap().as_bytes();
    let body = crate::replica_msg::encode_mutations(&[&m], 0);
    assert_eq!(
        engine.apply_replica_mutations(&body, Instant::now()).await,
        Err(crate::coordinator::ReplicaRefusal::Expired)
    );
}

fn simple_ring(nodes: u8) -> TokenMetadata {
    TokenMetadata::new((1..=nodes).map(ring_node).collect()).unwrap()
}

proptest! {
    /// blockFor as Cassandra's, for every level and factor of a SimpleStrategy keyspace.
    #[test]
    fn block_for_follows_cassandra(rf in 1u32..8) {
        let ring = simple_ring(3);
        let replication = Replication::Simple { factor: rf };
        let bf = |cl| requirement(cl, &replication, &ring, "datacenter1", true).unwrap().block_for;
        prop_assert_eq!(bf(Consistency::One), 1);
        prop_assert_eq!(bf(Consistency::Any), 1);
        prop_assert_eq!(bf(Consistency::LocalOne), 1);
        prop_assert_eq!(bf(Consistency::Two), 2);
        prop_assert_eq!(bf(Consistency::Three), 3);
        prop_assert_eq!(bf(Consistency::Quorum), rf / 2 + 1);
        prop_assert_eq!(bf(Consistency::LocalQuorum), rf / 2 + 1);
        prop_assert_eq!(bf(Consistency::EachQuorum), rf / 2 + 1);
        prop_assert_eq!(bf(Consistency::All), rf);
        prop_assert!(requirement(Consistency::Serial, &replication, &ring, "datacenter1", true).is_err());
    }

    /// A tally is met once blockFor targets acknowledged, impossible once
    /// `blockfor + failed > total`, and never both.
    #[test]
    fn tally_met_and_impossible(total in 1usize..7, bf in 1u32..7, acks in 0usize..7, fails in 0usize..7) {
        prop_assume!(acks + fails <= total);
        let mut targets = vec![(0u16, TargetState::Pending); total];
        for t in targets.iter_mut().take(acks) { t.1 = TargetState::Acked; }
        for t in targets.iter_mut().skip(acks).take(fails) { t.1 = TargetState::Failed; }
        let tally = Tally {
            req: Requirement { consistency: Consistency::Quorum, block_for: bf, only_dc: None, per_dc: vec![] },
            targets,
        };
        prop_assert_eq!(tally.met(), acks as u32 >= bf);
        prop_assert_eq!(tally.impossible(), bf + fails as u32 > total as u32);
        prop_assert_eq!(tally.received(), acks as u32);
        prop_assert_eq!(tally.failures(), fails as u32);
        if (bf as usize) <= total { prop_assert!(!(tally.met() && tally.impossible())); }
    }
}

#[test]
fn network_topology_levels_count_their_data_centers() {
    let mut nodes: Vec<Node> = (1..=6).map(ring_node).collect();
    for n in nodes.iter_mut().skip(3) {
        n.dc = "dc2".into();
    }
    for n in nodes.iter_mut().take(3) {
        n.dc = "dc1".into();
    }
    let ring = TokenMetadata::new(nodes).unwrap();
    let replication = Replication::NetworkTopology {
        factors: vec![("dc1".into(), 3), ("dc2".into(), 2)],
    };
    let req = |cl| requirement(cl, &replication, &ring, "dc1", true).unwrap();
    assert_eq!(req(Consistency::Quorum).block_for, 3);
    assert_eq!(req(Consistency::All).block_for, 5);
    let local = req(Consistency::LocalQuorum);
    assert_eq!((local.block_for, local.only_dc), (2, ring.dc_named("dc1")));
    let each = req(Consistency::EachQuorum);
    assert_eq!(each.block_for, 4);
    // dc1 has all three up, dc2 one of two: EACH_QUORUM reports dc2's counts.
    let dc1 = ring.dc_named("dc1").unwrap();
    let dc2 = ring.dc_named("dc2").unwrap();
    let alive = [
        (dc1, true),
        (dc1, true),
        (dc1, true),
        (dc2, true),
        (dc2, false),
    ];
    assert_eq!(
        each.check_alive(&alive),
        Err(DbError::Unavailable {
            consistency: Consistency::EachQuorum,
            required: 2,
            alive: 1
        })
    );
    assert_eq!(local.check_alive(&alive), Ok(()));
    // LOCAL_QUORUM counts only dc1's acknowledgements.
    let tally = Tally {
        req: local,
        targets: vec![
            (dc1, TargetState::Acked),
            (dc2, TargetState::Acked),
            (dc2, TargetState::Acked),
        ],
    };
    assert!(!tally.met());
}

#[tokio::test]
async fn a_read_target_that_fails_fast_is_replaced_by_a_spare() {
    let mut trio = Trio::new().await;
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')",
        Consistency::All,
    )
    .await
    .unwrap();
    // Both others are up as far as this node knows, but node 2 refuses everything.
    trio.transport.set(host(2), Behaviour::Refuse);
    trio.transport.set(host(3), Behaviour::Refuse);
    let e = error_of(
        trio.run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::Quorum)
            .await,
    );
    assert!(
        matches!(
            e,
            DbError::ReplicaReadFailure {
                received: 1,
                block_for: 2,
                failures: 2,
                ..
            }
        ),
        "{e:?}"
    );
    trio.transport.set(host(3), Behaviour::Serve);
    let before = trio.transport.sent_to(host(3));
    let rows = match trio
        .run(0, "SELECT v FROM ks.t WHERE pk = 1", Consistency::Quorum)
        .await
        .unwrap()
    {
        ResultMessage::Rows(r) => cells(&r),
        other => panic!("{other:?}"),
    };
    assert_eq!(ctext(&rows[0][0]), "a");
    assert!(trio.transport.sent_to(host(3)) > before);
}

#[tokio::test]
async fn a_replica_that_is_down_gets_a_hint_that_replays_its_writes() {
    let mut trio = Trio::new().await;
    let hint_dir = tempfile::tempdir().unwrap();
    trio.nodes[0]
        .engine
        .open_hints(crate::hints::HintConfig::new(hint_dir.path().to_path_buf()))
        .unwrap();
    trio.nodes[0].engine.set_node_up(host(3), false);
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')",
        Consistency::Quorum,
    )
    .await
    .unwrap();
    assert_eq!(trio.transport.sent_to(host(3)), 0);
    let stats = trio.nodes[0].engine.hint_stats();
    assert_eq!((stats.held, stats.stored), (1, 1));
    // Queued until the writer's batch; then on disk.
    trio.nodes[0].engine.hints().unwrap().flush();
    assert_eq!(trio.nodes[0].engine.hinted_hosts(), vec![host(3)]);
    assert!(trio.local_rows(2).await.is_empty());
    // The hint is the MUTATION node 3 would have got: replayed, node 3 has the row.
    let store = trio.nodes[0].engine.hints().unwrap();
    store.flush();
    let batch = store.next_batch(host(3)).await.unwrap();
    assert_eq!(batch.len(), 1);
    let later = Instant::now() + Duration::from_secs(5);
    for body in batch.bodies() {
        trio.nodes[2]
            .engine
            .apply_replica_mutations(body, later)
            .await
            .unwrap();
    }
    store.delivered(&batch, 1);
    store.flush();
    assert_eq!(trio.local_rows(2).await.len(), 1);
    let stats = trio.nodes[0].engine.hint_stats();
    assert_eq!((stats.held, stats.replayed, stats.disk_bytes), (0, 1, 0));
    // Hints off: nothing is kept.
    trio.nodes[0].engine.set_hinted_handoff(false);
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'b')",
        Consistency::Quorum,
    )
    .await
    .unwrap();
    assert_eq!(trio.nodes[0].engine.hint_stats().held, 0);
}

#[tokio::test]
async fn a_slow_read_target_is_overtaken_by_a_speculative_one() {
    let mut trio = Trio::new().await;
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')",
        Consistency::All,
    )
    .await
    .unwrap();
    let read = "SELECT v FROM ks.t WHERE pk = 1";
    // Replicas answering teach the coordinator their usual latency.
    for _ in 0..5 {
        trio.run(0, read, Consistency::Quorum).await.unwrap();
    }
    assert_eq!(trio.nodes[0].engine.speculative_reads(), 0);
    // One silent replica at a time (still up for the failure detector): whichever is asked
    // first, the read answers long before its 2 s deadline.
    for (silent, serving) in [(host(2), host(3)), (host(3), host(2))] {
        trio.transport.set(silent, Behaviour::Drop);
        trio.transport.set(serving, Behaviour::Serve);
        let started = Instant::now();
        let rows = match trio
            .run_with_deadline(0, read, Consistency::Quorum, Duration::from_secs(2))
            .await
            .unwrap()
        {
            ResultMessage::Rows(r) => cells(&r),
            other => panic!("{other:?}"),
        };
        assert_eq!(ctext(&rows[0][0]), "a");
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(trio.nodes[0].engine.speculative_reads(), 1);
}

#[test]
fn speculation_stays_within_its_budget_and_waits_for_slowness() {
    let s = crate::coordinator::Speculation::default();
    let sent = Instant::now();
    let deadline = sent + Duration::from_secs(2);
    // No latency known yet: half the budget.
    assert_eq!(s.point(sent, deadline), sent + Duration::from_secs(1));
    s.note_latency(Duration::from_millis(10));
    assert_eq!(s.point(sent, deadline), sent + Duration::from_millis(20));
    // Each sample moves the smoothed latency by an eighth: fast replicas bring it down.
    s.note_latency(Duration::from_micros(10));
    assert_eq!(
        s.point(sent, deadline) - sent,
        Duration::from_nanos(17_502_500)
    );
    for _ in 0..100 {
        s.note_latency(Duration::from_micros(10));
    }
    assert_eq!(
        s.point(sent, deadline) - sent,
        Duration::from_millis(2),
        "never earlier than the floor"
    );
    // A burst of ten, then one per ten reads.
    let taken = (0..20).filter(|_| s.take()).count();
    assert_eq!(taken, 10);
    for _ in 0..100 {
        s.count_read();
    }
    let taken = (0..20).filter(|_| s.take()).count();
    assert_eq!(taken, 10);
    assert_eq!(s.speculated(), 20);
}

#[tokio::test]
async fn counters_are_compared_but_never_merged_twice() {
    let mut trio = Trio::new().await;
    for h in &mut trio.nodes {
        h.ok("CREATE TABLE ks.c (pk int PRIMARY KEY, n counter) WITH id = 6e1f0a52-8d3b-4c07-a1e2-5b9d4c3f2e10")
            .await;
    }
    trio.run(
        0,
        "UPDATE ks.c SET n = n + 1 WHERE pk = 1",
        Consistency::All,
    )
    .await
    .unwrap();
    // Node 2 alone counts one more: the replicas differ.
    trio.nodes[1]
        .ok("UPDATE ks.c SET n = n + 1 WHERE pk = 1")
        .await;
    trio.nodes[0].engine.set_node_up(host(3), false);
    let rows = match trio
        .run(0, "SELECT n FROM ks.c WHERE pk = 1", Consistency::Quorum)
        .await
        .unwrap()
    {
        ResultMessage::Rows(r) => cells(&r),
        other => panic!("{other:?}"),
    };
    assert_eq!(cbig(&rows[0][0]), 1);
    assert_eq!(trio.nodes[0].engine.read_repairs(), 0);
    let on_two = trio.nodes[1]
        .select("SELECT n FROM ks.c WHERE pk = 1", vec![])
        .await;
    assert_eq!(
        cbig(&on_two[0][0]),
        2,
        "node 2's count is not merged into itself again"
    );
}

/// The trio's ring with node 3 joining: the RF 3 keyspace's natural replicas are nodes 1 and
/// 2 (two owners), and node 3 is pending for every token.
fn ring_with_node_3_joining() -> Arc<TokenMetadata> {
    let mut nodes: Vec<Node> = (1..=3).map(ring_node).collect();
    nodes[2].state = NodeState::Joining;
    Arc::new(TokenMetadata::new(nodes).unwrap())
}

#[tokio::test]
async fn a_joining_node_gets_every_write_and_raises_block_for_by_one() {
    let mut trio = Trio::new().await;
    let hint_dir = tempfile::tempdir().unwrap();
    trio.nodes[0]
        .engine
        .open_hints(crate::hints::HintConfig::new(hint_dir.path().to_path_buf()))
        .unwrap();
    trio.nodes[0].engine.set_ring(ring_with_node_3_joining());
    let insert = "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')";
    trio.run(0, insert, Consistency::Quorum).await.unwrap();
    assert_eq!(
        trio.transport.sent_to(host(3)),
        1,
        "the pending replica is written"
    );
    assert_eq!(trio.local_rows(2).await.len(), 1);

    // QUORUM of RF 3 is 2, plus 1 for the pending replica: a silent pending replica keeps
    // the write from being acknowledged by the two natural ones alone.
    trio.transport.set(host(3), Behaviour::Drop);
    let e = error_of(
        trio.run_with_deadline(0, insert, Consistency::Quorum, Duration::from_millis(300))
            .await,
    );
    assert_eq!(
        e,
        DbError::WriteTimeout {
            consistency: Consistency::Quorum,
            received: 2,
            block_for: 3,
            write_type: sluice_protocol::WriteType::Simple,
        }
    );
    // A refusal makes it impossible at once, whatever the natural replicas answered by then.
    trio.transport.set(host(3), Behaviour::Refuse);
    let e = error_of(trio.run(0, insert, Consistency::Quorum).await);
    assert!(
        matches!(
            e,
            DbError::ReplicaWriteFailure {
                consistency: Consistency::Quorum,
                block_for: 3,
                failures: 1,
                ..
            }
        ),
        "{e:?}"
    );

    // Down: a hint, as for a natural replica; ONE needs 1 + 1 of the two live natural ones.
    trio.transport.set(host(3), Behaviour::Serve);
    trio.nodes[0].engine.set_node_up(host(3), false);
    let sent = trio.transport.sent_to(host(3));
    trio.run(0, insert, Consistency::One).await.unwrap();
    assert_eq!(trio.transport.sent_to(host(3)), sent);
    trio.nodes[0].engine.hints().unwrap().flush();
    assert_eq!(trio.nodes[0].engine.hinted_hosts(), vec![host(3)]);
    // QUORUM needs 3 of the live natural and pending replicas, and only 2 are: Cassandra's
    // Unavailable with the raised counts.
    let e = error_of(trio.run(0, insert, Consistency::Quorum).await);
    assert_eq!(
        e,
        DbError::Unavailable {
            consistency: Consistency::Quorum,
            required: 3,
            alive: 2
        }
    );
    // Too few natural replicas: the counts are the natural replicas'.
    trio.nodes[0].engine.set_node_up(host(3), true);
    trio.nodes[0].engine.set_node_up(host(2), false);
    let e = error_of(trio.run(0, insert, Consistency::Quorum).await);
    assert_eq!(
        e,
        DbError::Unavailable {
            consistency: Consistency::Quorum,
            required: 2,
            alive: 1
        }
    );

    // Node 3 normal: a natural replica, and blockFor is QUORUM's again.
    trio.nodes[0].engine.set_node_up(host(2), true);
    trio.nodes[0].engine.set_ring(Arc::new(simple_ring(3)));
    trio.transport.set(host(3), Behaviour::Drop);
    trio.run(0, insert, Consistency::Quorum).await.unwrap();
}

#[test]
fn pending_replicas_raise_block_for_as_cassandra_does() {
    let mut nodes: Vec<Node> = (1..=6).map(ring_node).collect();
    for (i, n) in nodes.iter_mut().enumerate() {
        n.dc = if i < 3 { "dc1" } else { "dc2" }.into();
    }
    let ring = TokenMetadata::new(nodes).unwrap();
    let (dc1, dc2) = (ring.dc_named("dc1").unwrap(), ring.dc_named("dc2").unwrap());
    let replication = Replication::NetworkTopology {
        factors: vec![("dc1".into(), 3), ("dc2".into(), 2)],
    };
    let raised = |cl| {
        let mut r = requirement(cl, &replication, &ring, "dc1", true).unwrap();
        r.add_pending([dc1, dc2, dc2].into_iter());
        r
    };
    assert_eq!(raised(Consistency::Quorum).block_for, 3 + 3);
    assert_eq!(raised(Consistency::All).block_for, 5 + 3);
    assert_eq!(raised(Consistency::One).block_for, 1 + 3);
    assert_eq!(raised(Consistency::Any).block_for, 1, "ANY adds nothing");
    assert_eq!(
        raised(Consistency::LocalQuorum).block_for,
        2 + 1,
        "only this data center's pending replica"
    );
    let each = raised(Consistency::EachQuorum);
    assert_eq!(each.block_for, 4 + 3);
    assert_eq!(each.per_dc, vec![(dc1, 2 + 1), (dc2, 2 + 2)]);
}

#[tokio::test]
async fn truncate_empties_the_table_on_every_node_and_needs_them_all() {
    let mut trio = Trio::new().await;
    for ck in 1..=3 {
        trio.run(
            0,
            &format!("INSERT INTO ks.t (pk, ck, v) VALUES (1, {ck}, 'x')"),
            Consistency::All,
        )
        .await
        .unwrap();
    }
    for node in 0..3 {
        assert_eq!(trio.local_rows(node).await.len(), 3, "node {node}");
    }
    // A node down: refused before anything is truncated, with Cassandra's error.
    trio.nodes[0].engine.set_node_up(host(3), false);
    let e = trio
        .run(0, "TRUNCATE ks.t", Consistency::One)
        .await
        .unwrap_err();
    assert_eq!(e.error, DbError::TruncateError);
    assert_eq!(
        e.message,
        "Error during truncate: Cannot achieve consistency level ALL"
    );
    assert_eq!(trio.local_rows(0).await.len(), 3);
    assert_eq!(trio.transport.sent_to(host(2)), 3, "no TRUNCATE was sent");
    // A node that refuses: the statement fails, the others still truncate.
    trio.nodes[0].engine.set_node_up(host(3), true);
    trio.transport.set(host(3), Behaviour::Refuse);
    let e = trio
        .run(0, "TRUNCATE ks.t", Consistency::One)
        .await
        .unwrap_err();
    assert_eq!(e.error, DbError::TruncateError);
    // All answer: every node's table is empty.
    trio.transport.set(host(3), Behaviour::Serve);
    trio.run(
        0,
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 9, 'y')",
        Consistency::All,
    )
    .await
    .unwrap();
    trio.run(0, "TRUNCATE ks.t", Consistency::One)
        .await
        .unwrap();
    for node in 0..3 {
        assert!(trio.local_rows(node).await.is_empty(), "node {node}");
    }
}

const RF1_TABLE_ID: &str = "2c8e61f0-5d7a-4b8e-a1f3-6e9d0c4b7a52";

/// The trio with a keyspace of replication factor 1 on every node, each row of partitions
/// 0..partitions (three per partition) written only to its one replica's storage.
async fn trio_rf1(partitions: i32) -> Trio {
    let mut trio = Trio::new().await;
    for h in &mut trio.nodes {
        h.ok("CREATE KEYSPACE k1 WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
        h.ok(&format!(
            "CREATE TABLE k1.t (pk int, ck int, v text, PRIMARY KEY (pk, ck)) WITH id = {RF1_TABLE_ID}"
        ))
        .await;
    }
    let ring = trio.nodes[0].engine.ring();
    for pk in 0..partitions {
        let owner = ring
            .owner_of(Token::of_key(&pk.to_be_bytes()))
            .expect("a ring with tokens");
        let node = (1..=3)
            .position(|i| ring.node(owner).host_id == host(i))
            .unwrap();
        for ck in 0..3 {
            // Nodes 2 and 3 have no ring of their own: they write locally.
            let q = format!("INSERT INTO k1.t (pk, ck, v) VALUES ({pk}, {ck}, '{pk}-{ck}')");
            trio.run(node, &q, Consistency::One).await.unwrap();
        }
    }
    trio
}

/// Runs `q` on node 1 at `cl` with a page size, following paging states to the end.
async fn all_pages(
    trio: &mut Trio,
    q: &str,
    cl: Consistency,
    page: i32,
) -> Vec<Vec<Option<Bytes>>> {
    let h = &mut trio.nodes[0];
    let p = h.engine.prepare(None, q).unwrap();
    let mut params = QueryParameters {
        consistency: cl,
        page_size: Some(page),
        ..QueryParameters::default()
    };
    let mut out = Vec::new();
    for _ in 0..1000 {
        let ctx = h.ctx();
        let rows = match h.engine.execute(&mut h.session, &p, &params, &ctx).await {
            Ok(ResultMessage::Rows(r)) => r,
            other => panic!("{q}: {other:?}"),
        };
        assert!(
            rows.row_count as i32 <= page,
            "a page holds at most its size"
        );
        out.extend(cells(&rows));
        match rows.metadata.paging_state {
            Some(state) => params.paging_state = Some(state),
            None => return out,
        }
    }
    panic!("{q}: paging did not end");
}

#[tokio::test]
async fn a_node_that_is_not_a_replica_forwards_reads_and_scans_the_whole_ring() {
    let mut trio = trio_rf1(30).await;
    let mine = trio.local_rows_of_k1(0).await;
    assert!(
        mine < 90,
        "node 1 holds only its ranges ({mine} of 90 rows)"
    );
    // Every partition through node 1, two rows a page: the pages of a partition node 1 does
    // not hold come from its replica.
    for pk in 0..30 {
        let rows = all_pages(
            &mut trio,
            &format!("SELECT ck, v FROM k1.t WHERE pk = {pk}"),
            Consistency::One,
            2,
        )
        .await;
        let want: Vec<String> = (0..3).map(|ck| format!("{pk}-{ck}")).collect();
        let got: Vec<String> = rows.iter().map(|r| ctext(&r[1])).collect();
        assert_eq!(got, want, "pk {pk}");
    }
    assert!(trio
        .transport
        .sent
        .lock()
        .unwrap()
        .iter()
        .any(|(_, v)| *v == ReplicaVerb::Select));
    // The whole table, four rows a page, and COUNT(*): every row once.
    let rows = all_pages(&mut trio, "SELECT pk, ck, v FROM k1.t", Consistency::One, 4).await;
    let mut seen: Vec<String> = rows.iter().map(|r| ctext(&r[2])).collect();
    assert_eq!(seen.len(), 90);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 90, "no row twice");
    assert!(trio
        .transport
        .sent
        .lock()
        .unwrap()
        .iter()
        .any(|(_, v)| *v == ReplicaVerb::Scan));
    let count = trio.nodes[0]
        .select("SELECT COUNT(*) FROM k1.t", vec![])
        .await;
    assert_eq!(count[0][0].as_deref(), Some(&90i64.to_be_bytes()[..]));
    // A token restriction reads only the ranges it names.
    let all = trio.nodes[0]
        .select("SELECT pk FROM k1.t WHERE token(pk) > 0", vec![])
        .await;
    let upper = trio.nodes[0]
        .select("SELECT pk FROM k1.t WHERE token(pk) <= 0", vec![])
        .await;
    assert_eq!(all.len() + upper.len(), 90);
}

#[tokio::test]
async fn a_forwarded_read_answers_the_replicas_errors_and_its_own_timeout() {
    let mut trio = trio_rf1(30).await;
    let ring = trio.nodes[0].engine.ring();
    let remote_pk = (0..30)
        .find(|pk: &i32| {
            ring.node(ring.owner_of(Token::of_key(&pk.to_be_bytes())).unwrap())
                .host_id
                == host(2)
        })
        .expect("a partition on node 2");
    let q = format!("SELECT v FROM k1.t WHERE pk = {remote_pk}");
    // The only replica refuses: Read_failure with its counts, at once.
    trio.transport.set(host(2), Behaviour::Refuse);
    let e = error_of(trio.run(0, &q, Consistency::One).await);
    assert!(
        matches!(
            e,
            DbError::ReplicaReadFailure {
                consistency: Consistency::One,
                received: 0,
                block_for: 1,
                failures: 1,
                data_present: false,
            }
        ),
        "{e:?}"
    );
    // Silent: Read_timeout at the deadline.
    trio.transport.set(host(2), Behaviour::Drop);
    let started = Instant::now();
    let e = error_of(
        trio.run_with_deadline(0, &q, Consistency::One, Duration::from_millis(300))
            .await,
    );
    assert!(
        matches!(
            e,
            DbError::ReadTimeout {
                block_for: 1,
                data_present: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // Down for the failure detector: Unavailable before anything is sent.
    trio.transport.set(host(2), Behaviour::Serve);
    trio.nodes[0].engine.set_node_up(host(2), false);
    let e = error_of(trio.run(0, &q, Consistency::One).await);
    assert!(
        matches!(
            e,
            DbError::Unavailable {
                required: 1,
                alive: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = error_of(
        trio.run(0, "SELECT COUNT(*) FROM k1.t", Consistency::One)
            .await,
    );
    assert!(matches!(e, DbError::Unavailable { .. }), "{e:?}");
    // TWO of a single replica is Unavailable before anything is sent.
    trio.nodes[0].engine.set_node_up(host(2), true);
    let e = error_of(trio.run(0, &q, Consistency::Two).await);
    assert!(
        matches!(
            e,
            DbError::Unavailable {
                required: 2,
                alive: 1,
                ..
            }
        ),
        "{e:?}"
    );
}

impl Trio {
    /// Rows of `k1.t` in one node's own storage.
    async fn local_rows_of_k1(&mut self, node: usize) -> usize {
        let t = self.nodes[node].engine.table("k1", "t").unwrap();
        let page = self.nodes[node]
            .engine
            .storage()
            .scan(
                &t.layout,
                &sluice_storage::ScanStart::Token(std::ops::Bound::Unbounded),
                std::ops::Bound::Unbounded,
                10_000,
                0,
            )
            .unwrap();
        page.partitions.iter().map(|p| p.read.rows.len()).sum()
    }
}

#[tokio::test]
async fn peers_show_the_schema_version_each_peer_reported() {
    let mut trio = Trio::new().await;
    let mine = trio.nodes[0].engine.schema_version();
    let reported = Uuid::from_u128(42);
    trio.nodes[0]
        .engine
        .set_peer_schema_version(host(2), reported);
    let rows = trio.nodes[0]
        .select("SELECT host_id, schema_version FROM system.peers", vec![])
        .await;
    assert_eq!(rows.len(), 2);
    for row in rows {
        let peer = Uuid::from_slice(row[0].as_deref().unwrap()).unwrap();
        let version = Uuid::from_slice(row[1].as_deref().unwrap()).unwrap();
        // Node 3 has reported nothing yet: this node's own version stands in.
        let want = if peer == host(2) { reported } else { mine };
        assert_eq!(version, want, "peer {peer}");
    }
}

/// A transaction log for the coordinating node that counts what reaches it and commits
/// nothing: a statement forwarded to another node never touches it.
#[derive(Default)]
struct CountingLog {
    barriers: std::sync::atomic::AtomicUsize,
    submits: std::sync::atomic::AtomicUsize,
}

impl crate::transaction::replicated::TxnLog for CountingLog {
    fn read_barrier(
        &self,
        _deadline: Instant,
    ) -> crate::transaction::replicated::TxnLogFuture<
        Result<u64, crate::transaction::replicated::TxnLogError>,
    > {
        self.barriers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async { Ok(0) })
    }

    fn last_applied(&self) -> u64 {
        0
    }

    fn submit(
        &self,
        _txn: crate::transaction::replicated::LoggedTxn,
        _deadline: Instant,
    ) -> crate::transaction::replicated::TxnLogFuture<
        Result<
            crate::transaction::replicated::LoggedDecision,
            crate::transaction::replicated::TxnLogError,
        >,
    > {
        self.submits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async {
            Err(crate::transaction::replicated::TxnLogError::Unavailable(
                "this test log commits nothing",
            ))
        })
    }

    fn max_txn_bytes(&self) -> usize {
        1 << 20
    }
}

/// The first of `0..30` whose one replica (RF 1) is node `i`.
fn pk_on(trio: &Trio, i: u8) -> i32 {
    let ring = trio.nodes[0].engine.ring();
    (0..30)
        .find(|pk: &i32| {
            ring.node(ring.owner_of(Token::of_key(&pk.to_be_bytes())).unwrap())
                .host_id
                == host(i)
        })
        .expect("a partition on that node")
}

fn rows_of(r: Result<ResultMessage, DetailedError>) -> Vec<Vec<Option<Bytes>>> {
    match r {
        Ok(ResultMessage::Rows(rows)) => cells(&rows),
        other => panic!("expected rows, got {other:?}"),
    }
}

fn selects_sent(trio: &Trio) -> usize {
    trio.transport
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| *v == ReplicaVerb::Select)
        .count()
}

#[tokio::test]
async fn lwt_serial_reads_and_transactions_through_a_non_replica_run_on_a_replica() {
    let mut trio = trio_rf1(30).await;
    let log = Arc::new(CountingLog::default());
    assert!(trio.nodes[0].engine.set_txn_log(log.clone()));
    let on2 = pk_on(&trio, 2);
    let on3 = pk_on(&trio, 3);
    let on1 = pk_on(&trio, 1);
    let applied = |rows: &[Vec<Option<Bytes>>]| rows[0][0].as_deref() == Some(&[1u8][..]);

    // INSERT ... IF NOT EXISTS through node 1 runs on node 2: applied once, then not, with
    // the existing row shown.
    let insert = format!("INSERT INTO k1.t (pk, ck, v) VALUES ({on2}, 10, 'new') IF NOT EXISTS");
    let rows = rows_of(trio.run(0, &insert, Consistency::One).await);
    assert!(applied(&rows), "{rows:?}");
    let rows = rows_of(trio.run(0, &insert, Consistency::One).await);
    assert!(!applied(&rows), "{rows:?}");
    assert!(
        rows[0].iter().any(|c| c.as_deref() == Some(&b"new"[..])),
        "the [applied] = false row shows the row found: {rows:?}"
    );
    // UPDATE ... IF, then a SERIAL read of the result, both through node 1.
    let update = format!("UPDATE k1.t SET v = 'upd' WHERE pk = {on2} AND ck = 10 IF v = 'new'");
    assert!(applied(&rows_of(
        trio.run(0, &update, Consistency::One).await
    )));
    assert!(!applied(&rows_of(
        trio.run(0, &update, Consistency::One).await
    )));
    let serial = format!("SELECT v FROM k1.t WHERE pk = {on2} AND ck = 10");
    let rows = rows_of(trio.run(0, &serial, Consistency::Serial).await);
    assert_eq!(rows.len(), 1);
    assert_eq!(ctext(&rows[0][0]), "upd");
    // A one-partition transaction with a returning SELECT, and one answering Void.
    let txn = format!(
        "BEGIN TRANSACTION
           LET r = (SELECT v FROM k1.t WHERE pk = {on2} AND ck = 10);
           SELECT r.v;
           IF r.v = 'upd' THEN
             UPDATE k1.t SET v = 'txn' WHERE pk = {on2} AND ck = 10;
           END IF
         COMMIT TRANSACTION"
    );
    let rows = rows_of(trio.run(0, &txn, Consistency::Quorum).await);
    assert_eq!(ctext(&rows[0][0]), "upd");
    let void = format!(
        "BEGIN TRANSACTION
           LET r = (SELECT v FROM k1.t WHERE pk = {on2} AND ck = 10);
           IF r.v = 'txn' THEN
             UPDATE k1.t SET v = 'void' WHERE pk = {on2} AND ck = 10;
           END IF
         COMMIT TRANSACTION"
    );
    assert!(matches!(
        trio.run(0, &void, Consistency::Quorum).await,
        Ok(ResultMessage::Void)
    ));
    // Every write landed in node 2's own storage; node 1's log saw nothing.
    let on_node2 = trio.nodes[1].select(&serial, vec![]).await;
    assert_eq!(ctext(&on_node2[0][0]), "void");
    let sent = selects_sent(&trio);
    assert_eq!(
        sent, 7,
        "each of the seven statements went to the replica once"
    );
    assert_eq!(trio.transport.sent_to(host(3)), 0);
    assert_eq!(
        log.barriers.load(std::sync::atomic::Ordering::Relaxed)
            + log.submits.load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // Reads with no replica in common: an Invalid error naming why, nothing sent.
    let split = format!(
        "BEGIN TRANSACTION
           LET a = (SELECT v FROM k1.t WHERE pk = {on2} AND ck = 0);
           LET b = (SELECT v FROM k1.t WHERE pk = {on3} AND ck = 0);
           SELECT a.v, b.v;
         COMMIT TRANSACTION"
    );
    let e = trio.run(0, &split, Consistency::Quorum).await.unwrap_err();
    assert_eq!(e.error, DbError::Invalid);
    assert!(e.message.contains("no replica in common"), "{}", e.message);
    assert_eq!(selects_sent(&trio), sent);

    // A partition node 1 replicates stays on node 1 and reaches its log.
    let local = format!("UPDATE k1.t SET v = 'x' WHERE pk = {on1} AND ck = 0 IF v = '{on1}-0'");
    let _ = trio
        .run_with_deadline(0, &local, Consistency::One, Duration::from_millis(300))
        .await;
    assert_eq!(log.submits.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(selects_sent(&trio), sent);

    // The replica's errors come back with their fields; its silence is a CAS write timeout.
    trio.transport.set(host(2), Behaviour::Refuse);
    let e = trio.run(0, &update, Consistency::One).await.unwrap_err();
    assert_eq!(e.error, DbError::Overloaded, "{}", e.message);
    trio.transport.set(host(2), Behaviour::Drop);
    let started = Instant::now();
    let e = trio
        .run_with_deadline(0, &update, Consistency::One, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            DbError::WriteTimeout {
                write_type: sluice_protocol::WriteType::Cas,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let e = trio
        .run_with_deadline(0, &serial, Consistency::Serial, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e.error, DbError::ReadTimeout { .. }), "{e:?}");
    // Down for the failure detector: Unavailable before anything is sent.
    trio.transport.set(host(2), Behaviour::Serve);
    trio.nodes[0].engine.set_node_up(host(2), false);
    let before = selects_sent(&trio);
    let e = trio.run(0, &update, Consistency::One).await.unwrap_err();
    assert!(
        matches!(e.error, DbError::Unavailable { alive: 0, .. }),
        "{e:?}"
    );
    assert_eq!(selects_sent(&trio), before);
}

/// Every row of a `SELECT pk, ck, v` as (pk, ck, v), sorted.
fn pk_ck_v(rows: &[Vec<Option<Bytes>>]) -> Vec<(i32, i32, String)> {
    let mut out: Vec<(i32, i32, String)> = rows
        .iter()
        .map(|r| (cint(&r[0]), cint(&r[1]), ctext(&r[2])))
        .collect();
    out.sort();
    out
}

fn scans_sent(trio: &Trio) -> usize {
    trio.transport
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| *v == ReplicaVerb::Scan)
        .count()
}

async fn count_at(trio: &mut Trio, cl: Consistency) -> i64 {
    let rows = rows_of(trio.run(0, "SELECT COUNT(*) FROM ks.t", cl).await);
    cbig(&rows[0][0])
}

#[tokio::test]
async fn a_quorum_scan_sees_writes_this_replica_missed_and_repairs_them() {
    let mut trio = Trio::new().await;
    for pk in 0..20 {
        for ck in 0..2 {
            let q =
                format!("INSERT INTO ks.t (pk, ck, v) VALUES ({pk}, {ck}, 'a') USING TIMESTAMP 10");
            trio.run(0, &q, Consistency::All).await.unwrap();
        }
    }
    // Writes node 1 missed (down, no hint): only nodes 2 and 3 get a new partition, a new row
    // of an old one, a newer value and a deletion.
    for h in &mut trio.nodes[1..] {
        h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (100, 0, 'new') USING TIMESTAMP 20")
            .await;
        h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (5, 7, 'new') USING TIMESTAMP 20")
            .await;
        h.ok("UPDATE ks.t USING TIMESTAMP 20 SET v = 'newer' WHERE pk = 6 AND ck = 0")
            .await;
        h.ok("DELETE FROM ks.t USING TIMESTAMP 20 WHERE pk = 7 AND ck = 1")
            .await;
    }
    let mut want: Vec<(i32, i32, String)> = Vec::new();
    for pk in 0..20 {
        for ck in 0..2 {
            if (pk, ck) == (7, 1) {
                continue;
            }
            let v = if (pk, ck) == (6, 0) { "newer" } else { "a" };
            want.push((pk, ck, v.to_string()));
        }
    }
    want.push((5, 7, "new".into()));
    want.push((100, 0, "new".into()));
    want.sort();
    let q = "SELECT pk, ck, v FROM ks.t";
    // ONE through node 1 reads its own, stale copy and asks nobody.
    let one = pk_ck_v(&all_pages(&mut trio, q, Consistency::One, 7).await);
    assert_eq!(one.len(), 40);
    assert!(!one.contains(&(100, 0, "new".into())));
    assert_eq!(scans_sent(&trio), 0);
    // COUNT(*) at QUORUM compares each page with a second replica.
    assert_eq!(count_at(&mut trio, Consistency::Quorum).await, 41);
    assert!(scans_sent(&trio) > 0);
    // The differing partitions were repaired into node 1 (and node 2 already held them).
    assert_eq!(trio.nodes[0].engine.read_repairs(), 4);
    assert_eq!(count_at(&mut trio, Consistency::One).await, 41);
    let quorum = pk_ck_v(&all_pages(&mut trio, q, Consistency::Quorum, 7).await);
    assert_eq!(quorum, want, "every row once, the newest of each");
    assert_eq!(
        trio.nodes[0].engine.read_repairs(),
        4,
        "nothing left to repair"
    );
    // More missed writes, read through a paged QUORUM scan (pages of 3 rows cut partitions).
    for h in &mut trio.nodes[1..] {
        h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (101, 0, 'new') USING TIMESTAMP 20")
            .await;
        h.ok("DELETE FROM ks.t USING TIMESTAMP 20 WHERE pk = 8")
            .await;
    }
    want.retain(|r| r.0 != 8);
    want.push((101, 0, "new".into()));
    want.sort();
    let quorum = pk_ck_v(&all_pages(&mut trio, q, Consistency::Quorum, 3).await);
    assert_eq!(quorum, want);
    // A newer value only node 3 holds: QUORUM asks node 2 and misses it, ALL sees it.
    trio.nodes[2]
        .ok("UPDATE ks.t USING TIMESTAMP 30 SET v = 'only3' WHERE pk = 9 AND ck = 0")
        .await;
    let quorum = pk_ck_v(&all_pages(&mut trio, q, Consistency::Quorum, 50).await);
    assert!(quorum.contains(&(9, 0, "a".into())));
    let all = pk_ck_v(&all_pages(&mut trio, q, Consistency::All, 50).await);
    assert!(all.contains(&(9, 0, "only3".into())), "{all:?}");
    assert_eq!(all.len(), want.len());
}

#[tokio::test]
async fn a_reconciled_scan_replaces_a_refusing_replica_and_reports_the_counts() {
    let mut trio = Trio::new().await;
    for pk in 0..5 {
        let q = format!("INSERT INTO ks.t (pk, ck, v) VALUES ({pk}, 0, 'a')");
        trio.run(0, &q, Consistency::All).await.unwrap();
    }
    // Node 2 refuses: the page is read from node 3 instead.
    trio.transport.set(host(2), Behaviour::Refuse);
    assert_eq!(count_at(&mut trio, Consistency::Quorum).await, 5);
    assert!(trio.transport.sent_to(host(3)) > 5, "node 3 was asked");
    // Both refuse: Read_failure at once with the counts.
    trio.transport.set(host(3), Behaviour::Refuse);
    let e = error_of(
        trio.run(0, "SELECT COUNT(*) FROM ks.t", Consistency::Quorum)
            .await,
    );
    assert_eq!(
        e,
        DbError::ReplicaReadFailure {
            consistency: Consistency::Quorum,
            received: 1,
            block_for: 2,
            failures: 2,
            data_present: true,
        }
    );
    // A silent replica: Read_timeout at the deadline, with what was received.
    trio.transport.set(host(2), Behaviour::Drop);
    trio.transport.set(host(3), Behaviour::Serve);
    let started = Instant::now();
    let e = error_of(
        trio.run_with_deadline(
            0,
            "SELECT pk FROM ks.t",
            Consistency::All,
            Duration::from_millis(300),
        )
        .await,
    );
    assert_eq!(
        e,
        DbError::ReadTimeout {
            consistency: Consistency::All,
            received: 2,
            block_for: 3,
            data_present: true,
        }
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // Too few alive for the level: Unavailable before anything is sent.
    trio.transport.set(host(2), Behaviour::Serve);
    trio.nodes[0].engine.set_node_up(host(3), false);
    let sent = trio.transport.sent.lock().unwrap().len();
    let e = error_of(trio.run(0, "SELECT pk FROM ks.t", Consistency::All).await);
    assert_eq!(
        e,
        DbError::Unavailable {
            consistency: Consistency::All,
            required: 3,
            alive: 2,
        }
    );
    assert_eq!(trio.transport.sent.lock().unwrap().len(), sent);
}

#[tokio::test]
async fn a_non_replica_has_a_replica_reconcile_the_ranges_it_does_not_hold() {
    let mut trio = Trio::new().await;
    // Every node coordinates: each has the ring and reaches the others.
    let ring = trio.nodes[0].engine.ring();
    trio.transport
        .replicas
        .lock()
        .unwrap()
        .insert(host(1), (trio.nodes[0].engine.clone(), Behaviour::Serve));
    for h in &trio.nodes[1..] {
        h.engine.set_ring(ring.clone());
        assert!(h.engine.set_replica_transport(trio.transport.clone()));
    }
    for h in &mut trio.nodes {
        h.ok("CREATE KEYSPACE k2 WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}").await;
        h.ok(&format!(
            "CREATE TABLE k2.t (pk int, ck int, v text, PRIMARY KEY (pk, ck)) WITH id = {RF1_TABLE_ID}"
        ))
        .await;
    }
    for pk in 0..12 {
        let q = format!("INSERT INTO k2.t (pk, ck, v) VALUES ({pk}, 0, 'a')");
        trio.run(0, &q, Consistency::All).await.unwrap();
    }
    // A partition of a range node 1 does not replicate (nodes 2 and 3 do), written while
    // node 2 refused: only node 3 holds it.
    let step = i64::MAX / 8;
    let missed = (100..10_000)
        .find(|pk: &i32| {
            let token = Token::of_key(&pk.to_be_bytes()).0;
            token > step && token <= 2 * step
        })
        .expect("a partition in (t1, t2]");
    let replicas = |pk: i32| {
        let mut out = Vec::new();
        sluice_ring::natural_replicas(
            &ring,
            &Replication::Simple { factor: 2 },
            Token::of_key(&pk.to_be_bytes()),
            &mut out,
        );
        out.iter()
            .map(|&r| ring.node(r).host_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(replicas(missed), vec![host(2), host(3)]);
    trio.transport.set(host(2), Behaviour::Refuse);
    let q = format!("INSERT INTO k2.t (pk, ck, v) VALUES ({missed}, 0, 'missed')");
    trio.run(2, &q, Consistency::One).await.unwrap();
    trio.transport.set(host(2), Behaviour::Serve);
    // An IN with a partition node 1 holds: the other is read on node 2, which at QUORUM
    // first reconciles it with node 3 (and is repaired by it).
    let held = (0..12)
        .find(|&pk| replicas(pk).contains(&host(1)))
        .expect("a partition on node 1");
    let q = format!("SELECT pk, ck, v FROM k2.t WHERE pk IN ({missed}, {held})");
    let in_one = pk_ck_v(&rows_of(trio.run(0, &q, Consistency::One).await));
    assert_eq!(in_one, vec![(held, 0, "a".into())]);
    let in_quorum = pk_ck_v(&rows_of(trio.run(0, &q, Consistency::Quorum).await));
    assert_eq!(in_quorum.len(), 2, "{in_quorum:?}");
    assert!(in_quorum.contains(&(missed, 0, "missed".into())));
    assert_eq!(trio.nodes[1].engine.read_repairs(), 1);
    // Undo node 2's repair so that the scans below find it stale again.
    trio.nodes[1]
        .engine
        .storage()
        .truncate(*uuid::Uuid::parse_str(RF1_TABLE_ID).unwrap().as_bytes())
        .unwrap();
    for pk in 0..12 {
        if replicas(pk).contains(&host(2)) {
            let q = format!("INSERT INTO k2.t (pk, ck, v) VALUES ({pk}, 0, 'a')");
            trio.run(0, &q, Consistency::All).await.unwrap();
        }
    }
    let scan = "SELECT pk, ck, v FROM k2.t";
    let one = pk_ck_v(&all_pages(&mut trio, scan, Consistency::One, 5).await);
    assert_eq!(
        one.len(),
        12,
        "ONE reads the range from node 2 alone: {one:?}"
    );
    // QUORUM: node 2 reconciles the range with node 3 and answers node 1.
    let quorum = pk_ck_v(&all_pages(&mut trio, scan, Consistency::Quorum, 5).await);
    assert_eq!(quorum.len(), 13);
    assert!(quorum.contains(&(missed, 0, "missed".into())));
    assert!(trio.nodes[1].engine.read_repairs() >= 1);
    assert_eq!(
        trio.nodes[0].engine.read_repairs(),
        0,
        "node 1 holds no copy"
    );
    let one = pk_ck_v(&all_pages(&mut trio, scan, Consistency::One, 5).await);
    assert_eq!(one.len(), 13, "node 2 was repaired");
}

#[tokio::test]
async fn an_in_across_partitions_of_different_replicas_reads_each_where_it_lives() {
    let mut trio = trio_rf1(30).await;
    let (on1, on2, on3) = (pk_on(&trio, 1), pk_on(&trio, 2), pk_on(&trio, 3));
    // The rows in the IN's order (as one node answers), each partition's rows by ck.
    let order = [on3, on1, on2];
    let want: Vec<String> = order
        .iter()
        .flat_map(|pk| (0..3).map(move |ck| format!("{pk}-{ck}")))
        .collect();
    let q = format!("SELECT pk, ck, v FROM k1.t WHERE pk IN ({on3}, {on1}, {on2}, {on3})");
    let texts = |rows: &[Vec<Option<Bytes>>]| rows.iter().map(|r| ctext(&r[2])).collect::<Vec<_>>();
    let rows = rows_of(trio.run(0, &q, Consistency::One).await);
    assert_eq!(texts(&rows), want);
    let slices = |trio: &Trio| {
        trio.transport
            .sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| *v == ReplicaVerb::Slice)
            .count()
    };
    assert!(
        slices(&trio) >= 2,
        "the partitions of nodes 2 and 3 were read there"
    );
    assert_eq!(selects_sent(&trio), 0, "nothing forwarded whole");
    // Paged two rows at a time: the same rows in the same order.
    for page in [1, 2, 4] {
        let rows = all_pages(&mut trio, &q, Consistency::One, page).await;
        assert_eq!(texts(&rows), want, "page size {page}");
    }
    // LIMIT and PER PARTITION LIMIT count across the partitions, in order.
    let rows = rows_of(trio.run(0, &format!("{q} LIMIT 4"), Consistency::One).await);
    assert_eq!(texts(&rows), want[..4]);
    let rows = rows_of(
        trio.run(0, &format!("{q} PER PARTITION LIMIT 1"), Consistency::One)
            .await,
    );
    let firsts: Vec<String> = order.iter().map(|pk| format!("{pk}-0")).collect();
    assert_eq!(texts(&rows), firsts);
    let rows = all_pages(
        &mut trio,
        &format!("{q} PER PARTITION LIMIT 2 LIMIT 5"),
        Consistency::One,
        2,
    )
    .await;
    let two_each: Vec<String> = order
        .iter()
        .flat_map(|pk| (0..2).map(move |ck| format!("{pk}-{ck}")))
        .take(5)
        .collect();
    assert_eq!(texts(&rows), two_each);
    // An aggregate and an ORDER BY over the IN.
    let count = format!("SELECT COUNT(*) FROM k1.t WHERE pk IN ({on1}, {on2}, {on3})");
    let rows = rows_of(trio.run(0, &count, Consistency::One).await);
    assert_eq!(cbig(&rows[0][0]), 9);
    let ordered =
        format!("SELECT pk, ck, v FROM k1.t WHERE pk IN ({on3}, {on1}, {on2}) ORDER BY ck DESC");
    let rows = rows_of(trio.run(0, &ordered, Consistency::One).await);
    let by_ck: Vec<String> = (0..3)
        .rev()
        .flat_map(|ck| order.iter().map(move |pk| format!("{pk}-{ck}")))
        .collect();
    assert_eq!(texts(&rows), by_ck);
    // The only replica of one partition refuses: Read_failure with its counts.
    trio.transport.set(host(3), Behaviour::Refuse);
    let e = error_of(trio.run(0, &q, Consistency::One).await);
    assert_eq!(
        e,
        DbError::ReplicaReadFailure {
            consistency: Consistency::One,
            received: 0,
            block_for: 1,
            failures: 1,
            data_present: false,
        }
    );
}

#[path = "logged_batch.rs"]
mod logged_batch;

/// The engine of ring member `i` (127.0.0.i with its ring tokens), over fresh storage.
fn member(i: u8) -> H {
    let mut info = NodeInfo::single(IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)), 9042, host(i));
    info.tokens = ring_node(i).tokens.iter().map(|t| t.0).collect();
    H::with_info(info)
}

/// Three engines that each coordinate reads of a table limited to `limit` reads per second
/// per partition, replicated `rf` times; each knows the others through the ring.
async fn reading_trio(rf: u32, limit: u32) -> Vec<H> {
    let transport = Arc::new(FakeTransport::default());
    let ring = Arc::new(TokenMetadata::new((1..=3).map(ring_node).collect()).unwrap());
    let mut nodes = Vec::new();
    for i in 1..=3u8 {
        let mut h = member(i);
        h.ok(&format!(
            "CREATE KEYSPACE ks WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
        ))
        .await;
        h.ok(&format!(
            "CREATE TABLE ks.t (pk int, ck int, v text, PRIMARY KEY (pk, ck)) WITH id = {TABLE_ID} \
             AND per_partition_rate_limit = {{'max_reads_per_second': {limit}}}"
        ))
        .await;
        h.engine.set_ring(Arc::clone(&ring));
        assert!(h.engine.set_replica_transport(transport.clone()));
        nodes.push(h);
    }
    nodes
}

/// Offers 1,000 reads a second of one partition limited to `limit` for `seconds`, round-robin
/// over the three coordinators; with `exchange`, every 25 ms each node's read count messages
/// are delivered to the peers they are addressed to. Returns the reads accepted in each second.
fn offer_reads(nodes: &[H], limit: u32, seconds: usize, exchange: bool) -> Vec<u32> {
    const T0: u64 = 1_800_000_000_000;
    let table = *Uuid::parse_str(TABLE_ID).unwrap().as_bytes();
    let token = 42;
    let mut accepted = vec![0u32; seconds];
    for ms in 0..(seconds as u64 * 1000) {
        let now = T0 + ms;
        if ms % 25 == 0 {
            for n in nodes {
                for (peer, body) in n.engine.take_read_counts_at(now) {
                    let to = nodes
                        .iter()
                        .find(|m| {
                            let i = (m.engine.node().host_id.as_u128() - host(0).as_u128()) as u8;
                            ring_node(i).internode_address == peer
                        })
                        .expect("a message goes to a node of the ring");
                    assert_ne!(to.engine.node().host_id, n.engine.node().host_id);
                    if exchange {
                        assert_eq!(to.engine.count_peer_reads_at(&body, now), Ok(1));
                    }
                }
            }
        }
        let coordinator = &nodes[(ms % 3) as usize].engine;
        match coordinator.decide_replicated_read_at(&table, token, limit, now) {
            Some(true) => accepted[(ms / 1000) as usize] += 1,
            Some(false) => {}
            None => panic!("an RF 3 table's reads are decided across replicas"),
        }
    }
    accepted
}

#[tokio::test]
async fn reads_spread_over_three_coordinators_share_the_limit_through_the_exchange() {
    let nodes = reading_trio(3, 50).await;
    let with = offer_reads(&nodes, 50, 6, true);
    // The limit of 50 ±10% in every second, the first included.
    for (s, n) in with.iter().enumerate() {
        assert!(
            (45..=55).contains(n),
            "second {s} with the exchange: {n} ({with:?})"
        );
    }
    // A small limit too: each coordinator's share and margin keep the first second and the
    // ends of windows from going over.
    let nodes = reading_trio(3, 10).await;
    let ten = offer_reads(&nodes, 10, 6, true);
    for (s, n) in ten.iter().enumerate() {
        assert!(
            (9..=11).contains(n),
            "second {s} at a limit of 10: {n} ({ten:?})"
        );
    }
    let sent = nodes[0].engine.read_count_stats();
    assert!(sent.messages_sent > 0 && sent.keys_received > 0, "{sent:?}");
    assert_eq!(sent.dropped, 0);

    // Without it, each coordinator admits the limit on its own: about RF × the limit.
    let nodes = reading_trio(3, 50).await;
    let without = offer_reads(&nodes, 50, 6, false);
    for (s, n) in without.iter().enumerate().skip(1) {
        assert!(
            (135..=165).contains(n),
            "second {s} without the exchange: {n} ({without:?})"
        );
    }
}

#[tokio::test]
async fn reads_of_a_table_with_one_replica_stay_with_the_shard_limiter() {
    let nodes = reading_trio(1, 50).await;
    let table = *Uuid::parse_str(TABLE_ID).unwrap().as_bytes();
    for n in &nodes {
        assert_eq!(n.engine.decide_replicated_read(&table, 42, 50), None);
        assert!(n.engine.take_read_counts().is_empty());
    }
    // A message from a peer is still counted; a malformed one is refused whole.
    let body = crate::read_counts::encode_read_counts(&[crate::read_counts::ReadCount {
        table,
        token: 42,
        window: sluice_overload::window_of(1_800_000_000_000).0,
        count: 3,
    }]);
    assert_eq!(
        nodes[0]
            .engine
            .count_peer_reads_at(&body, 1_800_000_000_000),
        Ok(1)
    );
    assert!(matches!(
        nodes[0].engine.count_peer_reads(&body[..body.len() - 1]),
        Err(crate::coordinator::ReplicaRefusal::Malformed(_))
    ));
    assert_eq!(nodes[0].engine.read_count_stats().malformed, 1);
}
