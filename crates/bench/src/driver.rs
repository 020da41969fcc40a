//! The real target: any CQL endpoint through the Rust `scylla` driver, with prepared statements,
//! no retries by default and the driver's client timeout set to the request deadline.

use crate::target::{Op, OpKind, Reply, Target};
use anyhow::Context;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::client::PoolSize;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::policies::retry::{
    FallthroughRetryPolicy, RequestInfo, RetryDecision, RetryPolicy, RetrySession,
};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Keyspace every scenario uses.
pub const KEYSPACE: &str = "sluice_bench";

/// Bytes in every written value.
pub const VALUE_LEN: usize = 64;

/// Retry behaviour of the client.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RetryMode {
    /// Never retry: the benchmark measures the server, not the client's policy.
    None,
    /// What stock drivers do: retry at once on the next host, up to N times.
    Stock,
}

/// Consistency level of every benchmark request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConsistencyLevel {
    /// ANY (writes only).
    Any,
    /// ONE.
    One,
    /// TWO.
    Two,
    /// THREE.
    Three,
    /// QUORUM.
    Quorum,
    /// ALL.
    All,
    /// LOCAL_ONE.
    LocalOne,
    /// LOCAL_QUORUM.
    LocalQuorum,
    /// EACH_QUORUM.
    EachQuorum,
}

impl ConsistencyLevel {
    /// The driver's value.
    pub fn driver(self) -> Consistency {
        match self {
            ConsistencyLevel::Any => Consistency::Any,
            ConsistencyLevel::One => Consistency::One,
            ConsistencyLevel::Two => Consistency::Two,
            ConsistencyLevel::Three => Consistency::Three,
            ConsistencyLevel::Quorum => Consistency::Quorum,
            ConsistencyLevel::All => Consistency::All,
            ConsistencyLevel::LocalOne => Consistency::LocalOne,
            ConsistencyLevel::LocalQuorum => Consistency::LocalQuorum,
            ConsistencyLevel::EachQuorum => Consistency::EachQuorum,
        }
    }

    /// The value on the wire, for clients that encode their own frames.
    pub fn wire(self) -> sluice_protocol::Consistency {
        use sluice_protocol::Consistency as C;
        match self {
            ConsistencyLevel::Any => C::Any,
            ConsistencyLevel::One => C::One,
            ConsistencyLevel::Two => C::Two,
            ConsistencyLevel::Three => C::Three,
            ConsistencyLevel::Quorum => C::Quorum,
            ConsistencyLevel::All => C::All,
            ConsistencyLevel::LocalOne => C::LocalOne,
            ConsistencyLevel::LocalQuorum => C::LocalQuorum,
            ConsistencyLevel::EachQuorum => C::EachQuorum,
        }
    }

    /// The CQL name (QUORUM, LOCAL_ONE, ...).
    pub fn name(self) -> &'static str {
        match self {
            ConsistencyLevel::Any => "ANY",
            ConsistencyLevel::One => "ONE",
            ConsistencyLevel::Two => "TWO",
            ConsistencyLevel::Three => "THREE",
            ConsistencyLevel::Quorum => "QUORUM",
            ConsistencyLevel::All => "ALL",
            ConsistencyLevel::LocalOne => "LOCAL_ONE",
            ConsistencyLevel::LocalQuorum => "LOCAL_QUORUM",
            ConsistencyLevel::EachQuorum => "EACH_QUORUM",
        }
    }
}

/// How the driver picks the coordinator of each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Balancing {
    /// A replica of the request's partition (prepared statements carry the token).
    TokenAware,
    /// Every node in turn, whatever the partition: most requests need a hop to a replica.
    RoundRobin,
}

impl Balancing {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Balancing::TokenAware => "token-aware",
            Balancing::RoundRobin => "round-robin",
        }
    }
}

/// Connection settings.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Connections per host.
    pub connections: usize,
    /// The driver's client-side timeout.
    pub client_timeout: Duration,
    /// Retry policy.
    pub retry: RetryMode,
    /// Retries per request under `RetryMode::Stock`.
    pub retries: u32,
    /// User name and password, for a node that asks for a login.
    pub credentials: Option<(String, String)>,
    /// Consistency level of the measured requests.
    pub consistency: ConsistencyLevel,
    /// Choice of coordinator.
    pub balancing: Balancing,
    /// `replication_factor` of the keyspace the benchmark creates.
    pub replication_factor: u32,
}

impl DriverOptions {
    /// One node's defaults: consistency ONE, token-aware, replication factor 1.
    pub fn new(nodes: Vec<String>, connections: usize, client_timeout: Duration) -> Self {
        Self {
            nodes,
            connections,
            client_timeout,
            retry: RetryMode::None,
            retries: 3,
            credentials: None,
            consistency: ConsistencyLevel::One,
            balancing: Balancing::TokenAware,
            replication_factor: 1,
        }
    }

    /// One line for a report: the cluster-facing settings.
    pub fn describe(&self) -> String {
        format!(
            "{} node(s), {}, consistency {}, keyspace replication_factor {}",
            self.nodes.len(),
            self.balancing.name(),
            self.consistency.name(),
            self.replication_factor
        )
    }
}

/// Retries immediately on the next host, up to `max` times, for the errors stock drivers retry.
#[derive(Debug)]
struct StockRetry {
    max: u32,
    retries: Arc<AtomicU64>,
}

struct StockRetrySession {
    left: u32,
    retries: Arc<AtomicU64>,
}

impl RetryPolicy for StockRetry {
    fn new_session(&self) -> Box<dyn RetrySession> {
        Box::new(StockRetrySession {
            left: self.max,
            retries: self.retries.clone(),
        })
    }
}

impl RetrySession for StockRetrySession {
    fn decide_should_retry(&mut self, info: RequestInfo) -> RetryDecision {
        if stock_retries(info.error) && self.left > 0 {
            self.left -= 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
            RetryDecision::RetryNextTarget(None)
        } else {
            RetryDecision::DontRetry
        }
    }

    fn reset(&mut self) {}
}

/// Whether stock drivers retry this error at once on the next host (rate limits, syntax and
/// invalid-request errors are never retried).
pub fn stock_retries(e: &RequestAttemptError) -> bool {
    match e {
        RequestAttemptError::BrokenConnectionError(_)
        | RequestAttemptError::UnableToAllocStreamId => true,
        RequestAttemptError::DbError(db, _) => matches!(
            db,
            DbError::Overloaded
                | DbError::ServerError
                | DbError::TruncateError
                | DbError::IsBootstrapping
                | DbError::Unavailable { .. }
                | DbError::ReadTimeout { .. }
                | DbError::WriteTimeout { .. }
        ),
        _ => false,
    }
}

/// Maps a driver error onto the outcome classes.
pub fn classify_error(e: &ExecutionError) -> Reply {
    match e {
        ExecutionError::RequestTimeout(_) => Reply::ClientTimeout,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => match db {
            DbError::RateLimitReached { .. } => Reply::RateLimited,
            DbError::Overloaded => Reply::Overloaded,
            DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. } => Reply::ServerTimeout,
            _ => Reply::Other,
        },
        _ => Reply::Other,
    }
}

/// An open session plus the retry counter its policy feeds.
pub struct Connection {
    /// The driver session.
    pub session: Arc<Session>,
    retries: Arc<AtomicU64>,
    replication_factor: u32,
}

impl Connection {
    /// Connects with the given options (no speculative execution).
    pub async fn open(opts: &DriverOptions) -> anyhow::Result<Self> {
        let retries = Arc::new(AtomicU64::new(0));
        let policy: Arc<dyn RetryPolicy> = match opts.retry {
            RetryMode::None => Arc::new(FallthroughRetryPolicy::new()),
            RetryMode::Stock => Arc::new(StockRetry {
                max: opts.retries,
                retries: retries.clone(),
            }),
        };
        let profile = ExecutionProfile::builder()
            .request_timeout(Some(opts.client_timeout))
            .retry_policy(policy)
            .speculative_execution_policy(None)
            .consistency(opts.consistency.driver())
            .load_balancing_policy(
                DefaultPolicy::builder()
                    .token_aware(opts.balancing == Balancing::TokenAware)
                    .build(),
            )
            .build();
        let conns = NonZeroUsize::new(opts.connections.max(1)).unwrap_or(NonZeroUsize::MIN);
        let mut builder = SessionBuilder::new()
            .known_nodes(&opts.nodes)
            .pool_size(PoolSize::PerHost(conns))
            .default_execution_profile_handle(profile.into_handle());
        if let Some((user, password)) = &opts.credentials {
            builder = builder.user(user, password);
        }
        let session = builder
            .build()
            .await
            .with_context(|| format!("connecting to {}", opts.nodes.join(",")))?;
        Ok(Self {
            session: Arc::new(session),
            retries,
            replication_factor: opts.replication_factor.max(1),
        })
    }

    /// Connects to the one node `node` over `connections` connections, a 30 s client timeout
    /// and no retries (the single-node benchmarks count every failure), and runs `ddl` in
    /// order.
    pub async fn open_one_node(
        node: &str,
        connections: usize,
        ddl: &[String],
    ) -> anyhow::Result<Self> {
        let conn = Connection::open(&DriverOptions {
            nodes: vec![node.to_owned()],
            connections: connections.max(1),
            client_timeout: Duration::from_secs(30),
            retry: RetryMode::None,
            retries: 0,
            credentials: None,
            ..DriverOptions::new(Vec::new(), 1, Duration::from_secs(30))
        })
        .await?;
        for statement in ddl {
            conn.ddl(statement)
                .await
                .map_err(anyhow::Error::msg)
                .with_context(|| statement.clone())?;
        }
        Ok(conn)
    }

    /// Runs a schema statement with a generous timeout (schema changes are not measured).
    pub async fn ddl(&self, cql: &str) -> Result<(), String> {
        let mut st = scylla::statement::Statement::new(cql);
        st.set_request_timeout(Some(Duration::from_secs(60)));
        self.session
            .query_unpaged(st, ())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The commit-log settings the endpoint reports in `system_views.settings` (Cassandra 4.0+);
    /// Err with a short reason when the table is missing or unreadable (Sluice, ScyllaDB, 3.x).
    pub async fn durability_settings(&self) -> Result<Vec<(String, Option<String>)>, String> {
        let mut st = scylla::statement::Statement::new(durability_query());
        st.set_request_timeout(Some(Duration::from_secs(10)));
        let res = self
            .session
            .query_unpaged(st, ())
            .await
            .map_err(|e| match &e {
                // The server's own message ("Keyspace system_views does not exist") is the reason.
                ExecutionError::LastAttemptError(RequestAttemptError::DbError(_, msg)) => {
                    format!("system_views.settings: {msg}")
                }
                _ => format!("system_views.settings: {e}"),
            })?;
        let rows = res
            .into_rows_result()
            .map_err(|e| format!("system_views.settings: {e}"))?;
        let iter = rows
            .rows::<(String, Option<String>)>()
            .map_err(|e| format!("system_views.settings: {e}"))?;
        // The IN list bounds the answer to a handful of rows.
        iter.map(|r| r.map_err(|e| format!("system_views.settings: {e}")))
            .collect()
    }

    /// The counter of the retries the session's policy made.
    pub fn retry_counter(&self) -> Arc<AtomicU64> {
        self.retries.clone()
    }

    /// Creates the keyspace with the options' replication factor, or alters an existing one
    /// to it, so that a run at RF 3 never reuses a keyspace an earlier run made at RF 1.
    pub async fn create_keyspace(&self) -> anyhow::Result<()> {
        let replication = format!(
            "{{'class': 'SimpleStrategy', 'replication_factor': {}}}",
            self.replication_factor
        );
        self.ddl(&format!(
            "CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = {replication}"
        ))
        .await
        .map_err(anyhow::Error::msg)
        .context("creating keyspace")?;
        self.ddl(&format!(
            "ALTER KEYSPACE {KEYSPACE} WITH replication = {replication}"
        ))
        .await
        .map_err(anyhow::Error::msg)
        .context("setting the keyspace's replication factor")
    }

    /// Creates the keyspace and a `(pk bigint, ck int, v blob)` table; drops it first if `fresh`.
    pub async fn create_table(&self, table: &str, fresh: bool) -> anyhow::Result<()> {
        self.create_keyspace().await?;
        if fresh {
            self.ddl(&format!("DROP TABLE IF EXISTS {KEYSPACE}.{table}"))
                .await
                .map_err(anyhow::Error::msg)
                .context("dropping table")?;
        }
        self.ddl(&format!(
            "CREATE TABLE IF NOT EXISTS {KEYSPACE}.{table} \
             (pk bigint, ck int, v blob, PRIMARY KEY (pk, ck))"
        ))
        .await
        .map_err(anyhow::Error::msg)
        .context("creating table")
    }
}

/// Names under which Cassandra lists commit-log durability in `system_views.settings`: 4.1 and
/// later use `commitlog_sync_period` and `commitlog_sync_group_window`, 4.0 the `*_in_ms` forms.
pub const DURABILITY_SETTINGS: [&str; 5] = [
    "commitlog_sync",
    "commitlog_sync_period",
    "commitlog_sync_period_in_ms",
    "commitlog_sync_group_window",
    "commitlog_sync_group_window_in_ms",
];

/// The `system_views.settings` query for [`DURABILITY_SETTINGS`].
pub fn durability_query() -> String {
    let names: Vec<String> = DURABILITY_SETTINGS
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    format!(
        "SELECT name, value FROM system_views.settings WHERE name IN ({})",
        names.join(", ")
    )
}

/// One line for a header: `name=value, ...` in [`DURABILITY_SETTINGS`] order, or `unknown (why)`.
pub fn format_durability(reported: &Result<Vec<(String, Option<String>)>, String>) -> String {
    match reported {
        Err(why) => format!("unknown ({why})"),
        Ok(rows) if rows.is_empty() => {
            "unknown (system_views.settings lists no commit-log setting)".into()
        }
        Ok(rows) => {
            let rank = |n: &str| {
                DURABILITY_SETTINGS
                    .iter()
                    .position(|d| *d == n)
                    .unwrap_or(usize::MAX)
            };
            let mut rows: Vec<&(String, Option<String>)> = rows.iter().collect();
            rows.sort_by_key(|(n, _)| rank(n));
            rows.iter()
                .map(|(n, v)| format!("{n}={}", v.as_deref().unwrap_or("null")))
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// Prepared reads and writes on one table.
pub struct CqlTarget {
    session: Arc<Session>,
    write: PreparedStatement,
    read: PreparedStatement,
    value: [u8; VALUE_LEN],
    sent: AtomicU64,
    retries: Arc<AtomicU64>,
}

impl CqlTarget {
    /// Prepares the statements; `using_timeout` adds `USING TIMEOUT` to writes. Returns notes
    /// about what the server did not support (the run goes on without it).
    pub async fn prepare(
        conn: &Connection,
        table: &str,
        using_timeout: Option<Duration>,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let mut notes = Vec::new();
        let plain = format!("INSERT INTO {KEYSPACE}.{table} (pk, ck, v) VALUES (?, ?, ?)");
        let write = match using_timeout {
            Some(t) => {
                let cql = format!("{plain} USING TIMEOUT {}ms", t.as_millis());
                match conn.session.prepare(cql).await {
                    Ok(p) => p,
                    Err(e) => {
                        notes.push(format!(
                            "USING TIMEOUT unsupported by the server ({e}); writes carry only the client deadline"
                        ));
                        conn.session.prepare(plain).await?
                    }
                }
            }
            None => conn.session.prepare(plain).await?,
        };
        let read = conn
            .session
            .prepare(format!(
                "SELECT pk, ck, v FROM {KEYSPACE}.{table} WHERE pk = ?"
            ))
            .await?;
        let mut t = Self {
            session: conn.session.clone(),
            write,
            read,
            value: [0x5a; VALUE_LEN],
            sent: AtomicU64::new(0),
            retries: conn.retries.clone(),
        };
        // Idempotent, so that a stock retry policy may retry them as real applications do.
        t.write.set_is_idempotent(true);
        t.read.set_is_idempotent(true);
        Ok((t, notes))
    }
}

impl Target for CqlTarget {
    async fn execute(&self, op: Op) -> Reply {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let r = match op.kind {
            OpKind::Write => self
                .session
                .execute_unpaged(&self.write, (op.pk, op.ck, &self.value[..]))
                .await
                .map(|_| ()),
            OpKind::Read => self
                .session
                .execute_unpaged(&self.read, (op.pk,))
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => Reply::Ok,
            Err(e) => classify_error(&e),
        }
    }

    fn attempts(&self) -> Option<u64> {
        Some(self.sent.load(Ordering::Relaxed) + self.retries.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scylla::errors::{OperationType, WriteType};
    use scylla::statement::Consistency;

    fn db(e: DbError) -> ExecutionError {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(e, String::new()))
    }

    #[test]
    fn driver_errors_map_onto_outcome_classes() {
        assert_eq!(
            classify_error(&ExecutionError::RequestTimeout(Duration::from_millis(5))),
            Reply::ClientTimeout
        );
        assert_eq!(
            classify_error(&db(DbError::RateLimitReached {
                op_type: OperationType::Write,
                rejected_by_coordinator: true,
            })),
            Reply::RateLimited
        );
        assert_eq!(classify_error(&db(DbError::Overloaded)), Reply::Overloaded);
        assert_eq!(
            classify_error(&db(DbError::WriteTimeout {
                consistency: Consistency::One,
                received: 0,
                required: 1,
                write_type: WriteType::Simple,
            })),
            Reply::ServerTimeout
        );
        assert_eq!(
            classify_error(&db(DbError::ReadTimeout {
                consistency: Consistency::One,
                received: 0,
                required: 1,
                data_present: false,
            })),
            Reply::ServerTimeout
        );
        assert_eq!(classify_error(&db(DbError::SyntaxError)), Reply::Other);
        assert_eq!(classify_error(&ExecutionError::EmptyPlan), Reply::Other);
    }

    #[test]
    fn durability_query_names_every_setting_and_formats_what_is_reported() {
        let q = durability_query();
        assert!(q.starts_with("SELECT name, value FROM system_views.settings WHERE name IN ("));
        for n in DURABILITY_SETTINGS {
            assert!(q.contains(&format!("'{n}'")), "{n} missing from {q}");
        }
        // Rows come back in token order; the line follows the list order.
        let rows = Ok(vec![
            (
                "commitlog_sync_period".to_string(),
                Some("10000ms".to_string()),
            ),
            ("commitlog_sync".to_string(), Some("periodic".to_string())),
            ("commitlog_sync_group_window".to_string(), None),
        ]);
        assert_eq!(
            format_durability(&rows),
            "commitlog_sync=periodic, commitlog_sync_period=10000ms, commitlog_sync_group_window=null"
        );
        assert_eq!(
            format_durability(&Ok(vec![])),
            "unknown (system_views.settings lists no commit-log setting)"
        );
        assert_eq!(
            format_durability(&Err("system_views.settings: no such keyspace".into())),
            "unknown (system_views.settings: no such keyspace)"
        );
    }

    #[test]
    fn stock_policy_retries_what_stock_drivers_retry() {
        let attempt = |e| RequestAttemptError::DbError(e, String::new());
        assert!(stock_retries(&attempt(DbError::Overloaded)));
        assert!(stock_retries(&attempt(DbError::ServerError)));
        assert!(stock_retries(&RequestAttemptError::UnableToAllocStreamId));
        assert!(!stock_retries(&attempt(DbError::RateLimitReached {
            op_type: OperationType::Read,
            rejected_by_coordinator: false,
        })));
        assert!(!stock_retries(&attempt(DbError::SyntaxError)));
        assert!(!stock_retries(&attempt(DbError::Invalid)));
    }
}
