//! Authentication and authorization against the real binary: the Rust `scylla` driver's
//! authenticator, raw SASL PLAIN exchanges, and failed logins slowed down per address.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{frame, query, read_frame, startup, Node};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The password authenticator and the Cassandra authorizer, with a cheap bcrypt cost so that
/// tests measure the server, not the hash (the cost is the operator's choice).
const AUTH_FLAGS: [&str; 6] = [
    "--authenticator",
    "password",
    "--authorizer",
    "cassandra",
    "--auth-bcrypt-cost",
    "4",
];

const OPCODE_ERROR: u8 = 0x00;
const OPCODE_READY: u8 = 0x02;
const OPCODE_AUTHENTICATE: u8 = 0x03;
const OPCODE_AUTH_SUCCESS: u8 = 0x10;
const BAD_CREDENTIALS: u32 = 0x0100;
const PROTOCOL_ERROR: u32 = 0x000A;

fn start(dir: &tempfile::TempDir) -> Node {
    Node::start(&dir.path().join("data"), 1, &AUTH_FLAGS)
}

async fn login(node: &Node, user: &str, password: &str) -> Result<Session, String> {
    SessionBuilder::new()
        .known_node(node.addr.to_string())
        .user(user, password)
        .connection_timeout(Duration::from_secs(20))
        .build()
        .await
        .map_err(|e| format!("{e}"))
}

async fn run(s: &Session, q: &str) -> Result<(), String> {
    s.query_unpaged(q, &[])
        .await
        .map(|_| ())
        .map_err(|e| format!("{e}"))
}

async fn ok(s: &Session, q: &str) {
    if let Err(e) = run(s, q).await {
        panic!("{q}: {e}");
    }
}

async fn denied(s: &Session, q: &str) -> String {
    match run(s, q).await {
        Err(e) if e.contains("doesn't have the right to perform the query") => e,
        other => panic!("{q}: expected Unauthorized, got {other:?}"),
    }
}

fn auth_response(stream: i16, token: &[u8]) -> Vec<u8> {
    let mut body = (token.len() as i32).to_be_bytes().to_vec();
    body.extend_from_slice(token);
    frame(4, stream, 0x0F, &body)
}

fn error_message(body: &[u8]) -> String {
    let len = u16::from_be_bytes([body[4], body[5]]) as usize;
    String::from_utf8_lossy(&body[6..6 + len]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_driver_logins_roles_and_grants() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir);

    // A good login.
    let su = login(&node, "cassandra", "cassandra")
        .await
        .expect("superuser logs in");

    // A wrong password: Bad_credentials with the exact message.
    let e = login(&node, "cassandra", "wrong").await.unwrap_err();
    assert!(
        e.contains("Provided username and/or password are incorrect"),
        "{e}"
    );
    // A client with no authenticator cannot talk to a node that requires one.
    let e = SessionBuilder::new()
        .known_node(node.addr.to_string())
        .connection_timeout(Duration::from_secs(20))
        .build()
        .await
        .err()
        .map(|e| e.to_string())
        .expect("a client without credentials is refused");
    assert!(e.to_lowercase().contains("auth"), "{e}");

    ok(&su, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    ok(&su, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").await;
    ok(&su, "CREATE TABLE ks.v (k int PRIMARY KEY)").await;
    ok(
        &su,
        "CREATE ROLE app WITH PASSWORD = 'app-pw' AND LOGIN = true",
    )
    .await;
    ok(
        &su,
        "CREATE ROLE reader WITH PASSWORD = 'r-pw' AND LOGIN = true",
    )
    .await;
    ok(&su, "GRANT SELECT ON KEYSPACE ks TO reader").await;

    // Every statement kind: denied, then allowed by GRANT.
    let app = login(&node, "app", "app-pw").await.expect("app logs in");
    let steps = [
        (
            "INSERT INTO ks.t (k, v) VALUES (1, 1)",
            "GRANT MODIFY ON TABLE ks.t TO app",
        ),
        (
            "SELECT * FROM ks.t WHERE k = 1",
            "GRANT SELECT ON TABLE ks.t TO app",
        ),
        (
            "ALTER TABLE ks.t ADD w int",
            "GRANT ALTER ON KEYSPACE ks TO app",
        ),
        (
            "CREATE TABLE ks.u (k int PRIMARY KEY)",
            "GRANT CREATE ON KEYSPACE ks TO app",
        ),
        // ks.v is the superuser's: its creator's permissions do not cover app.
        ("DROP TABLE ks.v", "GRANT DROP ON KEYSPACE ks TO app"),
        ("CREATE ROLE helper", "GRANT CREATE ON ALL ROLES TO app"),
    ];
    for (stmt, grant) in steps {
        let e = denied(&app, stmt).await;
        assert!(e.contains("User app has no"), "{e}");
        ok(&su, grant).await;
        ok(&app, stmt).await;
    }
    // A prepared statement is checked on every EXECUTE, from the connection's cache.
    let insert = app
        .prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    app.execute_unpaged(&insert, (2, 2)).await.unwrap();
    ok(&su, "REVOKE MODIFY ON TABLE ks.t FROM app").await;
    let e = app
        .execute_unpaged(&insert, (3, 3))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("User app has no MODIFY permission on <table ks.t> or any of its parents"),
        "{e}"
    );
    // A BATCH needs MODIFY on every table it writes.
    let mut batch =
        scylla::statement::batch::Batch::new(scylla::statement::batch::BatchType::Unlogged);
    batch.append_statement(insert.clone());
    batch.append_statement(insert.clone());
    let e = app
        .batch(&batch, ((4, 4), (5, 5)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("User app has no MODIFY permission"), "{e}");
    ok(&su, "GRANT MODIFY ON TABLE ks.t TO app").await;
    app.batch(&batch, ((4, 4), (5, 5))).await.unwrap();
    ok(&su, "REVOKE MODIFY ON TABLE ks.t FROM app").await;

    // A role that reads but does not write.
    let reader = login(&node, "reader", "r-pw").await.unwrap();
    ok(&reader, "SELECT * FROM ks.t WHERE k = 1").await;
    let e = denied(&reader, "INSERT INTO ks.t (k, v) VALUES (9, 9)").await;
    assert!(
        e.contains("User reader has no MODIFY permission on <table ks.t>"),
        "{e}"
    );

    // Inheritance: writers' permission reaches reader through GRANT writers TO reader.
    ok(&su, "CREATE ROLE writers").await;
    ok(&su, "GRANT MODIFY ON KEYSPACE ks TO writers").await;
    ok(&su, "GRANT writers TO reader").await;
    ok(&reader, "INSERT INTO ks.t (k, v) VALUES (9, 9)").await;
    ok(&su, "REVOKE writers FROM reader").await;
    denied(&reader, "INSERT INTO ks.t (k, v) VALUES (10, 10)").await;

    // The superuser's password changed: the old one is refused, the new one works.
    ok(&su, "ALTER ROLE cassandra WITH PASSWORD = 'n3w-secret'").await;
    let e = login(&node, "cassandra", "cassandra").await.unwrap_err();
    assert!(
        e.contains("Provided username and/or password are incorrect"),
        "{e}"
    );
    login(&node, "cassandra", "n3w-secret")
        .await
        .expect("new password");

    // Logins are counted.
    assert!(node.metric("sluice_logins_total", &[("outcome", "succeeded")]) >= 5.0);
    assert!(node.metric("sluice_logins_total", &[("outcome", "failed")]) >= 2.0);
    assert!(node.metric("sluice_errors_total", &[("code", "unauthorized")]) >= 8.0);
    assert!(node.metric("sluice_role_and_permission_changes_total", &[]) >= 15.0);
}

#[test]
fn raw_sasl_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir);
    let connect = || {
        let s = std::net::TcpStream::connect(node.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    use std::io::Write;

    // STARTUP is answered AUTHENTICATE naming Cassandra's class.
    let mut s = connect();
    s.write_all(&startup()).unwrap();
    let (_, op, _, body) = read_frame(&mut s).unwrap();
    assert_eq!(op, OPCODE_AUTHENTICATE);
    assert_eq!(
        &body[2..],
        b"org.apache.cassandra.auth.PasswordAuthenticator"
    );
    // Nothing but the exchange before login.
    s.write_all(&query(2, "SELECT * FROM system.local"))
        .unwrap();
    let (_, op, code, body) = read_frame(&mut s).unwrap();
    assert_eq!((op, code), (OPCODE_ERROR, Some(PROTOCOL_ERROR)));
    assert!(error_message(&body).contains("expecting AUTH_RESPONSE"));
    // OPTIONS still works (drivers use it as a heartbeat).
    s.write_all(&frame(4, 3, 0x05, &[])).unwrap();
    assert_eq!(read_frame(&mut s).unwrap().1, 0x06);
    // A good token: AUTH_SUCCESS, then queries are served.
    s.write_all(&auth_response(4, b"\0cassandra\0cassandra"))
        .unwrap();
    assert_eq!(read_frame(&mut s).unwrap().1, OPCODE_AUTH_SUCCESS);
    s.write_all(&query(5, "SELECT * FROM system.local"))
        .unwrap();
    assert_eq!(read_frame(&mut s).unwrap().1, 0x08);

    // A malformed token and a wrong password: Bad_credentials, then the connection closes.
    for (token, message) in [
        (&b"cassandra"[..], "Password must not be null"),
        (
            &b"\0cassandra\0nope"[..],
            "Provided username and/or password are incorrect",
        ),
        (
            &b"\0ghost\0cassandra"[..],
            "Provided username and/or password are incorrect",
        ),
    ] {
        let mut s = connect();
        s.write_all(&startup()).unwrap();
        assert_eq!(read_frame(&mut s).unwrap().1, OPCODE_AUTHENTICATE);
        s.write_all(&auth_response(2, token)).unwrap();
        let (stream, op, code, body) = read_frame(&mut s).unwrap();
        assert_eq!((stream, op, code), (2, OPCODE_ERROR, Some(BAD_CREDENTIALS)));
        assert_eq!(error_message(&body), message);
        assert!(read_frame(&mut s).is_none(), "the connection is closed");
    }

    // Without the authenticator, STARTUP is answered READY (the default stays allow-all).
    let dir2 = tempfile::tempdir().unwrap();
    let open = Node::start(&dir2.path().join("data"), 1, &[]);
    let mut s = std::net::TcpStream::connect(open.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&startup()).unwrap();
    assert_eq!(read_frame(&mut s).unwrap().1, OPCODE_READY);
}

/// One login attempt from `source` over a fresh connection; Ok(elapsed) on AUTH_SUCCESS.
async fn attempt(
    node: SocketAddr,
    source: &str,
    password: &str,
) -> Result<Duration, (u32, String)> {
    let started = Instant::now();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut s: TcpStream = socket.connect(node).await.unwrap();
    s.write_all(&startup()).await.unwrap();
    let (op, _) = read_async(&mut s).await;
    assert_eq!(op, OPCODE_AUTHENTICATE);
    let token = format!("\0cassandra\0{password}");
    s.write_all(&auth_response(2, token.as_bytes()))
        .await
        .unwrap();
    let (op, body) = read_async(&mut s).await;
    if op == OPCODE_AUTH_SUCCESS {
        return Ok(started.elapsed());
    }
    let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    Err((code, error_message(&body)))
}

async fn read_async(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).await.unwrap();
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    (h[4], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brute_force_is_slowed_down_per_address() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir);
    let addr = node.addr;
    // 1,000 wrong passwords from 127.0.0.2, eight connections at a time.
    let attacker = tokio::spawn(async move {
        let started = Instant::now();
        let mut outcomes = Vec::with_capacity(1000);
        for batch in 0..125 {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..8 {
                set.spawn(attempt(
                    addr,
                    "127.0.0.2",
                    if (batch + i) % 2 == 0 {
                        "guess"
                    } else {
                        "guess2"
                    },
                ));
            }
            while let Some(r) = set.join_next().await {
                outcomes.push(r.unwrap());
            }
        }
        (outcomes, started.elapsed())
    });
    // Meanwhile, good logins from 127.0.0.3 succeed quickly.
    let mut good = Vec::new();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        good.push(
            attempt(addr, "127.0.0.3", "cassandra")
                .await
                .expect("good login"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (outcomes, took) = attacker.await.unwrap();
    assert_eq!(outcomes.len(), 1000);
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Err((BAD_CREDENTIALS, _)))));
    let throttled = outcomes
        .iter()
        .filter(|o| matches!(o, Err((_, m)) if m.starts_with("Too many failed login attempts")))
        .count();
    let checked = node.metric("sluice_logins_total", &[("outcome", "failed")]);
    eprintln!(
        "1000 wrong passwords in {took:?}: {checked} checked, {throttled} refused unchecked; \
         good logins from another address took {good:?}"
    );
    assert!(throttled >= 900, "{throttled} throttled");
    assert!(checked <= 100.0, "{checked} passwords checked");
    assert_eq!(
        node.metric("sluice_logins_total", &[("outcome", "throttled")]) as usize,
        throttled
    );
    let slowest = good.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(100),
        "good logins took {good:?}"
    );
}
