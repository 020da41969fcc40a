//! The schema catalog: keyspaces, tables, columns and table options.
//!
//! The catalog is an immutable [`Schema`] value; DDL builds a new one and swaps it in
//! (copy-on-write), so request-path readers only clone an `Arc`. User keyspaces are
//! persisted as one JSON document in the storage metadata store; the system keyspaces are
//! built in and never persisted.

use crate::system::{self, SystemTable};
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use sluice_protocol::{DbError, DetailedError};
use sluice_storage::{ColumnId, Order, RegularColumns, TableLayout};
use sluice_types::CqlType;
use std::collections::BTreeMap;
use std::sync::Arc;
use uuid::Uuid;

/// The role of a column in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColumnKind {
    /// A partition key component.
    PartitionKey,
    /// A clustering column.
    Clustering,
    /// A regular column.
    Regular,
    /// A static column (one value per partition).
    Static,
}

impl ColumnKind {
    /// The name used in `system_schema.columns.kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ColumnKind::PartitionKey => "partition_key",
            ColumnKind::Clustering => "clustering",
            ColumnKind::Regular => "regular",
            ColumnKind::Static => "static",
        }
    }

    /// True for partition key and clustering columns.
    pub const fn is_primary_key(self) -> bool {
        matches!(self, ColumnKind::PartitionKey | ColumnKind::Clustering)
    }
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDef {
    /// Column name (case preserved).
    pub name: String,
    /// Column type.
    pub ty: CqlType,
    /// Role.
    pub kind: ColumnKind,
    /// Component index for key columns, -1 for regular and static columns.
    pub position: i32,
    /// Stable storage id, never reused within the table.
    pub id: ColumnId,
    /// Clustering order (only meaningful for clustering columns).
    pub order: Order,
}

/// ScyllaDB's `per_partition_rate_limit` table option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RateLimits {
    /// Reads per second allowed per partition.
    pub max_reads_per_second: Option<u32>,
    /// Writes per second allowed per partition.
    pub max_writes_per_second: Option<u32>,
}

/// Table options (`WITH ...`), with Cassandra 5.0 defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableOptions {
    /// `additional_write_policy`.
    pub additional_write_policy: String,
    /// `bloom_filter_fp_chance`.
    pub bloom_filter_fp_chance: f64,
    /// `caching`.
    pub caching: BTreeMap<String, String>,
    /// `cdc`.
    pub cdc: bool,
    /// `comment`.
    pub comment: String,
    /// `compaction`.
    pub compaction: BTreeMap<String, String>,
    /// `compression`.
    pub compression: BTreeMap<String, String>,
    /// `crc_check_chance`.
    pub crc_check_chance: f64,
    /// `default_time_to_live` (seconds; 0 = none).
    pub default_time_to_live: i32,
    /// `gc_grace_seconds`.
    pub gc_grace_seconds: i32,
    /// `max_index_interval`.
    pub max_index_interval: i32,
    /// `memtable_flush_period_in_ms`.
    pub memtable_flush_period_in_ms: i32,
    /// `min_index_interval`.
    pub min_index_interval: i32,
    /// `read_repair`.
    pub read_repair: String,
    /// `speculative_retry`.
    pub speculative_retry: String,
    /// `memtable`.
    pub memtable: String,
    /// ScyllaDB's `per_partition_rate_limit`.
    pub per_partition_rate_limit: Option<RateLimits>,
    /// Cassandra 6's `transactional_mode`.
    #[serde(default)]
    pub transactional_mode: TransactionalMode,
}

/// How plain writes to a table are ordered with its lightweight transactions
/// (Cassandra 6's `transactional_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransactionalMode {
    /// Plain writes keep their own timestamps: last-write-wins between them and LWTs.
    #[default]
    Off,
    /// A plain write to one partition gets a commit-assigned timestamp, above every write
    /// stored in its partition's stripe, as an LWT does: plain writes and LWTs are then
    /// linearizable together.
    Full,
}

impl TransactionalMode {
    /// The option's value as CQL spells it.
    pub fn name(self) -> &'static str {
        match self {
            TransactionalMode::Off => "off",
            TransactionalMode::Full => "full",
        }
    }
}

fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            additional_write_policy: "99p".into(),
            bloom_filter_fp_chance: 0.01,
            caching: string_map(&[("keys", "ALL"), ("rows_per_partition", "NONE")]),
            cdc: false,
            comment: String::new(),
            compaction: string_map(&[
                (
                    "class",
                    "org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy",
                ),
                ("max_threshold", "32"),
                ("min_threshold", "4"),
            ]),
            compression: string_map(&[
                ("chunk_length_in_kb", "16"),
                ("class", "org.apache.cassandra.io.compress.LZ4Compressor"),
            ]),
            crc_check_chance: 1.0,
            default_time_to_live: 0,
            gc_grace_seconds: 864000,
            max_index_interval: 2048,
            memtable_flush_period_in_ms: 0,
            min_index_interval: 128,
            read_repair: "BLOCKING".into(),
            speculative_retry: "99p".into(),
            memtable: "default".into(),
            per_partition_rate_limit: None,
            transactional_mode: TransactionalMode::Off,
        }
    }
}

/// A dropped column, kept so that its old data stays invisible and for `system_schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedColumn {
    /// Name.
    pub name: String,
    /// Type it had.
    pub ty: CqlType,
    /// Kind it had.
    pub kind: ColumnKind,
    /// When it was dropped (µs since the epoch).
    pub dropped_time_micros: i64,
}

/// A table definition.
#[derive(Debug, Clone)]
pub struct TableDef {
    /// Keyspace.
    pub keyspace: String,
    /// Table name.
    pub name: String,
    /// Table id.
    pub id: Uuid,
    /// Columns in `SELECT *` order: partition key, clustering, then static and regular
    /// columns by name.
    pub columns: Vec<ColumnDef>,
    /// Indexes into `columns` of the partition key components, in order.
    pub partition_key: Vec<usize>,
    /// Indexes into `columns` of the clustering columns, in order.
    pub clustering: Vec<usize>,
    /// Options.
    pub options: TableOptions,
    /// Dropped columns.
    pub dropped: Vec<DroppedColumn>,
    /// Next column id to hand out.
    pub next_column_id: ColumnId,
    /// For system tables: which virtual table this is.
    pub system: Option<SystemTable>,
    /// What storage needs to order rows.
    pub layout: TableLayout,
}

impl TableDef {
    /// Builds a table from its columns (any order), sorting them into `SELECT *` order.
    pub fn new(
        keyspace: &str,
        name: &str,
        id: Uuid,
        mut columns: Vec<ColumnDef>,
        options: TableOptions,
    ) -> TableDef {
        columns.sort_by(|a, b| {
            let rank = |c: &ColumnDef| match c.kind {
                ColumnKind::PartitionKey => 0,
                ColumnKind::Clustering => 1,
                ColumnKind::Static => 2,
                ColumnKind::Regular => 3,
            };
            rank(a)
                .cmp(&rank(b))
                .then(a.position.cmp(&b.position))
                .then(a.name.cmp(&b.name))
        });
        let next_column_id = columns.iter().map(|c| c.id + 1).max().unwrap_or(0);
        let mut t = TableDef {
            keyspace: keyspace.to_string(),
            name: name.to_string(),
            id,
            columns,
            partition_key: Vec::new(),
            clustering: Vec::new(),
            options,
            dropped: Vec::new(),
            next_column_id,
            system: None,
            layout: TableLayout {
                id: *id.as_bytes(),
                clustering: Vec::new(),
                regular: None,
                gc_grace_seconds: sluice_storage::DEFAULT_GC_GRACE_SECONDS,
            },
        };
        t.reindex();
        t
    }

    /// `gc_grace_seconds` as storage takes it (the option is validated non-negative).
    fn gc_grace_for_storage(&self) -> u32 {
        u32::try_from(self.options.gc_grace_seconds).unwrap_or(0)
    }

    /// Recomputes the key index vectors and the storage layout after a column change.
    pub fn reindex(&mut self) {
        self.partition_key = (0..self.columns.len())
            .filter(|&i| self.columns[i].kind == ColumnKind::PartitionKey)
            .collect();
        self.clustering = (0..self.columns.len())
            .filter(|&i| self.columns[i].kind == ColumnKind::Clustering)
            .collect();
        let regular = self
            .columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Regular)
            .map(|c| (c.id, c.ty.is_multi_cell_collection()))
            .collect();
        self.layout = TableLayout {
            id: *self.id.as_bytes(),
            clustering: self
                .clustering
                .iter()
                .map(|&i| (self.columns[i].ty.clone(), self.columns[i].order))
                .collect(),
            regular: Some(Arc::new(RegularColumns::new(regular))),
            gc_grace_seconds: self.gc_grace_for_storage(),
        };
    }

    /// The column with this name.
    pub fn column(&self, name: &str) -> Option<(usize, &ColumnDef)> {
        self.columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
    }

    /// True when the table has counter columns.
    pub fn is_counter(&self) -> bool {
        self.columns.iter().any(|c| c.ty.is_counter())
    }

    /// True when the table has static columns.
    pub fn has_statics(&self) -> bool {
        self.columns.iter().any(|c| c.kind == ColumnKind::Static)
    }

    /// True for a virtual (system) table.
    pub fn is_virtual(&self) -> bool {
        self.system.is_some()
    }
}

/// A keyspace definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyspaceDef {
    /// Name.
    pub name: String,
    /// Replication options with a fully qualified `class`.
    pub replication: BTreeMap<String, String>,
    /// `durable_writes`.
    pub durable_writes: bool,
}

impl KeyspaceDef {
    /// The replication factor of this node's data center (1 when unknown).
    pub fn replication_factor(&self, data_center: &str) -> u32 {
        let v = self
            .replication
            .get("replication_factor")
            .or_else(|| self.replication.get(data_center));
        v.and_then(|s| s.parse().ok()).unwrap_or(1)
    }
}

/// The whole schema at one version.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    /// Keyspaces by name (system keyspaces included).
    pub keyspaces: BTreeMap<String, KeyspaceDef>,
    /// Tables by (keyspace, name).
    pub tables: BTreeMap<(String, String), Arc<TableDef>>,
    /// The schema version UUID (digest of the user schema).
    pub version: Uuid,
    /// The metadata group's schema epoch this schema was installed at; `None` on a node
    /// without a cluster, and for a schema loaded from the local store.
    pub epoch: Option<u64>,
}

/// System keyspaces, which users cannot alter.
pub const SYSTEM_KEYSPACES: [&str; 5] = [
    "system",
    "system_schema",
    "system_auth",
    "system_distributed",
    "system_traces",
];

/// True for a built-in keyspace name (including the virtual ones).
pub fn is_system_keyspace(name: &str) -> bool {
    SYSTEM_KEYSPACES.contains(&name) || is_virtual_keyspace(name)
}

/// True for the keyspaces of virtual tables, which `system_schema` and DESCRIBE leave out,
/// as Cassandra does.
pub fn is_virtual_keyspace(name: &str) -> bool {
    matches!(name, "system_virtual_schema" | "system_views")
}

impl Schema {
    /// A schema holding only the built-in keyspaces.
    pub fn with_system() -> Schema {
        let mut s = Schema::default();
        for ks in system::keyspaces() {
            s.keyspaces.insert(ks.name.clone(), ks);
        }
        for t in system::tables() {
            s.tables
                .insert((t.keyspace.clone(), t.name.clone()), Arc::new(t));
        }
        s.version = s.digest();
        s
    }

    /// Looks a table up.
    pub fn table(&self, keyspace: &str, name: &str) -> Option<&Arc<TableDef>> {
        self.tables.get(&(keyspace.to_string(), name.to_string()))
    }

    /// The tables of one keyspace, by name.
    pub fn tables_of<'a>(&'a self, keyspace: &'a str) -> impl Iterator<Item = &'a Arc<TableDef>> {
        self.tables
            .range((keyspace.to_string(), String::new())..)
            .take_while(move |((k, _), _)| k == keyspace)
            .map(|(_, t)| t)
    }

    /// Serializes the user part of the schema (what is persisted).
    pub fn to_persisted(&self) -> PersistedSchema {
        let keyspaces = self
            .keyspaces
            .values()
            .filter(|k| !is_system_keyspace(&k.name))
            .cloned()
            .collect();
        let tables = self
            .tables
            .values()
            .filter(|t| !t.is_virtual())
            .map(|t| PersistedTable::from_def(t))
            .collect();
        PersistedSchema {
            format: 1,
            keyspaces,
            tables,
        }
    }

    /// Rebuilds a schema from its persisted form plus the built-in keyspaces.
    pub fn from_persisted(p: PersistedSchema) -> Result<Schema, &'static str> {
        let mut s = Schema::with_system();
        for ks in p.keyspaces {
            s.keyspaces.insert(ks.name.clone(), ks);
        }
        for t in p.tables {
            let def = t.into_def()?;
            s.tables
                .insert((def.keyspace.clone(), def.name.clone()), Arc::new(def));
        }
        s.version = s.digest();
        Ok(s)
    }

    /// The schema version: an MD5 digest of the persisted user schema, as a UUID.
    pub fn digest(&self) -> Uuid {
        let json = serde_json::to_vec(&self.to_persisted()).unwrap_or_default();
        let mut h = Md5::new();
        h.update(&json);
        let mut bytes: [u8; 16] = h.finalize().into();
        // Name-based UUID (version 3) as Cassandra makes its schema versions.
        bytes[6] = (bytes[6] & 0x0f) | 0x30;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Uuid::from_bytes(bytes)
    }
}

/// The persisted form of the user schema.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedSchema {
    /// Format version.
    pub format: u32,
    /// User keyspaces.
    pub keyspaces: Vec<KeyspaceDef>,
    /// User tables.
    pub tables: Vec<PersistedTable>,
}

/// A persisted column.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedColumn {
    name: String,
    ty: String,
    kind: ColumnKind,
    position: i32,
    id: ColumnId,
    desc: bool,
}

/// A persisted dropped column.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedDropped {
    name: String,
    ty: String,
    kind: ColumnKind,
    dropped_time_micros: i64,
}

/// A persisted table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedTable {
    keyspace: String,
    name: String,
    id: Uuid,
    columns: Vec<PersistedColumn>,
    options: TableOptions,
    dropped: Vec<PersistedDropped>,
    next_column_id: ColumnId,
}

impl PersistedTable {
    pub(crate) fn from_def(t: &TableDef) -> PersistedTable {
        PersistedTable {
            keyspace: t.keyspace.clone(),
            name: t.name.clone(),
            id: t.id,
            columns: t
                .columns
                .iter()
                .map(|c| PersistedColumn {
                    name: c.name.clone(),
                    ty: c.ty.to_string(),
                    kind: c.kind,
                    position: c.position,
                    id: c.id,
                    desc: c.order == Order::Desc,
                })
                .collect(),
            options: t.options.clone(),
            dropped: t
                .dropped
                .iter()
                .map(|d| PersistedDropped {
                    name: d.name.clone(),
                    ty: d.ty.to_string(),
                    kind: d.kind,
                    dropped_time_micros: d.dropped_time_micros,
                })
                .collect(),
            next_column_id: t.next_column_id,
        }
    }

    pub(crate) fn into_def(self) -> Result<TableDef, &'static str> {
        let mut cols = Vec::with_capacity(self.columns.len());
        for c in self.columns {
            cols.push(ColumnDef {
                name: c.name,
                ty: CqlType::parse(&c.ty).map_err(|e| e.0)?,
                kind: c.kind,
                position: c.position,
                id: c.id,
                order: if c.desc { Order::Desc } else { Order::Asc },
            });
        }
        let mut def = TableDef::new(&self.keyspace, &self.name, self.id, cols, self.options);
        def.next_column_id = def.next_column_id.max(self.next_column_id);
        for d in self.dropped {
            def.dropped.push(DroppedColumn {
                name: d.name,
                ty: CqlType::parse(&d.ty).map_err(|e| e.0)?,
                kind: d.kind,
                dropped_time_micros: d.dropped_time_micros,
            });
        }
        Ok(def)
    }
}

/// Shorthand for an Invalid error with a built message (cold path).
pub(crate) fn invalid(msg: impl Into<std::borrow::Cow<'static, str>>) -> DetailedError {
    DetailedError::new(DbError::Invalid, msg)
}

/// Validates a keyspace or table name as Cassandra does (`\w+`, at most 48 characters).
pub(crate) fn check_name(kind: &str, name: &str) -> Result<(), DetailedError> {
    if name.is_empty()
        || name.len() > 48
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(invalid(format!(
            "{kind} name must not be empty, more than 48 characters long, or contain non-alphanumeric-underscore characters (got \"{name}\")"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_types::NativeType;

    fn sample() -> TableDef {
        let cols = vec![
            ColumnDef {
                name: "v".into(),
                ty: CqlType::Map(
                    Box::new(CqlType::native(NativeType::Text)),
                    Box::new(CqlType::native(NativeType::Int)),
                ),
                kind: ColumnKind::Regular,
                position: -1,
                id: 3,
                order: Order::Asc,
            },
            ColumnDef {
                name: "ck".into(),
                ty: CqlType::native(NativeType::Int),
                kind: ColumnKind::Clustering,
                position: 0,
                id: 1,
                order: Order::Desc,
            },
            ColumnDef {
                name: "pk".into(),
                ty: CqlType::native(NativeType::Bigint),
                kind: ColumnKind::PartitionKey,
                position: 0,
                id: 0,
                order: Order::Asc,
            },
            ColumnDef {
                name: "s".into(),
                ty: CqlType::native(NativeType::Text),
                kind: ColumnKind::Static,
                position: -1,
                id: 2,
                order: Order::Asc,
            },
        ];
        TableDef::new("ks", "t", Uuid::from_u128(7), cols, TableOptions::default())
    }

    #[test]
    fn columns_sorted_in_select_order() {
        let t = sample();
        let names: Vec<_> = t.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["pk", "ck", "s", "v"]);
        assert_eq!(t.partition_key, vec![0]);
        assert_eq!(t.clustering, vec![1]);
        assert_eq!(t.next_column_id, 4);
        assert_eq!(t.layout.clustering.len(), 1);
        assert_eq!(t.layout.clustering[0].1, Order::Desc);
    }

    #[test]
    fn persisted_round_trip_and_digest_changes() {
        let mut s = Schema::with_system();
        let v0 = s.version;
        s.keyspaces.insert(
            "ks".into(),
            KeyspaceDef {
                name: "ks".into(),
                replication: string_map(&[
                    ("class", "org.apache.cassandra.locator.SimpleStrategy"),
                    ("replication_factor", "1"),
                ]),
                durable_writes: true,
            },
        );
        s.tables
            .insert(("ks".into(), "t".into()), Arc::new(sample()));
        let v1 = s.digest();
        assert_ne!(v0, v1);
        let json = serde_json::to_vec(&s.to_persisted()).unwrap();
        let back: PersistedSchema = serde_json::from_slice(&json).unwrap();
        let s2 = Schema::from_persisted(back).unwrap();
        assert_eq!(s2.version, v1);
        let t = s2.table("ks", "t").unwrap();
        assert_eq!(t.columns, sample().columns);
        assert!(s2.table("system", "local").is_some());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("Keyspace", "good_name1").is_ok());
        assert!(check_name("Keyspace", "bad-name").is_err());
        assert!(check_name("Keyspace", "").is_err());
        assert!(check_name("Keyspace", &"x".repeat(49)).is_err());
    }
}
