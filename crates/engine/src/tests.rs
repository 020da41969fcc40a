//! End-to-end tests of the engine on a temporary storage directory: statements go through
//! the real parser, analysis, execution and storage.

use crate::{Engine, NodeInfo, RequestContext, Session};
use bytes::Bytes;
use sluice_protocol::{
    BatchEntry, BatchQuery, BatchRequest, Consistency, DbError, DetailedError, ErrorCode,
    QueryParameters, ResultMessage, Rows, SchemaChangeTarget, SchemaChangeType, Value,
};
use sluice_storage::{Durability, Storage, StorageConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

mod transaction_tests;

struct H {
    engine: Arc<Engine>,
    session: Session,
    dir: tempfile::TempDir,
    now: Option<i64>,
}

fn open_storage(path: &std::path::Path) -> Storage {
    Storage::open(StorageConfig {
        path: path.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 8 << 20,
        stores: 2,
    })
    .expect("storage opens")
}

fn node() -> NodeInfo {
    NodeInfo::single(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        9042,
        uuid::Uuid::from_u128(0x1234),
    )
}

fn int(v: i32) -> Value {
    Value::Set(Bytes::copy_from_slice(&v.to_be_bytes()))
}
fn bigint(v: i64) -> Value {
    Value::Set(Bytes::copy_from_slice(&v.to_be_bytes()))
}
fn text(v: &str) -> Value {
    Value::Set(Bytes::copy_from_slice(v.as_bytes()))
}
fn cint(b: &Option<Bytes>) -> i32 {
    i32::from_be_bytes(
        b.as_ref()
            .expect("non-null int")
            .as_ref()
            .try_into()
            .unwrap(),
    )
}
fn cbig(b: &Option<Bytes>) -> i64 {
    i64::from_be_bytes(
        b.as_ref()
            .expect("non-null bigint")
            .as_ref()
            .try_into()
            .unwrap(),
    )
}
fn ctext(b: &Option<Bytes>) -> String {
    String::from_utf8(b.as_ref().expect("non-null text").to_vec()).unwrap()
}

/// Decodes a Rows body into cells.
fn cells(rows: &Rows) -> Vec<Vec<Option<Bytes>>> {
    let n = rows.metadata.column_count;
    let mut out = Vec::new();
    let mut pos = 0;
    let b = &rows.body;
    for _ in 0..rows.row_count {
        let mut row = Vec::with_capacity(n);
        for _ in 0..n {
            let len = i32::from_be_bytes(b[pos..pos + 4].try_into().unwrap());
            pos += 4;
            if len < 0 {
                row.push(None);
            } else {
                row.push(Some(b.slice(pos..pos + len as usize)));
                pos += len as usize;
            }
        }
        out.push(row);
    }
    assert_eq!(pos, b.len(), "body fully consumed");
    out
}

fn names(rows: &Rows) -> Vec<String> {
    rows.metadata
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

impl H {
    fn new() -> H {
        H::with_info(node())
    }

    /// An engine over fresh storage, as the node `info` describes.
    fn with_info(info: NodeInfo) -> H {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(open_storage(dir.path()), info).unwrap();
        H {
            engine,
            session: Session::default(),
            dir,
            now: None,
        }
    }

    fn reopen(self) -> H {
        let H { engine, dir, .. } = self;
        engine.storage().close().unwrap();
        drop(engine);
        let engine = Engine::open(open_storage(dir.path()), node()).unwrap();
        H {
            engine,
            session: Session::default(),
            dir,
            now: None,
        }
    }

    fn ctx(&self) -> RequestContext {
        let mut c = RequestContext::now();
        if let Some(n) = self.now {
            c.now_micros = n;
        }
        c
    }

    async fn exec_params(
        &mut self,
        q: &str,
        params: QueryParameters,
    ) -> Result<ResultMessage, DetailedError> {
        let p = self.engine.prepare(self.session.keyspace.as_deref(), q)?;
        let ctx = self.ctx();
        self.engine
            .execute(&mut self.session, &p, &params, &ctx)
            .await
    }

    async fn exec(&mut self, q: &str, values: Vec<Value>) -> Result<ResultMessage, DetailedError> {
        self.exec_params(
            q,
            QueryParameters {
                values,
                ..QueryParameters::default()
            },
        )
        .await
    }

    async fn ok(&mut self, q: &str) -> ResultMessage {
        match self.exec(q, vec![]).await {
            Ok(r) => r,
            Err(e) => panic!("{q}: {e:?}"),
        }
    }

    async fn rows_of(&mut self, q: &str, values: Vec<Value>) -> Rows {
        match self.exec(q, values).await {
            Ok(ResultMessage::Rows(r)) => r,
            other => panic!("{q}: expected rows, got {other:?}"),
        }
    }

    async fn select(&mut self, q: &str, values: Vec<Value>) -> Vec<Vec<Option<Bytes>>> {
        cells(&self.rows_of(q, values).await)
    }

    async fn err(&mut self, q: &str, values: Vec<Value>) -> DetailedError {
        match self.exec(q, values).await {
            Err(e) => e,
            Ok(r) => panic!("{q}: expected an error, got {r:?}"),
        }
    }

    async fn setup_kv(&mut self) {
        self.ok("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
        self.ok("CREATE TABLE ks.t (pk int, ck int, v text, s int static, PRIMARY KEY (pk, ck))")
            .await;
    }
}

#[tokio::test]
async fn keyspace_ddl_results_errors_and_events() {
    let mut h = H::new();
    let mut events = h.engine.schema_events();
    let v0 = h.engine.schema_version();
    let r = h
        .ok("CREATE KEYSPACE ks WITH replication = {'class': 'NetworkTopologyStrategy', 'replication_factor': 3}")
        .await;
    match r {
        ResultMessage::SchemaChange(c) => {
            assert_eq!(c.change, SchemaChangeType::Created);
            assert_eq!(c.target, SchemaChangeTarget::Keyspace("ks".into()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        events.try_recv().unwrap().target,
        SchemaChangeTarget::Keyspace("ks".into())
    );
    assert_ne!(h.engine.schema_version(), v0);
    // IF NOT EXISTS on an existing keyspace: Void, no event.
    assert_eq!(
        h.ok("CREATE KEYSPACE IF NOT EXISTS ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await,
        ResultMessage::Void
    );
    assert!(events.try_recv().is_err());
    let e = h.err("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}", vec![]).await;
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert_eq!(e.already_exists, Some(("ks".into(), String::new())));
    // NTS replication_factor is expanded into our data center.
    let rows = h
        .select("SELECT keyspace_name, replication, durable_writes FROM system_schema.keyspaces WHERE keyspace_name = 'ks'", vec![])
        .await;
    assert_eq!(rows.len(), 1);
    let repl = crate::codec::split_map(rows[0][1].as_ref().unwrap()).unwrap();
    let repl: Vec<(String, String)> = repl
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        repl,
        vec![
            (
                "class".to_string(),
                "org.apache.cassandra.locator.NetworkTopologyStrategy".to_string()
            ),
            ("datacenter1".to_string(), "3".to_string())
        ]
    );
    assert_eq!(rows[0][2].as_deref(), Some(&[1u8][..]));
    let e = h
        .err(
            "CREATE KEYSPACE k2 WITH replication = {'class': 'Bogus'}",
            vec![],
        )
        .await;
    assert_eq!(e.code(), ErrorCode::ConfigError);
    let e = h.err("CREATE KEYSPACE system WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}", vec![]).await;
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    h.ok("ALTER KEYSPACE ks WITH durable_writes = false").await;
    h.ok("DROP KEYSPACE ks").await;
    assert_eq!(
        h.ok("DROP KEYSPACE IF EXISTS ks").await,
        ResultMessage::Void
    );
    assert_eq!(
        h.err("DROP KEYSPACE ks", vec![]).await.code(),
        ErrorCode::Invalid
    );
}

#[tokio::test]
async fn table_ddl_validation_and_system_schema() {
    let mut h = H::new();
    h.setup_kv().await;
    let e = h.err("CREATE TABLE ks.t (a int PRIMARY KEY)", vec![]).await;
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert_eq!(e.already_exists, Some(("ks".into(), "t".into())));
    assert_eq!(
        h.ok("CREATE TABLE IF NOT EXISTS ks.t (a int PRIMARY KEY)")
            .await,
        ResultMessage::Void
    );
    for (q, needle) in [
        ("CREATE TABLE ks.bad1 (a int, b counter, c int, PRIMARY KEY (a))", "mix counter"),
        ("CREATE TABLE ks.bad2 (a list<int> PRIMARY KEY)", "non-frozen collection"),
        ("CREATE TABLE ks.bad3 (a int PRIMARY KEY, s int static)", "Static columns"),
        ("CREATE TABLE nope.t (a int PRIMARY KEY)", "doesn't exist"),
        ("CREATE TABLE ks.bad4 (a int, b int, PRIMARY KEY (a, b)) WITH CLUSTERING ORDER BY (a DESC)", "CLUSTERING ORDER"),
    ] {
        let e = h.err(q, vec![]).await;
        assert_eq!(e.code(), ErrorCode::Invalid, "{q}");
        assert!(e.message.contains(needle), "{q}: {}", e.message);
    }
    let cols = h
        .select("SELECT column_name, kind, position, type, clustering_order FROM system_schema.columns WHERE keyspace_name = 'ks' AND table_name = 't'", vec![])
        .await;
    let got: Vec<(String, String, i32, String, String)> = cols
        .iter()
        .map(|r| {
            (
                ctext(&r[0]),
                ctext(&r[1]),
                cint(&r[2]),
                ctext(&r[3]),
                ctext(&r[4]),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "ck".into(),
                "clustering".into(),
                0,
                "int".into(),
                "asc".into()
            ),
            (
                "pk".into(),
                "partition_key".into(),
                0,
                "int".into(),
                "none".into()
            ),
            ("s".into(), "static".into(), -1, "int".into(), "none".into()),
            (
                "v".into(),
                "regular".into(),
                -1,
                "text".into(),
                "none".into()
            ),
        ]
    );
    let t = h.select("SELECT flags, default_time_to_live FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = 't'", vec![]).await;
    assert_eq!(t.len(), 1);
    assert_eq!(
        crate::codec::split_collection(t[0][0].as_ref().unwrap()).unwrap(),
        vec![Bytes::from_static(b"compound")]
    );
    // ALTER: add, drop (recorded), options.
    h.ok("ALTER TABLE ks.t ADD w bigint").await;
    h.ok("ALTER TABLE ks.t DROP v").await;
    h.ok("ALTER TABLE ks.t WITH default_time_to_live = 100 AND per_partition_rate_limit = {'max_writes_per_second': 10}").await;
    let t = h.engine.table("ks", "t").unwrap();
    assert!(t.column("w").is_some() && t.column("v").is_none());
    assert_eq!(t.options.default_time_to_live, 100);
    assert_eq!(
        t.options
            .per_partition_rate_limit
            .unwrap()
            .max_writes_per_second,
        Some(10)
    );
    let dropped = h.select("SELECT column_name, type FROM system_schema.dropped_columns WHERE keyspace_name = 'ks'", vec![]).await;
    assert_eq!(dropped.len(), 1);
    assert_eq!(ctext(&dropped[0][0]), "v");
    // The system keyspaces describe themselves.
    let local_cols = h
        .select("SELECT column_name FROM system_schema.columns WHERE keyspace_name = 'system' AND table_name = 'local'", vec![])
        .await;
    assert!(local_cols.len() >= 19);
    let ks = h
        .select("SELECT keyspace_name FROM system_schema.keyspaces", vec![])
        .await;
    let ks: Vec<String> = ks.iter().map(|r| ctext(&r[0])).collect();
    for want in [
        "ks",
        "system",
        "system_schema",
        "system_auth",
        "system_distributed",
        "system_traces",
    ] {
        assert!(ks.contains(&want.to_string()), "{want} in {ks:?}");
    }
    h.ok("DROP TABLE ks.t").await;
    assert!(h.engine.table("ks", "t").is_none());
    assert_eq!(
        h.err("SELECT * FROM ks.t", vec![]).await.code(),
        ErrorCode::Invalid
    );
}

/// Every query drivers send at connect (spec §3.3/§3.4) must work and have the right columns.
#[tokio::test]
async fn driver_connect_queries_succeed() {
    let mut h = H::new();
    h.setup_kv().await;
    let queries = [
        "SELECT * FROM system.peers",
        "SELECT * FROM system.peers_v2",
        "SELECT * FROM system.local WHERE key='local'",
        "SELECT host_id, cluster_name, data_center, rack, partitioner, release_version, schema_version FROM system.local WHERE key='local'",
        "SELECT rpc_address FROM system.local WHERE key='local'",
        "SELECT peer, host_id, rpc_address, schema_version FROM system.peers",
        "SELECT schema_version FROM system.local WHERE key='local'",
        "SELECT host_id, peer, peer_port, data_center, rack, native_address, native_port, release_version, schema_version FROM system.peers_v2",
        "SELECT peer, data_center, host_id, rack, release_version, rpc_address, schema_version, tokens FROM system.peers",
        "SELECT broadcast_address, cluster_name, data_center, host_id, listen_address, partitioner, rack, release_version, rpc_address, schema_version, tokens FROM system.local WHERE key='local'",
        "SELECT host_id, rpc_address, data_center, rack, tokens FROM system.peers",
        "SELECT host_id, rpc_address, data_center, rack, tokens, cluster_name FROM system.local WHERE key='local'",
        "SELECT keyspace_name, replication, durable_writes FROM system_schema.keyspaces",
        "SELECT keyspace_name, type_name, field_names, field_types FROM system_schema.types",
        "SELECT keyspace_name, table_name, column_name, kind, position, type FROM system_schema.columns",
        "SELECT keyspace_name, table_name FROM system_schema.tables",
        "SELECT keyspace_name, view_name, base_table_name FROM system_schema.views",
        "SELECT keyspace_name, table_name, partitioner FROM system_schema.scylla_tables",
        "SELECT keyspace_name, initial_tablets FROM system_schema.scylla_keyspaces",
        "SELECT host_id, data_center, rack, schema_version, rpc_address FROM system.peers",
        "SELECT * FROM system_schema.keyspaces",
        "SELECT * FROM system_schema.tables",
        "SELECT * FROM system_schema.columns",
        "SELECT * FROM system_schema.types",
        "SELECT * FROM system_schema.functions",
        "SELECT * FROM system_schema.aggregates",
        "SELECT * FROM system_schema.triggers",
        "SELECT * FROM system_schema.indexes",
        "SELECT * FROM system_schema.views",
        "SELECT * from system_virtual_schema.keyspaces",
        "SELECT * from system_virtual_schema.tables",
        "SELECT * from system_virtual_schema.columns",
        "SELECT * FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = 't'",
        "SELECT * FROM system_schema.functions WHERE keyspace_name = 'ks' AND function_name = 'f' AND argument_types = ['int']",
        "SELECT * FROM system.peers WHERE peer='127.0.0.2'",
        "SELECT cluster_name, release_version FROM system.local",
        "SELECT schema_version, host_id FROM system.local WHERE key='local'",
        "select * from system.local where key = 'local'",
        "SELECT * FROM system.local WHERE key='local' USING TIMEOUT 2000ms",
    ];
    for q in queries {
        if let Err(e) = h.exec(q, vec![]).await {
            panic!("{q}: {e:?}");
        }
    }
    // Bound forms used by gocql and the Rust driver.
    let list = Value::Set(crate::codec::text_list(&["ks", "system"]));
    let r = h
        .rows_of(
            "SELECT keyspace_name, table_name FROM system_schema.tables where keyspace_name in ?",
            vec![list],
        )
        .await;
    let ks: std::collections::BTreeSet<String> = cells(&r).iter().map(|r| ctext(&r[0])).collect();
    assert_eq!(
        ks.into_iter().collect::<Vec<_>>(),
        vec!["ks".to_string(), "system".to_string()]
    );
    let p = h
        .engine
        .prepare(
            None,
            "SELECT keyspace_name, table_name FROM system_schema.tables where keyspace_name in ?",
        )
        .unwrap();
    assert_eq!(p.bind_specs[0].name, "in(keyspace_name)");
    assert_eq!(p.bind_specs[0].ty.to_string(), "list<text>");
    let r = h
        .rows_of(
            "SELECT * FROM system_schema.columns WHERE keyspace_name = ?",
            vec![text("ks")],
        )
        .await;
    assert_eq!(r.row_count, 4);
    // system.local content.
    let r = h
        .rows_of("SELECT * FROM system.local WHERE key='local'", vec![])
        .await;
    let n = names(&r);
    let c = &cells(&r)[0];
    let get = |name: &str| c[n.iter().position(|x| x == name).unwrap()].clone();
    assert_eq!(ctext(&get("release_version")), "5.0.0");
    assert_eq!(ctext(&get("cql_version")), "3.4.7");
    assert_eq!(
        ctext(&get("partitioner")),
        "org.apache.cassandra.dht.Murmur3Partitioner"
    );
    assert_eq!(get("rpc_address").unwrap().as_ref(), &[127, 0, 0, 1]);
    assert_eq!(
        get("schema_version").unwrap().as_ref(),
        h.engine.schema_version().as_bytes()
    );
    assert_eq!(
        crate::codec::split_collection(&get("tokens").unwrap()).unwrap(),
        vec![Bytes::from_static(b"0")]
    );
    assert_eq!(
        r.metadata
            .columns
            .iter()
            .find(|c| c.name == "tokens")
            .unwrap()
            .ty
            .to_string(),
        "set<text>"
    );
    assert_eq!(
        cells(&h.rows_of("SELECT * FROM system.peers", vec![]).await).len(),
        0
    );
    // Unknown system table: Invalid.
    assert_eq!(
        h.err("SELECT * FROM system.nope", vec![]).await.code(),
        ErrorCode::Invalid
    );
    assert_eq!(
        h.err("SELECT nope FROM system.local", vec![]).await.code(),
        ErrorCode::Invalid
    );
}

#[tokio::test]
async fn system_table_paging() {
    let mut h = H::new();
    h.setup_kv().await;
    let q = "SELECT * FROM system_schema.columns";
    let all = h.select(q, vec![]).await;
    assert!(all.len() > 50);
    let mut got = Vec::new();
    let mut state = None;
    loop {
        let r = match h
            .exec_params(
                q,
                QueryParameters {
                    page_size: Some(7),
                    paging_state: state.clone(),
                    ..QueryParameters::default()
                },
            )
            .await
            .unwrap()
        {
            ResultMessage::Rows(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(r.row_count <= 7);
        got.extend(cells(&r));
        state = r.metadata.paging_state.clone();
        if state.is_none() {
            break;
        }
    }
    assert_eq!(got, all);
}

#[tokio::test]
async fn insert_select_and_prepared_metadata() {
    let mut h = H::new();
    h.setup_kv().await;
    let ins = "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?)";
    let p = h.engine.prepare(None, ins).unwrap();
    assert_eq!(p.pk_indexes, vec![0]);
    assert_eq!(
        p.bind_specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["pk", "ck", "v"]
    );
    assert_eq!(p.bind_specs[2].ty.to_string(), "text");
    assert_eq!(p.bind_specs[0].keyspace, "ks");
    assert!(p.result_columns.is_empty());
    // Deterministic ids: MD5(keyspace + query).
    let q2 = h.engine.prepare(None, ins).unwrap();
    assert_eq!(p.id, q2.id);
    assert_ne!(h.engine.prepare(Some("ks"), ins).unwrap().id, p.id);
    assert!(h.engine.prepared(&p.id).is_some());
    for pk in 0..3 {
        for ck in 0..5 {
            h.exec(ins, vec![int(pk), int(ck), text(&format!("v{pk}.{ck}"))])
                .await
                .unwrap();
        }
    }
    let sel = "SELECT ck, v FROM ks.t WHERE pk = ? AND ck >= ? AND ck < ?";
    let rows = h.select(sel, vec![int(1), int(1), int(4)]).await;
    assert_eq!(
        rows.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(ctext(&rows[0][1]), "v1.1");
    let rows = h
        .select(
            "SELECT ck FROM ks.t WHERE pk = 2 ORDER BY ck DESC LIMIT 2",
            vec![],
        )
        .await;
    assert_eq!(
        rows.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(),
        vec![4, 3]
    );
    let rows = h
        .select(
            "SELECT pk, ck FROM ks.t WHERE pk IN (2, 0) AND ck IN (3, 1)",
            vec![],
        )
        .await;
    assert_eq!(rows.len(), 4);
    let rows = h
        .select("SELECT ck FROM ks.t WHERE pk = 0 AND (ck) > (2)", vec![])
        .await;
    assert_eq!(
        rows.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(),
        vec![3, 4]
    );
    let p = h
        .engine
        .prepare(
            None,
            "SELECT pk, v AS value, writetime(v), token(pk) FROM ks.t WHERE pk = ? LIMIT ?",
        )
        .unwrap();
    assert_eq!(
        p.result_columns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["pk", "value", "writetime(v)", "system.token(pk)"]
    );
    assert_eq!(p.bind_specs[1].name, "[limit]");
    let r = h.select("SELECT count(*) FROM ks.t", vec![]).await;
    assert_eq!(cbig(&r[0][0]), 15);
    let r = h
        .select("SELECT count(*), max(ck) FROM ks.t WHERE pk = 1", vec![])
        .await;
    assert_eq!((cbig(&r[0][0]), cint(&r[0][1])), (5, 4));
    let r = h
        .select("SELECT pk, ck FROM ks.t PER PARTITION LIMIT 2", vec![])
        .await;
    assert_eq!(r.len(), 6);
    let r = h.select("SELECT DISTINCT pk FROM ks.t", vec![]).await;
    assert_eq!(r.len(), 3);
    // token() in the selection matches the Murmur3 token of the key.
    let r = h
        .select("SELECT token(pk) FROM ks.t WHERE pk = 1 LIMIT 1", vec![])
        .await;
    assert_eq!(
        cbig(&r[0][0]),
        sluice_types::murmur3_token(&1i32.to_be_bytes())
    );
    // Filtering needs ALLOW FILTERING.
    let e = h.err("SELECT * FROM ks.t WHERE v = 'v1.1'", vec![]).await;
    assert!(e.message.contains("ALLOW FILTERING"));
    let r = h
        .select(
            "SELECT pk, ck FROM ks.t WHERE v = 'v1.1' ALLOW FILTERING",
            vec![],
        )
        .await;
    assert_eq!(r.len(), 1);
    assert_eq!((cint(&r[0][0]), cint(&r[0][1])), (1, 1));
    // Errors with clear messages.
    let e = h
        .err("INSERT INTO ks.t (ck, v) VALUES (1, 'x')", vec![])
        .await;
    assert!(e.message.contains("partition key"), "{}", e.message);
    let e = h.err(ins, vec![text("abc"), int(1), text("x")]).await;
    assert_eq!(e.message, "Invalid value for column pk of type int");
    let e = h.err(ins, vec![int(1)]).await;
    assert!(e.message.contains("markers"));
}

#[tokio::test]
async fn update_delete_static_and_unset() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("INSERT INTO ks.t (pk, ck, v, s) VALUES (1, 1, 'a', 7)")
        .await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'b')")
        .await;
    // Unset leaves the column unchanged; null deletes it.
    h.exec(
        "UPDATE ks.t SET v = ? WHERE pk = ? AND ck = ?",
        vec![Value::Unset, int(1), int(1)],
    )
    .await
    .unwrap();
    let r = h
        .select("SELECT v, s FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await;
    assert_eq!(ctext(&r[0][0]), "a");
    assert_eq!(cint(&r[0][1]), 7);
    h.exec(
        "UPDATE ks.t SET v = ? WHERE pk = ? AND ck = ?",
        vec![Value::Null, int(1), int(1)],
    )
    .await
    .unwrap();
    let r = h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await;
    assert_eq!(r, vec![vec![None]], "row stays (INSERT marker), v is null");
    // Static column shared by the partition.
    h.ok("UPDATE ks.t SET s = 9 WHERE pk = 1").await;
    let r = h
        .select("SELECT ck, s FROM ks.t WHERE pk = 1", vec![])
        .await;
    assert_eq!(
        r.iter().map(|r| cint(&r[1])).collect::<Vec<_>>(),
        vec![9, 9]
    );
    // A partition with only a static row shows it once with null clustering.
    h.ok("UPDATE ks.t SET s = 3 WHERE pk = 5").await;
    let r = h
        .select("SELECT pk, ck, s FROM ks.t WHERE pk = 5", vec![])
        .await;
    assert_eq!(
        r,
        vec![vec![
            Some(Bytes::copy_from_slice(&5i32.to_be_bytes())),
            None,
            Some(Bytes::copy_from_slice(&3i32.to_be_bytes()))
        ]]
    );
    // Deletes: a column, a row, a range, a partition.
    h.ok("DELETE v FROM ks.t WHERE pk = 1 AND ck = 2").await;
    assert_eq!(
        h.select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 2", vec![])
            .await,
        vec![vec![None]]
    );
    for ck in 0..10 {
        h.exec(
            "INSERT INTO ks.t (pk, ck, v) VALUES (2, ?, 'x')",
            vec![int(ck)],
        )
        .await
        .unwrap();
    }
    h.ok("DELETE FROM ks.t WHERE pk = 2 AND ck = 0").await;
    h.ok("DELETE FROM ks.t WHERE pk = 2 AND ck > 6").await;
    h.ok("DELETE FROM ks.t WHERE pk = 2 AND ck >= 2 AND ck <= 3")
        .await;
    let r = h.select("SELECT ck FROM ks.t WHERE pk = 2", vec![]).await;
    assert_eq!(
        r.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(),
        vec![1, 4, 5, 6]
    );
    h.ok("DELETE FROM ks.t WHERE pk = 2").await;
    assert!(h
        .select("SELECT * FROM ks.t WHERE pk = 2", vec![])
        .await
        .is_empty());
    let e = h.err("UPDATE ks.t SET v = 'x' WHERE pk = 1", vec![]).await;
    assert!(e.message.contains("clustering"), "{}", e.message);
    let e = h
        .err("UPDATE ks.t SET pk = 1 WHERE pk = 1 AND ck = 1", vec![])
        .await;
    assert!(e.message.contains("PRIMARY KEY"), "{}", e.message);
}

#[tokio::test]
async fn last_write_wins_and_ttl() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'new') USING TIMESTAMP 2000")
        .await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'old') USING TIMESTAMP 1000")
        .await;
    let r = h
        .select(
            "SELECT v, writetime(v) FROM ks.t WHERE pk = 1 AND ck = 1",
            vec![],
        )
        .await;
    assert_eq!(ctext(&r[0][0]), "new");
    assert_eq!(cbig(&r[0][1]), 2000);
    // A deletion older than the write does not hide it; a newer one does.
    h.ok("DELETE FROM ks.t USING TIMESTAMP 1500 WHERE pk = 1 AND ck = 1")
        .await;
    assert_eq!(
        h.select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
            .await
            .len(),
        1
    );
    h.ok("DELETE FROM ks.t USING TIMESTAMP 2500 WHERE pk = 1 AND ck = 1")
        .await;
    assert!(h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await
        .is_empty());
    // Client default timestamp is used when the statement has none.
    let params = QueryParameters {
        values: vec![int(3)],
        default_timestamp: Some(777),
        ..QueryParameters::default()
    };
    h.exec_params("INSERT INTO ks.t (pk, ck, v) VALUES (?, 1, 'c')", params)
        .await
        .unwrap();
    let r = h
        .select("SELECT writetime(v) FROM ks.t WHERE pk = 3", vec![])
        .await;
    assert_eq!(cbig(&r[0][0]), 777);
    // TTL, with a controlled clock.
    let t0 = crate::now_micros();
    h.now = Some(t0);
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (4, 1, 'ttl') USING TTL 100")
        .await;
    let r = h
        .select("SELECT ttl(v) FROM ks.t WHERE pk = 4", vec![])
        .await;
    assert_eq!(cint(&r[0][0]), 100);
    h.now = Some(t0 + 50_000_000);
    let r = h
        .select("SELECT ttl(v) FROM ks.t WHERE pk = 4", vec![])
        .await;
    assert_eq!(cint(&r[0][0]), 50);
    h.now = Some(t0 + 101_000_000);
    assert!(h
        .select("SELECT v FROM ks.t WHERE pk = 4", vec![])
        .await
        .is_empty());
    // Table default TTL applies when USING TTL is absent.
    h.now = Some(t0);
    h.ok("ALTER TABLE ks.t WITH default_time_to_live = 10")
        .await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (6, 1, 'd')")
        .await;
    let r = h
        .select("SELECT ttl(v) FROM ks.t WHERE pk = 6", vec![])
        .await;
    assert_eq!(cint(&r[0][0]), 10);
    let e = h
        .err(
            "INSERT INTO ks.t (pk, ck, v) VALUES (7, 1, 'x') USING TTL ?",
            vec![int(-1)],
        )
        .await;
    assert!(e.message.contains("TTL"));
}

async fn page_through(
    h: &mut H,
    q: &str,
    values: Vec<Value>,
    page: i32,
) -> (Vec<Vec<Option<Bytes>>>, usize) {
    let mut got = Vec::new();
    let mut state: Option<Bytes> = None;
    let mut pages = 0;
    loop {
        let params = QueryParameters {
            values: values.clone(),
            page_size: Some(page),
            paging_state: state.clone(),
            ..QueryParameters::default()
        };
        let r = match h.exec_params(q, params).await.unwrap() {
            ResultMessage::Rows(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(r.row_count as i32 <= page);
        pages += 1;
        got.extend(cells(&r));
        state = r.metadata.paging_state.clone();
        if state.is_none() {
            return (got, pages);
        }
        assert!(pages < 10_000, "paging does not terminate");
    }
}

#[tokio::test]
async fn paging_through_ten_thousand_rows() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.kv (k int PRIMARY KEY, v int)").await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.kv (k, v) VALUES (?, ?)")
        .unwrap();
    let ctx = RequestContext::now();
    for k in 0..10_000 {
        let params = QueryParameters {
            values: vec![int(k), int(k * 2)],
            ..QueryParameters::default()
        };
        h.engine
            .execute(&mut h.session, &p, &params, &ctx)
            .await
            .unwrap();
    }
    for ck in 0..2500 {
        h.exec(
            "INSERT INTO ks.t (pk, ck, v) VALUES (1, ?, 'x')",
            vec![int(ck)],
        )
        .await
        .unwrap();
    }
    // Full scan of 10,000 single-row partitions.
    let (rows, pages) = page_through(&mut h, "SELECT k, v FROM ks.kv", vec![], 1000).await;
    assert_eq!(rows.len(), 10_000);
    assert!((10..=11).contains(&pages), "{pages} pages");
    let mut keys: Vec<i32> = rows.iter().map(|r| cint(&r[0])).collect();
    assert!(rows.iter().all(|r| cint(&r[1]) == cint(&r[0]) * 2));
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 10_000);
    // Unpaged: everything, never has-more.
    let r = h.rows_of("SELECT k FROM ks.kv", vec![]).await;
    assert_eq!(r.row_count, 10_000);
    assert!(r.metadata.paging_state.is_none());
    // One wide partition, in clustering order, and with LIMIT across pages.
    let (rows, _) = page_through(
        &mut h,
        "SELECT ck FROM ks.t WHERE pk = ?",
        vec![int(1)],
        300,
    )
    .await;
    assert_eq!(
        rows.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(),
        (0..2500).collect::<Vec<_>>()
    );
    let (rows, _) = page_through(
        &mut h,
        "SELECT ck FROM ks.t WHERE pk = 1 ORDER BY ck DESC LIMIT 1234",
        vec![],
        500,
    )
    .await;
    assert_eq!(rows.len(), 1234);
    assert_eq!(cint(&rows[0][0]), 2499);
    let (rows, _) = page_through(&mut h, "SELECT k FROM ks.kv LIMIT 2345", vec![], 1000).await;
    assert_eq!(rows.len(), 2345);
    // Token-range scans cover the ring without overlap.
    let (a, _) = page_through(
        &mut h,
        "SELECT k FROM ks.kv WHERE token(k) <= ?",
        vec![bigint(0)],
        999,
    )
    .await;
    let (b, _) = page_through(
        &mut h,
        "SELECT k FROM ks.kv WHERE token(k) > ?",
        vec![bigint(0)],
        999,
    )
    .await;
    assert_eq!(a.len() + b.len(), 10_000);
    // A foreign or tampered paging state is rejected.
    let r = match h
        .exec_params(
            "SELECT k FROM ks.kv",
            QueryParameters {
                page_size: Some(10),
                ..QueryParameters::default()
            },
        )
        .await
        .unwrap()
    {
        ResultMessage::Rows(r) => r,
        _ => unreachable!(),
    };
    let state = r.metadata.paging_state.unwrap();
    let e = h
        .exec_params(
            "SELECT v FROM ks.kv",
            QueryParameters {
                page_size: Some(10),
                paging_state: Some(state.clone()),
                ..QueryParameters::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
    let mut bad = state.to_vec();
    bad.truncate(bad.len() - 3);
    let e = h
        .exec_params(
            "SELECT k FROM ks.kv",
            QueryParameters {
                page_size: Some(10),
                paging_state: Some(Bytes::from(bad)),
                ..QueryParameters::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
}

#[tokio::test]
async fn deadline_passed_is_a_timeout_and_writes_nothing() {
    let mut h = H::new();
    h.setup_kv().await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'x')")
        .unwrap();
    let ctx = RequestContext {
        deadline: Some(std::time::Instant::now() - Duration::from_millis(1)),
        now_micros: crate::now_micros(),
        ack_barrier: None,
    };
    let e = h
        .engine
        .execute(&mut h.session, &p, &QueryParameters::default(), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::WriteTimeout);
    match e.error {
        DbError::WriteTimeout {
            received,
            block_for,
            write_type,
            ..
        } => {
            assert_eq!((received, block_for), (0, 1));
            assert_eq!(write_type, sluice_protocol::WriteType::Simple);
        }
        other => panic!("{other:?}"),
    }
    assert!(h
        .select("SELECT * FROM ks.t WHERE pk = 1", vec![])
        .await
        .is_empty());
    let p = h
        .engine
        .prepare(None, "SELECT * FROM ks.t WHERE pk = 1")
        .unwrap();
    let e = h
        .engine
        .execute(&mut h.session, &p, &QueryParameters::default(), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ReadTimeout);
    assert!(matches!(
        e.error,
        DbError::ReadTimeout {
            received: 0,
            block_for: 1,
            data_present: false,
            ..
        }
    ));
}

#[tokio::test]
async fn restart_keeps_schema_and_data() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'kept')")
        .await;
    h.ok("ALTER TABLE ks.t ADD extra int").await;
    let version = h.engine.schema_version();
    let id = h.engine.table("ks", "t").unwrap().id;
    let mut h = h.reopen();
    assert_eq!(h.engine.schema_version(), version);
    assert_eq!(h.engine.table("ks", "t").unwrap().id, id);
    let r = h
        .select("SELECT v, extra FROM ks.t WHERE pk = 1 AND ck = 2", vec![])
        .await;
    assert_eq!(ctext(&r[0][0]), "kept");
    assert_eq!(r[0][1], None);
}

/// The value of a `duration` of `nanos` nanoseconds.
fn duration_nanos(nanos: i64) -> Value {
    let mut d = Vec::new();
    sluice_types::value::encode_duration(
        sluice_types::datetime::Duration {
            months: 0,
            days: 0,
            nanos,
        },
        &mut d,
    );
    Value::Set(Bytes::from(d))
}

#[tokio::test]
async fn an_execute_head_routes_and_times_out_as_its_decoded_values() {
    use sluice_protocol::{ExecuteHead, FrameHeader, Opcode};
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.c (a int, b text, c int, v int, PRIMARY KEY ((a, b), c))")
        .await;
    h.ok("CREATE TABLE ks.s (k frozen<set<int>> PRIMARY KEY, v int)")
        .await;
    h.ok("CREATE TABLE ks.l (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 3}")
        .await;
    // A set serialized out of order with a duplicate: routing must see it canonical.
    let mut set = Vec::new();
    for v in [3i32, -1, 3] {
        set.extend_from_slice(&4i32.to_be_bytes());
        set.extend_from_slice(&v.to_be_bytes());
    }
    let mut set_value = 3i32.to_be_bytes().to_vec();
    set_value.extend_from_slice(&set[..]);
    let cases: Vec<(&str, Vec<Value>)> = vec![
        (
            "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?) USING TIMEOUT ?",
            vec![int(7), int(1), text("x"), duration_nanos(1)],
        ),
        (
            "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?) USING TIMEOUT ?",
            vec![int(7), int(1), Value::Null, Value::Null],
        ),
        (
            "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?) USING TIMEOUT ?",
            vec![int(7), int(1), Value::Unset, Value::Unset],
        ),
        (
            "SELECT * FROM ks.t WHERE pk = ? USING TIMEOUT ?",
            vec![int(9), Value::Set(Bytes::from_static(b"\xff"))],
        ),
        (
            "SELECT * FROM ks.c WHERE a = ? AND b = ? AND c = ?",
            vec![int(1), text("two"), int(3)],
        ),
        (
            "SELECT * FROM ks.t WHERE pk IN (?, ?)",
            vec![int(4), int(4)],
        ),
        ("SELECT * FROM ks.t WHERE pk = ?", vec![Value::Null]),
        (
            "INSERT INTO ks.s (k, v) VALUES (?, ?)",
            vec![Value::Set(Bytes::from(set_value)), int(1)],
        ),
        (
            "UPDATE ks.l SET v = ? WHERE k IN (?, ?)",
            vec![int(1), int(5), int(6)],
        ),
        ("UPDATE ks.l SET v = ? WHERE k = ?", vec![int(1), int(5)]),
    ];
    for (text, values) in cases {
        let p = h.engine.prepare(None, text).unwrap();
        let request = sluice_protocol::Request::Execute {
            id: Bytes::copy_from_slice(&p.id),
            params: QueryParameters {
                values: values.clone(),
                ..QueryParameters::default()
            },
        };
        let mut body = bytes::BytesMut::new();
        request.encode_body(&mut body);
        let body = body.freeze();
        let header = FrameHeader {
            version: 4,
            flags: 0,
            stream: 0,
            opcode: Opcode::Execute,
            length: body.len() as u32,
        };
        let mut head = ExecuteHead::new(&body);
        assert_eq!(head.read(&header).unwrap(), &p.id[..], "{text}");
        assert!(head.complete(), "{text}");
        let decoded = &values[..];
        let timeout = h.engine.timeout(&p, decoded);
        assert_eq!(h.engine.timeout(&p, &head), timeout, "{text}");
        let timeout = timeout.ok().flatten();
        assert_eq!(
            h.engine.route_with_timeout(&p, &head, timeout),
            h.engine.route_with_timeout(&p, decoded, timeout),
            "{text}"
        );
        assert_eq!(
            h.engine.limited_partitions(&p, &head),
            h.engine.limited_partitions(&p, decoded),
            "{text}"
        );
    }
    // The cases above reach each path: a bound timeout, the fallback binder, and limits.
    let p = h
        .engine
        .prepare(None, "UPDATE ks.l SET v = ? WHERE k IN (?, ?)")
        .unwrap();
    assert_eq!(
        h.engine
            .limited_partitions(&p, &[int(1), int(5), int(6)][..])
            .len(),
        2
    );
    let p = h
        .engine
        .prepare(None, "SELECT * FROM ks.t WHERE pk = ? USING TIMEOUT ?")
        .unwrap();
    assert_eq!(
        h.engine.timeout(&p, &[int(1), duration_nanos(5)][..]),
        Ok(Some(Duration::from_nanos(5)))
    );
}

#[tokio::test]
async fn use_keyspace_route_and_invalidation() {
    let mut h = H::new();
    h.setup_kv().await;
    assert_eq!(
        h.ok("USE ks").await,
        ResultMessage::SetKeyspace("ks".into())
    );
    assert_eq!(h.session.keyspace.as_deref(), Some("ks"));
    h.ok("INSERT INTO t (pk, ck, v) VALUES (1, 1, 'a')").await;
    let p = h
        .engine
        .prepare(Some("ks"), "SELECT * FROM t WHERE pk = ?")
        .unwrap();
    let route = h.engine.route(&p, &[int(42)]).unwrap();
    assert_eq!(route.kind, crate::OpKind::Read);
    assert_eq!(
        route.token,
        Some(sluice_types::murmur3_token(&42i32.to_be_bytes()))
    );
    assert_eq!(
        route.table,
        Some(*h.engine.table("ks", "t").unwrap().id.as_bytes())
    );
    let p2 = h
        .engine
        .prepare(Some("ks"), "SELECT * FROM t USING TIMEOUT 50ms")
        .unwrap();
    let r2 = h.engine.route(&p2, &[]).unwrap();
    assert_eq!(r2.kind, crate::OpKind::Range);
    assert_eq!(r2.timeout, Some(Duration::from_millis(50)));
    // ALTER invalidates statements of the table: EXECUTE must re-prepare.
    h.ok("ALTER TABLE t ADD w int").await;
    assert!(h.engine.prepared(&p.id).is_none());
    assert_eq!(h.err("USE nope", vec![]).await.code(), ErrorCode::Invalid);
}

#[tokio::test]
async fn gc_grace_seconds_is_validated_described_listed_and_handed_to_storage() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.g (k int PRIMARY KEY, v int)").await;
    assert_eq!(
        h.engine.table("ks", "g").unwrap().layout.gc_grace_seconds,
        864_000
    );
    h.ok("ALTER TABLE ks.g WITH gc_grace_seconds = 0").await;
    assert_eq!(
        h.engine.table("ks", "g").unwrap().layout.gc_grace_seconds,
        0
    );
    h.ok("CREATE TABLE ks.g2 (k int PRIMARY KEY) WITH gc_grace_seconds = 3600")
        .await;
    assert_eq!(
        h.engine.table("ks", "g2").unwrap().layout.gc_grace_seconds,
        3600
    );
    let t = h.select("SELECT gc_grace_seconds FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = 'g2'", vec![]).await;
    assert_eq!(cint(&t[0][0]), 3600);
    let stmt = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.g2", vec![]).await)[0][3]);
    assert!(stmt.contains("AND gc_grace_seconds = 3600"), "{stmt}");
    // As Cassandra: a ConfigurationException, and the table keeps its value.
    for bad in ["-1", "'x'", "1.5"] {
        let e = h
            .err(
                &format!("ALTER TABLE ks.g2 WITH gc_grace_seconds = {bad}"),
                vec![],
            )
            .await;
        assert_eq!(e.code(), ErrorCode::ConfigError, "{bad}");
    }
    let e = h
        .err(
            "CREATE TABLE ks.g3 (k int PRIMARY KEY) WITH gc_grace_seconds = -5",
            vec![],
        )
        .await;
    assert_eq!(e.code(), ErrorCode::ConfigError);
    assert!(h.engine.table("ks", "g3").is_none());
    assert_eq!(
        h.engine.table("ks", "g2").unwrap().options.gc_grace_seconds,
        3600
    );
}

#[tokio::test]
async fn describe_outputs_recreatable_cql() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.d (a int, b text, c int, PRIMARY KEY ((a, b), c)) WITH CLUSTERING ORDER BY (c DESC) AND comment = 'it''s'").await;
    let r = h.rows_of("DESCRIBE TABLE ks.d", vec![]).await;
    assert_eq!(
        names(&r),
        ["keyspace_name", "type", "name", "create_statement"]
    );
    let stmt = ctext(&cells(&r)[0][3]);
    assert!(stmt.starts_with("CREATE TABLE ks.d (\n    a int,\n    b text,\n    c int,\n    PRIMARY KEY ((a, b), c)\n) WITH CLUSTERING ORDER BY (c DESC)\n    AND additional_write_policy = '99p'"), "{stmt}");
    assert!(stmt.contains("AND comment = 'it''s'"), "{stmt}");
    assert!(stmt.ends_with("AND speculative_retry = '99p';"), "{stmt}");
    // The text recreates the same table.
    h.ok("DROP TABLE ks.d").await;
    h.ok(&stmt).await;
    let again = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.d", vec![]).await)[0][3]);
    assert_eq!(again, stmt);
    let r = h.rows_of("DESCRIBE KEYSPACE ks", vec![]).await;
    let c = cells(&r);
    assert_eq!(c.len(), 3);
    assert!(ctext(&c[0][3]).starts_with("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '1'}"));
    let r = h.rows_of("DESCRIBE KEYSPACES", vec![]).await;
    assert_eq!(names(&r), ["keyspace_name", "type", "name"]);
    assert!(cells(&r).iter().any(|row| ctext(&row[0]) == "ks"));
    let r = h.rows_of("DESCRIBE TABLES", vec![]).await;
    assert!(cells(&r).iter().any(|row| ctext(&row[2]) == "d"));
    let r = h.rows_of("DESCRIBE CLUSTER", vec![]).await;
    assert_eq!(names(&r), ["cluster", "partitioner", "snitch"]);
    let r = h
        .rows_of("DESCRIBE KEYSPACE ks WITH INTERNALS", vec![])
        .await;
    assert_eq!(r.row_count, 3);
    let r = h.rows_of("DESCRIBE SCHEMA", vec![]).await;
    assert_eq!(r.row_count, 3);
    let simple = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.t", vec![]).await)[0][3]);
    assert!(simple.contains("    s int static,\n"), "{simple}");
}

#[tokio::test]
async fn set_elements_and_map_keys_come_back_in_type_order() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.ord (k int PRIMARY KEY, s set<int>, m map<int, text>)")
        .await;
    h.ok("INSERT INTO ks.ord (k, s, m) VALUES (1, {1, -1, 0, -300}, {5: 'a', -5: 'b'})")
        .await;
    h.ok("UPDATE ks.ord SET s = s + {-2}, m[-7] = 'c' WHERE k = 1")
        .await;
    let r = h
        .select("SELECT s, m FROM ks.ord WHERE k = 1", vec![])
        .await;
    let set: Vec<i32> = crate::codec::split_collection(r[0][0].as_ref().unwrap())
        .unwrap()
        .iter()
        .map(|x| i32::from_be_bytes(x.as_ref().try_into().unwrap()))
        .collect();
    assert_eq!(set, vec![-300, -2, -1, 0, 1]);
    let keys: Vec<i32> = crate::codec::split_map(r[0][1].as_ref().unwrap())
        .unwrap()
        .iter()
        .map(|(k, _)| i32::from_be_bytes(k.as_ref().try_into().unwrap()))
        .collect();
    assert_eq!(keys, vec![-7, -5, 5]);
}

#[tokio::test]
async fn collections() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.c (k int PRIMARY KEY, l list<int>, s set<text>, m map<text, int>, f frozen<list<int>>)").await;
    h.ok("INSERT INTO ks.c (k, l, s, m, f) VALUES (1, [1, 2], {'b', 'a'}, {'x': 1}, [9, 8])")
        .await;
    h.ok("UPDATE ks.c SET l = l + [3], s = s + {'c'}, m['y'] = 2 WHERE k = 1")
        .await;
    h.ok("UPDATE ks.c SET l = [0] + l WHERE k = 1").await;
    let r = h
        .select("SELECT l, s, m, f FROM ks.c WHERE k = 1", vec![])
        .await;
    let ints = |b: &Option<Bytes>| -> Vec<i32> {
        crate::codec::split_collection(b.as_ref().unwrap())
            .unwrap()
            .iter()
            .map(|x| i32::from_be_bytes(x.as_ref().try_into().unwrap()))
            .collect()
    };
    let texts = |b: &Option<Bytes>| -> Vec<String> {
        crate::codec::split_collection(b.as_ref().unwrap())
            .unwrap()
            .iter()
            .map(|x| String::from_utf8(x.to_vec()).unwrap())
            .collect()
    };
    assert_eq!(ints(&r[0][0]), vec![0, 1, 2, 3]);
    assert_eq!(texts(&r[0][1]), vec!["a", "b", "c"]);
    assert_eq!(
        crate::codec::split_map(r[0][2].as_ref().unwrap())
            .unwrap()
            .len(),
        2
    );
    assert_eq!(ints(&r[0][3]), vec![9, 8]);
    // Element operations and removal.
    h.ok("UPDATE ks.c SET l[1] = 10, s = s - {'a'}, m = m - {'x'} WHERE k = 1")
        .await;
    h.ok("UPDATE ks.c SET l = l - [2] WHERE k = 1").await;
    h.ok("DELETE m['y'] FROM ks.c WHERE k = 1").await;
    let r = h
        .select("SELECT l, s, m FROM ks.c WHERE k = 1", vec![])
        .await;
    assert_eq!(ints(&r[0][0]), vec![0, 10, 3]);
    assert_eq!(texts(&r[0][1]), vec!["b", "c"]);
    assert_eq!(r[0][2], None, "empty map reads as null");
    // Overwrite replaces the whole collection.
    h.ok("UPDATE ks.c SET l = [7] WHERE k = 1").await;
    let r = h.select("SELECT l FROM ks.c WHERE k = 1", vec![]).await;
    assert_eq!(ints(&r[0][0]), vec![7]);
    let e = h.err("UPDATE ks.c SET l[5] = 1 WHERE k = 1", vec![]).await;
    assert!(e.message.contains("out of bound"));
}

#[tokio::test]
async fn counters() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.cnt (k int PRIMARY KEY, c counter, d counter)")
        .await;
    h.ok("UPDATE ks.cnt SET c = c + 5, d = d - 1 WHERE k = 1")
        .await;
    h.exec(
        "UPDATE ks.cnt SET c = c + ? WHERE k = ?",
        vec![bigint(3), int(1)],
    )
    .await
    .unwrap();
    let r = h
        .select("SELECT c, d FROM ks.cnt WHERE k = 1", vec![])
        .await;
    assert_eq!((cbig(&r[0][0]), cbig(&r[0][1])), (8, -1));
    assert!(h
        .err("UPDATE ks.cnt SET c = 1 WHERE k = 1", vec![])
        .await
        .message
        .contains("counter"));
    assert!(h
        .err("INSERT INTO ks.cnt (k, c) VALUES (1, 1)", vec![])
        .await
        .message
        .contains("counter"));
}

#[tokio::test]
async fn batches() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("BEGIN BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a'); INSERT INTO ks.t (pk, ck, v) VALUES (2, 1, 'b'); UPDATE ks.t SET v = 'c' WHERE pk = 1 AND ck = 2; APPLY BATCH").await;
    let r = h.select("SELECT pk, ck FROM ks.t", vec![]).await;
    assert_eq!(r.len(), 3);
    // A protocol BATCH with a prepared entry and a text entry.
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?)")
        .unwrap();
    let b = BatchRequest {
        batch_type: 1,
        entries: vec![
            BatchEntry {
                statement: BatchQuery::Prepared(Bytes::copy_from_slice(&p.id)),
                values: vec![int(3), int(1), text("p")],
            },
            BatchEntry {
                statement: BatchQuery::Text(Bytes::from_static(
                    b"DELETE FROM ks.t WHERE pk = ? AND ck = ?",
                )),
                values: vec![int(1), int(1)],
            },
        ],
        consistency: Consistency::One,
        serial_consistency: None,
        default_timestamp: None,
    };
    let ctx = RequestContext::now();
    assert_eq!(
        h.engine.batch(&mut h.session, &b, &ctx).await.unwrap(),
        ResultMessage::Void
    );
    let r = h.select("SELECT pk, ck FROM ks.t", vec![]).await;
    assert_eq!(r.len(), 3);
    assert_eq!(
        h.select("SELECT v FROM ks.t WHERE pk = 3 AND ck = 1", vec![])
            .await
            .len(),
        1
    );
    assert!(h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await
        .is_empty());
    // Unknown prepared id: Unprepared with that id.
    let b2 = BatchRequest {
        entries: vec![BatchEntry {
            statement: BatchQuery::Prepared(Bytes::from_static(&[7; 16])),
            values: vec![],
        }],
        ..b.clone()
    };
    let e = h.engine.batch(&mut h.session, &b2, &ctx).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unprepared);
    // Deadline passed: nothing applied.
    let late = RequestContext {
        deadline: Some(std::time::Instant::now() - Duration::from_millis(1)),
        now_micros: crate::now_micros(),
        ack_barrier: None,
    };
    let b3 = BatchRequest {
        entries: vec![BatchEntry {
            statement: BatchQuery::Prepared(Bytes::copy_from_slice(&p.id)),
            values: vec![int(9), int(9), text("late")],
        }],
        ..b
    };
    let e = h
        .engine
        .batch(&mut h.session, &b3, &late)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::WriteTimeout);
    assert!(h
        .select("SELECT v FROM ks.t WHERE pk = 9", vec![])
        .await
        .is_empty());
}

#[tokio::test]
async fn lightweight_transactions() {
    let mut h = H::new();
    h.setup_kv().await;
    let q = "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'first') IF NOT EXISTS";
    let p = h.engine.prepare(None, q).unwrap();
    assert!(p.lwt);
    assert_eq!(p.result_columns[0].name, "[applied]");
    let r = h.rows_of(q, vec![]).await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));
    let r = h
        .rows_of(
            "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'second') IF NOT EXISTS",
            vec![],
        )
        .await;
    let row = &cells(&r)[0];
    assert_eq!(row[0].as_deref(), Some(&[0u8][..]));
    let vi = names(&r).iter().position(|n| n == "v").unwrap();
    assert_eq!(ctext(&row[vi]), "first");
    let r = h
        .rows_of(
            "UPDATE ks.t SET v = 'third' WHERE pk = 1 AND ck = 1 IF v = 'first'",
            vec![],
        )
        .await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));
    let r = h
        .rows_of(
            "UPDATE ks.t SET v = 'fourth' WHERE pk = 1 AND ck = 1 IF v = 'first'",
            vec![],
        )
        .await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[0u8][..]));
    let r = h
        .rows_of("DELETE FROM ks.t WHERE pk = 1 AND ck = 1 IF EXISTS", vec![])
        .await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));
    assert!(h
        .select("SELECT * FROM ks.t WHERE pk = 1", vec![])
        .await
        .is_empty());
}

#[tokio::test]
async fn composite_keys_descending_order_and_multi_column_relations() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.w (a int, b text, c int, d int, v int, PRIMARY KEY ((a, b), c, d)) WITH CLUSTERING ORDER BY (c DESC, d ASC)").await;
    for c in 0..5 {
        for d in 0..3 {
            h.exec(
                "INSERT INTO ks.w (a, b, c, d, v) VALUES (1, 'x', ?, ?, ?)",
                vec![int(c), int(d), int(c * 10 + d)],
            )
            .await
            .unwrap();
        }
    }
    let pairs = |rows: Vec<Vec<Option<Bytes>>>| -> Vec<(i32, i32)> {
        rows.iter().map(|r| (cint(&r[0]), cint(&r[1]))).collect()
    };
    let r = h
        .select(
            "SELECT c, d FROM ks.w WHERE a = 1 AND b = 'x' AND c > 2",
            vec![],
        )
        .await;
    assert_eq!(
        pairs(r),
        vec![(4, 0), (4, 1), (4, 2), (3, 0), (3, 1), (3, 2)]
    );
    let r = h
        .select(
            "SELECT c, d FROM ks.w WHERE a = 1 AND b = 'x' AND c = 3 AND d >= 1",
            vec![],
        )
        .await;
    assert_eq!(pairs(r), vec![(3, 1), (3, 2)]);
    let r = h
        .select(
            "SELECT c, d FROM ks.w WHERE a = 1 AND b = 'x' AND c IN (1, 3) AND d = 0",
            vec![],
        )
        .await;
    assert_eq!(pairs(r), vec![(3, 0), (1, 0)]);
    let r = h
        .select(
            "SELECT c, d FROM ks.w WHERE a = 1 AND b = 'x' AND (c, d) IN ((1, 2), (4, 0))",
            vec![],
        )
        .await;
    assert_eq!(pairs(r), vec![(4, 0), (1, 2)]);
    let r = h
        .select(
            "SELECT c, d FROM ks.w WHERE a = 1 AND b = 'x' AND c >= 1 AND c < 3 ORDER BY c ASC",
            vec![],
        )
        .await;
    assert_eq!(
        pairs(r),
        vec![(1, 2), (1, 1), (1, 0), (2, 2), (2, 1), (2, 0)]
    );
    // pk_indexes follow partition-key order, whatever the WHERE order.
    let p = h
        .engine
        .prepare(
            None,
            "SELECT v FROM ks.w WHERE b = ? AND a = ? AND c = ? AND d = ?",
        )
        .unwrap();
    assert_eq!(p.pk_indexes, vec![1, 0]);
    let route = h
        .engine
        .route(&p, &[text("x"), int(1), int(1), int(1)])
        .unwrap();
    let key = sluice_types::routing_key(&[&1i32.to_be_bytes(), b"x"]);
    assert_eq!(route.token, Some(sluice_types::murmur3_token(&key)));
    let r = h
        .select(
            "SELECT v FROM ks.w WHERE b = ? AND a = ? AND c = ? AND d = ?",
            vec![text("x"), int(1), int(2), int(1)],
        )
        .await;
    assert_eq!(cint(&r[0][0]), 21);
    // Keys read back from a scan decode the composite key.
    let r = h.select("SELECT a, b FROM ks.w LIMIT 1", vec![]).await;
    assert_eq!((cint(&r[0][0]), ctext(&r[0][1])), (1, "x".to_string()));
    // IN on the partition key is not routable, and has no pk_indexes.
    let p = h
        .engine
        .prepare(None, "SELECT v FROM ks.w WHERE a IN ? AND b = ?")
        .unwrap();
    assert!(p.pk_indexes.is_empty());
    assert_eq!(p.bind_specs[0].name, "in(a)");
    let list = Value::Set(crate::codec::collection([
        &1i32.to_be_bytes()[..],
        &2i32.to_be_bytes()[..],
    ]));
    let r = h
        .select(
            "SELECT v FROM ks.w WHERE a IN ? AND b = ?",
            vec![list, text("x")],
        )
        .await;
    assert_eq!(r.len(), 15);
    let e = h.err("SELECT v FROM ks.w WHERE a = 1", vec![]).await;
    assert!(e.message.contains("ALLOW FILTERING"), "{}", e.message);
    let e = h
        .err(
            "SELECT v FROM ks.w WHERE a = 1 AND b = 'x' AND c > 1 ORDER BY d ASC",
            vec![],
        )
        .await;
    assert_eq!(e.code(), ErrorCode::Invalid);
}

#[tokio::test]
async fn named_values_and_filters() {
    let mut h = H::new();
    h.setup_kv().await;
    let params = QueryParameters {
        values: vec![text("named"), int(2), int(1)],
        names: Some(vec!["v".into(), "ck".into(), "pk".into()]),
        ..QueryParameters::default()
    };
    h.exec_params("INSERT INTO ks.t (pk, ck, v) VALUES (:pk, :ck, :v)", params)
        .await
        .unwrap();
    let r = h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 2", vec![])
        .await;
    assert_eq!(ctext(&r[0][0]), "named");
    h.ok("CREATE TABLE ks.tags (k int PRIMARY KEY, tags set<text>, attrs map<text, int>)")
        .await;
    h.ok("INSERT INTO ks.tags (k, tags, attrs) VALUES (1, {'red', 'big'}, {'w': 3})")
        .await;
    h.ok("INSERT INTO ks.tags (k, tags, attrs) VALUES (2, {'blue'}, {'h': 4})")
        .await;
    let r = h
        .select(
            "SELECT k FROM ks.tags WHERE tags CONTAINS 'red' ALLOW FILTERING",
            vec![],
        )
        .await;
    assert_eq!(r.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(), vec![1]);
    let r = h
        .select(
            "SELECT k FROM ks.tags WHERE attrs CONTAINS KEY 'h' ALLOW FILTERING",
            vec![],
        )
        .await;
    assert_eq!(r.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(), vec![2]);
    let r = h
        .select(
            "SELECT k FROM ks.tags WHERE k IN (1, 2) AND attrs CONTAINS 4 ALLOW FILTERING",
            vec![],
        )
        .await;
    assert_eq!(r.iter().map(|r| cint(&r[0])).collect::<Vec<_>>(), vec![2]);
}

#[tokio::test]
async fn scans_with_statics_per_partition_limit_and_distinct_page_correctly() {
    let mut h = H::new();
    h.setup_kv().await;
    for pk in 0..40 {
        h.exec("UPDATE ks.t SET s = ? WHERE pk = ?", vec![int(pk), int(pk)])
            .await
            .unwrap();
        if pk % 4 != 0 {
            for ck in 0..5 {
                h.exec(
                    "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, 'x')",
                    vec![int(pk), int(ck)],
                )
                .await
                .unwrap();
            }
        }
    }
    // 30 partitions with rows (2 each under the limit) and 10 static-only partitions.
    let expect = 30 * 2 + 10;
    let all = h
        .select("SELECT pk, ck, s FROM ks.t PER PARTITION LIMIT 2", vec![])
        .await;
    assert_eq!(all.len(), expect);
    for page in [1, 3, 7, 64] {
        let (rows, _) = page_through(
            &mut h,
            "SELECT pk, ck, s FROM ks.t PER PARTITION LIMIT 2",
            vec![],
            page,
        )
        .await;
        assert_eq!(rows, all, "page size {page}");
    }
    let (rows, _) = page_through(&mut h, "SELECT DISTINCT pk, s FROM ks.t", vec![], 9).await;
    assert_eq!(rows.len(), 40);
    assert!(rows.iter().all(|r| cint(&r[0]) == cint(&r[1])));
    let (rows, _) = page_through(
        &mut h,
        "SELECT pk, ck FROM ks.t WHERE ck = 3 ALLOW FILTERING",
        vec![],
        4,
    )
    .await;
    assert_eq!(rows.len(), 30);
    let (rows, _) = page_through(
        &mut h,
        "SELECT pk, ck FROM ks.t WHERE pk IN (1, 2, 3, 4) PER PARTITION LIMIT 3",
        vec![],
        2,
    )
    .await;
    assert_eq!(rows.len(), 3 + 3 + 3 + 1);
}

#[tokio::test]
async fn clustering_restrictions_on_static_only_statements_are_rejected() {
    let mut h = H::new();
    h.setup_kv().await;
    for (q, msg) in [
        (
            "UPDATE ks.t SET s = 1 WHERE pk = 1 AND ck = 1",
            "UPDATE statement modifies only static",
        ),
        (
            "DELETE s FROM ks.t WHERE pk = 1 AND ck = 1",
            "DELETE statement modifies only static",
        ),
        (
            "DELETE s FROM ks.t WHERE pk = 1 AND ck > 1",
            "DELETE statement modifies only static",
        ),
        (
            "SELECT s FROM ks.t WHERE pk = 1 AND ck = 1",
            "selecting only static",
        ),
        (
            "SELECT pk, s FROM ks.t WHERE pk = 1 AND ck > 1",
            "selecting only static",
        ),
        (
            "SELECT writetime(s) FROM ks.t WHERE pk = 1 AND ck = 1",
            "selecting only static",
        ),
        (
            "SELECT count(s) FROM ks.t WHERE pk = 1 AND ck = 1",
            "selecting only static",
        ),
        (
            "SELECT s FROM ks.t WHERE ck = 1 ALLOW FILTERING",
            "selecting only static",
        ),
    ] {
        let e = h.err(q, vec![]).await;
        assert!(e.message.contains(msg), "{q}: {}", e.message);
    }
    // Still accepted, as by Cassandra: no clustering restriction, a regular column or
    // count(*) in the selection, an INSERT naming the clustering key.
    h.ok("UPDATE ks.t SET s = 1 WHERE pk = 1").await;
    h.ok("INSERT INTO ks.t (pk, ck, s) VALUES (1, 1, 2)").await;
    h.ok("SELECT s, v FROM ks.t WHERE pk = 1 AND ck = 1").await;
    h.ok("SELECT count(*) FROM ks.t WHERE pk = 1 AND ck = 1")
        .await;
    h.ok("SELECT * FROM ks.t WHERE pk = 1 AND ck = 1").await;
    h.ok("DELETE s FROM ks.t WHERE pk = 1").await;
}

#[tokio::test]
async fn a_null_collection_overwrite_deletes_below_its_timestamp() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.c (k int PRIMARY KEY, s set<int>, l list<int>)")
        .await;
    h.ok("INSERT INTO ks.c (k, s, l) VALUES (1, {1, 2}, [3]) USING TIMESTAMP 10")
        .await;
    // Same timestamp: the elements survive (Cassandra deletes at ts-1 on overwrite).
    h.ok("INSERT INTO ks.c (k, s) VALUES (1, null) USING TIMESTAMP 10")
        .await;
    h.ok("UPDATE ks.c USING TIMESTAMP 10 SET l = null WHERE k = 1")
        .await;
    let rows = h.select("SELECT s, l FROM ks.c WHERE k = 1", vec![]).await;
    assert!(rows[0][0].is_some() && rows[0][1].is_some(), "{rows:?}");
    // A later null overwrite and a DELETE at the same timestamp remove them.
    h.ok("UPDATE ks.c USING TIMESTAMP 11 SET s = null WHERE k = 1")
        .await;
    h.ok("DELETE l FROM ks.c USING TIMESTAMP 10 WHERE k = 1")
        .await;
    let rows = h.select("SELECT s, l FROM ks.c WHERE k = 1", vec![]).await;
    assert!(rows[0][0].is_none() && rows[0][1].is_none(), "{rows:?}");
}

#[tokio::test]
async fn a_static_only_partition_after_a_page_boundary_is_not_skipped() {
    let mut h = H::new();
    h.setup_kv().await;
    // Partitions of one row each and static-only partitions: a page that ends on a partition's
    // last row resumes inside it, and the next partition may be static-only.
    // With a filter, a page ends after a row and the next partition of the storage page may be
    // static-only.
    for pk in 0..20 {
        if pk % 2 == 0 {
            h.exec(
                "INSERT INTO ks.t (pk, ck, v, s) VALUES (?, 1, 'x', ?)",
                vec![int(pk), int(pk)],
            )
            .await
            .unwrap();
        } else {
            h.exec("UPDATE ks.t SET s = ? WHERE pk = ?", vec![int(pk), int(pk)])
                .await
                .unwrap();
        }
    }
    for q in [
        "SELECT pk, ck, v FROM ks.t",
        "SELECT pk, ck, s FROM ks.t PER PARTITION LIMIT 3",
        "SELECT pk, ck, s FROM ks.t WHERE s < 100 ALLOW FILTERING",
    ] {
        let all = h.select(q, vec![]).await;
        assert_eq!(all.len(), 20, "{q}");
        for page in [1, 2, 3] {
            let (rows, _) = page_through(&mut h, q, vec![], page).await;
            assert_eq!(rows, all, "{q}, page size {page}");
        }
    }
}

#[tokio::test]
async fn aggregates() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.n (k int, c int, i int, d double, PRIMARY KEY (k, c))")
        .await;
    for c in 1..=4 {
        h.exec(
            "INSERT INTO ks.n (k, c, i, d) VALUES (1, ?, ?, ?)",
            vec![
                int(c),
                int(c * 10),
                Value::Set(Bytes::copy_from_slice(&(c as f64 / 2.0).to_be_bytes())),
            ],
        )
        .await
        .unwrap();
    }
    h.ok("INSERT INTO ks.n (k, c) VALUES (1, 5)").await;
    let r = h
        .rows_of(
            "SELECT sum(i), avg(i), sum(d), count(i), count(*), min(i) FROM ks.n WHERE k = 1",
            vec![],
        )
        .await;
    assert_eq!(
        names(&r),
        [
            "system.sum(i)",
            "system.avg(i)",
            "system.sum(d)",
            "system.count(i)",
            "count",
            "system.min(i)"
        ]
    );
    let row = &cells(&r)[0];
    assert_eq!(cint(&row[0]), 100);
    assert_eq!(cint(&row[1]), 25);
    assert_eq!(
        f64::from_be_bytes(row[2].as_ref().unwrap().as_ref().try_into().unwrap()),
        5.0
    );
    assert_eq!((cbig(&row[3]), cbig(&row[4]), cint(&row[5])), (4, 5, 10));
    assert!(h
        .err("SELECT sum(v) FROM ks.t", vec![])
        .await
        .message
        .contains("numeric"));
}

#[tokio::test]
async fn conditional_batches_apply_all_or_nothing() {
    let mut h = H::new();
    h.setup_kv().await;
    let q = "BEGIN BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a') IF NOT EXISTS; INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'b'); APPLY BATCH";
    let r = h.rows_of(q, vec![]).await;
    assert_eq!(r.row_count, 1);
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));
    assert_eq!(
        h.select("SELECT ck FROM ks.t WHERE pk = 1", vec![])
            .await
            .len(),
        2
    );
    // The condition fails now: nothing of the batch is written.
    let q2 = "BEGIN BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'x') IF NOT EXISTS; INSERT INTO ks.t (pk, ck, v) VALUES (1, 3, 'c'); APPLY BATCH";
    let r = h.rows_of(q2, vec![]).await;
    let row = &cells(&r)[0];
    assert_eq!(row[0].as_deref(), Some(&[0u8][..]));
    assert_eq!(
        h.select("SELECT ck FROM ks.t WHERE pk = 1", vec![])
            .await
            .len(),
        2
    );
    let e = h
        .err("BEGIN BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 9, 'a') IF NOT EXISTS; INSERT INTO ks.t (pk, ck, v) VALUES (2, 2, 'b'); APPLY BATCH", vec![])
        .await;
    assert!(e.message.contains("partitions"), "{}", e.message);
    // A protocol BATCH with a conditional prepared entry.
    let p = h
        .engine
        .prepare(
            None,
            "UPDATE ks.t SET v = ? WHERE pk = ? AND ck = ? IF v = ?",
        )
        .unwrap();
    let b = BatchRequest {
        batch_type: 0,
        entries: vec![BatchEntry {
            statement: BatchQuery::Prepared(Bytes::copy_from_slice(&p.id)),
            values: vec![text("new"), int(1), int(2), text("b")],
        }],
        consistency: Consistency::One,
        serial_consistency: Some(Consistency::Serial),
        default_timestamp: None,
    };
    match h
        .engine
        .batch(&mut h.session, &b, &RequestContext::now())
        .await
        .unwrap()
    {
        ResultMessage::Rows(r) => assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..])),
        other => panic!("{other:?}"),
    }
    let r = h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 2", vec![])
        .await;
    assert_eq!(ctext(&r[0][0]), "new");
}

#[tokio::test]
async fn shard_statement_cache_follows_schema_changes_and_evictions() {
    let mut h = H::new();
    h.setup_kv().await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?)")
        .unwrap();
    let mut shard = crate::ShardStatements::default();
    assert!(shard.prepared(&h.engine, &[0u8; 3]).is_none(), "short id");
    assert!(
        shard.prepared(&h.engine, &[7u8; 16]).is_none(),
        "unknown id"
    );
    let first = shard
        .prepared(&h.engine, &p.id)
        .expect("held by the engine");
    assert!(Arc::ptr_eq(&first, &p));
    assert_eq!(shard.len(), 1);
    let again = shard
        .prepared(&h.engine, &p.id)
        .expect("served by the shard");
    assert!(Arc::ptr_eq(&again, &p));
    // A schema change drops the statement from the engine: the shard must not serve it.
    h.ok("ALTER TABLE ks.t ADD w int").await;
    assert!(h.engine.prepared(&p.id).is_none(), "the engine dropped it");
    assert!(
        shard.prepared(&h.engine, &p.id).is_none(),
        "the shard forgot it"
    );
    assert!(shard.is_empty());
    // A statement the engine evicts is not served by the shard either.
    let cold = h
        .engine
        .prepare(None, "SELECT v FROM ks.t WHERE pk = ?")
        .unwrap();
    assert!(shard.prepared(&h.engine, &cold.id).is_some());
    for i in 0..=crate::STATEMENT_CACHE_CAPACITY {
        h.engine
            .prepare(None, &format!("SELECT v FROM ks.t WHERE pk = {i}"))
            .unwrap();
    }
    assert!(
        shard.prepared(&h.engine, &cold.id).is_none(),
        "evicted there"
    );
    assert!(
        h.engine.prepared(&cold.id).is_none(),
        "the engine evicted it"
    );
}

#[tokio::test]
async fn statement_cache_is_bounded_and_keeps_recent_statements() {
    let mut h = H::new();
    h.setup_kv().await;
    let hot = h
        .engine
        .prepare(None, "SELECT v FROM ks.t WHERE pk = ?")
        .unwrap();
    for i in 0..(crate::STATEMENT_CACHE_CAPACITY + 500) {
        h.engine
            .prepare(None, &format!("SELECT v FROM ks.t WHERE pk = {i}"))
            .unwrap();
        if i % 1000 == 0 {
            assert!(
                h.engine.prepared(&hot.id).is_some(),
                "hot statement evicted at {i}"
            );
        }
        assert!(h.engine.cached_statements() <= crate::STATEMENT_CACHE_CAPACITY);
    }
    assert!(h.engine.prepared(&hot.id).is_some());
    assert!(h.engine.cached_statements() >= crate::STATEMENT_CACHE_CAPACITY / 2);
}

#[tokio::test]
async fn extreme_values_do_not_panic() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.c2 (k int PRIMARY KEY, l list<int>)")
        .await;
    h.exec(
        "UPDATE ks.c2 USING TIMESTAMP ? SET l = [1] WHERE k = 1",
        vec![bigint(i64::MIN)],
    )
    .await
    .unwrap();
    let p = h
        .engine
        .prepare(None, "SELECT * FROM ks.t USING TIMEOUT ?")
        .unwrap();
    // A huge duration (2^31-1 days) saturates instead of overflowing.
    let mut d = Vec::new();
    sluice_types::value::encode_duration(
        sluice_types::datetime::Duration {
            months: 0,
            days: i32::MAX,
            nanos: i64::MAX,
        },
        &mut d,
    );
    let route = h.engine.route(&p, &[Value::Set(Bytes::from(d))]).unwrap();
    assert!(route.timeout.unwrap() > Duration::from_secs(1 << 33));
    // Random paging states and bound values are rejected, never panic.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for len in 0..64 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let params = QueryParameters {
            page_size: Some(5),
            paging_state: Some(Bytes::from(bytes.clone())),
            ..QueryParameters::default()
        };
        let _ = h.exec_params("SELECT * FROM ks.t", params).await;
        let _ = h
            .exec(
                "SELECT * FROM ks.t WHERE pk IN ?",
                vec![Value::Set(Bytes::from(bytes.clone()))],
            )
            .await;
        let _ = h
            .exec(
                "SELECT * FROM ks.t WHERE pk = 1 AND (ck) > ?",
                vec![Value::Set(Bytes::from(bytes))],
            )
            .await;
    }
}

#[tokio::test]
async fn in_with_order_by_merges_partitions() {
    let mut h = H::new();
    h.setup_kv().await;
    for (pk, ck) in [(1, 5), (1, 1), (2, 3), (2, 4), (3, 2)] {
        h.exec(
            "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, 'x')",
            vec![int(pk), int(ck)],
        )
        .await
        .unwrap();
    }
    let r = h
        .select(
            "SELECT pk, ck FROM ks.t WHERE pk IN (1, 2, 3) ORDER BY ck DESC LIMIT 4",
            vec![],
        )
        .await;
    assert_eq!(
        r.iter().map(|r| cint(&r[1])).collect::<Vec<_>>(),
        vec![5, 4, 3, 2]
    );
    let r = h
        .select(
            "SELECT pk, ck FROM ks.t WHERE pk IN (1, 2, 3) ORDER BY ck ASC",
            vec![],
        )
        .await;
    assert_eq!(
        r.iter().map(|r| cint(&r[1])).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    let params = QueryParameters {
        page_size: Some(10),
        ..QueryParameters::default()
    };
    let e = h
        .exec_params(
            "SELECT pk, ck FROM ks.t WHERE pk IN (1, 2) ORDER BY ck DESC",
            params,
        )
        .await
        .unwrap_err();
    assert!(e
        .message
        .contains("Cannot page queries with both ORDER BY and a IN"));
}

#[tokio::test]
async fn bind_markers_inside_collection_and_tuple_literals() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.cl (k int PRIMARY KEY, l list<int>, s frozen<set<int>>, m map<text, int>, t tuple<int, text>)").await;
    let p = h
        .engine
        .prepare(
            None,
            "INSERT INTO ks.cl (k, l, s, m, t) VALUES (?, [?, ?], {?, ?, 1}, {'a': ?}, (?, ?))",
        )
        .unwrap();
    assert_eq!(p.bind_specs.len(), 8);
    assert_eq!(p.bind_specs[1].ty.to_string(), "int");
    h.exec(
        "INSERT INTO ks.cl (k, l, s, m, t) VALUES (?, [?, ?], {?, ?, 1}, {'a': ?}, (?, ?))",
        vec![
            int(1),
            int(5),
            int(6),
            int(3),
            int(3),
            int(7),
            int(8),
            text("x"),
        ],
    )
    .await
    .unwrap();
    let r = h
        .select("SELECT l, s, m, t FROM ks.cl WHERE k = 1", vec![])
        .await;
    let ints = |b: &Option<Bytes>| -> Vec<i32> {
        crate::codec::split_collection(b.as_ref().unwrap())
            .unwrap()
            .iter()
            .map(|x| i32::from_be_bytes(x.as_ref().try_into().unwrap()))
            .collect()
    };
    assert_eq!(ints(&r[0][0]), vec![5, 6]);
    assert_eq!(
        ints(&r[0][1]),
        vec![1, 3],
        "frozen set sorted and deduplicated"
    );
    assert_eq!(
        crate::codec::split_map(r[0][2].as_ref().unwrap())
            .unwrap()
            .len(),
        1
    );
    let t = crate::codec::split_tuple(r[0][3].as_ref().unwrap(), 2).unwrap();
    assert_eq!(t[1].as_deref(), Some(&b"x"[..]));
}

#[tokio::test]
async fn filtering_scans_return_short_pages_instead_of_scanning_everything() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.kv (k int PRIMARY KEY, v int)").await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.kv (k, v) VALUES (?, ?)")
        .unwrap();
    let ctx = RequestContext::now();
    for k in 0..25_000 {
        let params = QueryParameters {
            values: vec![int(k), int(if k == 24_999 { 1 } else { 0 })],
            ..QueryParameters::default()
        };
        h.engine
            .execute(&mut h.session, &p, &params, &ctx)
            .await
            .unwrap();
    }
    let q = "SELECT k FROM ks.kv WHERE v = 1 ALLOW FILTERING";
    let params = QueryParameters {
        page_size: Some(100),
        ..QueryParameters::default()
    };
    let first = match h.exec_params(q, params).await.unwrap() {
        ResultMessage::Rows(r) => r,
        _ => unreachable!(),
    };
    // The first page stopped early (the match is not necessarily in it) but has more.
    assert!(first.metadata.paging_state.is_some());
    let (rows, pages) = page_through(&mut h, q, vec![], 100).await;
    assert_eq!(rows.len(), 1);
    assert!(pages >= 2);
    assert_eq!(
        h.select(q, vec![]).await.len(),
        1,
        "unpaged reads everything"
    );
}

#[tokio::test]
async fn insert_rejects_duplicate_columns() {
    let mut h = H::new();
    h.setup_kv().await;
    for q in [
        "INSERT INTO ks.t (pk, pk, ck) VALUES (1, 2, 3)",
        "INSERT INTO ks.t (pk, ck, ck) VALUES (1, 2, 3)",
        "INSERT INTO ks.t (pk, ck, v, v) VALUES (1, 2, 'a', 'b')",
    ] {
        let e = h.err(q, vec![]).await;
        assert!(
            e.message.contains("Multiple definitions"),
            "{q}: {}",
            e.message
        );
    }
}

#[tokio::test]
async fn server_timestamps_are_strictly_increasing() {
    let mut h = H::new();
    h.setup_kv().await;
    // Same "now" for every request: later writes must still win.
    h.now = Some(crate::now_micros());
    for i in 0..20 {
        h.exec(
            "UPDATE ks.t SET v = ? WHERE pk = 1 AND ck = 1",
            vec![text(&format!("{i:02}"))],
        )
        .await
        .unwrap();
        let r = h
            .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
            .await;
        assert_eq!(ctext(&r[0][0]), format!("{i:02}"));
    }
    let a = h.engine.write_timestamp(5);
    assert!(h.engine.write_timestamp(5) > a);
}

#[tokio::test]
async fn group_by_primary_key_prefix() {
    let mut h = H::new();
    h.setup_kv().await;
    for (pk, ck) in [(1, 1), (1, 2), (1, 3), (2, 1), (3, 5), (3, 6)] {
        h.exec(
            "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, 'x')",
            vec![int(pk), int(ck)],
        )
        .await
        .unwrap();
    }
    let r = h
        .select("SELECT pk, count(*), max(ck) FROM ks.t GROUP BY pk", vec![])
        .await;
    let mut got: Vec<(i32, i64, i32)> = r
        .iter()
        .map(|r| (cint(&r[0]), cbig(&r[1]), cint(&r[2])))
        .collect();
    got.sort();
    assert_eq!(got, vec![(1, 3, 3), (2, 1, 1), (3, 2, 6)]);
    let r = h
        .select(
            "SELECT pk, ck FROM ks.t WHERE pk = 1 GROUP BY pk, ck",
            vec![],
        )
        .await;
    assert_eq!(r.len(), 3);
    assert!(h
        .select(
            "SELECT pk, count(*) FROM ks.t WHERE pk = 9 GROUP BY pk",
            vec![]
        )
        .await
        .is_empty());
    assert_eq!(
        h.err("SELECT count(*) FROM ks.t GROUP BY ck", vec![])
            .await
            .code(),
        ErrorCode::Invalid
    );
}

#[tokio::test]
async fn group_by_limit_counts_groups_and_route_params_orders_named_values() {
    let mut h = H::new();
    h.setup_kv().await;
    for pk in 0..5 {
        for ck in 0..3 {
            h.exec(
                "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, 'x')",
                vec![int(pk), int(ck)],
            )
            .await
            .unwrap();
        }
    }
    let r = h
        .select("SELECT pk, count(*) FROM ks.t GROUP BY pk LIMIT 2", vec![])
        .await;
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|r| cbig(&r[1]) == 3));
    let p = h
        .engine
        .prepare(None, "SELECT v FROM ks.t WHERE pk = :p AND ck = :c")
        .unwrap();
    let params = QueryParameters {
        values: vec![int(2), int(7)],
        names: Some(vec!["c".into(), "p".into()]),
        ..QueryParameters::default()
    };
    let route = h.engine.route_params(&p, &params).unwrap();
    assert_eq!(
        route.token,
        Some(sluice_types::murmur3_token(&7i32.to_be_bytes()))
    );
}

#[tokio::test]
async fn select_json() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'x')")
        .await;
    let r = h
        .rows_of(
            "SELECT JSON pk, ck, v AS \"Value\" FROM ks.t WHERE pk = 1",
            vec![],
        )
        .await;
    assert_eq!(names(&r), ["[json]"]);
    assert_eq!(
        ctext(&cells(&r)[0][0]),
        r#"{"pk": 1, "ck": 2, "\"Value\"": "x"}"#
    );
    let p = h.engine.prepare(None, "SELECT JSON * FROM ks.t").unwrap();
    assert_eq!(p.result_columns.len(), 1);
    let r = h.select("SELECT JSON count(*) FROM ks.t", vec![]).await;
    assert_eq!(ctext(&r[0][0]), r#"{"count": 1}"#);
}

#[tokio::test]
async fn insert_json() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.j (k int PRIMARY KEY, \"Name\" text, u uuid, b blob, l list<int>, m map<int, text>, d double)").await;
    h.ok(r#"INSERT INTO ks.j JSON '{"k": 1, "\"Name\"": "Ann", "u": "123e4567-e89b-12d3-a456-426614174000", "b": "0xcafe", "l": [1, 2], "m": {"3": "c"}, "d": 1.5}'"#).await;
    let r = h
        .select("SELECT JSON * FROM ks.j WHERE k = 1", vec![])
        .await;
    assert_eq!(
        ctext(&r[0][0]),
        r#"{"k": 1, "\"Name\"": "Ann", "b": "0xcafe", "d": 1.5, "l": [1, 2], "m": {"3": "c"}, "u": "123e4567-e89b-12d3-a456-426614174000"}"#
    );
    // Omitted columns become null.
    h.ok(r#"INSERT INTO ks.j JSON '{"k": 1, "d": 2.0}'"#).await;
    let r = h
        .select("SELECT \"Name\", d FROM ks.j WHERE k = 1", vec![])
        .await;
    assert_eq!(r[0][0], None);
    assert!(h
        .err(r#"INSERT INTO ks.j JSON '{"k": 1, "zz": 2}'"#, vec![])
        .await
        .message
        .contains("unrecognized column"));
    assert!(
        h.err(r#"INSERT INTO ks.j JSON '{"k": "x"}'"#, vec![])
            .await
            .code()
            == ErrorCode::Invalid
    );
    assert!(h
        .err("INSERT INTO ks.j JSON 'nope'", vec![])
        .await
        .message
        .contains("JSON"));
}

#[tokio::test]
async fn system_views_settings_lists_the_node_settings_and_stays_out_of_the_schema() {
    let mut info = node();
    info.settings = vec![
        ("commitlog_sync_period".into(), "10000ms".into()),
        ("commitlog_sync".into(), "periodic".into()),
    ];
    let mut h = H::with_info(info);
    let r = h
        .select("SELECT name, value FROM system_views.settings", vec![])
        .await;
    let got: Vec<(String, String)> = r.iter().map(|r| (ctext(&r[0]), ctext(&r[1]))).collect();
    assert_eq!(
        got,
        vec![
            ("commitlog_sync".to_string(), "periodic".to_string()),
            ("commitlog_sync_period".to_string(), "10000ms".to_string()),
        ]
    );
    // A virtual keyspace: listed by the virtual schema, not by system_schema (as Cassandra).
    let ks = h
        .select("SELECT keyspace_name FROM system_schema.keyspaces", vec![])
        .await;
    assert!(ks.iter().all(|r| ctext(&r[0]) != "system_views"));
}

mod aggregates;
mod big_values;
mod canonical;
mod coordinator;

/// `system_views.token_replicas` answers the ring's replicas of a keyspace's token, by key.
#[tokio::test]
async fn token_replicas_are_served_by_key() {
    let mut h = H::new();
    h.ok("CREATE KEYSPACE rs WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        .await;
    h.ok("CREATE KEYSPACE rn WITH replication = {'class': 'NetworkTopologyStrategy', 'datacenter1': 2, 'dc9': 1}")
        .await;
    let q = "SELECT keyspace_name, token_value, replicas FROM system_views.token_replicas \
             WHERE keyspace_name = ? AND token_value = ?";
    let localhost = Bytes::from_static(&[0, 0, 0, 1, 0, 0, 0, 4, 127, 0, 0, 1]);
    for ks in ["rs", "rn", "system"] {
        for token in [i64::MIN, -1, 0, 1, i64::MAX] {
            let rows = h.select(q, vec![text(ks), bigint(token)]).await;
            assert_eq!(rows.len(), 1, "{ks} {token}");
            assert_eq!(ctext(&rows[0][0]), ks);
            assert_eq!(cbig(&rows[0][1]), token);
            assert_eq!(
                rows[0][2].as_ref(),
                Some(&localhost),
                "one node replicates all"
            );
        }
    }
    assert!(h.select(q, vec![text("nope"), bigint(1)]).await.is_empty());
    let both = h
        .select(
            "SELECT token_value FROM system_views.token_replicas \
             WHERE keyspace_name IN ('rs', 'rn') AND token_value IN (1, 2, 3)",
            vec![],
        )
        .await;
    assert_eq!(both.len(), 6);
    let e = h
        .err(
            "SELECT * FROM system_views.token_replicas WHERE keyspace_name = 'rs'",
            vec![],
        )
        .await;
    assert!(e.message.contains("read by key"), "{}", e.message);
}

#[tokio::test]
async fn lwt_past_its_deadline_is_a_cas_write_timeout_and_writes_nothing() {
    let mut h = H::new();
    h.setup_kv().await;
    let p = h
        .engine
        .prepare(
            None,
            "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'x') IF NOT EXISTS",
        )
        .unwrap();
    let ctx = RequestContext {
        deadline: Some(std::time::Instant::now() - Duration::from_millis(1)),
        now_micros: crate::now_micros(),
        ack_barrier: None,
    };
    let e = h
        .engine
        .execute(&mut h.session, &p, &QueryParameters::default(), &ctx)
        .await
        .unwrap_err();
    match e.error {
        DbError::WriteTimeout { write_type, .. } => {
            assert_eq!(write_type, sluice_protocol::WriteType::Cas)
        }
        other => panic!("{other:?}"),
    }
    assert!(h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await
        .is_empty());
}

#[tokio::test]
async fn lwt_write_is_ordered_after_a_newer_stored_write() {
    let mut h = H::new();
    h.setup_kv().await;
    // A plain write stamped an hour ahead: last-write-wins at the LWT's own clock would
    // keep it; the commit moves the LWT's write above it.
    let future = crate::now_micros() + 3_600_000_000;
    h.ok(&format!(
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'future') USING TIMESTAMP {future}"
    ))
    .await;
    let r = h
        .rows_of(
            "UPDATE ks.t SET v = 'lwt' WHERE pk = 1 AND ck = 1 IF v = 'future'",
            vec![],
        )
        .await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));
    let rows = h
        .select(
            "SELECT v, writetime(v) FROM ks.t WHERE pk = 1 AND ck = 1",
            vec![],
        )
        .await;
    assert_eq!(ctext(&rows[0][0]), "lwt");
    let written = cbig(&rows[0][1]);
    assert!(written > future, "{written} <= {future}");
    // A later server-stamped plain write is ordered after the LWT.
    h.ok("UPDATE ks.t SET v = 'after' WHERE pk = 1 AND ck = 1")
        .await;
    let rows = h
        .select("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", vec![])
        .await;
    assert_eq!(ctext(&rows[0][0]), "after");
}

#[tokio::test]
async fn serial_reads_see_the_applied_conditional_write() {
    let mut h = H::new();
    h.setup_kv().await;
    h.rows_of(
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'cas') IF NOT EXISTS",
        vec![],
    )
    .await;
    for consistency in [Consistency::Serial, Consistency::LocalSerial] {
        let params = QueryParameters {
            consistency,
            ..QueryParameters::default()
        };
        match h
            .exec_params("SELECT v FROM ks.t WHERE pk = 1 AND ck = 1", params)
            .await
        {
            Ok(ResultMessage::Rows(r)) => assert_eq!(ctext(&cells(&r)[0][0]), "cas"),
            other => panic!("{consistency:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn transactional_mode_full_orders_plain_writes_by_their_commit() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.tx_full (pk int PRIMARY KEY, v text) WITH transactional_mode = 'full'")
        .await;
    h.ok("CREATE TABLE ks.tx_off (pk int PRIMARY KEY, v text) WITH transactional_mode = 'off'")
        .await;
    // Two client-stamped writes, the first an hour ahead of the second.
    let now = crate::now_micros();
    for table in ["tx_full", "tx_off"] {
        for (v, ts) in [("ahead", now + 3_600_000_000), ("second", now)] {
            let params = QueryParameters {
                values: vec![text(v)],
                default_timestamp: Some(ts),
                ..QueryParameters::default()
            };
            h.exec_params(
                &format!("INSERT INTO ks.{table} (pk, v) VALUES (1, ?)"),
                params,
            )
            .await
            .unwrap();
        }
    }
    // 'full': the commit orders them; 'off': last-write-wins by their own timestamps.
    let full = h
        .select("SELECT v FROM ks.tx_full WHERE pk = 1", vec![])
        .await;
    assert_eq!(ctext(&full[0][0]), "second");
    let off = h
        .select("SELECT v FROM ks.tx_off WHERE pk = 1", vec![])
        .await;
    assert_eq!(ctext(&off[0][0]), "ahead");
    let described = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.tx_full", vec![]).await)[0][3]);
    assert!(
        described.contains("transactional_mode = 'full'"),
        "{described}"
    );
    let described = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.tx_off", vec![]).await)[0][3]);
    assert!(!described.contains("transactional_mode"), "{described}");
    // The option is part of the persisted schema.
    let mut h = h.reopen();
    let described = ctext(&cells(&h.rows_of("DESCRIBE TABLE ks.tx_full", vec![]).await)[0][3]);
    assert!(
        described.contains("transactional_mode = 'full'"),
        "{described}"
    );
    for bad in ["mixed_reads", "sometimes"] {
        let e = h
            .exec(
                &format!(
                    "CREATE TABLE ks.bad (pk int PRIMARY KEY) WITH transactional_mode = '{bad}'"
                ),
                vec![],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::ConfigError, "{bad}");
    }
}

/// A ring of this node (127.0.0.1, tokens -100 and 0), two normal peers and a joining one.
fn three_node_ring(me: &NodeInfo) -> Arc<sluice_ring::TokenMetadata> {
    let peer = |n: u8, tokens: &[i64], state| sluice_ring::Node {
        host_id: uuid::Uuid::from_u128(u128::from(n)),
        cql_address: ([127, 0, 0, n], 9042).into(),
        internode_address: ([127, 0, 0, n], 7000).into(),
        dc: "datacenter1".to_string(),
        rack: format!("rack{n}"),
        tokens: tokens.iter().map(|&t| sluice_ring::Token(t)).collect(),
        state,
    };
    let mut local = me.ring_node();
    local.tokens = vec![sluice_ring::Token(-100), sluice_ring::Token(0)];
    Arc::new(
        sluice_ring::TokenMetadata::new(vec![
            local,
            peer(2, &[100, -50], sluice_ring::NodeState::Normal),
            peer(3, &[200], sluice_ring::NodeState::Leaving),
            peer(4, &[300], sluice_ring::NodeState::Joining),
        ])
        .unwrap(),
    )
}

fn inet4(b: &Option<Bytes>) -> [u8; 4] {
    b.as_ref()
        .expect("non-null inet")
        .as_ref()
        .try_into()
        .unwrap()
}

fn text_set(b: &Option<Bytes>) -> Vec<String> {
    crate::codec::split_collection(b.as_ref().expect("non-null set"))
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.to_vec()).unwrap())
        .collect()
}

/// `system.peers` and `system.peers_v2` list every other node that serves its ranges, with
/// Cassandra's columns; `system.local` and `token_replicas` read the live ring.
#[tokio::test]
async fn peers_tables_describe_the_live_ring() {
    let mut h = H::new();
    assert!(h
        .select("SELECT * FROM system.peers", vec![])
        .await
        .is_empty());
    assert!(h
        .select("SELECT * FROM system.peers_v2", vec![])
        .await
        .is_empty());
    let ring = three_node_ring(h.engine.node());
    h.engine.set_ring(ring);
    let version = h.engine.schema_version();

    let r = h.rows_of("SELECT * FROM system.peers", vec![]).await;
    assert_eq!(
        names(&r),
        [
            "peer",
            "data_center",
            "host_id",
            "preferred_ip",
            "rack",
            "release_version",
            "rpc_address",
            "schema_version",
            "tokens"
        ]
    );
    let types: Vec<String> = r
        .metadata
        .columns
        .iter()
        .map(|c| c.ty.to_string())
        .collect();
    assert_eq!(
        types,
        [
            "inet",
            "text",
            "uuid",
            "inet",
            "text",
            "text",
            "inet",
            "uuid",
            "set<text>"
        ]
    );
    let mut rows = cells(&r);
    rows.sort_by_key(|row| inet4(&row[0]));
    assert_eq!(
        rows.len(),
        2,
        "the joining node and this node are not peers"
    );
    for (row, n) in rows.iter().zip([2u8, 3]) {
        assert_eq!(inet4(&row[0]), [127, 0, 0, n]);
        assert_eq!(ctext(&row[1]), "datacenter1");
        assert_eq!(
            row[2],
            Some(crate::codec::uuid(&uuid::Uuid::from_u128(n.into())))
        );
        assert_eq!(row[3], None, "preferred_ip");
        assert_eq!(ctext(&row[4]), format!("rack{n}"));
        assert_eq!(ctext(&row[5]), crate::RELEASE_VERSION);
        assert_eq!(inet4(&row[6]), [127, 0, 0, n]);
        assert_eq!(row[7], Some(crate::codec::uuid(&version)));
    }
    assert_eq!(
        text_set(&rows[0][8]),
        ["-50", "100"],
        "set<text> in byte order"
    );
    assert_eq!(text_set(&rows[1][8]), ["200"]);

    let r = h.rows_of("SELECT * FROM system.peers_v2", vec![]).await;
    assert_eq!(
        names(&r),
        [
            "peer",
            "peer_port",
            "data_center",
            "host_id",
            "native_address",
            "native_port",
            "preferred_ip",
            "preferred_port",
            "rack",
            "release_version",
            "schema_version",
            "tokens"
        ]
    );
    let mut rows = cells(&r);
    rows.sort_by_key(|row| inet4(&row[0]));
    assert_eq!(rows.len(), 2);
    let row = &rows[0];
    assert_eq!(inet4(&row[0]), [127, 0, 0, 2]);
    assert_eq!(cint(&row[1]), 7000, "peer_port: internode");
    assert_eq!(inet4(&row[4]), [127, 0, 0, 2], "native_address");
    assert_eq!(cint(&row[5]), 9042, "native_port");
    assert_eq!(
        (row[6].clone(), row[7].clone()),
        (None, None),
        "preferred_*"
    );
    assert_eq!(text_set(&row[11]), ["-50", "100"]);

    let one = h
        .select(
            "SELECT host_id FROM system.peers WHERE peer = '127.0.0.3'",
            vec![],
        )
        .await;
    assert_eq!(
        one,
        vec![vec![Some(crate::codec::uuid(&uuid::Uuid::from_u128(3)))]]
    );

    let local = h
        .select(
            "SELECT tokens FROM system.local WHERE key = 'local'",
            vec![],
        )
        .await;
    assert_eq!(
        text_set(&local[0][0]),
        ["-100", "0"],
        "this node's tokens in the ring"
    );

    h.ok("CREATE KEYSPACE r3 WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        .await;
    let replicas = h
        .select(
            "SELECT replicas FROM system_views.token_replicas \
             WHERE keyspace_name = 'r3' AND token_value = 1",
            vec![],
        )
        .await;
    let addresses: Vec<[u8; 4]> = crate::codec::split_collection(replicas[0][0].as_ref().unwrap())
        .unwrap()
        .into_iter()
        .map(|b| b.as_ref().try_into().unwrap())
        .collect();
    assert_eq!(
        addresses,
        [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 1]],
        "owner of 100, then 200, then -100 (the joining node owns nothing)"
    );

    // Back to a single node: the peers are gone again.
    h.engine
        .set_ring(Arc::new(h.engine.node().single_node_ring().unwrap()));
    assert!(h
        .select("SELECT * FROM system.peers", vec![])
        .await
        .is_empty());
}

/// Ring changes reach `node_events` subscribers once per change.
#[tokio::test]
async fn ring_changes_are_announced_once() {
    let h = H::new();
    let mut rx = h.engine.node_events();
    assert_eq!(h.engine.set_ring(three_node_ring(h.engine.node())), 2);
    assert_eq!(h.engine.set_ring(three_node_ring(h.engine.node())), 0);
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e);
    }
    use sluice_protocol::response::TopologyChange::NewNode;
    assert_eq!(
        seen,
        [
            crate::NodeEvent::Topology(NewNode(([127, 0, 0, 2], 9042).into())),
            crate::NodeEvent::Topology(NewNode(([127, 0, 0, 3], 9042).into())),
        ]
    );
}

/// `follow_ring` applies the ring it starts with and every one published after, and ends
/// when the publisher goes away.
#[tokio::test]
async fn follow_ring_applies_published_rings() {
    let h = H::new();
    let single = Arc::new(h.engine.node().single_node_ring().unwrap());
    let (tx, rx) = tokio::sync::watch::channel(three_node_ring(h.engine.node()));
    let task = tokio::spawn(crate::follow_ring(h.engine.clone(), rx));
    let wait_for = |nodes: usize| {
        let engine = h.engine.clone();
        async move {
            for _ in 0..200 {
                if engine.ring().nodes().len() == nodes {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("the ring never had {nodes} nodes");
        }
    };
    wait_for(4).await;
    tx.send(single).unwrap();
    wait_for(1).await;
    drop(tx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("follow_ring ends with its publisher")
        .unwrap();
}

#[tokio::test]
async fn create_table_takes_an_id_and_alter_refuses_one() {
    let mut h = H::new();
    h.setup_kv().await;
    let id = "5a1c395e-b41f-11e5-9f22-ba0be0483c18";
    h.ok(&format!(
        "CREATE TABLE ks.with_id (a int PRIMARY KEY, b text) WITH id = {id} AND comment = 'c'"
    ))
    .await;
    let t = h.engine.table("ks", "with_id").unwrap();
    assert_eq!(t.id.to_string(), id);
    assert_eq!(t.options.comment, "c");
    let rows = h
        .select(
            "SELECT id FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = 'with_id'",
            vec![],
        )
        .await;
    assert_eq!(
        rows[0][0].as_deref(),
        Some(&uuid::Uuid::parse_str(id).unwrap().as_bytes()[..])
    );
    // One id names one table.
    let e = h
        .err(
            &format!("CREATE TABLE ks.other (a int PRIMARY KEY) WITH id = {id}"),
            vec![],
        )
        .await;
    assert_eq!(e.code(), ErrorCode::Invalid);
    assert!(e.message.contains("already in use"), "{}", e.message);
    let e = h
        .err(
            "CREATE TABLE ks.bad (a int PRIMARY KEY) WITH id = 'not-a-uuid'",
            vec![],
        )
        .await;
    assert_eq!(e.code(), ErrorCode::ConfigError, "{}", e.message);
    let e = h
        .err(&format!("ALTER TABLE ks.with_id WITH id = {id}"), vec![])
        .await;
    assert_eq!(e.code(), ErrorCode::Invalid);
}

/// Runs `q` on its own task with its own session, at `consistency`, with `deadline`.
fn spawn_query(
    engine: &Arc<Engine>,
    q: &'static str,
    consistency: Consistency,
    deadline: Option<std::time::Instant>,
) -> tokio::task::JoinHandle<Result<ResultMessage, DetailedError>> {
    let engine = engine.clone();
    tokio::spawn(async move {
        let p = engine.prepare(None, q)?;
        let params = QueryParameters {
            consistency,
            ..QueryParameters::default()
        };
        let mut ctx = RequestContext::now();
        ctx.deadline = deadline;
        engine
            .execute(&mut Session::default(), &p, &params, &ctx)
            .await
    })
}

/// In `batch` durability, an answer that shows what a read saw (a SERIAL read, a
/// conditional write whose condition is false) waits until that is durable: it never
/// shows a write whose fsync has not finished, which a crash could still lose. A plain
/// read does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lwt_answers_never_show_a_write_before_it_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Batch,
        cache_bytes: 8 << 20,
        stores: 2,
    })
    .unwrap();
    let engine = Engine::open(storage.clone(), node()).unwrap();
    let mut h = H {
        engine: engine.clone(),
        session: Session::default(),
        dir,
        now: None,
    };
    h.setup_kv().await;
    h.rows_of(
        "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'first') IF NOT EXISTS",
        vec![],
    )
    .await;
    let hold = storage.hold_sync();
    let one = Consistency::One;
    let applied = spawn_query(
        &engine,
        "UPDATE ks.t SET v = 'second' WHERE pk = 1 AND ck = 1 IF v = 'first'",
        one,
        None,
    );
    // A plain read sees the applied (not yet durable) write at once, as before.
    let plain = "SELECT v FROM ks.t WHERE pk = 1 AND ck = 1";
    let mut seen = String::new();
    for _ in 0..200 {
        seen = ctext(&h.select(plain, vec![]).await[0][0]);
        if seen == "second" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, "second", "the conditional update applied");
    let refused = spawn_query(
        &engine,
        "UPDATE ks.t SET v = 'third' WHERE pk = 1 AND ck = 1 IF v = 'first'",
        one,
        None,
    );
    let serial = spawn_query(&engine, plain, Consistency::Serial, None);
    let soon = std::time::Instant::now() + Duration::from_millis(100);
    let serial_timed_out = spawn_query(&engine, plain, Consistency::LocalSerial, Some(soon));
    let refused_timed_out = spawn_query(
        &engine,
        "UPDATE ks.t SET v = 'third' WHERE pk = 1 AND ck = 1 IF v = 'first'",
        Consistency::Quorum,
        Some(soon),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (what, task) in [
        ("the applied update", &applied),
        ("the refused update", &refused),
        ("the SERIAL read", &serial),
    ] {
        assert!(!task.is_finished(), "{what} answered before the fsync");
    }
    // Past their deadline, the waits answer timeouts of their kind.
    match serial_timed_out.await.unwrap() {
        Err(e) => assert!(
            matches!(
                e.error,
                DbError::ReadTimeout {
                    consistency: Consistency::LocalSerial,
                    ..
                }
            ),
            "{e:?}"
        ),
        Ok(r) => panic!("expected a read timeout, got {r:?}"),
    }
    match refused_timed_out.await.unwrap() {
        Err(e) => assert!(
            matches!(
                e.error,
                DbError::WriteTimeout {
                    write_type: sluice_protocol::WriteType::Cas,
                    ..
                }
            ),
            "{e:?}"
        ),
        Ok(r) => panic!("expected a CAS write timeout, got {r:?}"),
    }
    drop(hold);
    let applied = applied.await.unwrap().unwrap();
    let ResultMessage::Rows(applied) = applied else {
        panic!("{applied:?}")
    };
    assert_eq!(cells(&applied)[0][0].as_deref(), Some(&[1u8][..]));
    let Ok(ResultMessage::Rows(refused)) = refused.await.unwrap() else {
        panic!("the refused update failed")
    };
    let row = &cells(&refused)[0];
    assert_eq!(row[0].as_deref(), Some(&[0u8][..]));
    let vi = names(&refused).iter().position(|n| n == "v").unwrap();
    assert_eq!(ctext(&row[vi]), "second");
    let Ok(ResultMessage::Rows(serial)) = serial.await.unwrap() else {
        panic!("the SERIAL read failed")
    };
    assert_eq!(ctext(&cells(&serial)[0][0]), "second");
}
