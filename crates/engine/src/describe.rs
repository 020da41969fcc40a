//! Server-side DESCRIBE (cqlsh 6 sends it verbatim), in Cassandra 5.0's output format.

use crate::catalog::{
    invalid, is_system_keyspace, is_virtual_keyspace, ColumnKind, KeyspaceDef, Schema, TableDef,
};
use crate::codec;
use crate::paging::{PagingState, Position};
use crate::result::RowsBuilder;
use crate::Engine;
use bytes::Bytes;
use sluice_cql::ast::Describe;
use sluice_protocol::{ColumnSpec, DetailedError, QueryParameters, ResultMessage};
use sluice_storage::Order;
use sluice_types::value::{write_identifier, write_quoted};
use sluice_types::{CqlType, NativeType};
use std::collections::BTreeMap;
use std::fmt::Write;

fn spec(name: &str) -> ColumnSpec {
    ColumnSpec {
        keyspace: "system".into(),
        table: "describe".into(),
        name: name.into(),
        ty: CqlType::native(NativeType::Text),
    }
}

fn ident(name: &str) -> String {
    let mut s = String::new();
    write_identifier(name, &mut s);
    s
}

fn quoted(v: &str) -> String {
    let mut s = String::new();
    write_quoted(v, &mut s);
    s
}

fn fmt_map(m: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{}: {}", quoted(k), quoted(v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

fn fmt_double(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// `CREATE KEYSPACE` text for a keyspace.
pub fn keyspace_cql(k: &KeyspaceDef) -> String {
    let mut m = k.replication.clone();
    if let Some(class) = m.get_mut("class") {
        if let Some(short) = class.strip_prefix("org.apache.cassandra.locator.") {
            *class = short.to_string();
        }
    }
    format!(
        "CREATE KEYSPACE {} WITH replication = {}  AND durable_writes = {};",
        ident(&k.name),
        fmt_map(&m),
        k.durable_writes
    )
}

/// `CREATE TABLE` text for a table.
pub fn table_cql(t: &TableDef) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "CREATE TABLE {}.{} (",
        ident(&t.keyspace),
        ident(&t.name)
    );
    let inline_pk = t.partition_key.len() == 1 && t.clustering.is_empty();
    for c in &t.columns {
        let _ = write!(s, "    {} {}", ident(&c.name), c.ty);
        if c.kind == ColumnKind::Static {
            s.push_str(" static");
        }
        if inline_pk && c.kind == ColumnKind::PartitionKey {
            s.push_str(" PRIMARY KEY");
        }
        if !(inline_pk && std::ptr::eq(c, t.columns.last().unwrap_or(c))) {
            s.push(',');
        }
        s.push('\n');
    }
    if !inline_pk {
        let pk: Vec<String> = t
            .partition_key
            .iter()
            .map(|&i| ident(&t.columns[i].name))
            .collect();
        let pk = if pk.len() == 1 {
            pk[0].clone()
        } else {
            format!("({})", pk.join(", "))
        };
        let mut parts = vec![pk];
        parts.extend(t.clustering.iter().map(|&i| ident(&t.columns[i].name)));
        let _ = writeln!(s, "    PRIMARY KEY ({})", parts.join(", "));
    }
    s.push_str(") WITH ");
    if !t.clustering.is_empty() {
        let order: Vec<String> = t
            .clustering
            .iter()
            .map(|&i| {
                let c = &t.columns[i];
                format!(
                    "{} {}",
                    ident(&c.name),
                    if c.order == Order::Asc { "ASC" } else { "DESC" }
                )
            })
            .collect();
        let _ = write!(s, "CLUSTERING ORDER BY ({})\n    AND ", order.join(", "));
    }
    let o = &t.options;
    let mut opts = vec![
        format!(
            "additional_write_policy = {}",
            quoted(&o.additional_write_policy)
        ),
        format!(
            "bloom_filter_fp_chance = {}",
            fmt_double(o.bloom_filter_fp_chance)
        ),
        format!("caching = {}", fmt_map(&o.caching)),
        format!("cdc = {}", o.cdc),
        format!("comment = {}", quoted(&o.comment)),
        format!("compaction = {}", fmt_map(&o.compaction)),
        format!("compression = {}", fmt_map(&o.compression)),
        format!("memtable = {}", quoted(&o.memtable)),
        format!("crc_check_chance = {}", fmt_double(o.crc_check_chance)),
        format!("default_time_to_live = {}", o.default_time_to_live),
        "extensions = {}".to_string(),
        format!("gc_grace_seconds = {}", o.gc_grace_seconds),
        format!("max_index_interval = {}", o.max_index_interval),
        format!(
            "memtable_flush_period_in_ms = {}",
            o.memtable_flush_period_in_ms
        ),
        format!("min_index_interval = {}", o.min_index_interval),
    ];
    if let Some(rl) = &o.per_partition_rate_limit {
        let mut items = Vec::new();
        if let Some(r) = rl.max_reads_per_second {
            items.push(format!("'max_reads_per_second': {r}"));
        }
        if let Some(w) = rl.max_writes_per_second {
            items.push(format!("'max_writes_per_second': {w}"));
        }
        opts.push(format!(
            "per_partition_rate_limit = {{{}}}",
            items.join(", ")
        ));
    }
    opts.push(format!("read_repair = {}", quoted(&o.read_repair)));
    opts.push(format!(
        "speculative_retry = {}",
        quoted(&o.speculative_retry)
    ));
    if o.transactional_mode != crate::catalog::TransactionalMode::Off {
        opts.push(format!(
            "transactional_mode = {}",
            quoted(o.transactional_mode.name())
        ));
    }
    s.push_str(&opts.join("\n    AND "));
    s.push(';');
    s
}

type Row = Vec<Option<Bytes>>;

fn listing(schema: &Schema, only_ks: Option<&str>, kind: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for k in schema.keyspaces.values() {
        if only_ks.is_some_and(|o| o != k.name) || is_virtual_keyspace(&k.name) {
            continue;
        }
        if kind == "keyspace" {
            rows.push(vec![
                Some(codec::text(&k.name)),
                Some(codec::text("keyspace")),
                Some(codec::text(&k.name)),
            ]);
        } else {
            for t in schema.tables_of(&k.name) {
                rows.push(vec![
                    Some(codec::text(&k.name)),
                    Some(codec::text("table")),
                    Some(codec::text(&t.name)),
                ]);
            }
        }
    }
    rows
}

fn keyspace_rows(schema: &Schema, k: &KeyspaceDef, only: bool, out: &mut Vec<Row>) {
    out.push(vec![
        Some(codec::text(&k.name)),
        Some(codec::text("keyspace")),
        Some(codec::text(&k.name)),
        Some(codec::text(&keyspace_cql(k))),
    ]);
    if !only {
        for t in schema.tables_of(&k.name) {
            out.push(table_row(t));
        }
    }
}

fn table_row(t: &TableDef) -> Row {
    vec![
        Some(codec::text(&t.keyspace)),
        Some(codec::text("table")),
        Some(codec::text(&t.name)),
        Some(codec::text(&table_cql(t))),
    ]
}

/// Executes a DESCRIBE statement.
pub(crate) fn execute(
    engine: &Engine,
    session_ks: Option<&str>,
    d: &Describe,
    params: &QueryParameters,
) -> Result<ResultMessage, DetailedError> {
    let schema = engine.schema();
    let four = ["keyspace_name", "type", "name", "create_statement"];
    let three = ["keyspace_name", "type", "name"];
    let need_ks = |k: Option<&str>| -> Result<String, DetailedError> {
        k.or(session_ks)
            .map(str::to_string)
            .ok_or_else(|| invalid("No keyspace specified and no current keyspace"))
    };
    let (cols, rows): (Vec<&str>, Vec<Row>) = match d {
        Describe::Cluster => (
            vec!["cluster", "partitioner", "snitch"],
            vec![vec![
                Some(codec::text(&engine.node().cluster_name)),
                Some(codec::text(crate::PARTITIONER)),
                Some(codec::text("org.apache.cassandra.locator.SimpleSnitch")),
            ]],
        ),
        Describe::Keyspaces => (three.to_vec(), listing(&schema, None, "keyspace")),
        Describe::Tables => (three.to_vec(), listing(&schema, session_ks, "table")),
        Describe::Types | Describe::Functions | Describe::Aggregates => {
            (three.to_vec(), Vec::new())
        }
        Describe::Schema { full } => {
            let mut rows = Vec::new();
            for k in schema.keyspaces.values() {
                if (!full && is_system_keyspace(&k.name)) || is_virtual_keyspace(&k.name) {
                    continue;
                }
                keyspace_rows(&schema, k, false, &mut rows);
            }
            (four.to_vec(), rows)
        }
        Describe::Keyspace { name, only, .. } => {
            let ks = need_ks(name.as_deref())?;
            let k = schema
                .keyspaces
                .get(&ks)
                .ok_or_else(|| invalid(format!("'{ks}' not found in keyspaces")))?;
            let mut rows = Vec::new();
            keyspace_rows(&schema, k, *only, &mut rows);
            (four.to_vec(), rows)
        }
        Describe::Table { name, .. } => {
            let ks = need_ks(name.keyspace.as_deref())?;
            let t = schema
                .table(&ks, &name.name)
                .ok_or_else(|| invalid(format!("'{}' not found in keyspace '{ks}'", name.name)))?;
            (four.to_vec(), vec![table_row(t)])
        }
        Describe::Name { name, .. } => {
            if name.keyspace.is_none() {
                if let Some(k) = schema.keyspaces.get(&name.name) {
                    let mut rows = Vec::new();
                    keyspace_rows(&schema, k, false, &mut rows);
                    return finish(engine, session_ks, d, &four, rows, params);
                }
            }
            let ks = need_ks(name.keyspace.as_deref())?;
            let t = schema
                .table(&ks, &name.name)
                .ok_or_else(|| invalid(format!("'{}' not found in keyspace '{ks}'", name.name)))?;
            (four.to_vec(), vec![table_row(t)])
        }
    };
    finish(engine, session_ks, d, &cols, rows, params)
}

fn finish(
    _engine: &Engine,
    session_ks: Option<&str>,
    d: &Describe,
    cols: &[&str],
    rows: Vec<Row>,
    params: &QueryParameters,
) -> Result<ResultMessage, DetailedError> {
    let specs: Vec<ColumnSpec> = cols.iter().map(|c| spec(c)).collect();
    let hash = {
        let id = crate::analyze::statement_id(session_ks, &format!("{d:?}"));
        u64::from_be_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]])
    };
    let page = params.page_size.filter(|&n| n > 0).map(|n| n as usize);
    let skip = match (&params.paging_state, page) {
        (Some(b), Some(_)) => match PagingState::decode(b, hash)?.pos {
            Position::Offset(n) => n as usize,
            _ => return Err(invalid("Invalid paging state")),
        },
        _ => 0,
    };
    let mut out = RowsBuilder::new(specs.len());
    let end = page.map_or(rows.len(), |p| (skip + p).min(rows.len()));
    for r in rows.iter().take(end).skip(skip) {
        for c in r {
            out.cell(c.as_deref());
        }
    }
    let paging_state = (end < rows.len()).then(|| {
        PagingState {
            stmt: hash,
            limit_left: None,
            pos: Position::Offset(end as u32),
        }
        .encode()
    });
    Ok(ResultMessage::Rows(out.finish(
        specs.into(),
        paging_state,
        false,
    )))
}
