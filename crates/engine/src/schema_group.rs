//! DDL through the cluster's metadata group.
//!
//! The engine does not know the group: it is handed a [`SchemaLog`] (the cluster layer
//! implements it) and is told of every accepted change through [`Engine::apply_group_edits`]
//! and [`Engine::install_group_schema`]. The group holds the user schema as documents, one
//! per keyspace (`keyspace/<name>`, a [`KeyspaceDef`] as JSON) and one per table
//! (`table/<keyspace>/<name>`, its persisted form as JSON), with an epoch that grows by one per
//! accepted change. A DDL statement reads the schema after a read barrier, builds the next one
//! as the local path does, and proposes the documents that differ, naming the epoch it read;
//! a change accepted meanwhile makes the proposal stale and the statement is built again.
//!
//! Every node installs an accepted change the same way, from the documents: the same
//! definitions give the same digest, hence the same `schema_version` everywhere.

use crate::catalog::{KeyspaceDef, PersistedTable, Schema, TableDef};
use crate::{auth, Engine};
use sluice_protocol::{DbError, DetailedError, SchemaChange, SchemaChangeTarget, SchemaChangeType};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A future that a [`SchemaLog`] returns.
pub type SchemaLogFuture<T> = Pin<Box<dyn Future<Output = Result<T, SchemaLogError>> + Send>>;

/// The cluster's metadata group as the engine's DDL uses it.
pub trait SchemaLog: Send + Sync + 'static {
    /// Returns once this node has applied everything the group committed before the call
    /// (and installed it in the engine), or fails at `deadline`.
    fn read_barrier(&self, deadline: Instant) -> SchemaLogFuture<()>;

    /// Proposes `edits` built against the schema at `base` and returns once this node has
    /// applied the outcome (an accepted change is then installed), or fails at `deadline`.
    fn commit(
        &self,
        base: u64,
        edits: Vec<DocumentEdit>,
        deadline: Instant,
    ) -> SchemaLogFuture<CommitOutcome>;

    /// The most bytes of document keys and values one proposal may carry.
    fn max_edit_bytes(&self) -> usize;
}

/// One document change of a proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentEdit {
    /// The document's name (`keyspace/<ks>` or `table/<ks>/<table>`).
    pub key: String,
    /// Its new content; `None` removes it.
    pub value: Option<String>,
}

/// What the group did with a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Accepted, and installed on this node.
    Applied,
    /// Another change was accepted since the base epoch; nothing changed.
    Stale,
}

/// Why a proposal did not go through. Small and `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaLogError {
    /// The group could not commit in time (no leader, timeout, shutting down).
    Unavailable(&'static str),
    /// The change is larger than one proposal may be.
    TooLarge,
    /// The group refused the proposal.
    Refused(&'static str),
}

impl SchemaLogError {
    /// The CQL error a DDL statement answers.
    pub(crate) fn to_cql(self) -> DetailedError {
        match self {
            SchemaLogError::Unavailable(why) => DetailedError::new(
                DbError::ServerError,
                format!("schema change not committed by the metadata group: {why}"),
            ),
            SchemaLogError::TooLarge => DetailedError::new(
                DbError::Invalid,
                "schema change is too large for one metadata group command",
            ),
            SchemaLogError::Refused(why) => DetailedError::new(
                DbError::ServerError,
                format!("the metadata group refused the schema change: {why}"),
            ),
        }
    }
}

const KEYSPACE_PREFIX: &str = "keyspace/";
const TABLE_PREFIX: &str = "table/";

fn keyspace_key(name: &str) -> String {
    format!("{KEYSPACE_PREFIX}{name}")
}

fn table_key(keyspace: &str, name: &str) -> String {
    format!("{TABLE_PREFIX}{keyspace}/{name}")
}

fn keyspace_document(ks: &KeyspaceDef) -> String {
    // Plain maps and strings always serialize.
    serde_json::to_string(ks).unwrap_or_default()
}

fn table_document(t: &TableDef) -> String {
    serde_json::to_string(&PersistedTable::from_def(t)).unwrap_or_default()
}

/// The user schema as the group's documents.
pub fn schema_documents(schema: &Schema) -> BTreeMap<String, String> {
    let persisted = schema.to_persisted();
    let mut out = BTreeMap::new();
    for ks in &persisted.keyspaces {
        out.insert(keyspace_key(&ks.name), keyspace_document(ks));
    }
    for t in schema.tables.values().filter(|t| is_user_table(t)) {
        out.insert(table_key(&t.keyspace, &t.name), table_document(t));
    }
    out
}

fn is_user_table(t: &TableDef) -> bool {
    !t.is_virtual() && !crate::catalog::is_system_keyspace(&t.keyspace)
}

/// The documents that differ between `base` and `next`: removals of tables first, then of
/// keyspaces, then keyspaces put, then tables put.
pub(crate) fn document_edits(base: &Schema, next: &Schema) -> Vec<DocumentEdit> {
    let mut edits = Vec::new();
    for key in base
        .tables
        .iter()
        .filter(|(_, t)| is_user_table(t))
        .map(|(k, _)| k)
    {
        if !next.tables.contains_key(key) {
            edits.push(DocumentEdit {
                key: table_key(&key.0, &key.1),
                value: None,
            });
        }
    }
    let user_keyspaces = |s: &Schema| {
        s.keyspaces
            .values()
            .filter(|k| !crate::catalog::is_system_keyspace(&k.name))
            .cloned()
            .collect::<Vec<_>>()
    };
    let (before, after) = (user_keyspaces(base), user_keyspaces(next));
    for ks in &before {
        if !next.keyspaces.contains_key(&ks.name) {
            edits.push(DocumentEdit {
                key: keyspace_key(&ks.name),
                value: None,
            });
        }
    }
    for ks in &after {
        if base.keyspaces.get(&ks.name) != Some(ks) {
            edits.push(DocumentEdit {
                key: keyspace_key(&ks.name),
                value: Some(keyspace_document(ks)),
            });
        }
    }
    for (key, t) in next.tables.iter().filter(|(_, t)| is_user_table(t)) {
        let document = match base.tables.get(key) {
            Some(old) if Arc::ptr_eq(old, t) => continue,
            Some(old) => {
                let document = table_document(t);
                if table_document(old) == document {
                    continue;
                }
                document
            }
            None => table_document(t),
        };
        edits.push(DocumentEdit {
            key: table_key(&key.0, &key.1),
            value: Some(document),
        });
    }
    edits
}

/// Applies one document to `schema`. A document this version cannot read is left out (and
/// logged): every node of the same version does the same.
fn apply_document(schema: &mut Schema, key: &str, value: Option<&str>) {
    if let Some(name) = key.strip_prefix(KEYSPACE_PREFIX) {
        match value {
            None => {
                schema.keyspaces.remove(name);
            }
            Some(json) => match serde_json::from_str::<KeyspaceDef>(json) {
                Ok(ks) if ks.name == name => {
                    schema.keyspaces.insert(ks.name.clone(), ks);
                }
                _ => tracing::error!(key, "cannot read a keyspace definition of the group"),
            },
        }
    } else if let Some(rest) = key.strip_prefix(TABLE_PREFIX) {
        let Some((keyspace, name)) = rest.split_once('/') else {
            tracing::error!(key, "a table document's name has no keyspace");
            return;
        };
        let slot = (keyspace.to_owned(), name.to_owned());
        match value {
            None => {
                schema.tables.remove(&slot);
            }
            Some(json) => {
                let def = serde_json::from_str::<PersistedTable>(json)
                    .map_err(|_| "does not decode")
                    .and_then(PersistedTable::into_def);
                match def {
                    Ok(def) if def.keyspace == keyspace && def.name == name => {
                        schema.tables.insert(slot, Arc::new(def));
                    }
                    Ok(_) => tracing::error!(key, "a table document names another table"),
                    Err(why) => {
                        tracing::error!(key, why, "cannot read a table definition of the group")
                    }
                }
            }
        }
    } else {
        tracing::error!(key, "unknown kind of schema document");
    }
}

/// What installing a schema changes beyond the swap: events, caches, storage.
#[derive(Default)]
struct Effects {
    events: Vec<SchemaChange>,
    touched_tables: Vec<uuid::Uuid>,
    touched_keyspaces: Vec<String>,
    retired: Vec<Arc<TableDef>>,
    dropped_tables: Vec<Arc<TableDef>>,
    dropped_keyspaces: Vec<String>,
}

fn effects(old: &Schema, new: &Schema) -> Effects {
    let mut fx = Effects::default();
    let event = |change, target| SchemaChange { change, target };
    for (name, ks) in &old.keyspaces {
        match new.keyspaces.get(name) {
            None => {
                fx.events.push(event(
                    SchemaChangeType::Dropped,
                    SchemaChangeTarget::Keyspace(name.clone()),
                ));
                fx.touched_keyspaces.push(name.clone());
                fx.dropped_keyspaces.push(name.clone());
            }
            Some(now) if now != ks => {
                fx.events.push(event(
                    SchemaChangeType::Updated,
                    SchemaChangeTarget::Keyspace(name.clone()),
                ));
                fx.touched_keyspaces.push(name.clone());
            }
            Some(_) => {}
        }
    }
    for name in new.keyspaces.keys() {
        if !old.keyspaces.contains_key(name) {
            fx.events.push(event(
                SchemaChangeType::Created,
                SchemaChangeTarget::Keyspace(name.clone()),
            ));
        }
    }
    let table_target = |t: &TableDef| SchemaChangeTarget::Table(t.keyspace.clone(), t.name.clone());
    for (key, t) in &old.tables {
        let keyspace_dropped = !new.keyspaces.contains_key(&t.keyspace);
        match new.tables.get(key) {
            Some(now) if Arc::ptr_eq(now, t) => {}
            Some(now) if now.id == t.id => {
                if table_document(now) != table_document(t) {
                    fx.events
                        .push(event(SchemaChangeType::Updated, table_target(t)));
                    fx.touched_tables.push(t.id);
                    fx.retired.push(Arc::clone(t));
                }
            }
            replaced => {
                // Gone, or a table of the same name with another id: the old one's data goes.
                if !keyspace_dropped {
                    fx.events
                        .push(event(SchemaChangeType::Dropped, table_target(t)));
                }
                fx.touched_tables.push(t.id);
                fx.dropped_tables.push(Arc::clone(t));
                if replaced.is_some() {
                    fx.events
                        .push(event(SchemaChangeType::Created, table_target(t)));
                }
            }
        }
    }
    for (key, t) in &new.tables {
        if !old.tables.contains_key(key) {
            fx.events
                .push(event(SchemaChangeType::Created, table_target(t)));
        }
    }
    fx
}

impl Engine {
    /// Routes this engine's DDL through the metadata group from now on.
    pub fn set_schema_log(&self, log: Arc<dyn SchemaLog>) {
        if self.schema_log.set(log).is_err() {
            tracing::warn!("the schema log was already set; keeping the first");
        }
    }

    pub(crate) fn schema_log(&self) -> Option<&Arc<dyn SchemaLog>> {
        self.schema_log.get()
    }

    /// The metadata group accepted a change: the schema is now at `epoch`, after `edits`
    /// (key, new content or `None` for a removal). `documents` is the whole schema then,
    /// used when this engine did not follow the change before (it holds another epoch).
    pub fn apply_group_edits<'a>(
        &self,
        epoch: u64,
        edits: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        documents: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        let current = self.schema();
        let next = if current.epoch.is_some_and(|e| e + 1 == epoch) {
            let mut next = (*current).clone();
            for (key, value) in edits {
                apply_document(&mut next, key, value);
            }
            next
        } else {
            schema_from_documents(documents)
        };
        self.install_from_group(next, epoch);
    }

    /// The metadata group's whole schema, at `epoch` (this engine was just attached to the
    /// group, or a snapshot was installed). At epoch 0 with no documents (the group never had
    /// a schema) an engine that holds tables from its local store keeps them, to be proposed
    /// by [`Engine::seed_schema_group`].
    pub fn install_group_schema<'a>(
        &self,
        epoch: u64,
        documents: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        let next = schema_from_documents(documents);
        let current = self.schema();
        // Epoch 0: the group never accepted a change, so it has no documents.
        if epoch == 0 && current.epoch.is_none() && !schema_documents(&current).is_empty() {
            tracing::info!(
                "the metadata group has no schema yet; keeping the local one to propose it"
            );
            return;
        }
        self.install_from_group(next, epoch);
    }

    /// Proposes the schema this engine loaded from its local store as the group's first one,
    /// when the group has none (a data directory from before schema went through the group).
    /// Returns how many documents were proposed; 0 when there was nothing to do, or when
    /// another node's schema got in first (which then replaces the local one).
    pub async fn seed_schema_group(
        &self,
        log: &dyn SchemaLog,
        deadline: Instant,
    ) -> Result<usize, SchemaLogError> {
        let schema = self.schema();
        if schema.epoch.is_some() {
            return Ok(0);
        }
        let documents = schema_documents(&schema);
        // Room for the command's own framing next to the documents.
        let budget = log.max_edit_bytes().saturating_sub(1024).max(1);
        let mut chunks: Vec<Vec<DocumentEdit>> = vec![Vec::new()];
        let mut bytes = 0;
        for (key, value) in documents {
            // JSON inside JSON: quotes are escaped, so count the content twice.
            let size = key.len() + 2 * value.len() + 32;
            if bytes + size > budget && !chunks.last().is_some_and(Vec::is_empty) {
                chunks.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            if let Some(chunk) = chunks.last_mut() {
                chunk.push(DocumentEdit {
                    key,
                    value: Some(value),
                });
            }
        }
        let total: usize = chunks.iter().map(Vec::len).sum();
        // While the chunks go in one by one, the schema installed from the group lacks the
        // later ones: their tables' data and grants must not be dropped meanwhile.
        self.seeding.store(true, Ordering::Release);
        let result = async {
            for (base, chunk) in chunks.into_iter().enumerate() {
                match log.commit(base as u64, chunk, deadline).await? {
                    CommitOutcome::Applied => {}
                    CommitOutcome::Stale if base == 0 => {
                        tracing::warn!("the metadata group already has a schema; the local one is replaced by it");
                        return Ok(0);
                    }
                    CommitOutcome::Stale => {
                        return Err(SchemaLogError::Refused(
                            "another schema change came in while the local schema was proposed",
                        ))
                    }
                }
            }
            Ok(total)
        }
        .await;
        self.seeding.store(false, Ordering::Release);
        result
    }

    /// Installs a schema that came from the group: the digest, the local copy, the swap, the
    /// caches, the storage of dropped tables, their grants, and the events.
    fn install_from_group(&self, mut next: Schema, epoch: u64) {
        next.epoch = Some(epoch);
        next.version = next.digest();
        let old = self.schema();
        let fx = effects(&old, &next);
        // A cache of the group's state: a restart installs the group's schema before serving.
        match serde_json::to_vec(&next.to_persisted()) {
            Ok(json) => {
                if let Err(e) = self.storage.meta_put(crate::SCHEMA_META_KEY, &json) {
                    tracing::error!(error = ?e, "cannot store the local copy of the schema");
                }
            }
            Err(_) => tracing::error!("the schema does not serialize"),
        }
        // Writes planned with a table's old columns must not replace whole rows any more.
        for t in &fx.retired {
            t.layout.retire_regular_columns();
        }
        {
            let mut g = self.schema.write().unwrap_or_else(|p| p.into_inner());
            *g = Arc::new(next);
        }
        for ks in &fx.touched_keyspaces {
            self.invalidate(&fx.touched_tables, Some(ks));
        }
        if fx.touched_keyspaces.is_empty() && !fx.touched_tables.is_empty() {
            self.invalidate(&fx.touched_tables, None);
        }
        // While the local schema is proposed in parts, what is missing is still to come.
        let seeding = self.seeding.load(Ordering::Acquire);
        if !seeding {
            for ks in &fx.dropped_keyspaces {
                self.auth
                    .drop_resource(&self.storage, &auth::AuthResource::keyspace(ks).name);
            }
            for t in &fx.dropped_tables {
                self.auth.drop_resource(
                    &self.storage,
                    &auth::AuthResource::table(&t.keyspace, &t.name).name,
                );
                tracing::info!(keyspace = %t.keyspace, table = %t.name, "dropping the data of a table the schema no longer has");
                if let Err(e) = self.storage.drop_table(*t.id.as_bytes()) {
                    tracing::error!(error = ?e, table = %t.name, "cannot drop a dropped table's data");
                }
            }
        }
        for change in fx.events {
            tracing::info!(change = ?change.change, target = ?change.target, epoch, "schema changed through the group");
            let _ = self.events.send(change);
        }
    }
}

/// A schema holding the built-in keyspaces and these documents.
fn schema_from_documents<'a>(documents: impl IntoIterator<Item = (&'a str, &'a str)>) -> Schema {
    let mut schema = Schema::with_system();
    // Keyspaces sort before tables ("keyspace/" < "table/"), but order does not matter here.
    for (key, value) in documents {
        apply_document(&mut schema, key, Some(value));
    }
    schema
}

/// Runs a DDL statement through the group: read the schema after a read barrier, build the
/// change, propose it against that epoch; rebuild when another change got in first.
pub(crate) async fn execute(
    engine: &Engine,
    log: &Arc<dyn SchemaLog>,
    session_ks: Option<&str>,
    stmt: &sluice_cql::ast::Statement,
    now_micros: i64,
    deadline: Instant,
) -> Result<sluice_protocol::ResultMessage, DetailedError> {
    // One statement at a time per node: the others would only be refused as stale.
    let Ok(_queue) = tokio::time::timeout_at(deadline.into(), engine.ddl_queue.lock()).await else {
        return Err(SchemaLogError::Unavailable(
            "the request's deadline passed while other schema changes of this node ran",
        )
        .to_cql());
    };
    loop {
        if Instant::now() >= deadline {
            return Err(SchemaLogError::Unavailable("the request's deadline passed").to_cql());
        }
        log.read_barrier(deadline)
            .await
            .map_err(SchemaLogError::to_cql)?;
        let base = engine.schema();
        let (result, next) =
            crate::ddl::build(engine, Arc::clone(&base), session_ks, stmt, now_micros)?;
        let Some(next) = next else {
            return Ok(result);
        };
        let edits = document_edits(&base, &next);
        if edits.is_empty() {
            return Ok(result);
        }
        match log
            .commit(base.epoch.unwrap_or(0), edits, deadline)
            .await
            .map_err(SchemaLogError::to_cql)?
        {
            CommitOutcome::Applied => return Ok(result),
            CommitOutcome::Stale => {
                tracing::debug!("a schema change got in first; building the statement again")
            }
        }
    }
}

#[cfg(test)]
mod tests;
