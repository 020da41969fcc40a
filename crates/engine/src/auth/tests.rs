//! Roles, logins and grants through the real parser, engine and storage.

use super::*;
use crate::{Engine, NodeInfo, RequestContext, Session};
use bytes::Bytes;
use sluice_protocol::{DetailedError, QueryParameters, ResultMessage, Rows};
use sluice_storage::{Durability, Storage, StorageConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

fn open_storage(path: &std::path::Path) -> Storage {
    Storage::open(StorageConfig {
        path: path.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 8 << 20,
        stores: 1,
    })
    .expect("storage opens")
}

fn config() -> AuthConfig {
    AuthConfig {
        authenticator: AuthenticatorKind::Password,
        authorizer: AuthorizerKind::Cassandra,
        bcrypt_cost: MIN_BCRYPT_COST,
    }
}

fn open(dir: &std::path::Path, config: AuthConfig) -> Arc<Engine> {
    let node = NodeInfo::single(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        9042,
        uuid::Uuid::from_u128(7),
    );
    Engine::open_with_auth(open_storage(dir), node, config).expect("engine opens")
}

/// A connection: its session and its cache of permission decisions.
#[derive(Default)]
struct Conn {
    session: Session,
    permissions: PermissionCache,
}

async fn login(e: &Engine, user: &str, pw: &str) -> Conn {
    let u = e
        .auth()
        .login(user, pw.as_bytes())
        .await
        .unwrap_or_else(|err| panic!("{user} logs in: {err:?}"));
    Conn {
        session: Session {
            user: Some(u),
            ..Session::default()
        },
        permissions: PermissionCache::default(),
    }
}

impl Conn {
    fn check(&mut self, e: &Engine, p: &crate::Prepared) -> Result<(), Unauthorized> {
        e.check_access(self.session.user.as_ref(), &mut self.permissions, p)
    }
}

/// Prepares, checks permissions as the server does, and executes.
async fn run(e: &Engine, c: &mut Conn, q: &str) -> Result<ResultMessage, DetailedError> {
    let s = &mut c.session;
    let p = e.prepare(s.keyspace.as_deref(), q)?;
    e.check_access(s.user.as_ref(), &mut c.permissions, &p)
        .map_err(|u| u.to_detailed())?;
    e.execute(s, &p, &QueryParameters::default(), &RequestContext::now())
        .await
}

async fn ok(e: &Engine, s: &mut Conn, q: &str) -> ResultMessage {
    match run(e, s, q).await {
        Ok(r) => r,
        Err(err) => panic!("{q}: {err:?}"),
    }
}

async fn denied(e: &Engine, s: &mut Conn, q: &str) -> String {
    match run(e, s, q).await {
        Err(err) if err.code() == ErrorCode::Unauthorized => err.message.into_owned(),
        other => panic!("{q}: expected Unauthorized, got {other:?}"),
    }
}

async fn invalid(e: &Engine, s: &mut Conn, q: &str) -> String {
    match run(e, s, q).await {
        Err(err) if err.code() == ErrorCode::Invalid => err.message.into_owned(),
        other => panic!("{q}: expected Invalid, got {other:?}"),
    }
}

fn cells(rows: &Rows) -> Vec<Vec<Option<Bytes>>> {
    let n = rows.metadata.column_count;
    let b = &rows.body;
    let mut pos = 0;
    let mut out = Vec::new();
    for _ in 0..rows.row_count {
        let mut row = Vec::new();
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
    out
}

/// The first column of every row, as text.
fn first_column(r: &ResultMessage) -> Vec<String> {
    let ResultMessage::Rows(rows) = r else {
        panic!("not rows: {r:?}");
    };
    cells(rows)
        .iter()
        .map(|row| String::from_utf8(row[0].clone().unwrap().to_vec()).unwrap())
        .collect()
}

fn all_columns_text(r: &ResultMessage) -> Vec<Vec<String>> {
    let ResultMessage::Rows(rows) = r else {
        panic!("not rows: {r:?}");
    };
    cells(rows)
        .iter()
        .map(|row| {
            row.iter()
                .map(|c| String::from_utf8_lossy(c.as_deref().unwrap_or(b"")).into_owned())
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn default_superuser_logs_in_and_wrong_passwords_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    assert!(e.auth().default_password_in_use());
    assert!(e.auth().login("cassandra", b"cassandra").await.is_ok());
    let err = e.auth().login("cassandra", b"wrong").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::BadCredentials);
    assert_eq!(err.message, BAD_CREDENTIALS);
    // An unknown user gets the same answer, so roles cannot be discovered.
    assert_eq!(
        e.auth().login("nobody", b"cassandra").await.unwrap_err(),
        err
    );
}

#[tokio::test]
async fn a_verified_login_is_remembered_briefly_and_forgotten_on_a_role_change() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let auth = e.auth();
    let checks = auth.password_checks();
    let mut su = login(&e, DEFAULT_SUPERUSER, DEFAULT_SUPERUSER_PASSWORD).await;
    assert_eq!(
        auth.password_checks(),
        checks + 1,
        "the first login is hashed"
    );
    // A pool's further connections: remembered, no second hash.
    login(&e, DEFAULT_SUPERUSER, DEFAULT_SUPERUSER_PASSWORD).await;
    assert_eq!(
        auth.password_checks(),
        checks + 1,
        "a repeated login is remembered"
    );
    // A wrong password is never answered from the cache: it is hashed and refused.
    let wrong = auth.login(DEFAULT_SUPERUSER, b"nope").await;
    assert_eq!(wrong.unwrap_err().code, ErrorCode::BadCredentials);
    assert_eq!(auth.password_checks(), checks + 2);
    // A password change forgets what was remembered: the old password is refused.
    ok(
        &e,
        &mut su,
        "ALTER ROLE cassandra WITH PASSWORD = 'changed'",
    )
    .await;
    let old = auth
        .login(DEFAULT_SUPERUSER, DEFAULT_SUPERUSER_PASSWORD.as_bytes())
        .await;
    assert_eq!(old.unwrap_err().code, ErrorCode::BadCredentials);
    login(&e, DEFAULT_SUPERUSER, "changed").await;
}

#[tokio::test]
async fn allow_all_creates_no_roles_and_refuses_role_statements() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(
        dir.path(),
        AuthConfig {
            bcrypt_cost: MIN_BCRYPT_COST,
            ..AuthConfig::default()
        },
    );
    assert!(e.auth().data().roles.is_empty());
    let mut anon = Conn::default();
    let msg = denied(&e, &mut anon, "CREATE ROLE r").await;
    assert_eq!(
        msg,
        "You have to be logged in and not anonymous to perform this request"
    );
    // Without the authorizer, data statements are never checked.
    ok(&e, &mut anon, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
}

#[tokio::test]
async fn roles_persist_and_superuser_password_change_refuses_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = open(dir.path(), config());
        let mut su = login(&e, "cassandra", "cassandra").await;
        ok(
            &e,
            &mut su,
            "CREATE ROLE alice WITH PASSWORD = 'a1' AND LOGIN = true",
        )
        .await;
        ok(&e, &mut su, "CREATE USER bob WITH PASSWORD 'b1'").await;
        ok(&e, &mut su, "ALTER ROLE cassandra WITH PASSWORD = 'n3w'").await;
        assert!(!e.auth().default_password_in_use());
        e.storage().close().unwrap();
    }
    let e = open(dir.path(), config());
    assert!(!e.auth().default_password_in_use());
    assert_eq!(
        e.auth()
            .login("cassandra", b"cassandra")
            .await
            .unwrap_err()
            .code,
        ErrorCode::BadCredentials
    );
    let mut su = login(&e, "cassandra", "n3w").await;
    login(&e, "alice", "a1").await;
    login(&e, "bob", "b1").await;
    let listed = first_column(&ok(&e, &mut su, "LIST ROLES").await);
    assert_eq!(listed, vec!["alice", "bob", "cassandra"]);
    let users = first_column(&ok(&e, &mut su, "LIST USERS").await);
    assert_eq!(users, vec!["alice", "bob", "cassandra"]);
    // system_auth tables change only through the role statements.
    let err = run(
        &e,
        &mut su,
        "INSERT INTO system_auth.roles (role, is_superuser) VALUES ('x', true)",
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err.code(), ErrorCode::Unauthorized | ErrorCode::Invalid),
        "{err:?}"
    );
    assert!(!e.auth().data().roles.contains_key("x"));
    // system_auth.roles is readable like other system tables.
    let rows = ok(
        &e,
        &mut su,
        "SELECT role, can_login, is_superuser FROM system_auth.roles",
    )
    .await;
    assert_eq!(first_column(&rows), vec!["alice", "bob", "cassandra"]);
}

#[tokio::test]
async fn roles_without_login_cannot_log_in() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(&e, &mut su, "CREATE ROLE svc WITH PASSWORD = 'p'").await;
    let err = e.auth().login("svc", b"p").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::BadCredentials);
    assert_eq!(err.message, "This role is not permitted to log in");
    ok(&e, &mut su, "ALTER ROLE svc WITH LOGIN = true").await;
    login(&e, "svc", "p").await;
}

#[tokio::test]
async fn statements_are_denied_then_allowed_by_grant() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(
        &e,
        &mut su,
        "CREATE ROLE app WITH PASSWORD = 'p' AND LOGIN = true",
    )
    .await;
    let mut app = login(&e, "app", "p").await;
    let ks = "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}";
    assert_eq!(
        denied(&e, &mut app, ks).await,
        "User app has no CREATE permission on <all keyspaces> or any of its parents"
    );
    ok(&e, &mut su, ks).await;
    ok(&e, &mut su, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").await;
    let cases: [(&str, &str, &str); 6] = [
        (
            "INSERT INTO ks.t (k, v) VALUES (1, 1)",
            "MODIFY",
            "GRANT MODIFY ON TABLE ks.t TO app",
        ),
        (
            "SELECT * FROM ks.t",
            "SELECT",
            "GRANT SELECT ON KEYSPACE ks TO app",
        ),
        ("TRUNCATE ks.t", "MODIFY", ""),
        (
            "ALTER TABLE ks.t ADD w int",
            "ALTER",
            "GRANT ALTER ON ks.t TO app",
        ),
        (
            "CREATE TABLE ks.u (k int PRIMARY KEY)",
            "CREATE",
            "GRANT CREATE ON KEYSPACE ks TO app",
        ),
        (
            "DROP TABLE ks.t",
            "DROP",
            "GRANT DROP ON ALL KEYSPACES TO app",
        ),
    ];
    for (stmt, perm, grant) in cases {
        if grant.is_empty() {
            // Already allowed by an earlier grant.
            ok(&e, &mut app, stmt).await;
            continue;
        }
        let msg = denied(&e, &mut app, stmt).await;
        assert!(
            msg.starts_with(&format!("User app has no {perm} permission on <")),
            "{msg}"
        );
        ok(&e, &mut su, grant).await;
        ok(&e, &mut app, stmt).await;
    }
    // The creator of ks.u got every permission on it.
    ok(&e, &mut app, "INSERT INTO ks.u (k) VALUES (1)").await;
    // Dropping the keyspace takes its grants along.
    ok(&e, &mut app, "DROP KEYSPACE ks").await;
    assert!(!e
        .auth()
        .data()
        .permissions
        .values()
        .any(|g| g.keys().any(|k| k.starts_with("data/ks"))));
}

#[tokio::test]
async fn read_only_role_and_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(&e, &mut su, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    ok(&e, &mut su, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").await;
    ok(&e, &mut su, "INSERT INTO ks.t (k, v) VALUES (1, 1)").await;
    ok(
        &e,
        &mut su,
        "CREATE ROLE reader WITH PASSWORD = 'r' AND LOGIN = true",
    )
    .await;
    ok(&e, &mut su, "GRANT SELECT ON ks.t TO reader").await;
    let mut r = login(&e, "reader", "r").await;
    ok(&e, &mut r, "SELECT * FROM ks.t WHERE k = 1").await;
    assert_eq!(
        denied(&e, &mut r, "UPDATE ks.t SET v = 2 WHERE k = 1").await,
        "User reader has no MODIFY permission on <table ks.t> or any of its parents"
    );
    // A conditional update needs SELECT and MODIFY.
    ok(&e, &mut su, "GRANT MODIFY ON ks.t TO reader").await;
    ok(&e, &mut r, "UPDATE ks.t SET v = 2 WHERE k = 1 IF v = 1").await;
    ok(&e, &mut su, "REVOKE SELECT ON ks.t FROM reader").await;
    assert!(
        denied(&e, &mut r, "UPDATE ks.t SET v = 3 WHERE k = 1 IF v = 2")
            .await
            .contains("no SELECT permission")
    );
    // System keyspaces drivers read stay readable; system_auth does not.
    ok(&e, &mut r, "SELECT * FROM system.local").await;
    ok(&e, &mut r, "SELECT * FROM system_schema.tables").await;
    denied(&e, &mut r, "SELECT * FROM system_auth.roles").await;
    // The read-only role cannot hand out what it holds without AUTHORIZE.
    denied(&e, &mut r, "GRANT MODIFY ON ks.t TO reader").await;
    let perms = all_columns_text(&ok(&e, &mut su, "LIST ALL PERMISSIONS OF reader").await);
    assert_eq!(
        perms,
        vec![vec!["reader", "reader", "<table ks.t>", "MODIFY"]]
    );
}

#[tokio::test]
async fn inherited_permissions_and_superuser_status() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(&e, &mut su, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    ok(&e, &mut su, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").await;
    ok(&e, &mut su, "CREATE ROLE writers").await;
    ok(&e, &mut su, "CREATE ROLE team").await;
    ok(&e, &mut su, "GRANT MODIFY ON KEYSPACE ks TO writers").await;
    ok(&e, &mut su, "GRANT writers TO team").await;
    ok(
        &e,
        &mut su,
        "CREATE ROLE carol WITH PASSWORD = 'c' AND LOGIN = true",
    )
    .await;
    let mut carol = login(&e, "carol", "c").await;
    denied(&e, &mut carol, "INSERT INTO ks.t (k, v) VALUES (1, 1)").await;
    ok(&e, &mut su, "GRANT team TO carol").await;
    // The grant changed the generation: carol's cached denial is not reused.
    ok(&e, &mut carol, "INSERT INTO ks.t (k, v) VALUES (1, 1)").await;
    assert_eq!(
        first_column(&ok(&e, &mut su, "LIST ROLES OF carol").await),
        vec!["carol", "team", "writers"]
    );
    assert_eq!(
        first_column(&ok(&e, &mut su, "LIST ROLES OF carol NORECURSIVE").await),
        vec!["carol", "team"]
    );
    assert_eq!(
        invalid(&e, &mut su, "GRANT carol TO writers").await,
        "carol is a member of writers"
    );
    assert_eq!(
        invalid(&e, &mut su, "GRANT team TO carol").await,
        "carol is a member of team"
    );
    let members =
        all_columns_text(&ok(&e, &mut su, "SELECT * FROM system_auth.role_members").await);
    assert_eq!(
        members,
        vec![vec!["team", "carol"], vec!["writers", "team"]]
    );
    ok(&e, &mut su, "REVOKE team FROM carol").await;
    denied(&e, &mut carol, "INSERT INTO ks.t (k, v) VALUES (2, 2)").await;
    assert_eq!(
        invalid(&e, &mut su, "REVOKE team FROM carol").await,
        "carol is not a member of team"
    );
    // Superuser status is inherited too.
    ok(&e, &mut su, "CREATE ROLE admins WITH SUPERUSER = true").await;
    ok(&e, &mut su, "GRANT admins TO carol").await;
    ok(&e, &mut carol, "DROP TABLE ks.t").await;
}

#[tokio::test]
async fn role_management_rules() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(
        &e,
        &mut su,
        "CREATE ROLE dave WITH PASSWORD = 'd' AND LOGIN = true",
    )
    .await;
    let mut dave = login(&e, "dave", "d").await;
    assert_eq!(
        denied(&e, &mut dave, "CREATE ROLE x").await,
        "User dave has no CREATE permission on <all roles> or any of its parents"
    );
    assert_eq!(
        denied(&e, &mut dave, "CREATE ROLE x WITH SUPERUSER = true").await,
        "Only superusers can create a role with superuser status"
    );
    // Anyone may change their own password.
    ok(&e, &mut dave, "ALTER ROLE dave WITH PASSWORD = 'd2'").await;
    login(&e, "dave", "d2").await;
    denied(&e, &mut dave, "ALTER ROLE dave WITH SUPERUSER = true").await;
    denied(&e, &mut dave, "ALTER ROLE cassandra WITH PASSWORD = 'x'").await;
    ok(&e, &mut su, "GRANT CREATE ON ALL ROLES TO dave").await;
    ok(&e, &mut dave, "CREATE ROLE x").await;
    // The creator may manage what it created.
    ok(&e, &mut dave, "ALTER ROLE x WITH LOGIN = true").await;
    ok(&e, &mut dave, "DROP ROLE x").await;
    assert_eq!(
        invalid(&e, &mut su, "CREATE ROLE dave").await,
        "dave already exists"
    );
    ok(&e, &mut su, "CREATE ROLE IF NOT EXISTS dave").await;
    assert_eq!(
        invalid(&e, &mut su, "DROP ROLE ghost").await,
        "ghost doesn't exist"
    );
    ok(&e, &mut su, "DROP ROLE IF EXISTS ghost").await;
    assert_eq!(
        invalid(&e, &mut su, "DROP ROLE cassandra").await,
        "Cannot DROP primary role for current login"
    );
    assert_eq!(
        invalid(&e, &mut su, "CREATE ROLE o WITH OPTIONS = {'a': 'b'}").await,
        "Custom options are not supported by CassandraRoleManager"
    );
    assert_eq!(
        invalid(&e, &mut su, "CREATE ROLE h WITH HASHED PASSWORD = 'nope'").await,
        "Hashed password is not a valid bcrypt hash"
    );
    let h = hash_password("hp", MIN_BCRYPT_COST).unwrap();
    ok(
        &e,
        &mut su,
        &format!("CREATE ROLE h WITH HASHED PASSWORD = '{h}' AND LOGIN = true"),
    )
    .await;
    login(&e, "h", "hp").await;
    assert_eq!(
        invalid(&e, &mut su, "GRANT CREATE ON TABLE system.local TO dave").await,
        "Resource <table system.local> does not support the CREATE permission"
    );
    assert_eq!(
        invalid(&e, &mut su, "GRANT SELECT ON KEYSPACE nope TO dave").await,
        "Resource <keyspace nope> doesn't exist"
    );
    // Dropping a role removes its memberships and grants.
    ok(&e, &mut su, "GRANT h TO dave").await;
    ok(&e, &mut su, "GRANT SELECT ON ALL KEYSPACES TO h").await;
    ok(&e, &mut su, "DROP ROLE h").await;
    let d = e.auth().data();
    assert!(d.roles["dave"].member_of.is_empty());
    assert!(!d.permissions.contains_key("h"));
    let perms = all_columns_text(
        &ok(
            &e,
            &mut su,
            "SELECT role, resource FROM system_auth.role_permissions",
        )
        .await,
    );
    // The creator of a role holds every permission on it, as in Cassandra.
    assert_eq!(
        perms,
        vec![vec!["cassandra", "roles/dave"], vec!["dave", "roles"]]
    );
}

#[tokio::test]
async fn cached_decisions_follow_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), config());
    let mut su = login(&e, "cassandra", "cassandra").await;
    ok(&e, &mut su, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    ok(&e, &mut su, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").await;
    ok(
        &e,
        &mut su,
        "CREATE ROLE w WITH PASSWORD = 'w' AND LOGIN = true",
    )
    .await;
    ok(&e, &mut su, "GRANT MODIFY ON ks.t TO w").await;
    let mut w = login(&e, "w", "w").await;
    let p = e
        .prepare(None, "INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .unwrap();
    assert_eq!(p.access.len(), 1);
    let g = e.auth().generation();
    w.check(&e, &p).unwrap();
    assert_eq!(w.permissions.len(), 1);
    // Repeated checks hit the cache: no new entry, same generation.
    for _ in 0..10 {
        w.check(&e, &p).unwrap();
    }
    assert_eq!(w.permissions.len(), 1);
    assert_eq!(e.auth().generation(), g);
    ok(&e, &mut su, "REVOKE MODIFY ON ks.t FROM w").await;
    assert!(e.auth().generation() > g);
    let u = w.check(&e, &p).unwrap_err();
    assert_eq!(u.permission, Permission::Modify);
    // The denial is cached too, and shares its message.
    let u2 = w.check(&e, &p).unwrap_err();
    assert!(Arc::ptr_eq(&u.message, &u2.message));
    let mut buf = bytes::BytesMut::new();
    u.encode(&mut buf, 5, sluice_protocol::Compression::None);
    assert_eq!(buf[4], 0x00, "ERROR opcode");
    assert_eq!(&buf[9..13], &0x2100i32.to_be_bytes());
    assert!(buf.ends_with(u.message.as_bytes()));
    // A session that never logged in is refused with the static message.
    let mut anon = Conn::default();
    assert_eq!(
        &*anon.check(&e, &p).unwrap_err().message,
        "You have not logged in"
    );
}

#[test]
fn permission_cache_is_bounded() {
    let mut data = AuthData::default();
    data.roles.insert(
        "r".into(),
        RoleRecord {
            can_login: true,
            is_superuser: false,
            member_of: Default::default(),
            salted_hash: None,
        },
    );
    let data = Arc::new(data);
    let mut cache = PermissionCache::default();
    for i in 0..100 {
        let check = AccessCheck {
            permission: Permission::Select,
            resource: Arc::new(AuthResource::table("ks", &format!("t{i}"))),
        };
        assert!(cache.check(1, "r", &check, || data.clone()).is_err());
        assert!(cache.len() <= 32);
    }
    assert_eq!(cache.len(), 32);
    let check = AccessCheck {
        permission: Permission::Select,
        resource: Arc::new(AuthResource::table("ks", "t0")),
    };
    cache.check(2, "r", &check, || data.clone()).unwrap_err();
    assert_eq!(cache.len(), 1, "a new generation starts empty");
}

#[test]
fn resource_chain_and_children() {
    let chain: Vec<&str> = authorizer::resource_chain("data/ks/t").collect();
    assert_eq!(chain, vec!["data/ks/t", "data/ks", "data"]);
    assert!(authorizer::is_same_or_child("data/ks/t", "data/ks"));
    assert!(authorizer::is_same_or_child("data/ks", "data/ks"));
    assert!(!authorizer::is_same_or_child("data/ks2", "data/ks"));
    assert!(!authorizer::is_same_or_child("data", "data/ks"));
}
