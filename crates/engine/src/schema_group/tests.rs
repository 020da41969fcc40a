//! DDL through an in-process stand-in for the metadata group: it keeps the documents and
//! the epoch, refuses stale bases, and has every attached engine install each accepted change,
//! as the cluster layer's state machine does.

use super::*;
use crate::{NodeInfo, RequestContext, Session};
use sluice_protocol::{QueryParameters, ResultMessage};
use sluice_storage::{Durability, Storage, StorageConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
struct GroupState {
    epoch: u64,
    documents: BTreeMap<String, String>,
    followers: Vec<Arc<Engine>>,
    /// A change another node gets in just before the next proposal.
    interloper: Option<Vec<DocumentEdit>>,
    unavailable: bool,
    stale_answers: usize,
}

impl GroupState {
    fn accept(&mut self, edits: &[DocumentEdit]) {
        for edit in edits {
            match &edit.value {
                Some(v) => self.documents.insert(edit.key.clone(), v.clone()),
                None => self.documents.remove(&edit.key),
            };
        }
        self.epoch += 1;
        for engine in &self.followers {
            engine.apply_group_edits(
                self.epoch,
                edits.iter().map(|e| (e.key.as_str(), e.value.as_deref())),
                self.documents.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
        }
    }
}

#[derive(Default, Clone)]
struct FakeGroup(Arc<Mutex<GroupState>>);

impl FakeGroup {
    fn attach(&self, engine: &Arc<Engine>) {
        let mut state = self.0.lock().unwrap();
        engine.install_group_schema(
            state.epoch,
            state
                .documents
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        state.followers.push(Arc::clone(engine));
        engine.set_schema_log(Arc::new(self.clone()));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.0.lock().unwrap()
    }
}

impl SchemaLog for FakeGroup {
    fn read_barrier(&self, _deadline: Instant) -> SchemaLogFuture<()> {
        let unavailable = self.state().unavailable;
        Box::pin(async move {
            if unavailable {
                Err(SchemaLogError::Unavailable("no metadata leader is known"))
            } else {
                Ok(())
            }
        })
    }

    fn commit(
        &self,
        base: u64,
        edits: Vec<DocumentEdit>,
        _deadline: Instant,
    ) -> SchemaLogFuture<CommitOutcome> {
        let mut state = self.state();
        if let Some(other) = state.interloper.take() {
            state.accept(&other);
        }
        let outcome = if base != state.epoch {
            state.stale_answers += 1;
            CommitOutcome::Stale
        } else {
            state.accept(&edits);
            CommitOutcome::Applied
        };
        Box::pin(async move { Ok(outcome) })
    }

    fn max_edit_bytes(&self) -> usize {
        4096
    }
}

fn open_engine(dir: &std::path::Path, last_octet: u8) -> Arc<Engine> {
    let storage = Storage::open(StorageConfig {
        path: dir.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 8 << 20,
        stores: 2,
    })
    .expect("storage opens");
    let node = NodeInfo::single(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last_octet)),
        9042,
        uuid::Uuid::from_u128(0x5000 + u128::from(last_octet)),
    );
    Engine::open(storage, node).unwrap()
}

async fn run(engine: &Engine, q: &str) -> Result<ResultMessage, DetailedError> {
    let mut session = Session::default();
    let p = engine.prepare(None, q)?;
    engine
        .execute(
            &mut session,
            &p,
            &QueryParameters::default(),
            &RequestContext::now(),
        )
        .await
}

async fn ok(engine: &Engine, q: &str) -> ResultMessage {
    match run(engine, q).await {
        Ok(r) => r,
        Err(e) => panic!("{q}: {e:?}"),
    }
}

async fn row_count(engine: &Engine, q: &str) -> u32 {
    match ok(engine, q).await {
        ResultMessage::Rows(rows) => rows.row_count,
        other => panic!("{q}: expected rows, got {other:?}"),
    }
}

const CREATE_KS: &str =
    "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}";
const CREATE_T: &str = "CREATE TABLE IF NOT EXISTS ks.t (pk int PRIMARY KEY, v text)";

#[tokio::test]
async fn ddl_on_one_node_is_installed_on_every_node_with_one_version_and_events() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open_engine(a_dir.path(), 1), open_engine(b_dir.path(), 2));
    let group = FakeGroup::default();
    group.attach(&a);
    group.attach(&b);
    assert_eq!(a.schema_version(), b.schema_version());
    let mut b_events = b.schema_events();

    let created = ok(&a, CREATE_KS).await;
    assert!(matches!(created, ResultMessage::SchemaChange(_)));
    ok(&a, CREATE_T).await;
    assert_eq!(group.state().epoch, 2);
    // The table is usable on the other node, with the same id and schema version.
    assert_eq!(a.schema_version(), b.schema_version());
    assert_eq!(
        a.table("ks", "t").unwrap().id,
        b.table("ks", "t").unwrap().id
    );
    ok(&b, "INSERT INTO ks.t (pk, v) VALUES (1, 'x')").await;
    assert_eq!(row_count(&b, "SELECT * FROM ks.t WHERE pk = 1").await, 1);
    // The other node announced both changes to its own connections.
    let first = b_events.try_recv().unwrap();
    assert_eq!(first.change, SchemaChangeType::Created);
    assert_eq!(first.target, SchemaChangeTarget::Keyspace("ks".into()));
    let second = b_events.try_recv().unwrap();
    assert_eq!(
        second.target,
        SchemaChangeTarget::Table("ks".into(), "t".into())
    );

    // Errors are the local path's: an existing keyspace, a table of a missing keyspace.
    let exists = run(&b, CREATE_KS).await.unwrap_err();
    assert_eq!(exists.error, DbError::AlreadyExists);
    let missing = run(&b, "CREATE TABLE nope.t (pk int PRIMARY KEY)")
        .await
        .unwrap_err();
    assert_eq!(missing.error, DbError::Invalid);
    // IF NOT EXISTS of an existing table proposes nothing.
    assert!(matches!(ok(&b, CREATE_T).await, ResultMessage::Void));
    assert_eq!(group.state().epoch, 2);

    // ALTER and DROP from the other node: both nodes follow, and the data goes on both.
    ok(&b, "ALTER TABLE ks.t ADD w int").await;
    assert!(a.table("ks", "t").unwrap().column("w").is_some());
    assert_eq!(a.schema_version(), b.schema_version());
    ok(&a, "DROP TABLE ks.t").await;
    assert!(a.table("ks", "t").is_none() && b.table("ks", "t").is_none());
    ok(&b, "DROP KEYSPACE ks").await;
    assert!(!a.schema().keyspaces.contains_key("ks"));
    assert_eq!(a.schema_version(), b.schema_version());
    assert_eq!(a.schema_version(), Schema::with_system().version);
    assert!(group.state().documents.is_empty());
}

#[tokio::test]
async fn a_stale_proposal_is_rebuilt_and_concurrent_creates_end_with_one_table() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open_engine(a_dir.path(), 1), open_engine(b_dir.path(), 2));
    let group = FakeGroup::default();
    group.attach(&a);
    group.attach(&b);
    ok(&a, CREATE_KS).await;

    // Node b builds the same table first (its own id); node a's proposal, built against the
    // epoch before, is refused as stale, rebuilt, and finds the table there.
    let base = b.schema();
    let (_, next) = crate::ddl::build(
        &b,
        Arc::clone(&base),
        None,
        &sluice_cql::parse(CREATE_T).unwrap().statement,
        crate::now_micros(),
    )
    .unwrap();
    let from_b = document_edits(&base, &next.unwrap());
    group.state().interloper = Some(from_b);
    let answer = ok(&a, CREATE_T).await;
    assert!(matches!(answer, ResultMessage::Void), "{answer:?}");
    assert_eq!(group.state().stale_answers, 1);
    // The keyspace and node b's table; node a's rebuilt statement proposed nothing.
    assert_eq!(group.state().epoch, 2);
    let (ta, tb) = (a.table("ks", "t").unwrap(), b.table("ks", "t").unwrap());
    assert_eq!(ta.id, tb.id);
    assert_eq!(a.schema_version(), b.schema_version());

    // Without IF NOT EXISTS the rebuilt statement answers AlreadyExists, as locally.
    let base = b.schema();
    let (_, next) = crate::ddl::build(
        &b,
        Arc::clone(&base),
        None,
        &sluice_cql::parse("CREATE TABLE ks.u (pk int PRIMARY KEY)")
            .unwrap()
            .statement,
        crate::now_micros(),
    )
    .unwrap();
    group.state().interloper = Some(document_edits(&base, &next.unwrap()));
    let error = run(&a, "CREATE TABLE ks.u (pk int PRIMARY KEY)")
        .await
        .unwrap_err();
    assert_eq!(error.error, DbError::AlreadyExists);
}

#[tokio::test]
async fn a_group_without_a_leader_answers_a_server_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = open_engine(dir.path(), 1);
    let group = FakeGroup::default();
    group.attach(&a);
    group.state().unavailable = true;
    let error = run(&a, CREATE_KS).await.unwrap_err();
    assert_eq!(error.error, DbError::ServerError);
    assert!(error.message.contains("no metadata leader"), "{error:?}");
    assert!(!a.schema().keyspaces.contains_key("ks"));
}

#[tokio::test]
async fn a_ddl_queued_behind_another_answers_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let a = open_engine(dir.path(), 1);
    let group = FakeGroup::default();
    group.attach(&a);
    // Another statement of this node holds the queue (as one waiting on the group would).
    let held = a.ddl_queue.lock().await;
    let p = a.prepare(None, CREATE_KS).unwrap();
    let mut ctx = RequestContext::now();
    ctx.deadline = Some(Instant::now() + Duration::from_millis(100));
    let started = Instant::now();
    let error = a
        .execute(
            &mut Session::default(),
            &p,
            &QueryParameters::default(),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(error.error, DbError::ServerError);
    assert!(error.message.contains("deadline"), "{error:?}");
    drop(held);
    assert_eq!(group.state().epoch, 0);
    ok(&a, CREATE_KS).await;
    assert_eq!(group.state().epoch, 1);
}

#[tokio::test]
async fn a_local_schema_is_proposed_as_the_first_one_and_reaches_a_new_node() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_engine(a_dir.path(), 1);
    // Built on the local path, as before the group existed: enough tables for several
    // proposals of the stand-in's 4 KiB.
    ok(&a, CREATE_KS).await;
    for i in 0..12 {
        ok(
            &a,
            &format!("CREATE TABLE ks.t{i} (pk int PRIMARY KEY, v text, w int, x bigint)"),
        )
        .await;
    }
    ok(&a, "INSERT INTO ks.t0 (pk, v) VALUES (1, 'kept')").await;
    let local_version = a.schema_version();

    let group = FakeGroup::default();
    group.attach(&a);
    // The group had nothing: the local schema stays until it is proposed.
    assert!(a.table("ks", "t11").is_some());
    let proposed = a
        .seed_schema_group(&group, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(proposed, 13);
    assert!(group.state().epoch > 1, "the seed took several proposals");
    assert_eq!(a.schema_version(), local_version);
    assert_eq!(a.schema().epoch, Some(group.state().epoch));
    // No data was dropped while the later proposals were on their way.
    assert_eq!(row_count(&a, "SELECT * FROM ks.t0 WHERE pk = 1").await, 1);

    let b = open_engine(b_dir.path(), 2);
    group.attach(&b);
    assert_eq!(b.schema_version(), local_version);
    assert_eq!(
        b.table("ks", "t7").unwrap().id,
        a.table("ks", "t7").unwrap().id
    );
    // A second seed has nothing to do.
    assert_eq!(
        a.seed_schema_group(&group, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_restart_installs_the_group_schema_over_its_stale_local_copy() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open_engine(a_dir.path(), 1), open_engine(b_dir.path(), 2));
    let group = FakeGroup::default();
    group.attach(&a);
    group.attach(&b);
    ok(&a, CREATE_KS).await;
    ok(&a, CREATE_T).await;
    ok(&b, "INSERT INTO ks.t (pk, v) VALUES (1, 'x')").await;
    // Node b goes away; the table is dropped and another made while it is down.
    b.storage().close().unwrap();
    drop(b);
    group.state().followers.retain(|e| Arc::ptr_eq(e, &a));
    ok(&a, "DROP TABLE ks.t").await;
    ok(&a, "CREATE TABLE ks.u (pk int PRIMARY KEY)").await;

    // Reopened, node b first has its local copy, then the group's schema replaces it.
    let b = open_engine(b_dir.path(), 2);
    assert!(b.table("ks", "t").is_some());
    assert_eq!(b.schema().epoch, None);
    group.attach(&b);
    assert!(b.table("ks", "t").is_none());
    assert!(b.table("ks", "u").is_some());
    assert_eq!(b.schema_version(), a.schema_version());
    assert_eq!(b.schema().epoch, a.schema().epoch);
    // Its copy of the dropped table's data went with it.
    let t_rows = run(&b, "SELECT * FROM ks.t").await.unwrap_err();
    assert_eq!(t_rows.error, DbError::Invalid);
}

#[test]
fn documents_round_trip_to_the_same_digest() {
    let dir = tempfile::tempdir().unwrap();
    let a = open_engine(dir.path(), 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        ok(&a, CREATE_KS).await;
        ok(
            &a,
            "CREATE TABLE ks.c (pk int, ck text, m map<text, int>, s int static, \
             PRIMARY KEY (pk, ck)) WITH CLUSTERING ORDER BY (ck DESC) AND comment = 'c' \
             AND gc_grace_seconds = 5",
        )
        .await;
        ok(&a, "ALTER TABLE ks.c DROP m").await;
    });
    let schema = a.schema();
    let documents = schema_documents(&schema);
    let mut rebuilt =
        schema_from_documents(documents.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    rebuilt.version = rebuilt.digest();
    assert_eq!(rebuilt.version, schema.version);
    assert_eq!(schema_documents(&rebuilt), documents);
    // Nothing differs, so nothing would be proposed.
    assert!(document_edits(&schema, &rebuilt).is_empty());
    // Unreadable documents are left out rather than failing the apply.
    let mut broken = rebuilt.clone();
    apply_document(&mut broken, "table/ks/x", Some("{not json"));
    apply_document(&mut broken, "keyspace/zz", Some("[]"));
    apply_document(&mut broken, "elsewhere", Some("{}"));
    assert_eq!(broken.digest(), rebuilt.version);
}
