//! The Rust `scylla` driver against the real binary: DDL, prepared statements, every native
//! type and the collections round-tripping, and token- plus shard-aware routing actually used.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{connect, create_keyspace, Node};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::value::{
    CqlDate, CqlDecimal, CqlDuration, CqlTime, CqlTimestamp, CqlTimeuuid, CqlValue, CqlVarint,
};

async fn wait_all_shards_connected(session: &Session, shards: usize) {
    // The driver opens one connection per shard in the background; wait until it has.
    for _ in 0..200 {
        let state = session.get_cluster_state();
        let node = &state.get_nodes_info()[0];
        if node.sharder().map(|s| s.nr_shards.get() as usize) == Some(shards) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the driver found no sharding information");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_prepared_statements_and_routing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), 2, &["--durability", "periodic"]);
    let session = connect(&node).await;
    wait_all_shards_connected(&session, 2).await;

    create_keyspace(&session, "rs").await;
    session
        .query_unpaged(
            "CREATE TABLE IF NOT EXISTS rs.kv (pk bigint, ck int, v text, PRIMARY KEY (pk, ck))",
            &[],
        )
        .await
        .unwrap();
    // Let the driver refresh its metadata so that it knows the table's partitioner.
    session.refresh_metadata().await.unwrap();

    let ins = session
        .prepare("INSERT INTO rs.kv (pk, ck, v) VALUES (?, ?, ?)")
        .await
        .unwrap();
    let sel = session
        .prepare("SELECT ck, v FROM rs.kv WHERE pk = ?")
        .await
        .unwrap();

    // Warm up: the driver fills its per-shard pool in the background (through the
    // shard-aware port); until a shard's connection is up, it uses another one.
    for pk in 0..200i64 {
        session
            .execute_unpaged(&ins, (pk + 100_000, 0i32, "warm-up".to_string()))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let forwards_before = node.metric("sluice_cross_shard_forwards_total", &[]);
    let exec_before = node.metric_per_shard("sluice_requests_total", &[("opcode", "execute")]);
    for pk in 0..400i64 {
        session
            .execute_unpaged(&ins, (pk, 1i32, format!("v{pk}")))
            .await
            .unwrap();
    }
    for pk in (0..400i64).step_by(7) {
        let rows = session
            .execute_unpaged(&sel, (pk,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let got: Vec<(i32, String)> = rows
            .rows::<(i32, String)>()
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got, vec![(1, format!("v{pk}"))]);
    }
    let forwards_after = node.metric("sluice_cross_shard_forwards_total", &[]);
    let exec_after = node.metric_per_shard("sluice_requests_total", &[("opcode", "execute")]);
    assert_eq!(
        forwards_after - forwards_before,
        0.0,
        "prepared single-partition statements must reach their owning shard"
    );
    for (shard, (a, b)) in exec_after.iter().zip(&exec_before).enumerate() {
        assert!(
            a - b > 50.0,
            "shard {shard} got {} executions: not shard-aware",
            a - b
        );
    }
    // Unprepared statements on the wrong shard are forwarded and still answered correctly.
    for pk in 0..20i64 {
        let r = session
            .query_unpaged(
                format!("SELECT v FROM rs.kv WHERE pk = {pk} AND ck = 1"),
                &[],
            )
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let (v,): (String,) = r.single_row().unwrap();
        assert_eq!(v, format!("v{pk}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_and_snappy_compression() {
    use scylla::frame::Compression;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), 1, &["--durability", "periodic"]);
    for compression in [Compression::Lz4, Compression::Snappy] {
        let session = SessionBuilder::new()
            .known_node(node.addr.to_string())
            .compression(Some(compression))
            .build()
            .await
            .expect("connect with compression");
        create_keyspace(&session, "cz").await;
        session
            .query_unpaged(
                "CREATE TABLE IF NOT EXISTS cz.t (k int PRIMARY KEY, v text)",
                &[],
            )
            .await
            .unwrap();
        // Large, compressible values: both requests and answers cross the threshold.
        let big = "sluice ".repeat(2000);
        let ins = session
            .prepare("INSERT INTO cz.t (k, v) VALUES (?, ?)")
            .await
            .unwrap();
        for k in 0..20i32 {
            session
                .execute_unpaged(&ins, (k, format!("{k}{big}")))
                .await
                .unwrap();
        }
        let r = session
            .query_unpaged("SELECT k, v FROM cz.t", &[])
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let rows: Vec<(i32, String)> = r
            .rows::<(i32, String)>()
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(rows.len(), 20, "{compression:?}");
        for (k, v) in rows {
            assert_eq!(v, format!("{k}{big}"), "{compression:?}");
        }
    }
}

fn types_and_values() -> Vec<(&'static str, CqlValue)> {
    vec![
        ("ascii", CqlValue::Ascii("ascii text".into())),
        ("text", CqlValue::Text("unicode ✓ text".into())),
        ("boolean", CqlValue::Boolean(true)),
        ("tinyint", CqlValue::TinyInt(-8)),
        ("smallint", CqlValue::SmallInt(31000)),
        ("int", CqlValue::Int(-2_000_000_000)),
        ("bigint", CqlValue::BigInt(9_000_000_000_000_000_000)),
        (
            "varint",
            CqlValue::Varint(CqlVarint::from_signed_bytes_be(vec![
                0x01, 0x8e, 0xe9, 0x0f, 0xf6, 0xc3, 0x73, 0xe0, 0xee, 0x4e, 0x3f, 0x0a, 0xd2,
            ])),
        ),
        ("float", CqlValue::Float(1.5)),
        ("double", CqlValue::Double(-2.25e100)),
        (
            "decimal",
            CqlValue::Decimal(CqlDecimal::from_signed_be_bytes_and_exponent(
                vec![0x30, 0x39],
                3,
            )),
        ),
        ("blob", CqlValue::Blob(vec![0, 1, 2, 255])),
        (
            "uuid",
            CqlValue::Uuid(uuid::Uuid::parse_str("12345678-1234-4234-8234-123456789abc").unwrap()),
        ),
        (
            "timeuuid",
            CqlValue::Timeuuid(CqlTimeuuid::from(
                uuid::Uuid::parse_str("d2177dd0-eaa2-11de-a572-001b779c76e3").unwrap(),
            )),
        ),
        (
            "timestamp",
            CqlValue::Timestamp(CqlTimestamp(1_715_949_045_123)),
        ),
        ("date", CqlValue::Date(CqlDate((1u32 << 31) + 19_000))),
        ("time", CqlValue::Time(CqlTime(47_655_161_718_000))),
        (
            "duration",
            CqlValue::Duration(CqlDuration {
                months: 1,
                days: 2,
                nanoseconds: 3_000_000_000,
            }),
        ),
        (
            "inet",
            CqlValue::Inet("192.168.10.20".parse::<IpAddr>().unwrap()),
        ),
        ("inet", CqlValue::Inet("::1".parse::<IpAddr>().unwrap())),
        (
            "list<int>",
            CqlValue::List(vec![CqlValue::Int(3), CqlValue::Int(1), CqlValue::Int(2)]),
        ),
        (
            "set<text>",
            CqlValue::Set(vec![CqlValue::Text("a".into()), CqlValue::Text("b".into())]),
        ),
        (
            "map<text, int>",
            CqlValue::Map(vec![
                (CqlValue::Text("x".into()), CqlValue::Int(1)),
                (CqlValue::Text("y".into()), CqlValue::Int(2)),
            ]),
        ),
        (
            "frozen<list<text>>",
            CqlValue::List(vec![CqlValue::Text("f".into()), CqlValue::Text("g".into())]),
        ),
        (
            "frozen<map<int, boolean>>",
            CqlValue::Map(vec![
                (CqlValue::Int(1), CqlValue::Boolean(true)),
                (CqlValue::Int(2), CqlValue::Boolean(false)),
            ]),
        ),
        (
            "frozen<set<bigint>>",
            CqlValue::Set(vec![CqlValue::BigInt(5), CqlValue::BigInt(6)]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), 2, &["--durability", "periodic"]);
    let session = connect(&node).await;
    create_keyspace(&session, "ty").await;
    for (i, (ty, value)) in types_and_values().into_iter().enumerate() {
        let table = format!("ty.t{i}");
        session
            .query_unpaged(
                format!("CREATE TABLE IF NOT EXISTS {table} (k int PRIMARY KEY, v {ty})"),
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("create {ty}: {e}"));
        let ins = session
            .prepare(format!("INSERT INTO {table} (k, v) VALUES (?, ?)"))
            .await
            .unwrap();
        session
            .execute_unpaged(&ins, (1i32, value.clone()))
            .await
            .unwrap_or_else(|e| panic!("insert {ty}: {e}"));
        let sel = session
            .prepare(format!("SELECT v FROM {table} WHERE k = ?"))
            .await
            .unwrap();
        let rows = session
            .execute_unpaged(&sel, (1i32,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let (got,): (CqlValue,) = rows.single_row().unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(got, value, "round trip of {ty}");
    }
}

/// The driver's token map (from the node's 8 tokens) gives the same replicas as the
/// server's `system_views.token_replicas`, for SimpleStrategy and NetworkTopologyStrategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_map_equals_the_servers_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        1,
        &["--num-tokens", "8", "--dc", "dc-r", "--rack", "rack-r"],
    );
    let session = connect(&node).await;
    for ddl in [
        "CREATE KEYSPACE ts WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}",
        "CREATE KEYSPACE tn WITH replication = {'class': 'NetworkTopologyStrategy', 'dc-r': 2}",
        "CREATE TABLE ts.t (pk int PRIMARY KEY)",
        "CREATE TABLE tn.t (pk int PRIMARY KEY)",
    ] {
        session.query_unpaged(ddl, &[]).await.unwrap();
    }
    session.refresh_metadata().await.unwrap();
    let state = session.get_cluster_state();
    let tokens: Vec<i64> = session
        .query_unpaged("SELECT tokens FROM system.local", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row::<(Vec<String>,)>()
        .unwrap()
        .0
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 8);
    let lookup = session
        .prepare(
            "SELECT replicas FROM system_views.token_replicas \
             WHERE keyspace_name = ? AND token_value = ?",
        )
        .await
        .unwrap();
    let mut probes: Vec<i64> = (0..100i64)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15u64 as i64))
        .collect();
    probes.extend(tokens.iter().flat_map(|&t| [t, t.wrapping_add(1)]));
    let mut compared = 0;
    for ks in ["ts", "tn"] {
        for &token in &probes {
            let (server,): (Vec<IpAddr>,) = session
                .execute_unpaged(&lookup, (ks, token))
                .await
                .unwrap()
                .into_rows_result()
                .unwrap()
                .single_row()
                .unwrap();
            let driver: Vec<IpAddr> = state
                .get_token_endpoints(ks, "t", scylla::routing::Token::new(token))
                .iter()
                .map(|(n, _)| n.address.ip())
                .collect();
            assert_eq!(server, driver, "{ks} {token}");
            assert_eq!(server, vec![IpAddr::from([127, 0, 0, 1])]);
            compared += 1;
        }
    }
    assert_eq!(compared, 2 * probes.len());
}

/// On a node given a three-node ring (two pretended peers, nothing listening): the driver
/// discovers three nodes from `system.peers`, connects only to the real one, keeps working
/// through it, and its token map for RF = 3 equals the server's replica lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretended_peers_are_discovered_and_do_not_break_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        1,
        &[
            "--num-tokens",
            "4",
            "--test-only-fake-peers",
            "127.0.0.202,127.0.0.203",
        ],
    );
    let session = connect(&node).await;
    for ddl in [
        "CREATE KEYSPACE fp WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}",
        "CREATE TABLE fp.t (pk int PRIMARY KEY, v int)",
    ] {
        session.query_unpaged(ddl, &[]).await.unwrap();
    }
    session.refresh_metadata().await.unwrap();
    let state = session.get_cluster_state();
    let mut addresses: Vec<IpAddr> = state
        .get_nodes_info()
        .iter()
        .map(|n| n.address.ip())
        .collect();
    addresses.sort();
    let real = IpAddr::from([127, 0, 0, 1]);
    assert_eq!(
        addresses,
        [
            real,
            IpAddr::from([127, 0, 0, 202]),
            IpAddr::from([127, 0, 0, 203])
        ]
    );
    for n in state.get_nodes_info() {
        assert_eq!(n.is_connected(), n.address.ip() == real, "{}", n.address);
        assert_eq!(
            n.address.port(),
            node.addr.port(),
            "peers on the contact port"
        );
    }

    let ins = session
        .prepare("INSERT INTO fp.t (pk, v) VALUES (?, ?)")
        .await
        .unwrap();
    for pk in 0..50i32 {
        session.execute_unpaged(&ins, (pk, pk * 2)).await.unwrap();
    }
    let count: (i64,) = session
        .query_unpaged("SELECT count(*) FROM fp.t", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    assert_eq!(count.0, 50);

    let lookup = session
        .prepare(
            "SELECT replicas FROM system_views.token_replicas \
             WHERE keyspace_name = 'fp' AND token_value = ?",
        )
        .await
        .unwrap();
    let probes: Vec<i64> = (0..100i64)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15u64 as i64))
        .collect();
    for token in probes {
        let (server,): (Vec<IpAddr>,) = session
            .execute_unpaged(&lookup, (token,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap()
            .single_row()
            .unwrap();
        let driver: Vec<IpAddr> = state
            .get_token_endpoints("fp", "t", scylla::routing::Token::new(token))
            .iter()
            .map(|(n, _)| n.address.ip())
            .collect();
        assert_eq!(server.len(), 3);
        assert_eq!(server, driver, "{token}");
    }
}
