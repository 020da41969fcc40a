//! DDL: CREATE / ALTER / DROP KEYSPACE and TABLE, TRUNCATE.
//!
//! Each statement builds the next schema from a clone of the current one. On a node without
//! a cluster it then commits it under the DDL lock: persists it, swaps it in and announces the
//! change. In a cluster the next schema goes back to `schema_group`, which proposes it to the
//! metadata group; every node installs it when the group applies it.

use crate::catalog::{
    check_name, invalid, is_system_keyspace, ColumnDef, ColumnKind, DroppedColumn, KeyspaceDef,
    Schema, TableDef, TableOptions,
};
use crate::{storage_error, Engine};
use sluice_cql::ast::{
    AlterKeyspace, AlterTable, AlterTableAction, CreateKeyspace, CreateTable, Drop, OptionValue,
    Property, QualifiedName, Statement,
};
use sluice_protocol::{
    DbError, DetailedError, ResultMessage, SchemaChange, SchemaChangeTarget, SchemaChangeType,
};
use sluice_storage::Order;
use sluice_types::{CqlType, NativeType};
use std::collections::BTreeMap;
use std::sync::Arc;
use uuid::Uuid;

const SIMPLE: &str = "org.apache.cassandra.locator.SimpleStrategy";
const NTS: &str = "org.apache.cassandra.locator.NetworkTopologyStrategy";

fn config_error(msg: impl Into<std::borrow::Cow<'static, str>>) -> DetailedError {
    DetailedError::new(DbError::ConfigError, msg)
}

fn not_modifiable(ks: &str) -> DetailedError {
    DetailedError::new(
        DbError::Unauthorized,
        format!("{ks} keyspace is not user-modifiable"),
    )
}

fn already_exists(ks: &str, table: &str, msg: String) -> DetailedError {
    DetailedError::already_exists(ks, table, msg)
}

fn change(change: SchemaChangeType, target: SchemaChangeTarget) -> SchemaChange {
    SchemaChange { change, target }
}

/// An option value as the string Cassandra stores.
fn option_string(v: &OptionValue) -> Option<String> {
    match v {
        OptionValue::String(s) | OptionValue::Number(s) | OptionValue::Identifier(s) => {
            Some(s.clone())
        }
        OptionValue::Bool(b) => Some(b.to_string()),
        OptionValue::Map(_) => None,
    }
}

fn option_map(name: &str, v: &OptionValue) -> Result<BTreeMap<String, String>, DetailedError> {
    let OptionValue::Map(pairs) = v else {
        return Err(config_error(format!("Property '{name}' must be a map")));
    };
    let mut out = BTreeMap::new();
    for (k, v) in pairs {
        let s = option_string(v)
            .ok_or_else(|| config_error(format!("Invalid value for '{k}' in '{name}'")))?;
        out.insert(k.clone(), s);
    }
    Ok(out)
}

fn option_bool(name: &str, v: &OptionValue) -> Result<bool, DetailedError> {
    match v {
        OptionValue::Bool(b) => Ok(*b),
        OptionValue::String(s) | OptionValue::Identifier(s) if s.eq_ignore_ascii_case("true") => {
            Ok(true)
        }
        OptionValue::String(s) | OptionValue::Identifier(s) if s.eq_ignore_ascii_case("false") => {
            Ok(false)
        }
        _ => Err(config_error(format!(
            "Invalid boolean value for property '{name}'"
        ))),
    }
}

fn option_int(name: &str, v: &OptionValue) -> Result<i32, DetailedError> {
    option_string(v)
        .and_then(|s| s.parse::<i32>().ok())
        .ok_or_else(|| config_error(format!("Invalid integer value for property '{name}'")))
}

fn option_f64(name: &str, v: &OptionValue) -> Result<f64, DetailedError> {
    option_string(v)
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| config_error(format!("Invalid double value for property '{name}'")))
}

/// Builds the replication map: fully qualified class, NTS `replication_factor` expanded.
fn replication(
    v: &OptionValue,
    data_center: &str,
) -> Result<BTreeMap<String, String>, DetailedError> {
    let mut m = option_map("replication", v)?;
    let class = m
        .remove("class")
        .ok_or_else(|| config_error("Missing replication strategy class"))?;
    let short = class.rsplit('.').next().unwrap_or(&class);
    let mut out = BTreeMap::new();
    let check_rf = |k: &str, v: &str| -> Result<(), DetailedError> {
        match v.parse::<u32>() {
            Ok(_) => Ok(()),
            Err(_) => Err(config_error(format!(
                "Replication factor must be numeric; found {v} for {k}"
            ))),
        }
    };
    match short {
        "SimpleStrategy" => {
            let rf = m.remove("replication_factor").ok_or_else(|| {
                config_error("SimpleStrategy requires a replication_factor strategy option.")
            })?;
            check_rf("replication_factor", &rf)?;
            if let Some(k) = m.keys().next() {
                return Err(config_error(format!(
                    "Unrecognized strategy option {{{k}}} passed to SimpleStrategy"
                )));
            }
            out.insert("class".into(), SIMPLE.into());
            out.insert("replication_factor".into(), rf);
        }
        "NetworkTopologyStrategy" => {
            out.insert("class".into(), NTS.into());
            if let Some(rf) = m.remove("replication_factor") {
                check_rf("replication_factor", &rf)?;
                out.insert(data_center.to_string(), rf);
            }
            for (k, v) in m {
                check_rf(&k, &v)?;
                out.insert(k, v);
            }
        }
        _ => {
            return Err(config_error(format!(
                "Unable to find replication strategy class 'org.apache.cassandra.locator.{short}'"
            )))
        }
    }
    Ok(out)
}

/// Applies `WITH` properties to table options.
pub(crate) fn apply_table_options(
    o: &mut TableOptions,
    props: &[Property],
) -> Result<(), DetailedError> {
    for p in props {
        let v = &p.value;
        let n = p.name.as_str();
        let string = || {
            option_string(v)
                .ok_or_else(|| config_error(format!("Invalid value for property '{n}'")))
        };
        match n {
            "comment" => o.comment = string()?,
            "default_time_to_live" => {
                let t = option_int(n, v)?;
                if t < 0 {
                    return Err(config_error(
                        "default_time_to_live must be greater than or equal to 0",
                    ));
                }
                o.default_time_to_live = t;
            }
            "gc_grace_seconds" => {
                let g = option_int(n, v)?;
                if g < 0 {
                    return Err(config_error(
                        "gc_grace_seconds must be greater than or equal to 0",
                    ));
                }
                o.gc_grace_seconds = g;
            }
            "bloom_filter_fp_chance" => o.bloom_filter_fp_chance = option_f64(n, v)?,
            "crc_check_chance" => o.crc_check_chance = option_f64(n, v)?,
            "caching" => o.caching = option_map(n, v)?,
            "compaction" => {
                let m = option_map(n, v)?;
                if !m.contains_key("class") {
                    return Err(config_error(
                        "Missing sub-option 'class' for the 'compaction' option.",
                    ));
                }
                o.compaction = m;
            }
            "compression" => {
                let m = option_map(n, v)?;
                o.compression = if m.is_empty() {
                    [("enabled".to_string(), "false".to_string())]
                        .into_iter()
                        .collect()
                } else {
                    m
                };
            }
            "speculative_retry" => o.speculative_retry = string()?,
            "additional_write_policy" => o.additional_write_policy = string()?,
            "read_repair" => o.read_repair = string()?,
            "memtable" => o.memtable = string()?,
            "max_index_interval" => o.max_index_interval = option_int(n, v)?,
            "min_index_interval" => o.min_index_interval = option_int(n, v)?,
            "memtable_flush_period_in_ms" => o.memtable_flush_period_in_ms = option_int(n, v)?,
            "cdc" => o.cdc = option_bool(n, v)?,
            // Accepted for compatibility with Cassandra 3.x/5.0 scripts; no effect here.
            "dclocal_read_repair_chance"
            | "read_repair_chance"
            | "allow_auto_snapshot"
            | "incremental_backups"
            | "extensions" => {}
            "per_partition_rate_limit" => {
                o.per_partition_rate_limit = crate::rate_limit_option::parse(v)?;
            }
            "transactional_mode" => {
                o.transactional_mode = match string()?.as_str() {
                    "off" => crate::catalog::TransactionalMode::Off,
                    "full" => crate::catalog::TransactionalMode::Full,
                    "mixed_reads" => return Err(config_error(
                        "transactional_mode 'mixed_reads' is not supported; use 'off' or 'full'",
                    )),
                    _ => {
                        return Err(config_error(
                            "Invalid value for property 'transactional_mode': use 'off' or 'full'",
                        ))
                    }
                };
            }
            "id" => return Err(invalid("Cannot set or alter table id")),
            other => {
                return Err(DetailedError::new(
                    DbError::SyntaxError,
                    format!("Unknown property '{other}'"),
                ))
            }
        }
    }
    Ok(())
}

fn resolve_keyspace<'a>(
    name: &'a QualifiedName,
    session: Option<&'a str>,
) -> Result<&'a str, DetailedError> {
    name.keyspace.as_deref().or(session).ok_or_else(|| {
        invalid("No keyspace has been specified. USE a keyspace, or explicitly specify keyspace.tablename")
    })
}

/// Where a statement's new schema goes: committed here (a node without a cluster), or handed
/// back to be proposed to the metadata group, which installs it on every node.
pub(crate) struct Ddl<'a> {
    engine: &'a Engine,
    /// The schema the statement is built against.
    base: Arc<Schema>,
    /// `Some` when building for the group: the next schema, once built.
    proposal: Option<Option<Schema>>,
}

impl<'a> Ddl<'a> {
    fn schema(&self) -> Arc<Schema> {
        Arc::clone(&self.base)
    }

    /// True when the change is committed here, with its side effects run by the statement.
    fn is_local(&self) -> bool {
        self.proposal.is_none()
    }

    fn commit(
        &mut self,
        next: Schema,
        change: SchemaChange,
        tables: &[Uuid],
        keyspace: Option<&str>,
    ) -> Result<(), DetailedError> {
        match &mut self.proposal {
            None => self.engine.commit_schema(next, change, tables, keyspace),
            Some(slot) => {
                *slot = Some(next);
                Ok(())
            }
        }
    }
}

/// Executes a DDL statement and commits its change on this node alone.
pub(crate) fn execute(
    engine: &Engine,
    session_ks: Option<&str>,
    stmt: &Statement,
    now_micros: i64,
) -> Result<ResultMessage, DetailedError> {
    let _guard = engine.ddl_guard();
    let mut ddl = Ddl {
        engine,
        base: engine.schema(),
        proposal: None,
    };
    run(&mut ddl, session_ks, stmt, now_micros)
}

/// Builds a DDL statement's next schema against `base` without committing it: the answer,
/// and the next schema when the statement changes it. TRUNCATE is not a schema change and
/// runs here, on this node's data.
pub(crate) fn build(
    engine: &Engine,
    base: Arc<Schema>,
    session_ks: Option<&str>,
    stmt: &Statement,
    now_micros: i64,
) -> Result<(ResultMessage, Option<Schema>), DetailedError> {
    let mut ddl = Ddl {
        engine,
        base,
        proposal: Some(None),
    };
    let result = run(&mut ddl, session_ks, stmt, now_micros)?;
    Ok((result, ddl.proposal.flatten()))
}

fn run(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    stmt: &Statement,
    now_micros: i64,
) -> Result<ResultMessage, DetailedError> {
    match stmt {
        Statement::CreateKeyspace(s) => create_keyspace(ddl, s),
        Statement::AlterKeyspace(s) => alter_keyspace(ddl, s),
        Statement::DropKeyspace(s) => drop_keyspace(ddl, s),
        Statement::CreateTable(s) => create_table(ddl, session_ks, s),
        Statement::AlterTable(s) => alter_table(ddl, session_ks, s, now_micros),
        Statement::DropTable(s) => drop_table(ddl, session_ks, s),
        Statement::Truncate(name) => truncate(ddl, session_ks, name),
        _ => Err(invalid("Unsupported statement")),
    }
}

fn keyspace_props(
    ddl: &Ddl<'_>,
    ks: &mut KeyspaceDef,
    props: &[Property],
    creating: bool,
) -> Result<(), DetailedError> {
    let mut saw_replication = false;
    for p in props {
        match p.name.as_str() {
            "replication" => {
                ks.replication = replication(&p.value, &ddl.engine.node().data_center)?;
                saw_replication = true;
            }
            "durable_writes" => ks.durable_writes = option_bool("durable_writes", &p.value)?,
            other => {
                return Err(DetailedError::new(
                    DbError::SyntaxError,
                    format!("Unknown property '{other}'"),
                ))
            }
        }
    }
    if creating && !saw_replication {
        return Err(config_error("Missing mandatory option 'replication'"));
    }
    Ok(())
}

fn create_keyspace(ddl: &mut Ddl<'_>, s: &CreateKeyspace) -> Result<ResultMessage, DetailedError> {
    check_name("Keyspace", &s.name)?;
    let schema = ddl.schema();
    if schema.keyspaces.contains_key(&s.name) {
        if s.if_not_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(already_exists(
            &s.name,
            "",
            format!("Keyspace {} already exists", s.name),
        ));
    }
    if is_system_keyspace(&s.name) {
        return Err(not_modifiable(&s.name));
    }
    let mut ks = KeyspaceDef {
        name: s.name.clone(),
        replication: BTreeMap::new(),
        durable_writes: true,
    };
    keyspace_props(ddl, &mut ks, &s.properties, true)?;
    let mut next = (*schema).clone();
    next.keyspaces.insert(s.name.clone(), ks);
    let ch = change(
        SchemaChangeType::Created,
        SchemaChangeTarget::Keyspace(s.name.clone()),
    );
    ddl.commit(next, ch.clone(), &[], None)?;
    Ok(ResultMessage::SchemaChange(ch))
}

fn alter_keyspace(ddl: &mut Ddl<'_>, s: &AlterKeyspace) -> Result<ResultMessage, DetailedError> {
    let schema = ddl.schema();
    let Some(existing) = schema.keyspaces.get(&s.name) else {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(invalid(format!("Keyspace '{}' does not exist", s.name)));
    };
    if is_system_keyspace(&s.name) {
        return Err(not_modifiable(&s.name));
    }
    let mut ks = existing.clone();
    keyspace_props(ddl, &mut ks, &s.properties, false)?;
    let mut next = (*schema).clone();
    next.keyspaces.insert(s.name.clone(), ks);
    let ch = change(
        SchemaChangeType::Updated,
        SchemaChangeTarget::Keyspace(s.name.clone()),
    );
    ddl.commit(next, ch.clone(), &[], Some(&s.name))?;
    Ok(ResultMessage::SchemaChange(ch))
}

fn drop_keyspace(ddl: &mut Ddl<'_>, s: &Drop) -> Result<ResultMessage, DetailedError> {
    let name = &s.name.name;
    let schema = ddl.schema();
    if !schema.keyspaces.contains_key(name) {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(invalid(format!("Keyspace '{name}' doesn't exist")));
    }
    if is_system_keyspace(name) {
        return Err(not_modifiable(name));
    }
    let tables: Vec<Arc<TableDef>> = schema.tables_of(name).cloned().collect();
    let mut next = (*schema).clone();
    next.keyspaces.remove(name);
    for t in &tables {
        next.tables.remove(&(t.keyspace.clone(), t.name.clone()));
    }
    let ids: Vec<Uuid> = tables.iter().map(|t| t.id).collect();
    let ch = change(
        SchemaChangeType::Dropped,
        SchemaChangeTarget::Keyspace(name.clone()),
    );
    ddl.commit(next, ch.clone(), &ids, Some(name))?;
    if ddl.is_local() {
        // Grants die with their keyspace, so that a new one of the same name starts clean.
        let engine = ddl.engine;
        engine.auth.drop_resource(
            &engine.storage,
            &crate::auth::AuthResource::keyspace(name).name,
        );
        for t in &tables {
            engine
                .storage
                .drop_table(*t.id.as_bytes())
                .map_err(storage_error)?;
        }
    }
    Ok(ResultMessage::SchemaChange(ch))
}

fn check_key_type(name: &str, ty: &CqlType) -> Result<(), DetailedError> {
    if ty.is_counter() {
        return Err(invalid(format!(
            "counter type is not supported for PRIMARY KEY column '{name}'"
        )));
    }
    if ty.is_multi_cell_collection() {
        return Err(invalid(format!(
            "Invalid non-frozen collection type {ty} for PRIMARY KEY column '{name}'"
        )));
    }
    if matches!(ty, CqlType::Native(NativeType::Duration)) {
        return Err(invalid(format!(
            "duration type is not supported for PRIMARY KEY column '{name}'"
        )));
    }
    Ok(())
}

fn check_counters(cols: &[ColumnDef], options: &TableOptions) -> Result<(), DetailedError> {
    let non_key: Vec<&ColumnDef> = cols.iter().filter(|c| !c.kind.is_primary_key()).collect();
    let counters = non_key.iter().filter(|c| c.ty.is_counter()).count();
    if counters > 0 && counters != non_key.len() {
        return Err(invalid(
            "Cannot mix counter and non counter columns in the same table",
        ));
    }
    if counters > 0 && options.default_time_to_live > 0 {
        return Err(invalid(
            "Cannot set default_time_to_live on a table with counters",
        ));
    }
    Ok(())
}

fn create_table(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    s: &CreateTable,
) -> Result<ResultMessage, DetailedError> {
    let ks = resolve_keyspace(&s.name, session_ks)?;
    let name = &s.name.name;
    let schema = ddl.schema();
    if !schema.keyspaces.contains_key(ks) {
        return Err(invalid(format!("Keyspace '{ks}' doesn't exist")));
    }
    if is_system_keyspace(ks) {
        return Err(not_modifiable(ks));
    }
    if schema.table(ks, name).is_some() {
        if s.if_not_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(already_exists(
            ks,
            name,
            format!("Cannot add already existing table \"{name}\" to keyspace \"{ks}\""),
        ));
    }
    check_name("Table", name)?;
    if s.compact_storage {
        return Err(invalid("COMPACT STORAGE tables are not supported"));
    }
    if s.partition_key.is_empty() {
        return Err(invalid(format!(
            "No PRIMARY KEY specified for table '{name}' (exactly one required)"
        )));
    }
    let mut cols: Vec<ColumnDef> = Vec::with_capacity(s.columns.len());
    for (i, c) in s.columns.iter().enumerate() {
        if cols.iter().any(|x| x.name == c.name) {
            return Err(invalid(format!(
                "Duplicate column '{}' declaration for table {ks}.{name}",
                c.name
            )));
        }
        let (kind, position) = if let Some(p) = s.partition_key.iter().position(|k| *k == c.name) {
            (ColumnKind::PartitionKey, p as i32)
        } else if let Some(p) = s.clustering_key.iter().position(|k| *k == c.name) {
            (ColumnKind::Clustering, p as i32)
        } else if c.is_static {
            (ColumnKind::Static, -1)
        } else {
            (ColumnKind::Regular, -1)
        };
        if kind.is_primary_key() {
            if c.is_static {
                return Err(invalid(format!(
                    "Static column {} cannot be part of the PRIMARY KEY",
                    c.name
                )));
            }
            check_key_type(&c.name, &c.ty)?;
        }
        cols.push(ColumnDef {
            name: c.name.clone(),
            ty: c.ty.clone(),
            kind,
            position,
            id: i as u16,
            order: Order::Asc,
        });
    }
    for k in s.partition_key.iter().chain(&s.clustering_key) {
        if !cols.iter().any(|c| c.name == *k) {
            return Err(invalid(format!(
                "Unknown definition {k} referenced in PRIMARY KEY"
            )));
        }
        if s.partition_key
            .iter()
            .chain(&s.clustering_key)
            .filter(|x| *x == k)
            .count()
            > 1
        {
            return Err(invalid(format!("Multiple definition of identifier {k}")));
        }
    }
    if s.clustering_key.is_empty() && cols.iter().any(|c| c.kind == ColumnKind::Static) {
        return Err(invalid("Static columns are only useful (and thus allowed) if the table has at least one clustering column"));
    }
    for (i, (col, asc)) in s.clustering_order.iter().enumerate() {
        if !s.clustering_key.contains(col) {
            return Err(invalid(format!(
                "Only clustering key columns can be defined in CLUSTERING ORDER directive: {col}"
            )));
        }
        if s.clustering_key.get(i) != Some(col) {
            return Err(invalid("The order of columns in the CLUSTERING ORDER directive must match that of the clustering columns"));
        }
        if let Some(c) = cols.iter_mut().find(|c| c.name == *col) {
            c.order = if *asc { Order::Asc } else { Order::Desc };
        }
    }
    // `WITH id = <uuid>` (CREATE only, as Cassandra): nodes that create one table each on
    // their own give it the same id, which is how replicas name it to each other.
    let (id_props, properties): (Vec<&Property>, Vec<&Property>) =
        s.properties.iter().partition(|p| p.name == "id");
    let id = match id_props.as_slice() {
        [] => Uuid::new_v4(),
        [p] => table_id_option(&schema, &p.value)?,
        _ => return Err(invalid("Multiple definitions for property 'id'")),
    };
    let properties: Vec<Property> = properties.into_iter().cloned().collect();
    let mut options = TableOptions::default();
    apply_table_options(&mut options, &properties)?;
    check_counters(&cols, &options)?;
    let def = TableDef::new(ks, name, id, cols, options);
    let mut next = (*schema).clone();
    next.tables
        .insert((ks.to_string(), name.clone()), Arc::new(def));
    let ch = change(
        SchemaChangeType::Created,
        SchemaChangeTarget::Table(ks.to_string(), name.clone()),
    );
    ddl.commit(next, ch.clone(), &[], None)?;
    Ok(ResultMessage::SchemaChange(ch))
}

/// The table id a CREATE TABLE asks for: a UUID no table of the schema has.
fn table_id_option(schema: &crate::Schema, v: &OptionValue) -> Result<Uuid, DetailedError> {
    let id = option_string(v)
        .and_then(|s| Uuid::parse_str(s.trim()).ok())
        .ok_or_else(|| config_error("Invalid value for property 'id': expected a UUID"))?;
    if schema.tables.values().any(|t| t.id == id) {
        return Err(invalid(format!("Table id {id} is already in use")));
    }
    Ok(id)
}

fn existing_table(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    name: &QualifiedName,
) -> Result<Option<Arc<TableDef>>, DetailedError> {
    let ks = resolve_keyspace(name, session_ks)?;
    let schema = ddl.schema();
    if !schema.keyspaces.contains_key(ks) {
        return Err(invalid(format!("Keyspace '{ks}' doesn't exist")));
    }
    Ok(schema.table(ks, &name.name).cloned())
}

fn alter_table(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    s: &AlterTable,
    now_micros: i64,
) -> Result<ResultMessage, DetailedError> {
    let Some(t) = existing_table(ddl, session_ks, &s.name)? else {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(invalid(format!("Table '{}' doesn't exist", s.name.name)));
    };
    if t.is_virtual() || is_system_keyspace(&t.keyspace) {
        return Err(not_modifiable(&t.keyspace));
    }
    let mut nt = (*t).clone();
    match &s.action {
        AlterTableAction::Add(defs) => {
            for d in defs {
                if nt.column(&d.name).is_some() {
                    return Err(invalid(format!(
                        "Column with name '{}' already exists",
                        d.name
                    )));
                }
                if d.primary_key {
                    return Err(invalid("Cannot add a PRIMARY KEY column"));
                }
                if d.is_static && nt.clustering.is_empty() {
                    return Err(invalid("Static columns are only useful (and thus allowed) if the table has at least one clustering column"));
                }
                let id = nt.next_column_id;
                nt.next_column_id = nt
                    .next_column_id
                    .checked_add(1)
                    .ok_or_else(|| invalid("Too many columns were added to this table"))?;
                nt.columns.push(ColumnDef {
                    name: d.name.clone(),
                    ty: d.ty.clone(),
                    kind: if d.is_static {
                        ColumnKind::Static
                    } else {
                        ColumnKind::Regular
                    },
                    position: -1,
                    id,
                    order: Order::Asc,
                });
            }
            check_counters(&nt.columns, &nt.options)?;
        }
        AlterTableAction::Drop(names) => {
            for n in names {
                let Some((i, c)) = nt.column(n) else {
                    return Err(invalid(format!(
                        "Column {n} was not found in table {}",
                        nt.name
                    )));
                };
                if c.kind.is_primary_key() {
                    return Err(invalid(format!("Cannot drop PRIMARY KEY part {n}")));
                }
                let c = nt.columns.remove(i);
                nt.dropped.retain(|d| d.name != c.name);
                nt.dropped.push(DroppedColumn {
                    name: c.name,
                    ty: c.ty,
                    kind: c.kind,
                    dropped_time_micros: now_micros,
                });
            }
        }
        AlterTableAction::Rename(pairs) => {
            for (from, to) in pairs {
                let Some((i, c)) = nt.column(from) else {
                    return Err(invalid(format!(
                        "Column {from} was not found in table {}",
                        nt.name
                    )));
                };
                if !c.kind.is_primary_key() {
                    return Err(invalid(format!(
                        "Cannot rename non PRIMARY KEY column {from}"
                    )));
                }
                if nt.column(to).is_some() {
                    return Err(invalid(format!("Cannot rename column {from} to {to} in table {}; another column with that name already exists", nt.name)));
                }
                nt.columns[i].name = to.clone();
            }
        }
        AlterTableAction::AlterType(..) => {
            return Err(invalid("Altering column types is no longer supported"));
        }
        AlterTableAction::With(props) => {
            apply_table_options(&mut nt.options, props)?;
            check_counters(&nt.columns, &nt.options)?;
        }
    }
    let rebuilt = TableDef {
        dropped: nt.dropped.clone(),
        next_column_id: nt.next_column_id,
        ..TableDef::new(
            &nt.keyspace,
            &nt.name,
            nt.id,
            nt.columns.clone(),
            nt.options.clone(),
        )
    };
    if ddl.is_local() {
        // Writes still planned with the old columns must not replace whole rows from now on:
        // they cannot know of a column added here (see `RegularColumns`).
        t.layout.retire_regular_columns();
    }
    let mut next = (*ddl.schema()).clone();
    next.tables
        .insert((t.keyspace.clone(), t.name.clone()), Arc::new(rebuilt));
    let ch = change(
        SchemaChangeType::Updated,
        SchemaChangeTarget::Table(t.keyspace.clone(), t.name.clone()),
    );
    ddl.commit(next, ch.clone(), &[t.id], None)?;
    Ok(ResultMessage::SchemaChange(ch))
}

fn drop_table(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    s: &Drop,
) -> Result<ResultMessage, DetailedError> {
    let Some(t) = existing_table(ddl, session_ks, &s.name)? else {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(invalid(format!("Table '{}' doesn't exist", s.name.name)));
    };
    if t.is_virtual() || is_system_keyspace(&t.keyspace) {
        return Err(not_modifiable(&t.keyspace));
    }
    let mut next = (*ddl.schema()).clone();
    next.tables.remove(&(t.keyspace.clone(), t.name.clone()));
    let ch = change(
        SchemaChangeType::Dropped,
        SchemaChangeTarget::Table(t.keyspace.clone(), t.name.clone()),
    );
    ddl.commit(next, ch.clone(), &[t.id], None)?;
    if ddl.is_local() {
        let engine = ddl.engine;
        engine.auth.drop_resource(
            &engine.storage,
            &crate::auth::AuthResource::table(&t.keyspace, &t.name).name,
        );
        engine
            .storage
            .drop_table(*t.id.as_bytes())
            .map_err(storage_error)?;
    }
    Ok(ResultMessage::SchemaChange(ch))
}

/// The table a TRUNCATE names, checked as Cassandra checks it (it exists, it is not virtual).
pub(crate) fn truncate_target(
    schema: &Schema,
    session_ks: Option<&str>,
    name: &QualifiedName,
) -> Result<Arc<TableDef>, DetailedError> {
    let ks = resolve_keyspace(name, session_ks)?;
    if !schema.keyspaces.contains_key(ks) {
        return Err(invalid(format!("Keyspace '{ks}' doesn't exist")));
    }
    let Some(t) = schema.table(ks, &name.name).cloned() else {
        return Err(invalid(format!("unconfigured table {}", name.name)));
    };
    if t.is_virtual() {
        return Err(invalid(format!(
            "Cannot TRUNCATE virtual table {}.{}",
            t.keyspace, t.name
        )));
    }
    Ok(t)
}

fn truncate(
    ddl: &mut Ddl<'_>,
    session_ks: Option<&str>,
    name: &QualifiedName,
) -> Result<ResultMessage, DetailedError> {
    let t = truncate_target(&ddl.schema(), session_ks, name)?;
    // Not a schema change: a cluster sends it to every node first (`crate::truncate`).
    ddl.engine
        .storage
        .truncate(*t.id.as_bytes())
        .map_err(storage_error)?;
    Ok(ResultMessage::Void)
}
