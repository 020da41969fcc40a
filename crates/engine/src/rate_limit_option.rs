//! ScyllaDB's `per_partition_rate_limit` table option: validation, and the
//! partitions a statement accounts against the limiter.
//!
//! Syntax: `WITH per_partition_rate_limit = {'max_reads_per_second': N,
//! 'max_writes_per_second': M}`; either key may be omitted (no limit for that operation),
//! `{}` removes the limit, and `ALTER` replaces the whole map (as ScyllaDB). Unlike ScyllaDB,
//! which wraps negative numbers into huge limits, every value must be a non-negative integer
//! that fits in 32 bits.
//!
//! Accounting (what the server's limiter counts): one write per distinct partition a write
//! or batch mutates, one read per partition of a single-partition or `IN` read. Range scans
//! (incomplete partition key), virtual/system tables and tables with no limit for the
//! operation are not counted. The common single-partition statement is handled by the
//! server from [`crate::Route`] alone (no allocation); the functions here serve the
//! multi-partition cases.

use crate::analyze::{Plan, WritePlan};
use crate::catalog::{RateLimits, TableDef};
use crate::{exec, Engine, OpKind, Prepared};
use sluice_cql::ast::OptionValue;
use sluice_protocol::{BatchQuery, BatchRequest, BoundValues, DbError, DetailedError, Value};
use sluice_storage::TableId;

/// The option's name in `WITH`.
pub const OPTION_NAME: &str = "per_partition_rate_limit";
/// Key of the read limit.
pub const MAX_READS: &str = "max_reads_per_second";
/// Key of the write limit.
pub const MAX_WRITES: &str = "max_writes_per_second";

fn config_error(msg: impl Into<std::borrow::Cow<'static, str>>) -> DetailedError {
    DetailedError::new(DbError::ConfigError, msg)
}

/// Parses the option's value; `Ok(None)` means no limit at all (`{}` or only absent keys).
pub fn parse(v: &OptionValue) -> Result<Option<RateLimits>, DetailedError> {
    let OptionValue::Map(pairs) = v else {
        return Err(config_error(
            "Property 'per_partition_rate_limit' must be a map, e.g. {'max_writes_per_second': 100}",
        ));
    };
    let mut rl = RateLimits::default();
    for (k, val) in pairs {
        let slot = match k.as_str() {
            MAX_READS => &mut rl.max_reads_per_second,
            MAX_WRITES => &mut rl.max_writes_per_second,
            _ => {
                return Err(config_error(format!(
                    "Unknown keys in map for per_partition_rate_limit extension: '{k}' \
                     (expected '{MAX_READS}' and/or '{MAX_WRITES}')"
                )))
            }
        };
        *slot = Some(parse_limit(k, val)?);
    }
    Ok((rl.max_reads_per_second.is_some() || rl.max_writes_per_second.is_some()).then_some(rl))
}

fn parse_limit(key: &str, v: &OptionValue) -> Result<u32, DetailedError> {
    let s = match v {
        OptionValue::Number(s) | OptionValue::String(s) => s.trim(),
        _ => {
            return Err(config_error(format!(
                "Invalid value for {key} option: expected a non-negative integer"
            )))
        }
    };
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(config_error(format!(
            "Invalid value '{s}' for {key} option: expected a non-negative integer"
        )));
    }
    digits.parse::<u32>().map_err(|_| {
        config_error(format!(
            "Invalid value '{s}' for {key} option: out of range accepted by 32-bit numbers"
        ))
    })
}

/// The `extensions` cell of `system_schema.tables`: ScyllaDB keeps the option there as the
/// schema extension `per_partition_rate_limit`, whose blob is its IDL serialization of a
/// `map<sstring, sstring>` (u32 little-endian count, then u32 length + bytes per string).
/// A `transactional_mode` other than 'off' is there too, its value as text. An empty map
/// when the table has neither.
pub(crate) fn extensions_cell(
    rl: Option<&RateLimits>,
    mode: crate::catalog::TransactionalMode,
) -> bytes::Bytes {
    let mut cells: Vec<(&[u8], Vec<u8>)> = Vec::new();
    if let Some(rl) = rl {
        let entries: Vec<(&str, String)> = [
            (MAX_READS, rl.max_reads_per_second),
            (MAX_WRITES, rl.max_writes_per_second),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v.to_string())))
        .collect();
        let mut blob = Vec::with_capacity(64);
        let mut put = |s: &[u8]| {
            blob.extend_from_slice(&(s.len() as u32).to_le_bytes());
            blob.extend_from_slice(s);
        };
        let mut count = Vec::new();
        count.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (k, v) in &entries {
            put(k.as_bytes());
            put(v.as_bytes());
        }
        count.extend_from_slice(&blob);
        cells.push((OPTION_NAME.as_bytes(), count));
    }
    // Shown only when set, so tables without it look as they do in Cassandra 5.0.
    if mode != crate::catalog::TransactionalMode::Off {
        cells.push((b"transactional_mode", mode.name().as_bytes().to_vec()));
    }
    crate::codec::map(cells.iter().map(|(k, v)| (*k, v.as_slice())))
}

impl RateLimits {
    /// The limit that applies to an operation of this kind (reads and writes only).
    #[inline]
    pub fn for_kind(&self, kind: OpKind) -> Option<u32> {
        match kind {
            OpKind::Read => self.max_reads_per_second,
            OpKind::Write => self.max_writes_per_second,
            _ => None,
        }
    }
}

impl Prepared {
    /// True for a `BEGIN BATCH ... APPLY BATCH` sent as one statement: its partitions (and
    /// tables) come from [`Engine::limited_partitions`], not from the route.
    pub fn is_text_batch(&self) -> bool {
        matches!(self.plan, Plan::Batch(_))
    }
}

/// One partition an operation accounts against a per-partition limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitedPartition {
    /// The table.
    pub table: TableId,
    /// The partition's token.
    pub token: i64,
    /// `OpKind::Read` or `OpKind::Write`.
    pub kind: OpKind,
    /// The table's limit for that kind, in operations per second.
    pub limit: u32,
}

/// Pushes the partitions of one statement on a limited table (nothing for range scans,
/// virtual tables, unlimited operations, or values that do not bind: execution reports those).
fn push_partitions(
    out: &mut Vec<LimitedPartition>,
    t: &TableDef,
    w: &crate::analyze::Where,
    kind: OpKind,
    b: &exec::Binder,
) {
    let Some(limit) = t
        .options
        .per_partition_rate_limit
        .and_then(|rl| rl.for_kind(kind))
    else {
        return;
    };
    if t.is_virtual() || !w.pk_complete() {
        return;
    }
    if let Ok(keys) = exec::partition_keys(b, t, w) {
        out.extend(keys.iter().map(|k| LimitedPartition {
            table: *t.id.as_bytes(),
            token: k.token,
            kind,
            limit,
        }));
    }
}

fn push_writes<'a>(
    out: &mut Vec<LimitedPartition>,
    writes: impl Iterator<Item = &'a WritePlan>,
    b: &exec::Binder,
) {
    for w in writes {
        push_partitions(out, &w.table, &w.where_, OpKind::Write, b);
    }
}

/// Sorts and removes duplicates: a partition touched twice by one operation counts once.
fn dedup(mut v: Vec<LimitedPartition>) -> Vec<LimitedPartition> {
    if v.len() > 1 {
        v.sort_unstable_by_key(|p| (p.table, p.token, p.kind as u8));
        v.dedup();
    }
    v
}

impl Engine {
    /// Every distinct (table, partition) a bound statement accounts against a limit: the
    /// partitions of an `IN` read, of a multi-partition write, or of a text batch. Empty for
    /// range scans, system tables, DDL and tables without a limit for the operation.
    pub fn limited_partitions<V: BoundValues + ?Sized>(
        &self,
        p: &Prepared,
        values: &V,
    ) -> Vec<LimitedPartition> {
        values.with_decoded(|values| Self::limited_partitions_of(p, values))
    }

    /// [`Engine::limited_partitions`] over decoded values.
    fn limited_partitions_of(p: &Prepared, values: &[Value]) -> Vec<LimitedPartition> {
        let values = exec::canonical_positional(p, values);
        let b = exec::Binder::new(&values, crate::now_micros());
        let mut out = Vec::new();
        match &p.plan {
            Plan::Select(s) if p.kind == OpKind::Read => {
                push_partitions(&mut out, &s.table, &s.where_, OpKind::Read, &b)
            }
            Plan::Select(_) | Plan::Dynamic(_) | Plan::Transaction(_) => {}
            Plan::Write(w) => push_writes(&mut out, std::iter::once(w.as_ref()), &b),
            Plan::Batch(bp) => push_writes(&mut out, bp.writes.iter(), &b),
        }
        dedup(out)
    }

    /// Every distinct (table, partition) a protocol BATCH mutates on limited tables.
    /// Statements that are unknown or do not bind are skipped: the batch's execution rejects
    /// them with the proper error.
    pub fn batch_limited_partitions(
        &self,
        keyspace: Option<&str>,
        batch: &BatchRequest,
    ) -> Vec<LimitedPartition> {
        let mut out = Vec::new();
        for e in &batch.entries {
            let p = match &e.statement {
                BatchQuery::Prepared(id) => self.prepared(id),
                BatchQuery::Text(text) => std::str::from_utf8(text)
                    .ok()
                    .and_then(|q| self.prepare(keyspace, q).ok()),
            };
            let Some(p) = p else { continue };
            if let Plan::Write(w) = &p.plan {
                let b = exec::Binder::new(&e.values, crate::now_micros());
                push_writes(&mut out, std::iter::once(w.as_ref()), &b);
            }
        }
        dedup(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeInfo, RequestContext, Session};
    use bytes::Bytes;
    use sluice_protocol::{BatchEntry, Consistency, QueryParameters, ResultMessage};
    use sluice_storage::{Durability, Storage, StorageConfig};
    use std::sync::Arc;

    /// A statement without bound values.
    const NO_VALUES: &[Value] = &[];

    fn map(pairs: &[(&str, OptionValue)]) -> OptionValue {
        OptionValue::Map(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }
    fn num(s: &str) -> OptionValue {
        OptionValue::Number(s.to_string())
    }

    #[test]
    fn extensions_cell_holds_the_serialized_map() {
        use crate::catalog::TransactionalMode;
        let empty = extensions_cell(None, TransactionalMode::Off);
        assert_eq!(&empty[..], &0i32.to_be_bytes());
        let full = extensions_cell(None, TransactionalMode::Full);
        let pairs = crate::codec::split_map(&full).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(
            (&pairs[0].0[..], &pairs[0].1[..]),
            (&b"transactional_mode"[..], &b"full"[..])
        );
        let rl = RateLimits {
            max_reads_per_second: None,
            max_writes_per_second: Some(10),
        };
        let cell = extensions_cell(Some(&rl), TransactionalMode::Off);
        let pairs = crate::codec::split_map(&cell).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(&pairs[0].0[..], OPTION_NAME.as_bytes());
        let mut want = Vec::new();
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&(MAX_WRITES.len() as u32).to_le_bytes());
        want.extend_from_slice(MAX_WRITES.as_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"10");
        assert_eq!(&pairs[0].1[..], &want[..]);
    }

    #[test]
    fn parses_either_key_both_or_none() {
        let r = parse(&map(&[(MAX_READS, num("100"))])).unwrap().unwrap();
        assert_eq!(
            (r.max_reads_per_second, r.max_writes_per_second),
            (Some(100), None)
        );
        let r = parse(&map(&[
            (MAX_WRITES, OptionValue::String("7".into())),
            (MAX_READS, num("0")),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.max_reads_per_second, r.max_writes_per_second),
            (Some(0), Some(7))
        );
        assert_eq!(parse(&map(&[])).unwrap(), None);
        assert_eq!(
            parse(&map(&[(MAX_WRITES, num("4294967295"))]))
                .unwrap()
                .unwrap()
                .max_writes_per_second,
            Some(u32::MAX)
        );
    }

    #[test]
    fn rejects_unknown_keys_negatives_fractions_and_overflow() {
        let cases = [
            (map(&[("max_writes", num("1"))]), "Unknown keys"),
            (map(&[(MAX_WRITES, num("-1"))]), "non-negative integer"),
            (map(&[(MAX_READS, num("1.5"))]), "non-negative integer"),
            (
                map(&[(MAX_READS, OptionValue::String("ten".into()))]),
                "non-negative integer",
            ),
            (map(&[(MAX_READS, OptionValue::Bool(true))]), "non-negative"),
            (map(&[(MAX_READS, num("4294967296"))]), "32-bit"),
            (num("10"), "must be a map"),
        ];
        for (v, msg) in cases {
            let e = parse(&v).unwrap_err();
            assert_eq!(e.code(), sluice_protocol::ErrorCode::ConfigError, "{v:?}");
            assert!(e.message.contains(msg), "{v:?}: {}", e.message);
        }
    }

    fn engine() -> (Arc<Engine>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(StorageConfig {
            path: dir.path().to_path_buf(),
            durability: Durability::Periodic {
                interval: std::time::Duration::from_millis(50),
            },
            cache_bytes: 8 << 20,
            stores: 1,
        })
        .unwrap();
        let node = NodeInfo::single(
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            9042,
            uuid::Uuid::from_u128(7),
        );
        (Engine::open(storage, node).unwrap(), dir)
    }

    async fn run(e: &Engine, q: &str) -> Result<ResultMessage, DetailedError> {
        let p = e.prepare(None, q)?;
        e.execute(
            &mut Session::default(),
            &p,
            &QueryParameters::default(),
            &RequestContext::now(),
        )
        .await
    }

    fn int(v: i32) -> Value {
        Value::Set(Bytes::copy_from_slice(&v.to_be_bytes()))
    }

    fn tokens(v: &[LimitedPartition]) -> Vec<i64> {
        let mut t: Vec<i64> = v.iter().map(|p| p.token).collect();
        t.sort_unstable();
        t
    }

    fn token_of(v: i32) -> i64 {
        sluice_types::murmur3_token(&v.to_be_bytes())
    }

    #[tokio::test]
    async fn accounts_in_reads_batches_and_skips_scans_and_unlimited_ops() {
        let (e, _dir) = engine();
        run(&e, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await.unwrap();
        run(&e, "CREATE TABLE ks.t (pk int, ck int, v int, PRIMARY KEY (pk, ck)) WITH per_partition_rate_limit = {'max_reads_per_second': 5, 'max_writes_per_second': 3}").await.unwrap();
        run(&e, "CREATE TABLE ks.u (pk int PRIMARY KEY, v int)")
            .await
            .unwrap();

        // Single-partition statements: the route carries token and limit (server fast path).
        let p = e
            .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (?, 1, 1)")
            .unwrap();
        let route = e.route(&p, &[int(1)]).unwrap();
        assert_eq!(route.token, Some(token_of(1)));
        assert_eq!(route.rate_limits.unwrap().for_kind(route.kind), Some(3));
        assert_eq!(e.limited_partitions(&p, &[int(1)][..]).len(), 1);

        // IN read: each partition on its own token, duplicates once.
        let p = e
            .prepare(None, "SELECT * FROM ks.t WHERE pk IN (1, 2, 3, 2)")
            .unwrap();
        let parts = e.limited_partitions(&p, NO_VALUES);
        let mut want = vec![token_of(1), token_of(2), token_of(3)];
        want.sort_unstable();
        assert_eq!(tokens(&parts), want);
        assert!(parts.iter().all(|x| x.kind == OpKind::Read && x.limit == 5));

        // Range scan and system table: nothing counted.
        let p = e.prepare(None, "SELECT * FROM ks.t").unwrap();
        assert!(e.limited_partitions(&p, NO_VALUES).is_empty());
        let p = e
            .prepare(None, "SELECT * FROM system.local WHERE key = 'local'")
            .unwrap();
        assert!(e.limited_partitions(&p, NO_VALUES).is_empty());

        // Text batch: every distinct partition on a limited table; the unlimited table not.
        let p = e
            .prepare(None, "BEGIN BATCH INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 1); INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 1); INSERT INTO ks.t (pk, ck, v) VALUES (9, 1, 1); INSERT INTO ks.u (pk, v) VALUES (4, 4); APPLY BATCH")
            .unwrap();
        assert!(p.is_text_batch());
        let parts = e.limited_partitions(&p, NO_VALUES);
        let mut want = vec![token_of(1), token_of(9)];
        want.sort_unstable();
        assert_eq!(tokens(&parts), want);
        assert!(parts
            .iter()
            .all(|x| x.kind == OpKind::Write && x.limit == 3));

        // Protocol BATCH (prepared and text entries).
        let ins = e
            .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, 0)")
            .unwrap();
        let batch = BatchRequest {
            batch_type: 1,
            entries: vec![
                BatchEntry {
                    statement: BatchQuery::Prepared(Bytes::copy_from_slice(&ins.id)),
                    values: vec![int(5), int(1)],
                },
                BatchEntry {
                    statement: BatchQuery::Prepared(Bytes::copy_from_slice(&ins.id)),
                    values: vec![int(5), int(2)],
                },
                BatchEntry {
                    statement: BatchQuery::Text(Bytes::from_static(
                        b"UPDATE ks.t SET v = 1 WHERE pk = 6 AND ck = 1",
                    )),
                    values: vec![],
                },
                BatchEntry {
                    statement: BatchQuery::Text(Bytes::from_static(
                        b"INSERT INTO ks.u (pk, v) VALUES (1, 1)",
                    )),
                    values: vec![],
                },
            ],
            consistency: Consistency::One,
            serial_consistency: None,
            default_timestamp: None,
        };
        let mut want = vec![token_of(5), token_of(6)];
        want.sort_unstable();
        assert_eq!(tokens(&e.batch_limited_partitions(None, &batch)), want);

        // ALTER replaces the map: reads only; writes are then unlimited.
        run(
            &e,
            "ALTER TABLE ks.t WITH per_partition_rate_limit = {'max_reads_per_second': 8}",
        )
        .await
        .unwrap();
        let p = e
            .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 1)")
            .unwrap();
        let route = e.route(&p, &[]).unwrap();
        assert_eq!(route.rate_limits.unwrap().for_kind(OpKind::Write), None);
        assert!(e.limited_partitions(&p, NO_VALUES).is_empty());
        run(
            &e,
            "ALTER TABLE ks.t WITH per_partition_rate_limit = {'max_reads_per_second': -1}",
        )
        .await
        .unwrap_err();
        run(&e, "ALTER TABLE ks.t WITH per_partition_rate_limit = {}")
            .await
            .unwrap();
        assert_eq!(
            e.table("ks", "t").unwrap().options.per_partition_rate_limit,
            None
        );
    }
}
