//! INSERT / UPDATE / DELETE / BATCH execution: plans become storage mutations, applied in
//! one atomic `Storage::apply`, then awaited for durability. Conditional statements read,
//! check and write under a per-partition lock stripe.

use crate::analyze::{CondPlan, Op, WriteKind, WritePlan};
use crate::catalog::{invalid, ColumnKind, TableDef};
use crate::codec;
use crate::exec::{self, Binder, PartitionKey, R};
use crate::read::{filter_matches, resolve_filters};
use crate::result::RowsBuilder;
use crate::{storage_error, Engine, RequestContext};
use bytes::Bytes;
use sluice_cql::ast::BatchKind;
use sluice_protocol::{ColumnSpec, Consistency, DetailedError, ResultMessage, Value, WriteType};
use sluice_storage::{
    CellValue, CellWrite, ClusteringSlice, ConditionRead, Liveness, Mutation, PartitionRead,
    RangeDeletion, ReadRow, RowMutation, TableLayout,
};
use sluice_types::{CqlType, NativeType};
use std::borrow::Cow;
use std::ops::Bound;

/// The longest TTL Cassandra accepts (20 years).
const MAX_TTL: i32 = 630_720_000;

/// The write type reported when a batch of this kind times out.
pub(crate) fn batch_write_type(kind: BatchKind) -> WriteType {
    match kind {
        BatchKind::Logged => WriteType::Batch,
        BatchKind::Unlogged => WriteType::UnloggedBatch,
        BatchKind::Counter => WriteType::Counter,
    }
}

/// Counter and non-counter mutations cannot be mixed, as in Cassandra.
pub(crate) fn check_batch_kind<'a>(
    kind: BatchKind,
    writes: impl Iterator<Item = &'a WritePlan>,
) -> Result<(), DetailedError> {
    for w in writes {
        let counter = w.table.is_counter();
        if kind == BatchKind::Counter && !counter {
            return Err(invalid(
                "Only counter mutations are allowed in COUNTER batches",
            ));
        }
        if kind != BatchKind::Counter && counter {
            return Err(invalid(
                "Counter and non-counter mutations cannot exist in the same batch",
            ));
        }
    }
    Ok(())
}

/// The result columns of a conditional statement: `[applied]` then the table's columns.
pub(crate) fn lwt_result_specs(t: &TableDef) -> Vec<ColumnSpec> {
    let mut v = Vec::with_capacity(t.columns.len() + 1);
    v.push(ColumnSpec {
        keyspace: t.keyspace.clone(),
        table: t.name.clone(),
        name: "[applied]".into(),
        ty: CqlType::native(NativeType::Boolean),
    });
    v.extend(t.columns.iter().map(|c| ColumnSpec {
        keyspace: t.keyspace.clone(),
        table: t.name.clone(),
        name: c.name.clone(),
        ty: c.ty.clone(),
    }));
    v
}

/// Write timestamp and expiry of one statement.
struct Stamp {
    ts: i64,
    expiry: Option<(u32, u32)>,
}

fn stamp(
    w: &WritePlan,
    b: &Binder,
    batch_ts: Option<i64>,
    default_ts: Option<i64>,
) -> Result<Stamp, DetailedError> {
    let using_ts = match &w.timestamp {
        Some(v) => exec::opt_i64(b, v, "[timestamp]")?,
        None => None,
    };
    let ts = using_ts
        .or(batch_ts)
        .or(default_ts)
        .unwrap_or_else(|| b.now_micros());
    let ttl = match &w.ttl {
        Some(v) => match exec::opt_i32(b, v, "[ttl]")? {
            Some(t) if t < 0 => {
                return Err(invalid(format!(
                    "A TTL must be greater or equal to 0, but was {t}"
                )))
            }
            Some(t) if t > MAX_TTL => {
                return Err(invalid(format!(
                    "ttl is too large. requested ({t}) maximum ({MAX_TTL})"
                )))
            }
            Some(t) => t,
            None => w.table.options.default_time_to_live,
        },
        None => w.table.options.default_time_to_live,
    };
    let now_secs = (b.now_micros().max(0) / 1_000_000) as u32;
    let expiry = (ttl > 0).then(|| (now_secs.saturating_add(ttl as u32), ttl as u32));
    Ok(Stamp { ts, expiry })
}

fn cell(col: u16, path: Option<Bytes>, value: CellValue, st: &Stamp) -> CellWrite {
    CellWrite {
        column: col,
        path,
        value,
        timestamp: st.ts,
        expiry: st.expiry,
    }
}

fn tombstone(col: u16, path: Option<Bytes>, ts: i64) -> CellWrite {
    CellWrite {
        column: col,
        path,
        value: CellValue::Tombstone,
        timestamp: ts,
        expiry: None,
    }
}

/// A 16-byte list element key: `hi` orders the element, `lo` makes it unique.
fn list_key(hi: u64, lo: u64) -> Bytes {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&hi.to_be_bytes());
    k[8..].copy_from_slice(&lo.to_be_bytes());
    Bytes::copy_from_slice(&k)
}

/// Context to write one row's cells.
struct RowCtx<'a> {
    engine: &'a Engine,
    t: &'a TableDef,
    pk: &'a PartitionKey,
    clustering: &'a [Bytes],
    now_secs: u32,
}

impl RowCtx<'_> {
    /// Reads the current elements (path, value) of a list column.
    fn read_list(&self, col: u16, is_static: bool) -> Result<Vec<(Bytes, Bytes)>, DetailedError> {
        let slice = if is_static || self.clustering.is_empty() {
            ClusteringSlice::all()
        } else {
            ClusteringSlice {
                ranges: vec![(
                    Bound::Included(self.clustering.to_vec()),
                    Bound::Included(self.clustering.to_vec()),
                )],
                reversed: false,
            }
        };
        let read = self
            .engine
            .storage
            .read_partition(
                &self.t.layout,
                self.pk.token,
                &self.pk.key,
                &slice,
                None,
                1,
                self.now_secs,
            )
            .map_err(storage_error)?;
        let row = if is_static {
            read.static_row.as_ref()
        } else {
            read.rows.first()
        };
        Ok(row
            .map(|r| {
                r.cells
                    .iter()
                    .filter(|c| c.column == col)
                    .filter_map(|c| Some((c.path.clone()?, c.value.clone())))
                    .collect()
            })
            .unwrap_or_default())
    }
}

fn list_index(b: &Binder, key: &crate::analyze::Val, len: usize) -> Result<usize, DetailedError> {
    let i =
        exec::opt_i32(b, key, "list index")?.ok_or_else(|| invalid("Invalid null list index"))?;
    if i < 0 || i as usize >= len {
        return Err(invalid(format!(
            "List index {i} out of bound, list has size {len}"
        )));
    }
    Ok(i as usize)
}

/// The cells (and collection deletions) one operation writes.
fn op_cells(
    rc: &RowCtx,
    op: &Op,
    b: &Binder,
    st: &Stamp,
    cells: &mut Vec<CellWrite>,
    coll_dels: &mut Vec<(u16, i64)>,
) -> Result<(), DetailedError> {
    let col = &rc.t.columns[op.col()];
    let id = col.id;
    let is_static = col.kind == ColumnKind::Static;
    let ty = &col.ty;
    let list_seq = |n: usize| rc.engine.next_list_seq_block(n as u64);
    match op {
        Op::Set { val, .. } => match b.get(val) {
            R::Unset => {}
            R::Null => {
                if ty.is_multi_cell_collection() {
                    // An overwrite, as with a value: Cassandra deletes at ts-1, so elements
                    // written at the same timestamp survive.
                    coll_dels.push((id, st.ts.saturating_sub(1)));
                } else {
                    cells.push(tombstone(id, None, st.ts));
                }
            }
            R::V(bytes) => {
                if ty.is_multi_cell_collection() {
                    // The old elements go at ts-1 so that the new ones (at ts) survive.
                    coll_dels.push((id, st.ts.saturating_sub(1)));
                    add_elements(rc, ty, id, &bytes, false, st, cells, &list_seq)?;
                } else {
                    cells.push(cell(id, None, CellValue::Live(bytes), st));
                }
            }
        },
        Op::Append { val, .. } | Op::Prepend { val, .. } => {
            if let R::V(bytes) = b.get(val) {
                add_elements(
                    rc,
                    ty,
                    id,
                    &bytes,
                    matches!(op, Op::Prepend { .. }),
                    st,
                    cells,
                    &list_seq,
                )?;
            }
        }
        Op::Remove { val, .. } => {
            if let R::V(bytes) = b.get(val) {
                let items = codec::split_collection(&bytes)
                    .ok_or_else(|| invalid("Invalid collection value"))?;
                match ty {
                    CqlType::List(et) => {
                        for (path, v) in rc.read_list(id, is_static)? {
                            if items
                                .iter()
                                .any(|x| sluice_types::compare(et, x, &v).is_eq())
                            {
                                cells.push(tombstone(id, Some(path), st.ts));
                            }
                        }
                    }
                    _ => {
                        for k in items {
                            cells.push(tombstone(id, Some(k), st.ts));
                        }
                    }
                }
            }
        }
        Op::SetElement { key, val, .. } => {
            let value = match b.get(val) {
                R::Unset => return Ok(()),
                R::Null => CellValue::Tombstone,
                R::V(v) => CellValue::Live(v),
            };
            let path = match ty {
                CqlType::List(_) => {
                    let list = rc.read_list(id, is_static)?;
                    let i = list_index(b, key, list.len())?;
                    list[i].0.clone()
                }
                _ => b.required(key, "map key")?,
            };
            cells.push(cell(id, Some(path), value, st));
        }
        Op::DeleteElement { key, .. } => {
            let path = match ty {
                CqlType::List(_) => {
                    let list = rc.read_list(id, is_static)?;
                    let i = list_index(b, key, list.len())?;
                    list[i].0.clone()
                }
                _ => b.required(key, "collection element")?,
            };
            cells.push(tombstone(id, Some(path), st.ts));
        }
        Op::Counter { val, negate, .. } => match b.get(val) {
            R::Unset => {}
            R::Null => return Err(invalid("Invalid null value for counter increment")),
            R::V(bytes) => {
                let d =
                    codec::as_i64(&bytes).ok_or_else(|| invalid("Invalid counter increment"))?;
                let d = if *negate {
                    d.checked_neg()
                        .ok_or_else(|| invalid("Counter decrement overflow"))?
                } else {
                    d
                };
                cells.push(CellWrite {
                    column: id,
                    path: None,
                    value: CellValue::CounterDelta(d),
                    timestamp: st.ts,
                    expiry: None,
                });
            }
        },
        Op::Delete { .. } => {
            if ty.is_multi_cell_collection() {
                coll_dels.push((id, st.ts));
            } else {
                cells.push(tombstone(id, None, st.ts));
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn add_elements(
    rc: &RowCtx,
    ty: &CqlType,
    id: u16,
    bytes: &Bytes,
    prepend: bool,
    st: &Stamp,
    cells: &mut Vec<CellWrite>,
    list_seq: &dyn Fn(usize) -> u64,
) -> Result<(), DetailedError> {
    match ty {
        CqlType::Map(_, _) => {
            let pairs = codec::split_map(bytes).ok_or_else(|| invalid("Invalid map value"))?;
            for (k, v) in pairs {
                cells.push(cell(id, Some(k), CellValue::Live(v), st));
            }
        }
        CqlType::Set(_) => {
            let items =
                codec::split_collection(bytes).ok_or_else(|| invalid("Invalid set value"))?;
            for k in items {
                cells.push(cell(id, Some(k), CellValue::Live(Bytes::new()), st));
            }
        }
        _ => {
            let items =
                codec::split_collection(bytes).ok_or_else(|| invalid("Invalid list value"))?;
            let base = list_seq(items.len());
            let now = rc.engine_now_micros();
            // Appends sort after every prepend; later prepends sort before earlier ones.
            let hi = if prepend {
                (1u64 << 62).saturating_sub(now)
            } else {
                (1u64 << 63) + now
            };
            for (i, v) in items.into_iter().enumerate() {
                cells.push(cell(
                    id,
                    Some(list_key(hi, base + i as u64)),
                    CellValue::Live(v),
                    st,
                ));
            }
        }
    }
    Ok(())
}

impl RowCtx<'_> {
    fn engine_now_micros(&self) -> u64 {
        crate::now_micros().max(0) as u64
    }
}

impl Engine {
    /// Reserves `n` consecutive list-element sequence numbers.
    pub(crate) fn next_list_seq_block(&self, n: u64) -> u64 {
        let first = self.next_list_seq();
        for _ in 1..n {
            self.next_list_seq();
        }
        first
    }
}

/// Builds the mutations of one write statement.
pub(crate) fn build_mutations(
    engine: &Engine,
    w: &WritePlan,
    b: &Binder,
    batch_ts: Option<i64>,
    default_ts: Option<i64>,
    out: &mut Vec<Mutation>,
) -> Result<(), DetailedError> {
    let t = &*w.table;
    let st = stamp(w, b, batch_ts, default_ts)?;
    let keys = exec::partition_keys(b, t, &w.where_)?;
    let now_secs = (b.now_micros().max(0) / 1_000_000) as u32;
    let full_key = w.where_.ck_covered == t.clustering.len() && w.where_.ck_slice.is_none();
    let points = if full_key && !t.clustering.is_empty() {
        exec::clustering_points(b, t, &w.where_)?
    } else {
        vec![Vec::new()]
    };
    for p in &points {
        for (i, v) in p.iter().enumerate() {
            if v.len() > u16::MAX as usize {
                let name = &t.columns[t.clustering[i]].name;
                return Err(invalid(format!(
                    "Key length exceeds 65535 bytes for {name}"
                )));
            }
        }
    }
    for pk in &keys {
        let mut m = Mutation {
            table: *t.id.as_bytes(),
            token: pk.token,
            partition_key: pk.key.clone(),
            partition_deletion: None,
            range_deletions: Vec::new(),
            static_row: None,
            rows: Vec::with_capacity(points.len()),
        };
        if w.kind == WriteKind::Delete && w.ops.is_empty() {
            if !w.where_.restricts_clustering() {
                m.partition_deletion = Some(st.ts);
            } else if full_key {
                for p in &points {
                    m.rows.push(RowMutation {
                        clustering: p.clone(),
                        deletion: Some(st.ts),
                        ..RowMutation::default()
                    });
                }
            } else {
                for (start, end) in exec::clustering_ranges(b, t, &w.where_)? {
                    m.range_deletions.push(RangeDeletion {
                        start,
                        end,
                        timestamp: st.ts,
                    });
                }
            }
            out.push(m);
            continue;
        }
        let has_static = w
            .ops
            .iter()
            .any(|o| t.columns[o.col()].kind == ColumnKind::Static);
        if has_static {
            let rc = RowCtx {
                engine,
                t,
                pk,
                clustering: &[],
                now_secs,
            };
            let mut row = RowMutation::default();
            for op in w
                .ops
                .iter()
                .filter(|o| t.columns[o.col()].kind == ColumnKind::Static)
            {
                op_cells(
                    &rc,
                    op,
                    b,
                    &st,
                    &mut row.cells,
                    &mut row.collection_deletions,
                )?;
            }
            m.static_row = Some(row);
        }
        if !w.static_only {
            for p in &points {
                let rc = RowCtx {
                    engine,
                    t,
                    pk,
                    clustering: p,
                    now_secs,
                };
                let mut row = RowMutation {
                    clustering: p.clone(),
                    liveness: (w.kind == WriteKind::Insert).then_some(Liveness {
                        timestamp: st.ts,
                        expiry: st.expiry,
                    }),
                    // One cell per operation, except for collection elements.
                    cells: Vec::with_capacity(w.ops.len()),
                    ..RowMutation::default()
                };
                for op in w
                    .ops
                    .iter()
                    .filter(|o| t.columns[o.col()].kind != ColumnKind::Static)
                {
                    op_cells(
                        &rc,
                        op,
                        b,
                        &st,
                        &mut row.cells,
                        &mut row.collection_deletions,
                    )?;
                }
                m.rows.push(row);
            }
        }
        out.push(m);
    }
    Ok(())
}

/// Merges mutations of the same partition so that storage sees each partition once.
pub(crate) fn merge_mutations(muts: Vec<Mutation>) -> Vec<Mutation> {
    let mut out: Vec<Mutation> = Vec::with_capacity(muts.len());
    for m in muts {
        let Some(existing) = out.iter_mut().find(|e| {
            e.table == m.table && e.token == m.token && e.partition_key == m.partition_key
        }) else {
            out.push(m);
            continue;
        };
        existing.partition_deletion = existing.partition_deletion.max(m.partition_deletion);
        existing.range_deletions.extend(m.range_deletions);
        if let Some(s) = m.static_row {
            match &mut existing.static_row {
                Some(e) => merge_row(e, s),
                None => existing.static_row = Some(s),
            }
        }
        for r in m.rows {
            match existing
                .rows
                .iter_mut()
                .find(|e| e.clustering == r.clustering)
            {
                Some(e) => merge_row(e, r),
                None => existing.rows.push(r),
            }
        }
    }
    out
}

fn merge_row(into: &mut RowMutation, r: RowMutation) {
    into.liveness = match (into.liveness, r.liveness) {
        (Some(a), Some(b)) => Some(if b.timestamp >= a.timestamp { b } else { a }),
        (a, b) => a.or(b),
    };
    into.deletion = into.deletion.max(r.deletion);
    into.collection_deletions.extend(r.collection_deletions);
    into.cells.extend(r.cells);
}

/// Each entry's bound values with sets and maps in canonical order, or `None` when they
/// all are already (the common case, which allocates nothing). The statements of a
/// protocol BATCH are bound without `exec::order_values`, which does this for the others;
/// for those, this is one more pass over their set and map values only.
fn canonical_entries(entries: &[(&WritePlan, &Binder<'_>)]) -> Option<Vec<Option<Vec<Value>>>> {
    let mut out: Option<Vec<Option<Vec<Value>>>> = None;
    for (i, (w, b)) in entries.iter().enumerate() {
        if w.canonical_binds.is_empty() {
            continue;
        }
        let markers = w.canonical_binds.iter().map(|(m, ty)| (*m, ty));
        if let Cow::Owned(values) = exec::canonical_values(markers, Cow::Borrowed(b.values())) {
            if let Some(slot) = out
                .get_or_insert_with(|| entries.iter().map(|_| None).collect())
                .get_mut(i)
            {
                *slot = Some(values);
            }
        }
    }
    out
}

/// Binders over the canonical values of the entries that have them.
fn canonical_binders<'v>(
    entries: &[(&WritePlan, &Binder<'_>)],
    canonical: &'v [Option<Vec<Value>>],
) -> Vec<Option<Binder<'v>>> {
    entries
        .iter()
        .zip(canonical)
        .map(|((_, b), values)| values.as_deref().map(|v| b.with_values(v)))
        .collect()
}

/// The entries, each with its canonical binder when it has one.
fn rebind<'a>(
    entries: &[(&'a WritePlan, &'a Binder<'a>)],
    binders: &'a [Option<Binder<'a>>],
) -> Vec<(&'a WritePlan, &'a Binder<'a>)> {
    entries
        .iter()
        .zip(binders)
        .map(|((w, b), canonical)| (*w, canonical.as_ref().unwrap_or(*b)))
        .collect()
}

/// Applies the mutations of several write statements atomically and waits for durability.
pub(crate) async fn execute_writes(
    engine: &Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    batch_ts: Option<i64>,
    default_ts: Option<i64>,
    consistency: Consistency,
    ctx: &RequestContext,
    write_type: WriteType,
) -> Result<ResultMessage, DetailedError> {
    let canonical = canonical_entries(entries);
    let binders = canonical.as_deref().map(|c| canonical_binders(entries, c));
    let rebound = binders.as_deref().map(|b| rebind(entries, b));
    let entries = rebound.as_deref().unwrap_or(entries);
    // One timestamp for the whole request (a batch's statements share it).
    let request_ts = default_ts.unwrap_or_else(|| engine.write_timestamp(ctx.now_micros));
    let default_ts = Some(request_ts);
    let mut muts = Vec::with_capacity(entries.len());
    for (w, b) in entries {
        build_mutations(engine, w, b, batch_ts, default_ts, &mut muts)?;
    }
    let muts = merge_mutations(muts);
    if muts.is_empty() {
        return Ok(ResultMessage::Void);
    }
    // Never start storage work after the deadline.
    if exec::expired(ctx.deadline) {
        return Err(exec::write_timeout(consistency, write_type));
    }
    // `transactional_mode = 'full'` on a cluster: the write is ordered with every transaction
    // and LWT of the table through the log, with the log's timestamp.
    if commit_assigns_timestamp(entries, batch_ts, &muts) {
        if let Some(log) = engine.txn_log_for(entries.iter().map(|(w, _)| &*w.table)) {
            let deadline = ctx
                .deadline
                .unwrap_or_else(|| std::time::Instant::now() + LOGGED_LWT_DEFAULT_WAIT);
            Box::pin(crate::transaction::replicated::commit_blind(
                engine,
                log,
                muts,
                request_ts,
                deadline,
                || exec::write_timeout(consistency, write_type),
            ))
            .await?;
            return Ok(ResultMessage::Void);
        }
    }
    // A LOGGED batch over several replica sets is atomic across them through the log. One
    // replica set needs no log: each replica applies its one MUTATION whole, so none holds
    // part of the batch. UNLOGGED batches promise nothing more; COUNTER batches are deltas,
    // which the log's replay and the fan-out would both apply.
    if write_type == WriteType::Batch {
        if let Some(route) = crate::logged_batch::route(engine, entries, &muts) {
            match Box::pin(crate::logged_batch::execute(
                engine,
                route,
                entries,
                muts,
                request_ts,
                consistency,
                ctx,
            ))
            .await?
            {
                None => return Ok(ResultMessage::Void),
                Some(local) => {
                    apply(engine, entries, local, ctx.ack_barrier).await?;
                    return Ok(ResultMessage::Void);
                }
            }
        }
    }
    let muts = match engine.replica_transport() {
        // Boxed: a single node's write future stays as small as it was.
        Some(transport) if engine.is_multi_node() => {
            match Box::pin(crate::coordinator::replicate_writes(
                engine,
                transport,
                entries,
                muts,
                consistency,
                write_type,
                ctx,
            ))
            .await?
            {
                // Every partition's only replica is this node: the local path below.
                Some(muts) => muts,
                None => return Ok(ResultMessage::Void),
            }
        }
        _ => muts,
    };
    if commit_assigns_timestamp(entries, batch_ts, &muts) {
        apply_with_assigned_timestamp(engine, entries, muts, default_ts, ctx.ack_barrier).await?;
        return Ok(ResultMessage::Void);
    }
    apply(engine, entries, muts, ctx.ack_barrier).await?;
    Ok(ResultMessage::Void)
}

/// Whether a plain write gets a commit-assigned timestamp: every table it writes has
/// `transactional_mode = 'full'` (counters excepted), no statement carries its own
/// timestamp, and it writes one partition (a batch over several keeps its timestamps).
fn commit_assigns_timestamp(
    entries: &[(&WritePlan, &Binder<'_>)],
    batch_ts: Option<i64>,
    muts: &[Mutation],
) -> bool {
    batch_ts.is_none()
        && muts.len() == 1
        && entries.iter().all(|(w, _)| {
            w.table.options.transactional_mode == crate::catalog::TransactionalMode::Full
                && !w.table.is_counter()
                && w.timestamp.is_none()
        })
}

/// Applies a one-partition write whose timestamp the commit assigns (above everything
/// stored in the partition's stripe), then waits as [`apply`] does.
async fn apply_with_assigned_timestamp(
    engine: &Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    muts: Vec<Mutation>,
    provisional: Option<i64>,
    ack_barrier: Option<sluice_storage::AckBarrierHeld>,
) -> Result<(), DetailedError> {
    let batch = with_layouts(entries, muts)?;
    let Some((_, first)) = batch.first() else {
        return Ok(());
    };
    let (token, key) = (first.token, first.partition_key.clone());
    let outcome = engine
        .storage
        .apply_conditional(token, &key, &[], 0, &batch, provisional, |_| true)
        .map_err(storage_error)?;
    if let Some(ts) = outcome.timestamp {
        engine.note_write_timestamp(ts);
    }
    match outcome.ticket {
        Some(ticket) => wait_until_durable(engine, ticket, ack_barrier).await,
        None => Err(DetailedError::new(
            sluice_protocol::DbError::ServerError,
            "an unconditional write was not applied",
        )),
    }
}

/// Applies `muts` and waits until they are durable, or only until they are applied when the
/// caller's acknowledgement barrier will make them durable (see
/// [`RequestContext::ack_barrier`]).
async fn apply(
    engine: &Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    muts: Vec<Mutation>,
    ack_barrier: Option<sluice_storage::AckBarrierHeld>,
) -> Result<(), DetailedError> {
    let batch = with_layouts(entries, muts)?;
    let ticket = engine.storage.apply(&batch).map_err(storage_error)?;
    wait_until_durable(engine, ticket, ack_barrier).await
}

/// Applies `muts` now (visible to reads) and returns the ticket to await durability with.
pub(crate) fn apply_now(
    engine: &Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    muts: Vec<Mutation>,
) -> Result<sluice_storage::CommitTicket, DetailedError> {
    let batch = with_layouts(entries, muts)?;
    engine.storage.apply(&batch).map_err(storage_error)
}

/// Pairs each mutation with its table's layout.
fn with_layouts<'p>(
    entries: &[(&'p WritePlan, &Binder<'_>)],
    muts: Vec<Mutation>,
) -> Result<Vec<(&'p TableLayout, Mutation)>, DetailedError> {
    muts.into_iter()
        .map(|m| {
            entries
                .iter()
                .find(|(w, _)| *w.table.id.as_bytes() == m.table)
                .map(|(w, _)| (&w.table.layout, m))
                .ok_or_else(|| invalid("Mutation for an unknown table"))
        })
        .collect()
}

/// Waits until `ticket`'s write is durable, or only until it is applied when the caller's
/// acknowledgement barrier will make it durable.
pub(crate) async fn wait_until_durable(
    engine: &Engine,
    ticket: sluice_storage::CommitTicket,
    ack_barrier: Option<sluice_storage::AckBarrierHeld>,
) -> Result<(), DetailedError> {
    if let Some(held) = ack_barrier {
        if engine.storage.durable_at_ack_barrier(&ticket, held) {
            return Ok(());
        }
    }
    engine
        .storage
        .wait_durable(ticket)
        .await
        .map_err(storage_error)
}

/// Waits until everything a read that has returned could have seen (in the store of
/// `token`, or in every store) is durable, so that an answer showing the read's result
/// never shows a write a crash can still lose: at most one group fsync (in Periodic mode,
/// until it is in the OS, what that mode acknowledges). Answers `timeout()` if `deadline`
/// passes first. No lock is held while waiting.
pub(crate) async fn wait_seen_durable(
    engine: &Engine,
    token: Option<i64>,
    deadline: Option<std::time::Instant>,
    timeout: impl FnOnce() -> DetailedError,
) -> Result<(), DetailedError> {
    let ticket = engine.storage.seen_ticket(token);
    let wait = engine.storage.wait_durable(ticket);
    let Some(deadline) = deadline else {
        return wait.await.map_err(storage_error);
    };
    match tokio::time::timeout_at(deadline.into(), wait).await {
        Ok(done) => done.map_err(storage_error),
        Err(_) => Err(timeout()),
    }
}

/// The single row a conditional statement checks: its clustering key (empty for the
/// static row or tables without clustering columns).
fn condition_row(w: &WritePlan, b: &Binder) -> Result<Vec<Bytes>, DetailedError> {
    let t = &*w.table;
    let full_key = w.where_.ck_covered == t.clustering.len() && w.where_.ck_slice.is_none();
    let points = if t.clustering.is_empty() || w.static_only && !w.where_.restricts_clustering() {
        vec![Vec::new()]
    } else if full_key {
        exec::clustering_points(b, t, &w.where_)?
    } else {
        return Err(invalid("Conditional updates require the full primary key"));
    };
    match <[Vec<Bytes>; 1]>::try_from(points) {
        Ok([ck]) => Ok(ck),
        Err(_) => Err(invalid(
            "IN on the clustering key columns is not supported with conditional updates",
        )),
    }
}

/// What one conditional statement checks, prepared before the partition's locks: the
/// row it reads and its column conditions with their operands bound.
struct ConditionInputs<'p> {
    plan: &'p WritePlan,
    filters: Vec<crate::read::ResolvedFilter>,
}

/// The row a statement's condition reads and its bound column conditions.
fn condition_inputs<'p>(
    w: &'p WritePlan,
    b: &Binder,
) -> Result<(ConditionRead<'p>, ConditionInputs<'p>), DetailedError> {
    let ck = condition_row(w, b)?;
    let filters = match &w.condition {
        Some(CondPlan::Columns(fs)) => resolve_filters(b, fs)?,
        _ => Vec::new(),
    };
    let slice = if ck.is_empty() {
        ClusteringSlice::all()
    } else {
        ClusteringSlice {
            ranges: vec![(Bound::Included(ck.clone()), Bound::Included(ck))],
            reversed: false,
        }
    };
    let read = ConditionRead {
        layout: &w.table.layout,
        slice,
        limit: 1,
    };
    Ok((read, ConditionInputs { plan: w, filters }))
}

/// The row a condition read, as the result and the condition see it.
fn condition_source<'r>(
    w: &WritePlan,
    read: &'r PartitionRead,
    pk: &'r PartitionKey,
) -> (crate::read::StoredRow<'r>, bool) {
    let row: Option<&ReadRow> = if w.static_only {
        None
    } else {
        read.rows.first()
    };
    let stat = read.static_row.as_ref();
    let exists = if w.static_only {
        stat.is_some()
    } else {
        row.is_some()
    };
    let src = crate::read::StoredRow {
        pk: &pk.components,
        row,
        stat,
        token: pk.token,
    };
    (src, exists)
}

/// Whether one statement's condition holds on the row it read (run under the partition's
/// stripe locks: comparisons only).
fn condition_holds(
    inputs: &ConditionInputs<'_>,
    read: &PartitionRead,
    pk: &PartitionKey,
) -> Result<bool, DetailedError> {
    let w = inputs.plan;
    let t = &*w.table;
    let (src, exists) = condition_source(w, read, pk);
    Ok(match &w.condition {
        Some(CondPlan::NotExists) => !exists,
        Some(CondPlan::Exists) => exists,
        Some(CondPlan::Columns(_)) => {
            for f in &inputs.filters {
                let v = crate::read::RowSource::value(&src, t, f.col());
                if !filter_matches(t, f, v.as_ref())? {
                    return Ok(false);
                }
            }
            true
        }
        None => true,
    })
}

/// The row's cells as shown in the result (table columns, ScyllaDB style): key and
/// regular columns only for an existing row; static columns whenever the partition has them.
fn shown_cells(w: &WritePlan, read: &PartitionRead, pk: &PartitionKey) -> Vec<Option<Bytes>> {
    let t = &*w.table;
    let (src, exists) = condition_source(w, read, pk);
    t.columns
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            if exists || c.kind == ColumnKind::Static {
                crate::read::RowSource::value(&src, t, ci)
            } else {
                None
            }
        })
        .collect()
}

/// Executes conditional statements (one, or a conditional batch on one partition): read,
/// check every condition, and write everything only if all hold, inside the storage commit
/// under the partition's stripe locks (which plain writes take too); durability is awaited
/// after they are released, so concurrent LWTs share an fsync. The result has one row per conditional statement: `[applied]` then the
/// row as it was (ScyllaDB's stable layout).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn execute_conditional(
    engine: &Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    batch_ts: Option<i64>,
    default_ts: Option<i64>,
    consistency: Consistency,
    skip_metadata: bool,
    ctx: &RequestContext,
) -> Result<ResultMessage, DetailedError> {
    let canonical = canonical_entries(entries);
    let binders = canonical.as_deref().map(|c| canonical_binders(entries, c));
    let rebound = binders.as_deref().map(|b| rebind(entries, b));
    let entries = rebound.as_deref().unwrap_or(entries);
    let request_ts = default_ts.unwrap_or_else(|| engine.write_timestamp(ctx.now_micros));
    let default_ts = Some(request_ts);
    let mut partition: Option<PartitionKey> = None;
    let mut table = None;
    for (w, b) in entries {
        let keys = exec::partition_keys(b, &w.table, &w.where_)?;
        let [pk] = keys.as_slice() else {
            return Err(invalid(
                "IN on the partition key is not supported with conditional updates",
            ));
        };
        if table.is_some_and(|id| id != w.table.id)
            || partition.as_ref().is_some_and(|p| p.key != pk.key)
        {
            return Err(invalid(
                "Batch with conditions cannot span multiple tables or partitions",
            ));
        }
        table = Some(w.table.id);
        partition = Some(pk.clone());
    }
    let (Some(pk), Some((first, _))) = (partition, entries.first()) else {
        return Ok(ResultMessage::Void);
    };
    let t = &*first.table;
    // Benchmark switch only: the old behaviour, one LWT per lock stripe until durable.
    let _serialized = match engine.lwt_durability_serializer(pk.token) {
        Some(stripe) => Some(stripe.lock().await),
        None => None,
    };
    if exec::expired(ctx.deadline) {
        return Err(exec::write_timeout(consistency, WriteType::Cas));
    }
    let now_secs = (ctx.now_micros.max(0) / 1_000_000) as u32;
    // Everything but the check itself is prepared before the partition's locks.
    let mut reads = Vec::new();
    let mut conditions = Vec::new();
    for (w, b) in entries.iter().filter(|(w, _)| w.condition.is_some()) {
        let (read, inputs) = condition_inputs(w, b)?;
        reads.push(read);
        conditions.push(inputs);
    }
    let mut muts = Vec::new();
    for (w, b) in entries {
        build_mutations(engine, w, b, batch_ts, default_ts, &mut muts)?;
    }
    let batch = with_layouts(entries, merge_mutations(muts))?;
    // The commit moves the write above what the partition's stripe stores, unless the
    // statements carry their own timestamp.
    let provisional = (batch_ts.is_none() && entries.iter().all(|(w, _)| w.timestamp.is_none()))
        .then_some(default_ts)
        .flatten();
    let specs = lwt_result_specs(t);
    if let Some(log) = engine.txn_log_for(std::iter::once(t)) {
        let muts: Vec<Mutation> = batch.into_iter().map(|(_, m)| m).collect();
        let (found, applied) = Box::pin(logged_conditional(
            engine,
            log,
            t,
            &pk,
            &reads,
            &conditions,
            muts,
            request_ts,
            consistency,
            ctx,
        ))
        .await?;
        let mut rows = RowsBuilder::new(specs.len());
        for (inputs, read) in conditions.iter().zip(&found) {
            rows.cell(Some(&[applied as u8]));
            for c in shown_cells(inputs.plan, read, &pk) {
                rows.cell(c.as_deref());
            }
        }
        return Ok(ResultMessage::Rows(rows.finish(
            specs.into(),
            None,
            skip_metadata,
        )));
    }
    let mut failure = None;
    let outcome = engine
        .storage
        .apply_conditional(
            pk.token,
            &pk.key,
            &reads,
            now_secs,
            &batch,
            provisional,
            |found| {
                for (inputs, read) in conditions.iter().zip(found) {
                    match condition_holds(inputs, read, &pk) {
                        Ok(true) => {}
                        Ok(false) => return false,
                        Err(e) => {
                            failure = Some(e);
                            return false;
                        }
                    }
                }
                true
            },
        )
        .map_err(storage_error)?;
    if let Some(e) = failure {
        return Err(e);
    }
    let applied = outcome.applied();
    let mut rows = RowsBuilder::new(specs.len());
    for (inputs, read) in conditions.iter().zip(&outcome.reads) {
        rows.cell(Some(&[applied as u8]));
        for c in shown_cells(inputs.plan, read, &pk) {
            rows.cell(c.as_deref());
        }
    }
    if let Some(ticket) = outcome.ticket {
        if let Some(ts) = outcome.timestamp {
            engine.note_write_timestamp(ts);
        }
        wait_until_durable(engine, ticket, ctx.ack_barrier).await?;
    } else {
        // The `[applied] = false` row shows the partition as the check read it.
        wait_seen_durable(engine, Some(pk.token), ctx.deadline, || {
            exec::write_timeout(consistency, WriteType::Cas)
        })
        .await?;
    }
    Ok(ResultMessage::Rows(rows.finish(
        specs.into(),
        None,
        skip_metadata,
    )))
}

/// An LWT on a multi-node cluster: the condition is read and checked on this replica at a
/// log index it has applied, and the writes go through the cluster's transaction log (see
/// `transaction::replicated`). Answers what the check read and whether it applied.
#[allow(clippy::too_many_arguments)]
async fn logged_conditional(
    engine: &Engine,
    log: &std::sync::Arc<dyn crate::transaction::replicated::TxnLog>,
    t: &crate::catalog::TableDef,
    pk: &PartitionKey,
    reads: &[ConditionRead<'_>],
    conditions: &[ConditionInputs<'_>],
    muts: Vec<Mutation>,
    provisional: i64,
    consistency: Consistency,
    ctx: &RequestContext,
) -> Result<(Vec<PartitionRead>, bool), DetailedError> {
    use crate::transaction::replicated::{self, Evaluated, LoggedPartition};
    let part = LoggedPartition {
        table: *t.id.as_bytes(),
        token: pk.token,
        key_hash: replicated::key_hash(&pk.key),
    };
    let now_secs = (ctx.now_micros.max(0) / 1_000_000) as u32;
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| std::time::Instant::now() + LOGGED_LWT_DEFAULT_WAIT);
    replicated::read_and_commit(
        engine,
        log,
        deadline,
        || replicated::cas_timeout(consistency),
        || {
            engine.check_txn_reads(&[(t, pk.token)])?;
            let mut failure = None;
            let mut holds = true;
            let outcome = engine
                .storage
                .apply_conditional(pk.token, &pk.key, reads, now_secs, &[], None, |found| {
                    for (inputs, read) in conditions.iter().zip(found) {
                        match condition_holds(inputs, read, pk) {
                            Ok(true) => {}
                            Ok(false) => holds = false,
                            Err(e) => {
                                failure = Some(e);
                                holds = false;
                            }
                        }
                    }
                    // Nothing is written here: the log commits the writes on every replica.
                    false
                })
                .map_err(storage_error)?;
            if let Some(e) = failure {
                return Err(e);
            }
            Ok(Evaluated {
                reads: vec![part],
                mutations: if holds { muts.clone() } else { Vec::new() },
                provisional,
                result: (outcome.reads, holds),
            })
        },
    )
    .await
}

/// How long a logged LWT without a deadline of its own may take.
const LOGGED_LWT_DEFAULT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
