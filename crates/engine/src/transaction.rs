//! `BEGIN TRANSACTION ... COMMIT TRANSACTION` (Cassandra Accord's CQL) on one node.
//!
//! Every partition a transaction touches is named by a full key in its text, so all of
//! them are known once it is bound. Execution: admission through the adaptive limit
//! ([`gate`]); binding, keys and every write that does not depend on a LET value built
//! before any lock; then one storage call (`Storage::apply_transaction`) takes all the
//! partitions' stripe locks in one global order, reads the LET rows, evaluates the IF,
//! builds the remaining writes and commits them (one batch per store, with a batchlog
//! record when they span stores); durability is awaited after the locks are released.
//! Ordered locking means no deadlock and no abort on conflict: a transaction that meets
//! another waits for it, and is serializable because everything it read stays locked
//! until it has written.

pub mod gate;
pub mod replicated;

use crate::analyze::{Analyzer, Filter, FilterRhs, SelItem, SelectPlan, Val, Where, WritePlan};
use crate::catalog::{invalid, TableDef};
use crate::exec::{self, Binder, PartitionKey, R};
use crate::read::{filter_matches, resolve_filters, ResolvedFilter, RowSource, StoredRow};
use crate::result::RowsBuilder;
use crate::{storage_error, Engine, Prepared, RequestContext};
use bytes::Bytes;
use sluice_cql::ast::{
    Assignment, BatchStatement, Insert, Operator, RowReference, Term, Transaction, TxnReturning,
    TxnTest, Update,
};
use sluice_protocol::{ColumnSpec, DbError, DetailedError, QueryParameters, ResultMessage, Value};
use sluice_storage::{ClusteringSlice, Mutation, PartitionRead, TxnError, TxnPartition, TxnRead};
use sluice_types::{CqlType, NativeType};
use std::sync::Arc;

/// Most rows a transaction's returning SELECT reads (under the transaction's locks).
const MAX_RETURNED_ROWS: usize = 1000;

/// How long a logged transaction without a deadline of its own may take.
const LOGGED_DEFAULT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// An analysed transaction.
#[derive(Debug, Clone)]
pub(crate) struct TxnPlan {
    /// The reads, in order: the LETs, then the returning SELECT's, then those that
    /// `SET c = c + v` needs.
    reads: Vec<ReadPlan>,
    /// What the transaction returns.
    returning: Returning,
    /// Every write statement.
    writes: Vec<WritePlan>,
    /// Writes that run whatever the IF decides.
    always: Vec<usize>,
    /// `IF`, `ELSE IF`..., `ELSE`: the first whose conditions hold runs.
    branches: Vec<Branch>,
    /// Values computed under the locks, bound as markers `user_binds + i`.
    slots: Vec<Slot>,
    /// Which writes read a slot (built under the locks); the others are built before.
    uses_slots: Vec<bool>,
    /// Markers of the statement text.
    user_binds: usize,
}

/// One row (or, for the returning SELECT, one partition's rows) read under the locks.
#[derive(Debug, Clone)]
struct ReadPlan {
    table: Arc<TableDef>,
    where_: Where,
    /// LIMIT of a returning SELECT; a LET reads one row.
    limit: Option<Val>,
    returning: bool,
}

#[derive(Debug, Clone)]
enum Returning {
    Nothing,
    /// `SELECT a.x, b.y`: (read, column) each.
    References(Vec<(usize, usize)>),
    /// A plain SELECT of columns: its read and the columns, in order.
    Select {
        read: usize,
        columns: Vec<usize>,
    },
}

#[derive(Debug, Clone)]
struct Branch {
    conditions: Vec<Cond>,
    writes: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Cond {
    read: usize,
    test: Test,
}

#[derive(Debug, Clone)]
enum Test {
    /// `row IS NOT NULL` (true) / `row IS NULL` (false).
    RowExists(bool),
    /// `row.c IS NULL` (true) / `IS NOT NULL` (false).
    ColumnNull { col: usize, null: bool },
    /// `row.c op term`; a null value never matches (Accord).
    Compare(Filter),
}

#[derive(Debug, Clone)]
enum Slot {
    /// A LET column.
    Reference { read: usize, col: usize },
    /// `c = c + v` / `c = c - v` on an integer column of the written row.
    Arithmetic {
        read: usize,
        col: usize,
        operand: Val,
        negate: bool,
        ty: NativeType,
    },
}

fn single_row_error() -> DetailedError {
    invalid("Within a transaction, a LET must select a single row: the full primary key, or the partition key with LIMIT 1")
}

/// Whether a SELECT is a plain selection of columns of one partition.
fn check_plain_select(
    plan: &SelectPlan,
    s: &sluice_cql::ast::Select,
) -> Result<Vec<usize>, DetailedError> {
    if plan.table.is_virtual() {
        return Err(invalid("System tables cannot be read inside a transaction"));
    }
    if !plan.where_.pk_complete() || plan.where_.token.is_some() {
        return Err(invalid(
            "Within a transaction, SELECT statements must select a single partition",
        ));
    }
    if !plan.where_.filters.is_empty() || s.allow_filtering {
        return Err(invalid("Filtering is not supported inside a transaction"));
    }
    if plan.aggregate
        || !plan.group_by.is_empty()
        || plan.distinct
        || s.json
        || !s.order_by.is_empty()
        || s.per_partition_limit.is_some()
    {
        return Err(invalid(
            "Aggregates, GROUP BY, DISTINCT, JSON, ORDER BY and PER PARTITION LIMIT are not supported inside a transaction",
        ));
    }
    plan.items
        .iter()
        .map(|i| match i {
            SelItem::Col(c) => Ok(*c),
            _ => Err(invalid(
                "Only columns may be selected inside a transaction (no functions)",
            )),
        })
        .collect()
}

/// Whether `v` is the constant 1.
fn is_one(v: &Option<Val>) -> bool {
    matches!(v, Some(Val::Const(Some(b))) if b.as_ref() == 1i32.to_be_bytes())
}

/// Replaces a top-level LET reference by a marker bound under the locks.
fn reference_slot(
    a: &mut Analyzer,
    names: &[String],
    reads: &[ReadPlan],
    slots: &mut Vec<(usize, Slot)>,
    r: &RowReference,
) -> Result<Term, DetailedError> {
    let (read, col) = resolve_reference(names, reads, r)?;
    let index = a.add_internal_slot();
    slots.push((index, Slot::Reference { read, col }));
    Ok(Term::Bind(sluice_cql::ast::BindMarker {
        index,
        name: None,
    }))
}

/// The (read, column) a `name.column` reference designates.
fn resolve_reference(
    names: &[String],
    reads: &[ReadPlan],
    r: &RowReference,
) -> Result<(usize, usize), DetailedError> {
    let read = names
        .iter()
        .position(|n| *n == r.row)
        .ok_or_else(|| invalid(format!("Undefined LET reference '{}'", r.row)))?;
    let Some(column) = &r.column else {
        return Err(invalid(format!(
            "A whole LET row ('{}') cannot be used as a value",
            r.row
        )));
    };
    let t = &reads[read].table;
    let (col, _) = t.column(column).ok_or_else(|| {
        invalid(format!(
            "Undefined column name {column} in LET '{}' ({}.{})",
            r.row, t.keyspace, t.name
        ))
    })?;
    Ok((read, col))
}

/// The integer type `SET c = c ± v` may compute on.
fn arithmetic_type(ty: &CqlType) -> Option<NativeType> {
    match ty {
        CqlType::Native(
            n @ (NativeType::Tinyint | NativeType::Smallint | NativeType::Int | NativeType::Bigint),
        ) => Some(*n),
        _ => None,
    }
}

/// Analyses a transaction; returns its plan and its result columns.
pub(crate) fn analyze(
    a: &mut Analyzer,
    t: &Transaction,
    user_binds: usize,
) -> Result<(TxnPlan, Vec<ColumnSpec>), DetailedError> {
    let mut names: Vec<String> = Vec::with_capacity(t.lets.len());
    let mut reads: Vec<ReadPlan> = Vec::with_capacity(t.lets.len() + 1);
    for l in &t.lets {
        if names.contains(&l.name) {
            return Err(invalid(format!(
                "The name '{}' has already been used by a LET assignment.",
                l.name
            )));
        }
        let plan = a.select(&l.select)?;
        check_plain_select(&plan, &l.select)?;
        let table = &plan.table;
        let full_key =
            plan.where_.ck_covered == table.clustering.len() && plan.where_.ck_slice.is_none();
        if !full_key && !is_one(&plan.limit) {
            return Err(single_row_error());
        }
        if table.is_counter() {
            return Err(invalid("Counter tables are not supported in transactions"));
        }
        names.push(l.name.clone());
        reads.push(ReadPlan {
            table: plan.table.clone(),
            where_: plan.where_.clone(),
            limit: None,
            returning: false,
        });
    }
    let mut specs = Vec::new();
    let returning = match &t.returning {
        None => Returning::Nothing,
        Some(TxnReturning::References(refs)) => {
            let mut out = Vec::with_capacity(refs.len());
            for r in refs {
                let (read, col) = resolve_reference(&names, &reads, r)?;
                let table = &reads[read].table;
                let c = &table.columns[col];
                specs.push(ColumnSpec {
                    keyspace: table.keyspace.clone(),
                    table: table.name.clone(),
                    name: format!("{}.{}", r.row, c.name),
                    ty: c.ty.clone(),
                });
                out.push((read, col));
            }
            Returning::References(out)
        }
        Some(TxnReturning::Select(s)) => {
            let plan = a.select(s)?;
            let columns = check_plain_select(&plan, s)?;
            specs = Analyzer::result_specs(&plan, s);
            reads.push(ReadPlan {
                table: plan.table.clone(),
                where_: plan.where_.clone(),
                limit: plan.limit.clone(),
                returning: true,
            });
            Returning::Select {
                read: reads.len() - 1,
                columns,
            }
        }
    };
    // Writes: LET references become markers bound under the locks.
    let mut slots: Vec<(usize, Slot)> = Vec::new();
    let mut writes = Vec::new();
    let mut uses_slots = Vec::new();
    let mut analyze_write = |a: &mut Analyzer,
                             reads: &mut Vec<ReadPlan>,
                             st: &BatchStatement|
     -> Result<usize, DetailedError> {
        let before = slots.len();
        let mut arithmetic: Vec<(usize, String, Term, bool)> = Vec::new();
        let rewritten = match st {
            BatchStatement::Insert(i) => {
                let mut i: Insert = i.clone();
                if i.json {
                    return Err(invalid("INSERT JSON is not supported inside a transaction"));
                }
                for v in &mut i.values {
                    if let Term::Reference(r) = v {
                        *v = reference_slot(a, &names, reads, &mut slots, r)?;
                    }
                }
                BatchStatement::Insert(i)
            }
            BatchStatement::Update(u) => {
                let mut u: Update = u.clone();
                let table = a.table(&u.table)?;
                for asg in &mut u.assignments {
                    let negate = matches!(asg, Assignment::Subtract { .. });
                    match asg {
                        Assignment::Set { value, .. } => {
                            if let Term::Reference(r) = value {
                                *value = reference_slot(a, &names, reads, &mut slots, r)?;
                            }
                        }
                        Assignment::Add { column, value }
                        | Assignment::Subtract { column, value } => {
                            let integer = table
                                .column(column)
                                .and_then(|(_, c)| arithmetic_type(&c.ty));
                            if integer.is_some() && !table.is_counter() {
                                let index = a.add_internal_slot();
                                arithmetic.push((index, column.clone(), value.clone(), negate));
                                *asg = Assignment::Set {
                                    column: column.clone(),
                                    value: Term::Bind(sluice_cql::ast::BindMarker {
                                        index,
                                        name: None,
                                    }),
                                };
                            }
                        }
                        _ => {}
                    }
                }
                BatchStatement::Update(u)
            }
            BatchStatement::Delete(d) => BatchStatement::Delete(d.clone()),
        };
        let w = a.batch_statement(&rewritten)?;
        if w.condition.is_some() {
            return Err(invalid(
                "Conditional statements are not supported inside a transaction; use IF ... THEN",
            ));
        }
        if w.timestamp.is_some() || w.ttl.is_some() || w.timeout.is_some() {
            return Err(invalid(
                "USING TIMESTAMP, TTL and TIMEOUT are not supported inside a transaction: it assigns its own timestamp",
            ));
        }
        if w.table.is_counter() {
            return Err(invalid("Counter tables are not supported in transactions"));
        }
        let t = &w.table;
        let full_key = w.where_.ck_covered == t.clustering.len() && w.where_.ck_slice.is_none();
        if !full_key && !w.static_only {
            return Err(invalid(
                "Within a transaction, writes must name the full primary key (no range deletions)",
            ));
        }
        // References must fit their receivers exactly.
        for (index, slot) in &slots[before..] {
            let Slot::Reference { read, col } = slot else {
                continue;
            };
            let source = &reads[*read].table.columns[*col];
            if a.internal_type(*index) != Some(&source.ty) {
                return Err(invalid(format!(
                    "A LET reference of type {} cannot be assigned to a column of another type",
                    source.ty
                )));
            }
        }
        for (index, column, operand, negate) in arithmetic {
            let (col, c) = t
                .column(&column)
                .ok_or_else(|| invalid(format!("Undefined column name {column}")))?;
            let ty = arithmetic_type(&c.ty).ok_or_else(|| invalid("not an integer column"))?;
            let operand = a.term(&operand, &c.name.clone(), &c.ty.clone(), t)?;
            // The row written, read under the locks.
            reads.push(ReadPlan {
                table: t.clone(),
                where_: w.where_.clone(),
                limit: None,
                returning: false,
            });
            slots.push((
                index,
                Slot::Arithmetic {
                    read: reads.len() - 1,
                    col,
                    operand,
                    negate,
                    ty,
                },
            ));
        }
        uses_slots.push(slots.len() > before);
        writes.push(w);
        Ok(writes.len() - 1)
    };
    let mut branches = Vec::with_capacity(t.branches.len());
    for b in &t.branches {
        let mut conditions = Vec::with_capacity(b.conditions.len());
        for c in &b.conditions {
            let read = names
                .iter()
                .position(|n| *n == c.reference.row)
                .ok_or_else(|| invalid(format!("Undefined LET reference '{}'", c.reference.row)))?;
            let test = match (&c.reference.column, &c.test) {
                (None, TxnTest::IsNull) => Test::RowExists(false),
                (None, TxnTest::IsNotNull) => Test::RowExists(true),
                (None, TxnTest::Compare(..)) => {
                    return Err(invalid(
                        "A whole LET row can only be tested with IS NULL or IS NOT NULL",
                    ))
                }
                (Some(_), test) => {
                    let (_, col) = resolve_reference(&names, &reads, &c.reference)?;
                    match test {
                        TxnTest::IsNull => Test::ColumnNull { col, null: true },
                        TxnTest::IsNotNull => Test::ColumnNull { col, null: false },
                        TxnTest::Compare(op, term) => {
                            if matches!(
                                op,
                                Operator::In
                                    | Operator::Contains
                                    | Operator::ContainsKey
                                    | Operator::Like
                            ) {
                                return Err(invalid(
                                    "Only = != < <= > >= are supported in transaction conditions",
                                ));
                            }
                            let table = reads[read].table.clone();
                            let column = &table.columns[col];
                            let val = a.term(term, &column.name, &column.ty, &table)?;
                            Test::Compare(Filter {
                                col,
                                op: *op,
                                rhs: FilterRhs::Val(val),
                            })
                        }
                    }
                }
            };
            conditions.push(Cond { read, test });
        }
        let mut ws = Vec::with_capacity(b.writes.len());
        for st in &b.writes {
            ws.push(analyze_write(a, &mut reads, st)?);
        }
        branches.push(Branch {
            conditions,
            writes: ws,
        });
    }
    let mut always = Vec::with_capacity(t.writes.len());
    for st in &t.writes {
        always.push(analyze_write(a, &mut reads, st)?);
    }
    if t.lets.is_empty() && t.returning.is_none() && writes.is_empty() {
        return Err(invalid("Transaction contains no reads or writes"));
    }
    let mut ordered = vec![None; slots.len()];
    for (index, slot) in slots {
        let at = index
            .checked_sub(user_binds)
            .ok_or_else(|| invalid("bad marker"))?;
        if let Some(s) = ordered.get_mut(at) {
            *s = Some(slot);
        }
    }
    let slots = ordered
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid("A LET reference in an unsupported position"))?;
    Ok((
        TxnPlan {
            reads,
            returning,
            writes,
            always,
            branches,
            slots,
            uses_slots,
            user_binds,
        },
        specs,
    ))
}

impl TxnPlan {
    /// The timeout error of this transaction, as Accord answers it: Write_timeout with
    /// write type CAS, or Read_timeout for a transaction without writes.
    fn timeout(&self, consistency: sluice_protocol::Consistency) -> DetailedError {
        self.timeout_kind()(consistency)
    }

    /// The error of a transaction that ran out of time: a read's timeout for a read-only one,
    /// else a CAS write's.
    pub(crate) fn timeout_kind(&self) -> fn(sluice_protocol::Consistency) -> DetailedError {
        if self.writes.is_empty() {
            exec::read_timeout
        } else {
            replicated::cas_timeout
        }
    }

    /// The tables the transaction reads, then those it writes (for permissions).
    pub(crate) fn tables(&self) -> (Vec<&Arc<TableDef>>, Vec<&Arc<TableDef>>) {
        (
            self.reads.iter().map(|r| &r.table).collect(),
            self.writes.iter().map(|w| &w.table).collect(),
        )
    }
}

/// A read bound before the locks.
/// The partitions a transaction reads (its LETs and returning SELECT), bound.
pub(crate) fn read_partitions<'p>(
    plan: &'p TxnPlan,
    b: &Binder,
) -> Result<Vec<(&'p TableDef, i64)>, DetailedError> {
    plan.reads
        .iter()
        .map(|r| Ok((&*r.table, bind_read(b, r)?.pk.token)))
        .collect()
}

struct BoundRead {
    pk: PartitionKey,
    slice: ClusteringSlice,
    limit: usize,
}

fn bind_read(b: &Binder, r: &ReadPlan) -> Result<BoundRead, DetailedError> {
    let t = &*r.table;
    let keys = exec::partition_keys(b, t, &r.where_)?;
    let Ok([pk]) = <[PartitionKey; 1]>::try_from(keys) else {
        return Err(invalid(
            "Within a transaction, SELECT statements must select a single partition",
        ));
    };
    let ranges = exec::clustering_ranges(b, t, &r.where_)?;
    if !r.returning && ranges.len() > 1 {
        return Err(single_row_error());
    }
    let limit = if r.returning {
        match exec::positive_limit(b, &r.limit, "LIMIT")? {
            Some(n) => n.min(MAX_RETURNED_ROWS),
            None => MAX_RETURNED_ROWS,
        }
    } else {
        1
    };
    Ok(BoundRead {
        pk,
        slice: ClusteringSlice {
            ranges,
            reversed: false,
        },
        limit,
    })
}

/// Whether a read found its row (a LET of a missing row is null).
fn row_exists(read: &PartitionRead) -> bool {
    !read.rows.is_empty()
}

/// The value of column `col` in a read's first row, or None when null or missing.
fn read_value(t: &TableDef, read: &PartitionRead, pk: &PartitionKey, col: usize) -> Option<Bytes> {
    if !row_exists(read) {
        return None;
    }
    let src = StoredRow {
        pk: &pk.components,
        row: read.rows.first(),
        stat: read.static_row.as_ref(),
        token: pk.token,
    };
    src.value(t, col)
}

/// `current ± operand` on an integer type, None on overflow.
fn integer_arithmetic(
    ty: NativeType,
    current: &[u8],
    operand: &[u8],
    negate: bool,
) -> Option<Vec<u8>> {
    // Each integer type the same way: big-endian operands of its width, checked arithmetic.
    macro_rules! checked {
        ($int:ty) => {{
            let a = <$int>::from_be_bytes(current.try_into().ok()?);
            let b = <$int>::from_be_bytes(operand.try_into().ok()?);
            let sum = if negate {
                a.checked_sub(b)
            } else {
                a.checked_add(b)
            };
            sum?.to_be_bytes().to_vec()
        }};
    }
    Some(match ty {
        NativeType::Tinyint => checked!(i8),
        NativeType::Smallint => checked!(i16),
        NativeType::Int => checked!(i32),
        NativeType::Bigint => checked!(i64),
        _ => return None,
    })
}

/// Executes a transaction (see the module doc). Aborts answer Write_timeout with write
/// type CAS, as Accord does; a false IF is not an abort (it writes nothing, answers as usual).
pub(crate) async fn execute(
    engine: &Engine,
    p: &Prepared,
    plan: &TxnPlan,
    b: &Binder<'_>,
    params: &QueryParameters,
    ctx: &RequestContext,
) -> Result<ResultMessage, DetailedError> {
    let consistency = params.consistency;
    let gate = engine.transactions();
    let permit = match gate.admit(ctx.deadline).await {
        Ok(permit) => permit,
        Err(_) => return Err(plan.timeout(consistency)),
    };
    let outcome = run(engine, p, plan, b, params, ctx, permit).await;
    match &outcome {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.error,
                DbError::WriteTimeout { .. } | DbError::ReadTimeout { .. }
            ) =>
        {
            gate.metrics().note_deadline_abort()
        }
        Err(_) => gate.metrics().note_error(),
    }
    outcome
}

async fn run(
    engine: &Engine,
    p: &Prepared,
    plan: &TxnPlan,
    b: &Binder<'_>,
    params: &QueryParameters,
    ctx: &RequestContext,
    permit: gate::TxnPermit<'_>,
) -> Result<ResultMessage, DetailedError> {
    let consistency = params.consistency;
    // Before any lock: keys, slices, condition operands, and the writes that need no LET value.
    let reads = plan
        .reads
        .iter()
        .map(|r| bind_read(b, r))
        .collect::<Result<Vec<_>, _>>()?;
    let mut partitions = Vec::with_capacity(plan.writes.len());
    for w in &plan.writes {
        let keys = exec::partition_keys(b, &w.table, &w.where_)?;
        let [pk] = keys.as_slice() else {
            return Err(invalid(
                "IN on the partition key is not supported inside a transaction",
            ));
        };
        if !w.static_only
            && !w.table.clustering.is_empty()
            && exec::clustering_points(b, &w.table, &w.where_)?.len() != 1
        {
            return Err(invalid(
                "IN on the clustering key is not supported inside a transaction",
            ));
        }
        partitions.push(TxnPartition {
            table: *w.table.id.as_bytes(),
            token: pk.token,
        });
    }
    let mut filters: Vec<Option<ResolvedFilter>> = Vec::new();
    for branch in &plan.branches {
        for c in &branch.conditions {
            filters.push(match &c.test {
                Test::Compare(f) => resolve_filters(b, std::slice::from_ref(f))?.pop(),
                _ => None,
            });
        }
    }
    let provisional = engine.write_timestamp(ctx.now_micros);
    let mut prebuilt: Vec<Option<Vec<Mutation>>> = Vec::with_capacity(plan.writes.len());
    for (w, uses_slots) in plan.writes.iter().zip(&plan.uses_slots) {
        if *uses_slots {
            prebuilt.push(None);
            continue;
        }
        let mut muts = Vec::new();
        crate::write::build_mutations(engine, w, b, None, Some(provisional), &mut muts)?;
        prebuilt.push(Some(muts));
    }
    // The writes that run whatever is read go to the storage before the locks (it encodes
    // them there); only the rest is built under them.
    let mut known_muts = Vec::new();
    if !engine.txn_prepare_under_lock() {
        for &w in &plan.always {
            if let Some(muts) = prebuilt.get_mut(w).and_then(Option::as_mut) {
                known_muts.append(muts);
            }
        }
    }
    let known = with_layouts(plan, crate::write::merge_mutations(known_muts))?;
    let mut values: Vec<Value> = b.values().to_vec();
    values.truncate(plan.user_binds);
    values.resize(plan.user_binds + plan.slots.len(), Value::Null);
    let storage_reads: Vec<TxnRead<'_>> = plan
        .reads
        .iter()
        .zip(&reads)
        .map(|(r, bound)| TxnRead {
            layout: &r.table.layout,
            token: bound.pk.token,
            partition_key: &bound.pk.key,
            slice: bound.slice.clone(),
            limit: bound.limit,
        })
        .collect();
    let now_secs = (ctx.now_micros.max(0) / 1_000_000) as u32;
    // An expired transaction never runs.
    if exec::expired(ctx.deadline) {
        return Err(plan.timeout(consistency));
    }
    let logged_tables = plan
        .reads
        .iter()
        .map(|r| &*r.table)
        .chain(plan.writes.iter().map(|w| &*w.table));
    if let Some(log) = engine.txn_log_for(logged_tables) {
        let read_parts: Vec<(&TableDef, i64)> = plan
            .reads
            .iter()
            .zip(&reads)
            .map(|(r, bound)| (&*r.table, bound.pk.token))
            .collect();
        let logged_reads: Vec<replicated::LoggedPartition> = plan
            .reads
            .iter()
            .zip(&reads)
            .map(|(r, bound)| replicated::LoggedPartition {
                table: *r.table.id.as_bytes(),
                token: bound.pk.token,
                key_hash: replicated::key_hash(&bound.pk.key),
            })
            .collect();
        let deadline = ctx
            .deadline
            .unwrap_or_else(|| std::time::Instant::now() + LOGGED_DEFAULT_WAIT);
        let evaluate = || {
            engine.check_txn_reads(&read_parts)?;
            let mut chosen = Vec::new();
            let decide = |found: &[PartitionRead]| {
                let writes = decide_writes(
                    engine,
                    plan,
                    b,
                    &reads,
                    &filters,
                    found,
                    prebuilt.clone(),
                    values.clone(),
                    provisional,
                )?;
                chosen = writes.into_iter().map(|(_, m)| m).collect();
                // The writes that need no read are the log's to commit too.
                chosen.extend(known.iter().map(|(_, m)| m.clone()));
                // Nothing is written here: the log commits the writes on every replica.
                Ok(Vec::new())
            };
            let found = match engine.storage().apply_transaction(
                &partitions,
                &storage_reads,
                &[],
                now_secs,
                provisional,
                decide,
            ) {
                Ok(outcome) => outcome.reads,
                Err(TxnError::Storage(e)) => return Err(storage_error(e)),
                Err(TxnError::Decide(e)) => return Err(e),
            };
            let wrote = !chosen.is_empty();
            Ok(replicated::Evaluated {
                reads: logged_reads.clone(),
                mutations: chosen,
                provisional,
                result: (found, wrote),
            })
        };
        let decided = replicated::read_and_commit(
            engine,
            log,
            deadline,
            || plan.timeout(consistency),
            evaluate,
        )
        .await;
        permit.finish(decided.is_ok());
        let (found, wrote) = decided?;
        engine.transactions().metrics().note_commit(wrote);
        return Ok(answer(p, plan, params, &reads, &found));
    }
    let decide = |found: &[PartitionRead]| {
        decide_writes(
            engine,
            plan,
            b,
            &reads,
            &filters,
            found,
            prebuilt,
            values,
            provisional,
        )
    };
    let applied = engine.storage().apply_transaction(
        &partitions,
        &storage_reads,
        &known,
        now_secs,
        provisional,
        decide,
    );
    // The slot is for the contended part, the locks: the durability wait is shared by
    // every commit of a group fsync, so holding a slot through it would only shrink groups.
    permit.finish(applied.is_ok());
    let outcome = match applied {
        Ok(outcome) => outcome,
        Err(TxnError::Storage(e)) => return Err(storage_error(e)),
        Err(TxnError::Decide(e)) => return Err(e),
    };
    let metrics = engine.transactions().metrics();
    metrics.note_locks(outcome.lock_wait, outcome.locked_for);
    if let Some(ts) = outcome.timestamp {
        engine.note_write_timestamp(ts);
    }
    match outcome.ticket {
        Some(ticket) => {
            metrics.note_commit(true);
            crate::write::wait_until_durable(engine, ticket, ctx.ack_barrier).await?;
        }
        None => metrics.note_commit(false),
    }
    // What it returns, or decided on, may come from writes not yet durable, in stores it
    // did not write: answer only once they are.
    if !plan.reads.is_empty() {
        crate::write::wait_seen_durable(engine, None, ctx.deadline, || plan.timeout(consistency))
            .await?;
    }
    Ok(answer(p, plan, params, &reads, &outcome.reads))
}

/// The answer of a transaction from what it read (before its writes).
fn answer(
    p: &Prepared,
    plan: &TxnPlan,
    params: &QueryParameters,
    reads: &[BoundRead],
    found: &[PartitionRead],
) -> ResultMessage {
    match &plan.returning {
        Returning::Nothing => ResultMessage::Void,
        Returning::References(refs) => {
            let mut rows = RowsBuilder::new(refs.len());
            for &(read, col) in refs {
                let v = read_value(&plan.reads[read].table, &found[read], &reads[read].pk, col);
                rows.cell(v.as_deref());
            }
            ResultMessage::Rows(rows.finish(p.result_columns.clone(), None, params.skip_metadata))
        }
        Returning::Select { read, columns } => {
            let t = &*plan.reads[*read].table;
            let found = &found[*read];
            let pk = &reads[*read].pk;
            let mut rows = RowsBuilder::new(columns.len());
            for row in &found.rows {
                let src = StoredRow {
                    pk: &pk.components,
                    row: Some(row),
                    stat: found.static_row.as_ref(),
                    token: pk.token,
                };
                for &c in columns {
                    rows.cell(src.value(t, c).as_deref());
                }
            }
            ResultMessage::Rows(rows.finish(p.result_columns.clone(), None, params.skip_metadata))
        }
    }
}

/// Under the locks: evaluates the IF on what was read, fills the LET values the writes use
/// and returns the writes to commit.
#[allow(clippy::too_many_arguments)]
fn decide_writes<'p>(
    engine: &Engine,
    plan: &'p TxnPlan,
    b: &Binder<'_>,
    reads: &[BoundRead],
    filters: &[Option<ResolvedFilter>],
    found: &[PartitionRead],
    mut prebuilt: Vec<Option<Vec<Mutation>>>,
    mut values: Vec<Value>,
    provisional: i64,
) -> Result<Vec<(&'p sluice_storage::TableLayout, Mutation)>, DetailedError> {
    let value_of = |read: usize, col: usize| {
        read_value(&plan.reads[read].table, &found[read], &reads[read].pk, col)
    };
    let mut chosen: Option<&Branch> = None;
    let mut filter_at = 0;
    for branch in &plan.branches {
        let mut holds = true;
        for c in &branch.conditions {
            let filter = filters.get(filter_at).and_then(Option::as_ref);
            filter_at += 1;
            if !holds {
                continue;
            }
            holds = match &c.test {
                Test::RowExists(exists) => row_exists(&found[c.read]) == *exists,
                Test::ColumnNull { col, null } => value_of(c.read, *col).is_none() == *null,
                Test::Compare(_) => match (value_of(c.read, filter.map_or(0, |f| f.col())), filter)
                {
                    (Some(v), Some(f)) => filter_matches(&plan.reads[c.read].table, f, Some(&v))?,
                    _ => false,
                },
            };
        }
        if holds {
            chosen = Some(branch);
            break;
        }
    }
    let run: Vec<usize> = plan
        .always
        .iter()
        .chain(chosen.map_or(&[][..], |b| &b.writes[..]))
        .copied()
        .collect();
    if run.iter().any(|&w| plan.uses_slots[w]) {
        for (i, slot) in plan.slots.iter().enumerate() {
            let v = match slot {
                Slot::Reference { read, col } => value_of(*read, *col),
                Slot::Arithmetic {
                    read,
                    col,
                    operand,
                    negate,
                    ty,
                } => match (value_of(*read, *col), b.get(operand)) {
                    (Some(current), R::V(operand)) => Some(Bytes::from(
                        integer_arithmetic(*ty, &current, &operand, *negate).ok_or_else(|| {
                            invalid("Integer overflow in a transaction's SET c = c + v")
                        })?,
                    )),
                    // SQL's rule: arithmetic on null is null.
                    _ => None,
                },
            };
            values[plan.user_binds + i] = match v {
                Some(v) => Value::Set(v),
                None => Value::Null,
            };
        }
    }
    let bound = b.with_values(&values);
    let mut muts = Vec::new();
    for &w in &run {
        match prebuilt.get_mut(w).and_then(Option::take) {
            Some(m) => muts.extend(m),
            None => crate::write::build_mutations(
                engine,
                &plan.writes[w],
                &bound,
                None,
                Some(provisional),
                &mut muts,
            )?,
        }
    }
    with_layouts(plan, crate::write::merge_mutations(muts))
}

/// Pairs each mutation with the layout of its table.
fn with_layouts(
    plan: &TxnPlan,
    muts: Vec<Mutation>,
) -> Result<Vec<(&sluice_storage::TableLayout, Mutation)>, DetailedError> {
    muts.into_iter()
        .map(|m| {
            plan.writes
                .iter()
                .find(|w| *w.table.id.as_bytes() == m.table)
                .map(|w| (&w.table.layout, m))
                .ok_or_else(|| invalid("Mutation for an unknown table"))
        })
        .collect()
}
