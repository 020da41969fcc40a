//! Built-in keyspaces and the virtual system tables drivers read (spec §3.1-§3.5).
//!
//! System tables are generated on demand from the catalog and the node's identity; they
//! are small (one row per keyspace / table / column), so a query materialises the rows,
//! filters and pages them.

use crate::catalog::{ColumnDef, ColumnKind, KeyspaceDef, Schema, TableDef, TableOptions};
use crate::codec;
use crate::NodeInfo;
use bytes::Bytes;
use md5::{Digest, Md5};
use sluice_ring::{Node, TokenMetadata};
use sluice_storage::Order;
use sluice_types::CqlType;
use std::collections::BTreeMap;
use uuid::Uuid;

/// Which generator produces a virtual table's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemTable {
    /// `system.local`.
    Local,
    /// `system.peers`: the other nodes that serve their ranges.
    Peers,
    /// `system.peers_v2`: as `system.peers`, with ports.
    PeersV2,
    /// `system_schema.keyspaces`.
    Keyspaces,
    /// `system_schema.tables`.
    Tables,
    /// `system_schema.columns`.
    Columns,
    /// `system_schema.dropped_columns`.
    DroppedColumns,
    /// `system_schema.scylla_tables`.
    ScyllaTables,
    /// `system_views.settings`: the node's settings, by Cassandra's names.
    Settings,
    /// `system_views.token_replicas`: the ring's replicas of a keyspace's token, so that
    /// tests can compare drivers' token maps with the server's placement.
    TokenReplicas,
    /// `system_auth.roles`.
    Roles,
    /// `system_auth.role_members`.
    RoleMembers,
    /// `system_auth.role_permissions`.
    RolePermissions,
    /// Any other system table: always empty (types, functions, size estimates...).
    Empty,
}

const LOCAL_STRATEGY: &str = "org.apache.cassandra.locator.LocalStrategy";
const SIMPLE_STRATEGY: &str = "org.apache.cassandra.locator.SimpleStrategy";

/// The built-in keyspaces.
pub fn keyspaces() -> Vec<KeyspaceDef> {
    let ks = |name: &str, class: &str, rf: Option<&str>| {
        let mut replication = BTreeMap::new();
        replication.insert("class".to_string(), class.to_string());
        if let Some(rf) = rf {
            replication.insert("replication_factor".to_string(), rf.to_string());
        }
        KeyspaceDef {
            name: name.to_string(),
            replication,
            durable_writes: true,
        }
    };
    vec![
        ks("system", LOCAL_STRATEGY, None),
        ks("system_schema", LOCAL_STRATEGY, None),
        ks("system_auth", SIMPLE_STRATEGY, Some("1")),
        ks("system_distributed", SIMPLE_STRATEGY, Some("3")),
        ks("system_traces", SIMPLE_STRATEGY, Some("2")),
        ks("system_virtual_schema", LOCAL_STRATEGY, None),
        ks("system_views", LOCAL_STRATEGY, None),
    ]
}

const TABLE_OPTION_COLUMNS: &[(&str, &str)] = &[
    ("additional_write_policy", "text"),
    ("bloom_filter_fp_chance", "double"),
    ("caching", "frozen<map<text, text>>"),
    ("cdc", "boolean"),
    ("comment", "text"),
    ("compaction", "frozen<map<text, text>>"),
    ("compression", "frozen<map<text, text>>"),
    ("crc_check_chance", "double"),
    ("dclocal_read_repair_chance", "double"),
    ("default_time_to_live", "int"),
    ("extensions", "frozen<map<text, blob>>"),
    ("gc_grace_seconds", "int"),
    ("max_index_interval", "int"),
    ("memtable", "text"),
    ("memtable_flush_period_in_ms", "int"),
    ("min_index_interval", "int"),
    ("read_repair", "text"),
    ("read_repair_chance", "double"),
    ("speculative_retry", "text"),
];

struct Def {
    ks: &'static str,
    name: &'static str,
    cols: Vec<(&'static str, &'static str)>,
    pk: &'static [&'static str],
    ck: &'static [&'static str],
    gen: SystemTable,
}

fn def(
    ks: &'static str,
    name: &'static str,
    cols: &[(&'static str, &'static str)],
    pk: &'static [&'static str],
    ck: &'static [&'static str],
    gen: SystemTable,
) -> Def {
    Def {
        ks,
        name,
        cols: cols.to_vec(),
        pk,
        ck,
        gen,
    }
}

/// A stable id for a system table (name-based, like Cassandra's).
fn system_table_id(ks: &str, name: &str) -> Uuid {
    let mut h = Md5::new();
    h.update(ks.as_bytes());
    h.update(b".");
    h.update(name.as_bytes());
    let mut b: [u8; 16] = h.finalize().into();
    b[6] = (b[6] & 0x0f) | 0x30;
    b[8] = (b[8] & 0x3f) | 0x80;
    Uuid::from_bytes(b)
}

fn build(d: Def) -> TableDef {
    let mut columns = Vec::with_capacity(d.cols.len());
    for (i, (name, ty)) in d.cols.iter().enumerate() {
        let (kind, position) = if let Some(p) = d.pk.iter().position(|k| k == name) {
            (ColumnKind::PartitionKey, p as i32)
        } else if let Some(p) = d.ck.iter().position(|k| k == name) {
            (ColumnKind::Clustering, p as i32)
        } else {
            (ColumnKind::Regular, -1)
        };
        columns.push(ColumnDef {
            name: name.to_string(),
            ty: CqlType::parse(ty).unwrap_or(CqlType::native(sluice_types::NativeType::Blob)),
            kind,
            position,
            id: i as u16,
            order: Order::Asc,
        });
    }
    let options = TableOptions {
        comment: format!("{} {}", d.ks, d.name),
        ..TableOptions::default()
    };
    let mut t = TableDef::new(
        d.ks,
        d.name,
        system_table_id(d.ks, d.name),
        columns,
        options,
    );
    t.system = Some(d.gen);
    t
}

/// The built-in tables, all virtual.
pub fn tables() -> Vec<TableDef> {
    use SystemTable::*;
    let schema_cols = |extra: &[(&'static str, &'static str)]| {
        let mut v = extra.to_vec();
        v.extend_from_slice(TABLE_OPTION_COLUMNS);
        v
    };
    let defs = vec![
        def(
            "system",
            "local",
            &[
                ("key", "text"),
                ("bootstrapped", "text"),
                ("broadcast_address", "inet"),
                ("broadcast_port", "int"),
                ("cluster_name", "text"),
                ("cql_version", "text"),
                ("data_center", "text"),
                ("gossip_generation", "int"),
                ("host_id", "uuid"),
                ("listen_address", "inet"),
                ("listen_port", "int"),
                ("native_protocol_version", "text"),
                ("partitioner", "text"),
                ("rack", "text"),
                ("release_version", "text"),
                ("rpc_address", "inet"),
                ("rpc_port", "int"),
                ("schema_version", "uuid"),
                ("tokens", "set<text>"),
                ("truncated_at", "map<uuid, blob>"),
            ],
            &["key"],
            &[],
            Local,
        ),
        def(
            "system",
            "peers",
            &[
                ("peer", "inet"),
                ("data_center", "text"),
                ("host_id", "uuid"),
                ("preferred_ip", "inet"),
                ("rack", "text"),
                ("release_version", "text"),
                ("rpc_address", "inet"),
                ("schema_version", "uuid"),
                ("tokens", "set<text>"),
            ],
            &["peer"],
            &[],
            Peers,
        ),
        def(
            "system",
            "peers_v2",
            &[
                ("peer", "inet"),
                ("peer_port", "int"),
                ("data_center", "text"),
                ("host_id", "uuid"),
                ("native_address", "inet"),
                ("native_port", "int"),
                ("preferred_ip", "inet"),
                ("preferred_port", "int"),
                ("rack", "text"),
                ("release_version", "text"),
                ("schema_version", "uuid"),
                ("tokens", "set<text>"),
            ],
            &["peer"],
            &["peer_port"],
            PeersV2,
        ),
        def(
            "system",
            "size_estimates",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("range_start", "text"),
                ("range_end", "text"),
                ("mean_partition_size", "bigint"),
                ("partitions_count", "bigint"),
            ],
            &["keyspace_name"],
            &["table_name", "range_start", "range_end"],
            Empty,
        ),
        def(
            "system_schema",
            "keyspaces",
            &[
                ("keyspace_name", "text"),
                ("durable_writes", "boolean"),
                ("replication", "frozen<map<text, text>>"),
            ],
            &["keyspace_name"],
            &[],
            Keyspaces,
        ),
        def(
            "system_schema",
            "tables",
            &schema_cols(&[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("flags", "frozen<set<text>>"),
                ("id", "uuid"),
            ]),
            &["keyspace_name"],
            &["table_name"],
            Tables,
        ),
        def(
            "system_schema",
            "columns",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("column_name", "text"),
                ("clustering_order", "text"),
                ("column_name_bytes", "blob"),
                ("kind", "text"),
                ("position", "int"),
                ("type", "text"),
            ],
            &["keyspace_name"],
            &["table_name", "column_name"],
            Columns,
        ),
        def(
            "system_schema",
            "dropped_columns",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("column_name", "text"),
                ("dropped_time", "timestamp"),
                ("kind", "text"),
                ("type", "text"),
            ],
            &["keyspace_name"],
            &["table_name", "column_name"],
            DroppedColumns,
        ),
        def(
            "system_schema",
            "types",
            &[
                ("keyspace_name", "text"),
                ("type_name", "text"),
                ("field_names", "frozen<list<text>>"),
                ("field_types", "frozen<list<text>>"),
            ],
            &["keyspace_name"],
            &["type_name"],
            Empty,
        ),
        def(
            "system_schema",
            "functions",
            &[
                ("keyspace_name", "text"),
                ("function_name", "text"),
                ("argument_types", "frozen<list<text>>"),
                ("argument_names", "frozen<list<text>>"),
                ("body", "text"),
                ("called_on_null_input", "boolean"),
                ("language", "text"),
                ("return_type", "text"),
            ],
            &["keyspace_name"],
            &["function_name", "argument_types"],
            Empty,
        ),
        def(
            "system_schema",
            "aggregates",
            &[
                ("keyspace_name", "text"),
                ("aggregate_name", "text"),
                ("argument_types", "frozen<list<text>>"),
                ("final_func", "text"),
                ("initcond", "text"),
                ("return_type", "text"),
                ("state_func", "text"),
                ("state_type", "text"),
            ],
            &["keyspace_name"],
            &["aggregate_name", "argument_types"],
            Empty,
        ),
        def(
            "system_schema",
            "triggers",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("trigger_name", "text"),
                ("options", "frozen<map<text, text>>"),
            ],
            &["keyspace_name"],
            &["table_name", "trigger_name"],
            Empty,
        ),
        def(
            "system_schema",
            "indexes",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("index_name", "text"),
                ("kind", "text"),
                ("options", "frozen<map<text, text>>"),
            ],
            &["keyspace_name"],
            &["table_name", "index_name"],
            Empty,
        ),
        def(
            "system_schema",
            "views",
            &schema_cols(&[
                ("keyspace_name", "text"),
                ("view_name", "text"),
                ("base_table_id", "uuid"),
                ("base_table_name", "text"),
                ("id", "uuid"),
                ("include_all_columns", "boolean"),
                ("where_clause", "text"),
            ]),
            &["keyspace_name"],
            &["view_name"],
            Empty,
        ),
        def(
            "system_schema",
            "scylla_tables",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("cdc", "frozen<map<text, text>>"),
                ("in_memory", "boolean"),
                ("partitioner", "text"),
                ("version", "uuid"),
            ],
            &["keyspace_name"],
            &["table_name"],
            ScyllaTables,
        ),
        def(
            "system_schema",
            "scylla_keyspaces",
            &[
                ("keyspace_name", "text"),
                ("initial_tablets", "int"),
                ("storage_options", "frozen<map<text, text>>"),
                ("storage_type", "text"),
            ],
            &["keyspace_name"],
            &[],
            Empty,
        ),
        def(
            "system_views",
            "settings",
            &[("name", "text"), ("value", "text")],
            &["name"],
            &[],
            Settings,
        ),
        def(
            "system_views",
            "token_replicas",
            &[
                ("keyspace_name", "text"),
                ("token_value", "bigint"),
                ("replicas", "list<inet>"),
            ],
            &["keyspace_name", "token_value"],
            &[],
            TokenReplicas,
        ),
        def(
            "system_virtual_schema",
            "keyspaces",
            &[("keyspace_name", "text")],
            &["keyspace_name"],
            &[],
            Empty,
        ),
        def(
            "system_virtual_schema",
            "tables",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("comment", "text"),
            ],
            &["keyspace_name"],
            &["table_name"],
            Empty,
        ),
        def(
            "system_virtual_schema",
            "columns",
            &[
                ("keyspace_name", "text"),
                ("table_name", "text"),
                ("column_name", "text"),
                ("clustering_order", "text"),
                ("column_name_bytes", "blob"),
                ("kind", "text"),
                ("position", "int"),
                ("type", "text"),
            ],
            &["keyspace_name"],
            &["table_name", "column_name"],
            Empty,
        ),
        def(
            "system_auth",
            "roles",
            &[
                ("role", "text"),
                ("can_login", "boolean"),
                ("is_superuser", "boolean"),
                ("member_of", "set<text>"),
                ("salted_hash", "text"),
            ],
            &["role"],
            &[],
            Roles,
        ),
        def(
            "system_auth",
            "role_members",
            &[("role", "text"), ("member", "text")],
            &["role"],
            &["member"],
            RoleMembers,
        ),
        def(
            "system_auth",
            "role_permissions",
            &[
                ("role", "text"),
                ("resource", "text"),
                ("permissions", "set<text>"),
            ],
            &["role"],
            &["resource"],
            RolePermissions,
        ),
        def(
            "system_auth",
            "network_permissions",
            &[("role", "text"), ("dcs", "frozen<set<text>>")],
            &["role"],
            &[],
            Empty,
        ),
        def(
            "system_distributed",
            "repair_history",
            &[
                ("keyspace_name", "text"),
                ("columnfamily_name", "text"),
                ("id", "timeuuid"),
                ("coordinator", "inet"),
                ("exception_message", "text"),
                ("finished_at", "timestamp"),
                ("parent_id", "timeuuid"),
                ("participants", "set<inet>"),
                ("range_begin", "text"),
                ("range_end", "text"),
                ("started_at", "timestamp"),
                ("status", "text"),
            ],
            &["keyspace_name", "columnfamily_name"],
            &["id"],
            Empty,
        ),
        def(
            "system_distributed",
            "parent_repair_history",
            &[
                ("parent_id", "timeuuid"),
                ("columnfamily_names", "set<text>"),
                ("exception_message", "text"),
                ("finished_at", "timestamp"),
                ("keyspace_name", "text"),
                ("options", "map<text, text>"),
                ("requested_ranges", "set<text>"),
                ("started_at", "timestamp"),
                ("successful_ranges", "set<text>"),
            ],
            &["parent_id"],
            &[],
            Empty,
        ),
        def(
            "system_distributed",
            "view_build_status",
            &[
                ("keyspace_name", "text"),
                ("view_name", "text"),
                ("host_id", "uuid"),
                ("status", "text"),
            ],
            &["keyspace_name", "view_name"],
            &["host_id"],
            Empty,
        ),
        def(
            "system_traces",
            "sessions",
            &[
                ("session_id", "uuid"),
                ("client", "inet"),
                ("command", "text"),
                ("coordinator", "inet"),
                ("coordinator_port", "int"),
                ("duration", "int"),
                ("parameters", "map<text, text>"),
                ("request", "text"),
                ("started_at", "timestamp"),
            ],
            &["session_id"],
            &[],
            Empty,
        ),
        def(
            "system_traces",
            "events",
            &[
                ("session_id", "uuid"),
                ("event_id", "timeuuid"),
                ("activity", "text"),
                ("source", "inet"),
                ("source_elapsed", "int"),
                ("source_port", "int"),
                ("thread", "text"),
            ],
            &["session_id"],
            &["event_id"],
            Empty,
        ),
    ];
    defs.into_iter().map(build).collect()
}

/// One generated row: cells in the table's column order (None = null).
pub type SystemRow = Vec<Option<Bytes>>;

fn row_from(t: &TableDef, cells: Vec<(&str, Option<Bytes>)>) -> SystemRow {
    t.columns
        .iter()
        .map(|c| {
            cells
                .iter()
                .find(|(n, _)| *n == c.name)
                .and_then(|(_, v)| v.clone())
        })
        .collect()
}

fn option_cells(o: &TableOptions) -> Vec<(&'static str, Option<Bytes>)> {
    vec![
        (
            "additional_write_policy",
            Some(codec::text(&o.additional_write_policy)),
        ),
        (
            "bloom_filter_fp_chance",
            Some(codec::double(o.bloom_filter_fp_chance)),
        ),
        ("caching", Some(codec::text_map(&o.caching))),
        ("cdc", Some(codec::boolean(o.cdc))),
        ("comment", Some(codec::text(&o.comment))),
        ("compaction", Some(codec::text_map(&o.compaction))),
        ("compression", Some(codec::text_map(&o.compression))),
        ("crc_check_chance", Some(codec::double(o.crc_check_chance))),
        ("dclocal_read_repair_chance", Some(codec::double(0.0))),
        (
            "default_time_to_live",
            Some(codec::int(o.default_time_to_live)),
        ),
        (
            "extensions",
            Some(crate::rate_limit_option::extensions_cell(
                o.per_partition_rate_limit.as_ref(),
                o.transactional_mode,
            )),
        ),
        ("gc_grace_seconds", Some(codec::int(o.gc_grace_seconds))),
        ("max_index_interval", Some(codec::int(o.max_index_interval))),
        ("memtable", Some(codec::text(&o.memtable))),
        (
            "memtable_flush_period_in_ms",
            Some(codec::int(o.memtable_flush_period_in_ms)),
        ),
        ("min_index_interval", Some(codec::int(o.min_index_interval))),
        ("read_repair", Some(codec::text(&o.read_repair))),
        ("read_repair_chance", Some(codec::double(0.0))),
        ("speculative_retry", Some(codec::text(&o.speculative_retry))),
    ]
}

/// Keyspaces shown in `system_schema` (the virtual schema keyspace is described elsewhere).
fn described_keyspace(name: &str) -> bool {
    !crate::catalog::is_virtual_keyspace(name)
}

/// Generates the rows of a virtual table. `peer_version` gives a peer's schema version as it
/// last reported it.
pub fn rows(
    t: &TableDef,
    schema: &Schema,
    node: &NodeInfo,
    ring: &TokenMetadata,
    auth: &crate::auth::AuthData,
    peer_version: &dyn Fn(Uuid) -> Option<Uuid>,
) -> Vec<SystemRow> {
    let Some(kind) = t.system else {
        return Vec::new();
    };
    match kind {
        // Generated per requested key by `token_replica_rows`; a table scan has no rows.
        SystemTable::Empty | SystemTable::TokenReplicas => Vec::new(),
        SystemTable::Roles => auth
            .roles
            .iter()
            .map(|(name, r)| {
                let member_of: Vec<&str> = r.member_of.iter().map(String::as_str).collect();
                row_from(
                    t,
                    vec![
                        ("role", Some(codec::text(name))),
                        ("can_login", Some(codec::boolean(r.can_login))),
                        ("is_superuser", Some(codec::boolean(r.is_superuser))),
                        (
                            "member_of",
                            (!member_of.is_empty()).then(|| codec::text_list(&member_of)),
                        ),
                        ("salted_hash", r.salted_hash.as_deref().map(codec::text)),
                    ],
                )
            })
            .collect(),
        SystemTable::RoleMembers => {
            let mut pairs: Vec<(&str, &str)> = auth
                .roles
                .iter()
                .flat_map(|(member, r)| {
                    r.member_of
                        .iter()
                        .map(move |role| (role.as_str(), member.as_str()))
                })
                .collect();
            pairs.sort_unstable();
            pairs
                .into_iter()
                .map(|(role, member)| {
                    row_from(
                        t,
                        vec![
                            ("role", Some(codec::text(role))),
                            ("member", Some(codec::text(member))),
                        ],
                    )
                })
                .collect()
        }
        SystemTable::RolePermissions => auth
            .permissions
            .iter()
            .flat_map(|(role, grants)| grants.iter().map(move |(res, set)| (role, res, set)))
            .map(|(role, res, set)| {
                let names: Vec<&str> = set.iter().map(|p| p.as_str()).collect();
                row_from(
                    t,
                    vec![
                        ("role", Some(codec::text(role))),
                        ("resource", Some(codec::text(res))),
                        ("permissions", Some(codec::text_list(&names))),
                    ],
                )
            })
            .collect(),
        SystemTable::Settings => {
            let mut settings: Vec<&(String, String)> = node.settings.iter().collect();
            settings.sort();
            settings
                .into_iter()
                .map(|(name, value)| {
                    row_from(
                        t,
                        vec![
                            ("name", Some(codec::text(name))),
                            ("value", Some(codec::text(value))),
                        ],
                    )
                })
                .collect()
        }
        SystemTable::Peers | SystemTable::PeersV2 => ring
            .nodes()
            .iter()
            .filter(|n| crate::cluster::is_served_peer(node.host_id, n))
            .map(|n| {
                peer_row(
                    t,
                    kind,
                    n,
                    peer_version(n.host_id).unwrap_or(schema.version),
                )
            })
            .collect(),
        SystemTable::Local => {
            // The ring's tokens for this node once the cluster has assigned them.
            let tokens = match ring.index_of(node.host_id) {
                Some(i) => token_texts(ring.node(i).tokens.iter().map(|t| t.0)),
                None => token_texts(node.tokens.iter().copied()),
            };
            vec![row_from(
                t,
                vec![
                    ("key", Some(codec::text("local"))),
                    ("bootstrapped", Some(codec::text("COMPLETED"))),
                    (
                        "broadcast_address",
                        Some(codec::inet(&node.internode_address.ip())),
                    ),
                    (
                        "broadcast_port",
                        Some(codec::int(node.internode_address.port().into())),
                    ),
                    ("cluster_name", Some(codec::text(&node.cluster_name))),
                    ("cql_version", Some(codec::text(crate::CQL_VERSION))),
                    ("data_center", Some(codec::text(&node.data_center))),
                    ("gossip_generation", Some(codec::int(node.generation))),
                    ("host_id", Some(codec::uuid(&node.host_id))),
                    (
                        "listen_address",
                        Some(codec::inet(&node.internode_address.ip())),
                    ),
                    (
                        "listen_port",
                        Some(codec::int(node.internode_address.port().into())),
                    ),
                    ("native_protocol_version", Some(codec::text("4"))),
                    ("partitioner", Some(codec::text(crate::PARTITIONER))),
                    ("rack", Some(codec::text(&node.rack))),
                    ("release_version", Some(codec::text(crate::RELEASE_VERSION))),
                    ("rpc_address", Some(codec::inet(&node.rpc_address))),
                    ("rpc_port", Some(codec::int(node.port as i32))),
                    ("schema_version", Some(codec::uuid(&schema.version))),
                    ("tokens", Some(codec::text_list(&tokens))),
                    ("truncated_at", None),
                ],
            )]
        }
        SystemTable::Keyspaces => schema
            .keyspaces
            .values()
            .filter(|k| described_keyspace(&k.name))
            .map(|k| {
                row_from(
                    t,
                    vec![
                        ("keyspace_name", Some(codec::text(&k.name))),
                        ("durable_writes", Some(codec::boolean(k.durable_writes))),
                        ("replication", Some(codec::text_map(&k.replication))),
                    ],
                )
            })
            .collect(),
        SystemTable::Tables => schema
            .tables
            .values()
            .filter(|tb| described_keyspace(&tb.keyspace))
            .map(|tb| {
                let mut cells = vec![
                    ("keyspace_name", Some(codec::text(&tb.keyspace))),
                    ("table_name", Some(codec::text(&tb.name))),
                    ("flags", Some(codec::text_list(&["compound"]))),
                    ("id", Some(codec::uuid(&tb.id))),
                ];
                cells.extend(option_cells(&tb.options));
                row_from(t, cells)
            })
            .collect(),
        SystemTable::Columns => {
            let mut out = Vec::new();
            for tb in schema.tables.values() {
                if !described_keyspace(&tb.keyspace) {
                    continue;
                }
                let mut cols: Vec<&ColumnDef> = tb.columns.iter().collect();
                cols.sort_by(|a, b| a.name.cmp(&b.name));
                for c in cols {
                    let order = match (c.kind, c.order) {
                        (ColumnKind::Clustering, Order::Asc) => "asc",
                        (ColumnKind::Clustering, Order::Desc) => "desc",
                        _ => "none",
                    };
                    out.push(row_from(
                        t,
                        vec![
                            ("keyspace_name", Some(codec::text(&tb.keyspace))),
                            ("table_name", Some(codec::text(&tb.name))),
                            ("column_name", Some(codec::text(&c.name))),
                            ("clustering_order", Some(codec::text(order))),
                            ("column_name_bytes", Some(codec::text(&c.name))),
                            ("kind", Some(codec::text(c.kind.as_str()))),
                            ("position", Some(codec::int(c.position))),
                            ("type", Some(codec::text(&c.ty.to_string()))),
                        ],
                    ));
                }
            }
            out
        }
        SystemTable::DroppedColumns => {
            let mut out = Vec::new();
            for tb in schema.tables.values() {
                for d in &tb.dropped {
                    out.push(row_from(
                        t,
                        vec![
                            ("keyspace_name", Some(codec::text(&tb.keyspace))),
                            ("table_name", Some(codec::text(&tb.name))),
                            ("column_name", Some(codec::text(&d.name))),
                            (
                                "dropped_time",
                                Some(codec::bigint(d.dropped_time_micros / 1000)),
                            ),
                            ("kind", Some(codec::text(d.kind.as_str()))),
                            ("type", Some(codec::text(&d.ty.to_string()))),
                        ],
                    ));
                }
            }
            out
        }
        SystemTable::ScyllaTables => schema
            .tables
            .values()
            .filter(|tb| described_keyspace(&tb.keyspace))
            .map(|tb| {
                row_from(
                    t,
                    vec![
                        ("keyspace_name", Some(codec::text(&tb.keyspace))),
                        ("table_name", Some(codec::text(&tb.name))),
                        ("in_memory", Some(codec::boolean(false))),
                        ("version", Some(codec::uuid(&schema.version))),
                    ],
                )
            })
            .collect(),
    }
}

/// A node's tokens as `set<text>` elements, in the set's order (UTF-8 byte order).
fn token_texts(tokens: impl Iterator<Item = i64>) -> Vec<String> {
    let mut texts: Vec<String> = tokens.map(|t| t.to_string()).collect();
    texts.sort_unstable();
    texts
}

/// A `system.peers` or `system.peers_v2` row for `peer`. `schema_version` is the one the peer
/// last reported in its heartbeat, or this node's before it has reported one.
fn peer_row(t: &TableDef, kind: SystemTable, peer: &Node, schema_version: Uuid) -> SystemRow {
    let tokens = token_texts(peer.tokens.iter().map(|t| t.0));
    let internode = peer.internode_address;
    let native = peer.cql_address;
    let mut cells = vec![
        ("peer", Some(codec::inet(&internode.ip()))),
        ("data_center", Some(codec::text(&peer.dc))),
        ("host_id", Some(codec::uuid(&peer.host_id))),
        ("preferred_ip", None),
        ("rack", Some(codec::text(&peer.rack))),
        ("release_version", Some(codec::text(crate::RELEASE_VERSION))),
        ("schema_version", Some(codec::uuid(&schema_version))),
        ("tokens", Some(codec::text_list(&tokens))),
    ];
    if kind == SystemTable::PeersV2 {
        cells.extend([
            ("peer_port", Some(codec::int(internode.port().into()))),
            ("native_address", Some(codec::inet(&native.ip()))),
            ("native_port", Some(codec::int(native.port().into()))),
            ("preferred_port", None),
        ]);
    } else {
        cells.push(("rpc_address", Some(codec::inet(&native.ip()))));
    }
    row_from(t, cells)
}

/// The rows of `system_views.token_replicas` for the requested (keyspace, token) pairs: the
/// replicas of the token under the keyspace's replication, primary first, by CQL address.
/// An unknown keyspace gives no row; a LocalStrategy keyspace is served by this node alone.
pub fn token_replica_rows(
    t: &TableDef,
    schema: &Schema,
    node: &NodeInfo,
    ring: &TokenMetadata,
    keys: &[(&str, i64)],
) -> Vec<SystemRow> {
    let mut out = Vec::with_capacity(keys.len());
    let mut replicas = Vec::new();
    for &(keyspace, token) in keys {
        let Some(ks) = schema.keyspaces.get(keyspace) else {
            continue;
        };
        let Ok(replication) = sluice_ring::Replication::from_map(&ks.replication) else {
            continue;
        };
        let addresses: Vec<std::net::IpAddr> = if replication == sluice_ring::Replication::Local {
            vec![node.rpc_address]
        } else {
            sluice_ring::natural_replicas(
                ring,
                &replication,
                sluice_ring::Token(token),
                &mut replicas,
            );
            replicas
                .iter()
                .map(|&r| ring.node(r).cql_address.ip())
                .collect()
        };
        let cells: Vec<Bytes> = addresses.iter().map(codec::inet).collect();
        out.push(row_from(
            t,
            vec![
                ("keyspace_name", Some(codec::text(keyspace))),
                ("token_value", Some(codec::bigint(token))),
                (
                    "replicas",
                    Some(codec::collection(cells.iter().map(|c| c.as_ref()))),
                ),
            ],
        ));
    }
    out
}
