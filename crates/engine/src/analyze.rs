//! Statement analysis: resolves names against the schema, types every value and bind
//! marker, and turns the AST into an executable plan kept in the statement cache.

use crate::catalog::{invalid, ColumnKind, Schema, TableDef};
use crate::{OpKind, Prepared};
use bytes::Bytes;
use sluice_cql::ast::{
    Assignment, BatchKind, BatchStatement, Condition, Delete, Insert, Operator, Relation,
    RelationLhs, RelationRhs, Select, Selector, Statement, Term, Update, Using,
};
use sluice_protocol::{ColumnSpec, DetailedError};
use sluice_types::{CqlType, NativeType};
use std::sync::Arc;

/// A value in a plan: a constant, a bind marker, or a function evaluated at execution.
#[derive(Debug, Clone)]
pub(crate) enum Val {
    /// A typed constant (None = null).
    Const(Option<Bytes>),
    /// The bind marker with this index.
    Bind(usize),
    /// A non-deterministic function (`now()`, `uuid()`, `currentTimestamp()`...).
    Func(ValFn),
    /// A collection or tuple literal holding markers or functions.
    Composite(Box<(CompositeKind, Vec<Val>)>),
}

/// How a composite literal is serialized.
#[derive(Debug, Clone)]
pub(crate) enum CompositeKind {
    /// A list (elements in order).
    List,
    /// A set of this element type (sorted, deduplicated).
    Set(CqlType),
    /// A map with this key type (items are key, value, key, value...; sorted by key).
    Map(CqlType),
    /// A tuple (null items allowed).
    Tuple,
}

/// Functions whose value is computed at execution time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValFn {
    /// `now()` / `currentTimeUUID()`: a timeuuid.
    TimeUuid,
    /// `uuid()`: a random UUID.
    RandomUuid,
    /// `currentTimestamp()` / `toTimestamp(now())`.
    CurrentTimestamp,
    /// `currentDate()`.
    CurrentDate,
}

/// An equality-like restriction on one key column.
#[derive(Debug, Clone)]
pub(crate) enum Restr {
    /// `= v`.
    Eq(Val),
    /// `IN (a, b)`.
    In(Vec<Val>),
    /// `IN ?` (a list value).
    InBind(usize),
}

/// A tuple value: items or one bind marker holding a tuple.
#[derive(Debug, Clone)]
pub(crate) enum TupleVal {
    /// `(a, b)`.
    Items(Vec<Val>),
    /// `?` bound to a tuple.
    Bind(usize),
}

/// A clustering "point" restriction covering `width` columns.
#[derive(Debug, Clone)]
pub(crate) enum PointRestr {
    /// One column `=` or `IN`.
    Single(Restr),
    /// `(c1, c2) = (..)` or `(c1, c2) IN ((..), (..))`.
    Tuples(Vec<TupleVal>, usize),
    /// `(c1, c2) IN ?`.
    TuplesBind(usize, usize),
}

/// One side of a clustering slice.
#[derive(Debug, Clone)]
pub(crate) struct SliceBound {
    /// The bound value (one item per covered column).
    pub val: TupleVal,
    /// Inclusive?
    pub inclusive: bool,
}

/// A range on clustering columns `start..start+width`.
#[derive(Debug, Clone)]
pub(crate) struct CkSlice {
    /// Number of columns the range covers (1, or a tuple's width).
    pub width: usize,
    /// Lower bound (value order).
    pub lower: Option<SliceBound>,
    /// Upper bound (value order).
    pub upper: Option<SliceBound>,
}

/// Right-hand side of a filter.
#[derive(Debug, Clone)]
pub(crate) enum FilterRhs {
    /// One value.
    Val(Val),
    /// A list of values (`IN (...)`).
    List(Vec<Val>),
    /// `IN ?`.
    InBind(usize),
}

/// A restriction evaluated on materialised rows (system tables, ALLOW FILTERING).
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    /// Column index.
    pub col: usize,
    /// Operator.
    pub op: Operator,
    /// Value(s).
    pub rhs: FilterRhs,
}

/// A token range restriction.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenRange {
    /// Lower bound and inclusiveness.
    pub lower: Option<(Val, bool)>,
    /// Upper bound and inclusiveness.
    pub upper: Option<(Val, bool)>,
}

/// An analysed WHERE clause.
#[derive(Debug, Clone, Default)]
pub(crate) struct Where {
    /// Per partition key component (all Some when the partition is known).
    pub pk: Vec<Option<Restr>>,
    /// `token(pk) op v` restrictions.
    pub token: Option<TokenRange>,
    /// Clustering point restrictions from the first clustering column on.
    pub ck_points: Vec<PointRestr>,
    /// How many clustering columns `ck_points` cover.
    pub ck_covered: usize,
    /// A range following the points.
    pub ck_slice: Option<CkSlice>,
    /// Row filters.
    pub filters: Vec<Filter>,
}

impl Where {
    /// True when every partition key component is restricted by `=` or `IN`.
    pub fn pk_complete(&self) -> bool {
        !self.pk.is_empty() && self.pk.iter().all(|r| r.is_some())
    }

    /// True when the clustering columns are restricted at all.
    pub fn restricts_clustering(&self) -> bool {
        !self.ck_points.is_empty() || self.ck_slice.is_some()
    }
}

/// One selected item.
#[derive(Debug, Clone)]
pub(crate) enum SelItem {
    /// A column.
    Col(usize),
    /// `writetime(c)`.
    WriteTime(usize),
    /// `ttl(c)`.
    Ttl(usize),
    /// `token(pk...)`.
    Token,
    /// `count(*)`.
    CountAll,
    /// `count(c)`.
    Count(usize),
    /// `max(c)`.
    Max(usize),
    /// `sum(c)` on a numeric column.
    Sum(usize),
    /// `avg(c)` on a numeric column.
    Avg(usize),
    /// `min(c)`.
    Min(usize),
}

impl SelItem {
    /// The column the item reads, if any.
    fn column(&self) -> Option<usize> {
        match self {
            SelItem::Col(c)
            | SelItem::WriteTime(c)
            | SelItem::Ttl(c)
            | SelItem::Count(c)
            | SelItem::Max(c)
            | SelItem::Min(c)
            | SelItem::Sum(c)
            | SelItem::Avg(c) => Some(*c),
            SelItem::Token | SelItem::CountAll => None,
        }
    }

    fn is_aggregate(&self) -> bool {
        matches!(
            self,
            SelItem::CountAll
                | SelItem::Count(_)
                | SelItem::Max(_)
                | SelItem::Min(_)
                | SelItem::Sum(_)
                | SelItem::Avg(_)
        )
    }
}

/// An analysed SELECT.
#[derive(Debug, Clone)]
pub(crate) struct SelectPlan {
    /// The table.
    pub table: Arc<TableDef>,
    /// Selected items, in result order.
    pub items: Vec<SelItem>,
    /// Whether the selection aggregates (one result row).
    pub aggregate: bool,
    /// WHERE.
    pub where_: Where,
    /// LIMIT.
    pub limit: Option<Val>,
    /// PER PARTITION LIMIT.
    pub per_partition_limit: Option<Val>,
    /// Read in reverse clustering order.
    pub reversed: bool,
    /// The statement has an ORDER BY (rows of several partitions must then be merged).
    pub ordered: bool,
    /// GROUP BY columns (a primary key prefix); empty = one group.
    pub group_by: Vec<usize>,
    /// SELECT JSON: the names and types of the selected columns.
    pub json: Option<Vec<(String, CqlType)>>,
    /// SELECT DISTINCT.
    pub distinct: bool,
    /// USING TIMEOUT.
    pub timeout: Option<Val>,
}

/// What a write does to a column.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// `c = v` (for a multi-cell collection: overwrite).
    Set { col: usize, val: Val },
    /// `m[k] = v` / `l[i] = v`.
    SetElement { col: usize, key: Val, val: Val },
    /// `l = l + v`, `s = s + v`, `m = m + v`.
    Append { col: usize, val: Val },
    /// `l = v + l`.
    Prepend { col: usize, val: Val },
    /// `l = l - v`, `s = s - v`, `m = m - keys`.
    Remove { col: usize, val: Val },
    /// `c = c + v` / `c = c - v` on a counter.
    Counter { col: usize, val: Val, negate: bool },
    /// `DELETE c`.
    Delete { col: usize },
    /// `DELETE m[k]` / `DELETE l[i]`.
    DeleteElement { col: usize, key: Val },
}

impl Op {
    /// The column written.
    pub fn col(&self) -> usize {
        match self {
            Op::Set { col, .. }
            | Op::SetElement { col, .. }
            | Op::Append { col, .. }
            | Op::Prepend { col, .. }
            | Op::Remove { col, .. }
            | Op::Counter { col, .. }
            | Op::Delete { col }
            | Op::DeleteElement { col, .. } => *col,
        }
    }
}

/// INSERT, UPDATE or DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// INSERT (writes the row marker).
    Insert,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
}

/// A conditional statement's condition.
#[derive(Debug, Clone)]
pub(crate) enum CondPlan {
    /// IF NOT EXISTS.
    NotExists,
    /// IF EXISTS.
    Exists,
    /// IF c op v AND ...
    Columns(Vec<Filter>),
}

/// An analysed INSERT / UPDATE / DELETE.
#[derive(Debug, Clone)]
pub(crate) struct WritePlan {
    /// The table.
    pub table: Arc<TableDef>,
    /// Kind.
    pub kind: WriteKind,
    /// Key restrictions.
    pub where_: Where,
    /// Column operations.
    pub ops: Vec<Op>,
    /// USING TTL.
    pub ttl: Option<Val>,
    /// USING TIMESTAMP.
    pub timestamp: Option<Val>,
    /// USING TIMEOUT.
    pub timeout: Option<Val>,
    /// IF ...
    pub condition: Option<CondPlan>,
    /// Only static columns are written (no clustering key needed).
    pub static_only: bool,
    /// The markers whose type holds a set or a map, with that type: their bound values
    /// are put in canonical order before use (see `write::canonical_entries`).
    pub canonical_binds: Vec<(usize, CqlType)>,
}

/// An analysed BATCH statement text.
#[derive(Debug, Clone)]
pub(crate) struct BatchPlan {
    /// Batch kind.
    pub kind: BatchKind,
    /// Statements.
    pub writes: Vec<WritePlan>,
    /// Batch-level USING TIMESTAMP.
    pub timestamp: Option<Val>,
    /// Batch-level USING TIMEOUT.
    pub timeout: Option<Val>,
}

/// The executable form of a statement.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    /// SELECT on a user or virtual table.
    Select(Box<SelectPlan>),
    /// INSERT / UPDATE / DELETE.
    Write(Box<WritePlan>),
    /// BATCH given as text.
    Batch(Box<BatchPlan>),
    /// `BEGIN TRANSACTION ... COMMIT TRANSACTION`.
    Transaction(Box<crate::transaction::TxnPlan>),
    /// DDL, USE, DESCRIBE: interpreted at execution against the current schema.
    Dynamic(Box<Statement>),
}

impl Plan {
    /// The `USING TIMEOUT` value of the statement, if it has one.
    pub(crate) fn timeout(&self) -> Option<&Val> {
        match self {
            Plan::Select(s) => s.timeout.as_ref(),
            Plan::Write(w) => w.timeout.as_ref(),
            Plan::Batch(bp) => bp.timeout.as_ref(),
            Plan::Transaction(_) | Plan::Dynamic(_) => None,
        }
    }
}

/// The TTL, TIMESTAMP and TIMEOUT values of a USING clause.
type UsingVals = (Option<Val>, Option<Val>, Option<Val>);

/// Collects bind-marker receivers while a statement is analysed.
pub(crate) struct Analyzer<'a> {
    schema: &'a Schema,
    keyspace: Option<&'a str>,
    specs: Vec<Option<ColumnSpec>>,
    /// Markers of the statement text; slots past them are internal (a transaction's LET
    /// values, bound at execution).
    user_binds: usize,
}

impl<'a> Analyzer<'a> {
    /// Starts analysing a statement with `bind_count` markers.
    pub fn new(schema: &'a Schema, keyspace: Option<&'a str>, bind_count: usize) -> Self {
        Analyzer {
            schema,
            keyspace,
            specs: vec![None; bind_count],
            user_binds: bind_count,
        }
    }

    /// Adds a marker slot bound by the engine at execution, not by the client; returns
    /// its index.
    pub fn add_internal_slot(&mut self) -> usize {
        self.specs.push(None);
        self.specs.len() - 1
    }

    /// The receiver type an internal slot got.
    pub fn internal_type(&self, index: usize) -> Option<&CqlType> {
        self.specs.get(index)?.as_ref().map(|s| &s.ty)
    }

    /// The bind specs, failing if a marker got no receiver.
    pub fn finish(mut self) -> Result<Vec<ColumnSpec>, DetailedError> {
        self.specs.truncate(self.user_binds);
        self.specs
            .into_iter()
            .map(|s| s.ok_or_else(|| invalid("Bind marker in an unsupported position")))
            .collect()
    }

    /// Resolves a table name.
    pub fn table(
        &self,
        name: &sluice_cql::ast::QualifiedName,
    ) -> Result<Arc<TableDef>, DetailedError> {
        let ks = name.keyspace.as_deref().or(self.keyspace).ok_or_else(|| {
            invalid("No keyspace has been specified. USE a keyspace, or explicitly specify keyspace.tablename")
        })?;
        if !self.schema.keyspaces.contains_key(ks) {
            return Err(invalid(format!("Keyspace {ks} does not exist")));
        }
        self.schema
            .table(ks, &name.name)
            .cloned()
            .ok_or_else(|| invalid(format!("unconfigured table {}", name.name)))
    }

    fn spec(
        &mut self,
        index: usize,
        name: &str,
        table: &TableDef,
        ty: CqlType,
    ) -> Result<(), DetailedError> {
        let slot = self
            .specs
            .get_mut(index)
            .ok_or_else(|| invalid("Bind marker index out of range"))?;
        *slot = Some(ColumnSpec {
            keyspace: table.keyspace.clone(),
            table: table.name.clone(),
            name: name.to_string(),
            ty,
        });
        Ok(())
    }

    /// Types a term against a receiver.
    pub fn term(
        &mut self,
        term: &Term,
        name: &str,
        ty: &CqlType,
        table: &TableDef,
    ) -> Result<Val, DetailedError> {
        match term {
            Term::Bind(m) => {
                let n = m.name.as_deref().unwrap_or(name);
                self.spec(m.index, n, table, ty.clone())?;
                Ok(Val::Bind(m.index))
            }
            Term::Function { name: f, args } => {
                let func = match (f.as_str(), args.as_slice()) {
                    ("now", []) | ("currenttimeuuid", []) => ValFn::TimeUuid,
                    ("uuid", []) => ValFn::RandomUuid,
                    ("currenttimestamp", []) => ValFn::CurrentTimestamp,
                    ("currentdate", []) => ValFn::CurrentDate,
                    ("totimestamp", [Term::Function { name: inner, args }])
                        if inner == "now" && args.is_empty() =>
                    {
                        ValFn::CurrentTimestamp
                    }
                    _ => {
                        return Err(invalid(format!(
                            "Unknown function or unsupported use of {f}()"
                        )))
                    }
                };
                let fits = match func {
                    ValFn::TimeUuid => {
                        matches!(ty, CqlType::Native(NativeType::Timeuuid | NativeType::Uuid))
                    }
                    ValFn::RandomUuid => matches!(ty, CqlType::Native(NativeType::Uuid)),
                    ValFn::CurrentTimestamp => matches!(ty, CqlType::Native(NativeType::Timestamp)),
                    ValFn::CurrentDate => matches!(ty, CqlType::Native(NativeType::Date)),
                };
                if !fits {
                    return Err(invalid(format!(
                        "Type error: {f}() cannot be passed as argument 0 of {name} of type {ty}"
                    )));
                }
                Ok(Val::Func(func))
            }
            Term::Cast(_, inner) => self.term(inner, name, ty, table),
            other => {
                if contains_marker(other) {
                    return self.composite(other, name, ty, table);
                }
                let v = sluice_cql::literal::literal_to_bytes(ty, other)
                    .map_err(|e| invalid(e.to_string()))?;
                Ok(Val::Const(v))
            }
        }
    }

    /// A collection or tuple literal with bind markers or functions inside: typed element
    /// by element, serialized at execution.
    fn composite(
        &mut self,
        term: &Term,
        name: &str,
        ty: &CqlType,
        table: &TableDef,
    ) -> Result<Val, DetailedError> {
        let mismatch = || invalid(format!("Invalid literal for {name} of type {ty}"));
        let (kind, items) = match (ty.unfrozen(), term) {
            (CqlType::List(e), Term::List(items)) => {
                let mut v = Vec::with_capacity(items.len());
                for i in items {
                    v.push(self.term(i, name, e, table)?);
                }
                (CompositeKind::List, v)
            }
            (CqlType::Set(e), Term::Set(items) | Term::List(items)) => {
                let mut v = Vec::with_capacity(items.len());
                for i in items {
                    v.push(self.term(i, name, e, table)?);
                }
                (CompositeKind::Set((**e).clone()), v)
            }
            (CqlType::Map(k, vt), Term::Map(pairs)) => {
                let mut v = Vec::with_capacity(pairs.len() * 2);
                for (a, b) in pairs {
                    v.push(self.term(a, name, k, table)?);
                    v.push(self.term(b, name, vt, table)?);
                }
                (CompositeKind::Map((**k).clone()), v)
            }
            (CqlType::Tuple(types), Term::Tuple(items)) if items.len() <= types.len() => {
                let mut v = Vec::with_capacity(items.len());
                for (i, t) in items.iter().zip(types) {
                    v.push(self.term(i, name, t, table)?);
                }
                (CompositeKind::Tuple, v)
            }
            _ => return Err(mismatch()),
        };
        Ok(Val::Composite(Box::new((kind, items))))
    }

    /// Analyses a WHERE clause. `filtering_ok`: system tables and ALLOW FILTERING.
    pub fn where_clause(
        &mut self,
        table: &Arc<TableDef>,
        relations: &[Relation],
        virtual_table: bool,
    ) -> Result<Where, DetailedError> {
        let mut w = Where {
            pk: vec![None; table.partition_key.len()],
            ..Where::default()
        };
        // Per column: the single-column relations, analysed.
        let mut eqs: Vec<Option<Restr>> = vec![None; table.columns.len()];
        let mut ranges: Vec<(usize, Operator, Val)> = Vec::new();
        let mut tuples: Vec<(Vec<usize>, Operator, &RelationRhs)> = Vec::new();
        for rel in relations {
            match &rel.lhs {
                RelationLhs::Column(name) => {
                    let (ci, col) = table
                        .column(name)
                        .ok_or_else(|| invalid(format!("Undefined column name {name}")))?;
                    let ty = col.ty.clone();
                    let cname = col.name.clone();
                    if virtual_table {
                        let rhs = self.filter_rhs(rel, &cname, &ty, table)?;
                        w.filters.push(Filter {
                            col: ci,
                            op: rel.op,
                            rhs,
                        });
                        continue;
                    }
                    match rel.op {
                        Operator::Eq | Operator::In => {
                            if eqs[ci].is_some() {
                                return Err(invalid(format!(
                                    "{cname} cannot be restricted by more than one relation if it includes an Equal"
                                )));
                            }
                            let r = match &rel.rhs {
                                RelationRhs::Term(t) => {
                                    Restr::Eq(self.term(t, &cname, &ty, table)?)
                                }
                                RelationRhs::InList(ts) => {
                                    let mut vals = Vec::with_capacity(ts.len());
                                    for t in ts {
                                        vals.push(self.term(t, &cname, &ty, table)?);
                                    }
                                    Restr::In(vals)
                                }
                                RelationRhs::InMarker(m) => {
                                    let n =
                                        m.name.clone().unwrap_or_else(|| format!("in({cname})"));
                                    self.spec(
                                        m.index,
                                        &n,
                                        table,
                                        CqlType::List(Box::new(ty.clone())),
                                    )?;
                                    Restr::InBind(m.index)
                                }
                            };
                            eqs[ci] = Some(r);
                        }
                        Operator::Lt | Operator::Le | Operator::Gt | Operator::Ge => {
                            let RelationRhs::Term(t) = &rel.rhs else {
                                return Err(invalid("Invalid range relation"));
                            };
                            let v = self.term(t, &cname, &ty, table)?;
                            ranges.push((ci, rel.op, v));
                        }
                        Operator::Neq
                        | Operator::Contains
                        | Operator::ContainsKey
                        | Operator::Like => {
                            let rhs = self.filter_rhs(rel, &cname, &ty, table)?;
                            w.filters.push(Filter {
                                col: ci,
                                op: rel.op,
                                rhs,
                            });
                        }
                    }
                }
                RelationLhs::Token(cols) => {
                    if virtual_table {
                        return Err(invalid(
                            "token() restrictions are not supported on system tables",
                        ));
                    }
                    let pk_names: Vec<&str> = table
                        .partition_key
                        .iter()
                        .map(|&i| table.columns[i].name.as_str())
                        .collect();
                    if cols.iter().map(|s| s.as_str()).ne(pk_names.iter().copied()) {
                        return Err(invalid(
                            "The token function arguments must be in the partition key order",
                        ));
                    }
                    let RelationRhs::Term(t) = &rel.rhs else {
                        return Err(invalid("IN is not supported on token()"));
                    };
                    let t = match t {
                        Term::Function { name, args } if name == "token" && args.len() == 1 => {
                            &args[0]
                        }
                        other => other,
                    };
                    let v = self.term(
                        t,
                        "partition key token",
                        &CqlType::native(NativeType::Bigint),
                        table,
                    )?;
                    let tr = w.token.get_or_insert_with(TokenRange::default);
                    match rel.op {
                        Operator::Eq => {
                            tr.lower = Some((v.clone(), true));
                            tr.upper = Some((v, true));
                        }
                        Operator::Gt => tr.lower = Some((v, false)),
                        Operator::Ge => tr.lower = Some((v, true)),
                        Operator::Lt => tr.upper = Some((v, false)),
                        Operator::Le => tr.upper = Some((v, true)),
                        _ => return Err(invalid("Unsupported operator on token()")),
                    }
                }
                RelationLhs::Tuple(cols) => {
                    if virtual_table {
                        return Err(invalid(
                            "Multi-column relations are not supported on system tables",
                        ));
                    }
                    let mut idx = Vec::with_capacity(cols.len());
                    for (k, c) in cols.iter().enumerate() {
                        let (ci, col) = table
                            .column(c)
                            .ok_or_else(|| invalid(format!("Undefined column name {c}")))?;
                        if col.kind != ColumnKind::Clustering {
                            return Err(invalid(format!(
                                "Multi-column relations can only be applied to clustering columns but was applied to: {c}"
                            )));
                        }
                        if k > 0 && ci != idx[k - 1] + 1 {
                            return Err(invalid(
                                "Clustering columns must appear in the PRIMARY KEY order in multi-column relations",
                            ));
                        }
                        idx.push(ci);
                    }
                    tuples.push((idx, rel.op, &rel.rhs));
                }
                RelationLhs::Element(name, _) => {
                    return Err(invalid(format!(
                        "Element restrictions on {name} are not supported"
                    )));
                }
            }
        }
        if virtual_table {
            return Ok(w);
        }
        // Partition key.
        for (k, &ci) in table.partition_key.iter().enumerate() {
            if ranges.iter().any(|(c, _, _)| *c == ci) {
                return Err(invalid(
                    "Only EQ and IN relation are supported on the partition key (unless you use the token() function)",
                ));
            }
            w.pk[k] = eqs[ci].take();
        }
        let pk_complete = w.pk_complete();
        if !pk_complete && w.pk.iter().any(|r| r.is_some()) {
            // Partial partition key: the restricted components become filters.
            for (k, &ci) in table.partition_key.iter().enumerate() {
                if let Some(r) = w.pk[k].take() {
                    w.filters.push(restr_filter(ci, r));
                }
            }
        }
        // Clustering.
        let mut next = 0usize; // next clustering component
        let mut tuples_left = tuples;
        if pk_complete {
            while let Some(&ci) = table.clustering.get(next) {
                if let Some(pos) = tuples_left.iter().position(|(idx, _, _)| idx[0] == ci) {
                    let (idx, op, _) = &tuples_left[pos];
                    let width = idx.len();
                    if matches!(op, Operator::Eq | Operator::In) {
                        let (idx, op, rhs) = tuples_left.remove(pos);
                        w.ck_points.push(self.tuple_points(table, &idx, op, rhs)?);
                        next += width;
                        w.ck_covered = next;
                        continue;
                    }
                    // A tuple slice (possibly two relations for both bounds).
                    let mut slice = CkSlice {
                        width,
                        lower: None,
                        upper: None,
                    };
                    let mut i = 0;
                    while i < tuples_left.len() {
                        if tuples_left[i].0[0] == ci {
                            let (idx, op, rhs) = tuples_left.remove(i);
                            if idx.len() != width {
                                return Err(invalid(
                                    "Mixed-width multi-column slices are not supported",
                                ));
                            }
                            let orders_differ = idx
                                .iter()
                                .any(|&c| table.columns[c].order != table.columns[idx[0]].order);
                            if orders_differ {
                                return Err(invalid("Multi-column slices over mixed clustering orders are not supported"));
                            }
                            let val = self.tuple_val(table, &idx, rhs)?;
                            set_bound(&mut slice, op, val)?;
                        } else {
                            i += 1;
                        }
                    }
                    w.ck_slice = Some(slice);
                    break;
                }
                if let Some(r) = eqs[ci].take() {
                    w.ck_points.push(PointRestr::Single(r));
                    next += 1;
                    w.ck_covered = next;
                    continue;
                }
                let mine: Vec<_> = ranges
                    .iter()
                    .filter(|(c, _, _)| *c == ci)
                    .cloned()
                    .collect();
                if !mine.is_empty() {
                    ranges.retain(|(c, _, _)| *c != ci);
                    let mut slice = CkSlice {
                        width: 1,
                        lower: None,
                        upper: None,
                    };
                    for (_, op, v) in mine {
                        set_bound(&mut slice, op, TupleVal::Items(vec![v]))?;
                    }
                    w.ck_slice = Some(slice);
                }
                break;
            }
        }
        if !tuples_left.is_empty() {
            return Err(invalid(
                "Multi-column relations require the partition key and the preceding clustering columns to be restricted",
            ));
        }
        // Whatever is left becomes a filter.
        for (ci, r) in eqs.into_iter().enumerate() {
            if let Some(r) = r {
                w.filters.push(restr_filter(ci, r));
            }
        }
        for (ci, op, v) in ranges {
            w.filters.push(Filter {
                col: ci,
                op,
                rhs: FilterRhs::Val(v),
            });
        }
        Ok(w)
    }

    fn filter_rhs(
        &mut self,
        rel: &Relation,
        cname: &str,
        ty: &CqlType,
        table: &TableDef,
    ) -> Result<FilterRhs, DetailedError> {
        let elem_ty = match (rel.op, ty.unfrozen()) {
            (Operator::Contains, CqlType::List(t) | CqlType::Set(t)) => (**t).clone(),
            (Operator::Contains, CqlType::Map(_, v)) => (**v).clone(),
            (Operator::ContainsKey, CqlType::Map(k, _)) => (**k).clone(),
            (Operator::Contains | Operator::ContainsKey, _) => {
                return Err(invalid(format!(
                    "Cannot use CONTAINS on non-collection column {cname}"
                )))
            }
            _ => ty.clone(),
        };
        Ok(match &rel.rhs {
            RelationRhs::Term(t) => FilterRhs::Val(self.term(t, cname, &elem_ty, table)?),
            RelationRhs::InList(ts) => {
                let mut v = Vec::with_capacity(ts.len());
                for t in ts {
                    v.push(self.term(t, cname, &elem_ty, table)?);
                }
                FilterRhs::List(v)
            }
            RelationRhs::InMarker(m) => {
                let n = m.name.clone().unwrap_or_else(|| format!("in({cname})"));
                self.spec(m.index, &n, table, CqlType::List(Box::new(elem_ty)))?;
                FilterRhs::InBind(m.index)
            }
        })
    }

    fn tuple_type(table: &TableDef, idx: &[usize]) -> CqlType {
        CqlType::Tuple(idx.iter().map(|&i| table.columns[i].ty.clone()).collect())
    }

    fn tuple_name(table: &TableDef, idx: &[usize]) -> String {
        let names: Vec<&str> = idx
            .iter()
            .map(|&i| table.columns[i].name.as_str())
            .collect();
        format!("({})", names.join(","))
    }

    fn tuple_val(
        &mut self,
        table: &TableDef,
        idx: &[usize],
        rhs: &RelationRhs,
    ) -> Result<TupleVal, DetailedError> {
        let RelationRhs::Term(t) = rhs else {
            return Err(invalid("Invalid multi-column relation"));
        };
        self.tuple_term(table, idx, t)
    }

    fn tuple_term(
        &mut self,
        table: &TableDef,
        idx: &[usize],
        t: &Term,
    ) -> Result<TupleVal, DetailedError> {
        match t {
            Term::Tuple(items) => {
                if items.len() != idx.len() {
                    return Err(invalid(format!(
                        "Expected {} elements in value tuple, but got {}",
                        idx.len(),
                        items.len()
                    )));
                }
                let mut vals = Vec::with_capacity(items.len());
                for (item, &ci) in items.iter().zip(idx) {
                    let c = &table.columns[ci];
                    let (n, ty) = (c.name.clone(), c.ty.clone());
                    vals.push(self.term(item, &n, &ty, table)?);
                }
                Ok(TupleVal::Items(vals))
            }
            Term::Bind(m) => {
                let n = m
                    .name
                    .clone()
                    .unwrap_or_else(|| Self::tuple_name(table, idx));
                self.spec(m.index, &n, table, Self::tuple_type(table, idx))?;
                Ok(TupleVal::Bind(m.index))
            }
            _ => Err(invalid("Expected a tuple value in a multi-column relation")),
        }
    }

    fn tuple_points(
        &mut self,
        table: &TableDef,
        idx: &[usize],
        op: Operator,
        rhs: &RelationRhs,
    ) -> Result<PointRestr, DetailedError> {
        let width = idx.len();
        match (op, rhs) {
            (Operator::Eq, RelationRhs::Term(t)) => Ok(PointRestr::Tuples(
                vec![self.tuple_term(table, idx, t)?],
                width,
            )),
            (Operator::In, RelationRhs::InList(ts)) => {
                let mut v = Vec::with_capacity(ts.len());
                for t in ts {
                    v.push(self.tuple_term(table, idx, t)?);
                }
                Ok(PointRestr::Tuples(v, width))
            }
            (Operator::In, RelationRhs::InMarker(m)) => {
                let n = m
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("in({})", Self::tuple_name(table, idx)));
                self.spec(
                    m.index,
                    &n,
                    table,
                    CqlType::List(Box::new(Self::tuple_type(table, idx))),
                )?;
                Ok(PointRestr::TuplesBind(m.index, width))
            }
            _ => Err(invalid("Invalid multi-column relation")),
        }
    }

    fn using(&mut self, using: &Using, table: &TableDef) -> Result<UsingVals, DetailedError> {
        let ttl = match &using.ttl {
            Some(t) => Some(self.term(t, "[ttl]", &CqlType::native(NativeType::Int), table)?),
            None => None,
        };
        let ts = match &using.timestamp {
            Some(t) => Some(self.term(
                t,
                "[timestamp]",
                &CqlType::native(NativeType::Bigint),
                table,
            )?),
            None => None,
        };
        let timeout = match &using.timeout {
            Some(t) => Some(self.timeout_term(t, table)?),
            None => None,
        };
        Ok((ttl, ts, timeout))
    }

    fn timeout_term(&mut self, t: &Term, table: &TableDef) -> Result<Val, DetailedError> {
        self.term(
            t,
            "[timeout]",
            &CqlType::native(NativeType::Duration),
            table,
        )
    }

    /// Analyses a SELECT.
    pub fn select(&mut self, s: &Select) -> Result<SelectPlan, DetailedError> {
        let table = self.table(&s.table)?;
        // GROUP BY: a prefix of the primary key columns, in order.
        let mut group_by = Vec::with_capacity(s.group_by.len());
        let key_order: Vec<usize> = table
            .partition_key
            .iter()
            .chain(&table.clustering)
            .copied()
            .collect();
        for (k, name) in s.group_by.iter().enumerate() {
            let (ci, _) = table
                .column(name)
                .ok_or_else(|| invalid(format!("Undefined column name {name}")))?;
            if key_order.get(k) != Some(&ci) {
                return Err(invalid(format!(
                    "Group by currently only supports a prefix of the PRIMARY KEY columns in order, got {name}"
                )));
            }
            group_by.push(ci);
        }
        if !group_by.is_empty() && group_by.len() < table.partition_key.len() {
            return Err(invalid("Group by must include every partition key column"));
        }
        let virtual_table = table.is_virtual();
        let where_ = self.where_clause(&table, &s.where_clause, virtual_table)?;
        if !virtual_table && !s.allow_filtering {
            let needs = !where_.filters.is_empty()
                || (!where_.pk_complete() && where_.restricts_clustering());
            if needs {
                return Err(invalid("Cannot execute this query as it might involve data filtering and thus may have unpredictable performance. If you want to execute this query despite the performance unpredictability, use ALLOW FILTERING"));
            }
        }
        // Selection.
        let mut items = Vec::new();
        if s.selectors.is_empty() {
            items.extend((0..table.columns.len()).map(SelItem::Col));
        } else {
            for sel in &s.selectors {
                items.push(self.selector(&table, sel)?);
            }
        }
        // As Cassandra: a selection of static (and partition key) columns only reads no rows, so
        // a clustering restriction there would be ignored; it is rejected instead.
        if !s.selectors.is_empty()
            && Self::selects_only_static(&table, &items)
            && (where_.restricts_clustering()
                || where_
                    .filters
                    .iter()
                    .any(|f| table.columns[f.col].kind == ColumnKind::Clustering))
        {
            return Err(invalid(
                "Cannot restrict clustering columns when selecting only static columns",
            ));
        }
        // Grouped selections aggregate per group (plain columns show the group's first row).
        let aggregate = items.iter().any(|i| i.is_aggregate()) || !group_by.is_empty();
        if s.distinct {
            for it in &items {
                match it {
                    SelItem::Col(c)
                        if matches!(table.columns[*c].kind, ColumnKind::PartitionKey | ColumnKind::Static) => {}
                    SelItem::CountAll | SelItem::Token => {}
                    _ => {
                        return Err(invalid(
                            "SELECT DISTINCT queries must only request partition key columns and/or static columns",
                        ))
                    }
                }
            }
            let all_pk = table
                .partition_key
                .iter()
                .all(|p| items.iter().any(|i| matches!(i, SelItem::Col(c) if c == p)));
            if !all_pk && !aggregate {
                return Err(invalid(
                    "SELECT DISTINCT queries must request all the partition key columns",
                ));
            }
        }
        // ORDER BY.
        let mut reversed = None;
        for (k, (name, asc)) in s.order_by.iter().enumerate() {
            let (ci, col) = table
                .column(name)
                .ok_or_else(|| invalid(format!("Undefined column name {name}")))?;
            if col.kind != ColumnKind::Clustering {
                return Err(invalid(format!("Order by is currently only supported on the clustered columns of the PRIMARY KEY, got {name}")));
            }
            if table.clustering.get(k) != Some(&ci) {
                return Err(invalid("Order by currently only supports the ordering of columns following their declared order in the PRIMARY KEY"));
            }
            let declared_asc = col.order == sluice_storage::Order::Asc;
            let r = *asc != declared_asc;
            if reversed.is_some_and(|prev| prev != r) {
                return Err(invalid("Unsupported order by relation"));
            }
            reversed = Some(r);
        }
        if reversed.is_some() && !where_.pk_complete() {
            return Err(invalid("ORDER BY is only supported when the partition key is restricted by an EQ or an IN."));
        }
        let limit = match &s.limit {
            Some(t) => Some(self.term(t, "[limit]", &CqlType::native(NativeType::Int), &table)?),
            None => None,
        };
        if s.per_partition_limit.is_some() && group_by.is_empty() && aggregate {
            return Err(invalid(
                "PER PARTITION LIMIT is not allowed with aggregate queries.",
            ));
        }
        let per_partition_limit = match &s.per_partition_limit {
            Some(t) => Some(self.term(
                t,
                "[per_partition_limit]",
                &CqlType::native(NativeType::Int),
                &table,
            )?),
            None => None,
        };
        let timeout = match &s.timeout {
            Some(t) => Some(self.timeout_term(t, &table)?),
            None => None,
        };
        Ok(SelectPlan {
            table,
            items,
            aggregate,
            where_,
            limit,
            per_partition_limit,
            reversed: reversed.unwrap_or(false),
            ordered: reversed.is_some(),
            group_by,
            json: None,
            distinct: s.distinct,
            timeout,
        })
    }

    fn selector(&mut self, table: &TableDef, sel: &Selector) -> Result<SelItem, DetailedError> {
        let col_of = |name: &str| {
            table
                .column(name)
                .map(|(i, _)| i)
                .ok_or_else(|| invalid(format!("Undefined column name {name}")))
        };
        match sel {
            Selector::Column { name, .. } => Ok(SelItem::Col(col_of(name)?)),
            Selector::Function {
                name, args, star, ..
            } => {
                let arg_col = |args: &[Selector]| -> Result<usize, DetailedError> {
                    match args {
                        [Selector::Column { name, .. }] => col_of(name),
                        _ => Err(invalid("Function arguments must be a single column")),
                    }
                };
                match name.as_str() {
                    "count" if *star => Ok(SelItem::CountAll),
                    "count" => match args.as_slice() {
                        [Selector::Term(_)] => Ok(SelItem::CountAll),
                        _ => Ok(SelItem::Count(arg_col(args)?)),
                    },
                    "writetime" | "ttl" => {
                        let c = arg_col(args)?;
                        let col = &table.columns[c];
                        if col.kind.is_primary_key() {
                            return Err(invalid(format!(
                                "Cannot use selection function {name} on PRIMARY KEY part {}",
                                col.name
                            )));
                        }
                        if col.ty.is_multi_cell_collection() {
                            return Err(invalid(format!(
                                "Cannot use selection function {name} on non-frozen collection {}",
                                col.name
                            )));
                        }
                        Ok(if name == "writetime" {
                            SelItem::WriteTime(c)
                        } else {
                            SelItem::Ttl(c)
                        })
                    }
                    "token" => {
                        let names: Vec<&str> = args
                            .iter()
                            .filter_map(|a| match a {
                                Selector::Column { name, .. } => Some(name.as_str()),
                                _ => None,
                            })
                            .collect();
                        let pk: Vec<&str> = table
                            .partition_key
                            .iter()
                            .map(|&i| table.columns[i].name.as_str())
                            .collect();
                        if names != pk {
                            return Err(invalid("The token function arguments must be the partition key columns in order"));
                        }
                        Ok(SelItem::Token)
                    }
                    "max" => Ok(SelItem::Max(arg_col(args)?)),
                    "sum" | "avg" => {
                        let c = arg_col(args)?;
                        if !matches!(
                            table.columns[c].ty,
                            CqlType::Native(
                                NativeType::Tinyint
                                    | NativeType::Smallint
                                    | NativeType::Int
                                    | NativeType::Bigint
                                    | NativeType::Counter
                                    | NativeType::Float
                                    | NativeType::Double
                            )
                        ) {
                            return Err(invalid(format!(
                                "Invalid call to function {name}: column {} is not of a supported numeric type",
                                table.columns[c].name
                            )));
                        }
                        Ok(if name == "sum" {
                            SelItem::Sum(c)
                        } else {
                            SelItem::Avg(c)
                        })
                    }
                    "min" => Ok(SelItem::Min(arg_col(args)?)),
                    other => Err(invalid(format!("Unknown function '{other}'"))),
                }
            }
            Selector::Term(_) => Err(invalid("Constant selectors are not supported")),
        }
    }

    /// Result column specs of a SELECT.
    pub fn result_specs(plan: &SelectPlan, s: &Select) -> Vec<ColumnSpec> {
        let t = &plan.table;
        let spec = |name: String, ty: CqlType| ColumnSpec {
            keyspace: t.keyspace.clone(),
            table: t.name.clone(),
            name,
            ty,
        };
        let bigint = CqlType::native(NativeType::Bigint);
        plan.items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let alias = s.selectors.get(i).and_then(|sel| match sel {
                    Selector::Column { alias, .. } | Selector::Function { alias, .. } => {
                        alias.clone()
                    }
                    Selector::Term(_) => None,
                });
                let (name, ty) = match item {
                    SelItem::Col(c) => (t.columns[*c].name.clone(), t.columns[*c].ty.clone()),
                    SelItem::WriteTime(c) => {
                        (format!("writetime({})", t.columns[*c].name), bigint.clone())
                    }
                    SelItem::Ttl(c) => (
                        format!("ttl({})", t.columns[*c].name),
                        CqlType::native(NativeType::Int),
                    ),
                    SelItem::Token => {
                        let names: Vec<&str> = t
                            .partition_key
                            .iter()
                            .map(|&i| t.columns[i].name.as_str())
                            .collect();
                        (
                            format!("system.token({})", names.join(", ")),
                            bigint.clone(),
                        )
                    }
                    SelItem::CountAll => ("count".to_string(), bigint.clone()),
                    SelItem::Count(c) => (
                        format!("system.count({})", t.columns[*c].name),
                        bigint.clone(),
                    ),
                    SelItem::Max(c) => (
                        format!("system.max({})", t.columns[*c].name),
                        t.columns[*c].ty.clone(),
                    ),
                    SelItem::Min(c) => (
                        format!("system.min({})", t.columns[*c].name),
                        t.columns[*c].ty.clone(),
                    ),
                    SelItem::Sum(c) => (
                        format!("system.sum({})", t.columns[*c].name),
                        t.columns[*c].ty.clone(),
                    ),
                    SelItem::Avg(c) => (
                        format!("system.avg({})", t.columns[*c].name),
                        t.columns[*c].ty.clone(),
                    ),
                };
                spec(alias.unwrap_or(name), ty)
            })
            .collect()
    }

    fn column_for_write<'t>(
        table: &'t TableDef,
        name: &str,
    ) -> Result<(usize, &'t crate::catalog::ColumnDef), DetailedError> {
        table
            .column(name)
            .ok_or_else(|| invalid(format!("Undefined column name {name}")))
    }

    /// Whether a selection reads at least one static column and otherwise only partition key
    /// columns (Cassandra's `containsOnlyStaticColumns`).
    fn selects_only_static(table: &TableDef, items: &[SelItem]) -> bool {
        let mut any_static = false;
        for c in items.iter().filter_map(SelItem::column) {
            match table.columns[c].kind {
                ColumnKind::Static => any_static = true,
                ColumnKind::PartitionKey => {}
                _ => return false,
            }
        }
        any_static
    }

    /// Checks that a write restricts the whole key, and that no filters remain.
    fn check_write_where(
        table: &TableDef,
        w: &Where,
        static_only: bool,
        kind: WriteKind,
    ) -> Result<(), DetailedError> {
        if !w.pk_complete() {
            let missing: Vec<&str> = table
                .partition_key
                .iter()
                .enumerate()
                .filter(|(k, _)| w.pk.get(*k).is_none_or(|r| r.is_none()))
                .map(|(_, &i)| table.columns[i].name.as_str())
                .collect();
            if !missing.is_empty() {
                return Err(invalid(format!(
                    "Some partition key parts are missing: {}",
                    missing.join(", ")
                )));
            }
        }
        if w.token.is_some() {
            return Err(invalid("The token function cannot be used in WHERE clauses for UPDATE and DELETE statements"));
        }
        if let Some(f) = w.filters.first() {
            let c = &table.columns[f.col];
            return Err(invalid(if c.kind.is_primary_key() {
                format!("PRIMARY KEY column \"{}\" cannot be restricted as preceding columns are not restricted", c.name)
            } else {
                format!("Non PRIMARY KEY columns found in where clause: {}", c.name)
            }));
        }
        if kind != WriteKind::Delete && !static_only {
            if w.ck_slice.is_some() {
                return Err(invalid("Slice restrictions are not supported on the clustering columns in UPDATE statements"));
            }
            if w.ck_covered < table.clustering.len() {
                let missing: Vec<&str> = table.clustering[w.ck_covered..]
                    .iter()
                    .map(|&i| table.columns[i].name.as_str())
                    .collect();
                return Err(invalid(format!(
                    "Some clustering keys are missing: {}",
                    missing.join(", ")
                )));
            }
        }
        if static_only
            && w.restricts_clustering()
            && kind == WriteKind::Update
            && w.ck_covered < table.clustering.len()
        {
            return Err(invalid("Invalid restrictions on clustering columns since the UPDATE statement modifies only static columns"));
        }
        Ok(())
    }

    fn condition(
        &mut self,
        table: &TableDef,
        cond: &Option<Condition>,
    ) -> Result<Option<CondPlan>, DetailedError> {
        Ok(match cond {
            None => None,
            Some(Condition::NotExists) => Some(CondPlan::NotExists),
            Some(Condition::Exists) => Some(CondPlan::Exists),
            Some(Condition::Columns(rels)) => {
                let mut out = Vec::with_capacity(rels.len());
                for rel in rels {
                    let RelationLhs::Column(name) = &rel.lhs else {
                        return Err(invalid(
                            "Only column conditions are supported in IF clauses",
                        ));
                    };
                    let (ci, col) = Self::column_for_write(table, name)?;
                    if col.kind.is_primary_key() {
                        return Err(invalid(format!(
                            "PRIMARY KEY column '{name}' cannot have IF conditions"
                        )));
                    }
                    let (cname, ty) = (col.name.clone(), col.ty.clone());
                    let rhs = self.filter_rhs(rel, &cname, &ty, table)?;
                    out.push(Filter {
                        col: ci,
                        op: rel.op,
                        rhs,
                    });
                }
                Some(CondPlan::Columns(out))
            }
        })
    }

    /// Analyses an INSERT.
    pub fn insert(&mut self, s: &Insert) -> Result<WritePlan, DetailedError> {
        if s.json {
            let table = self.table(&s.table)?;
            return self.insert(&json_insert::rewrite(s, &table)?);
        }
        let table = self.table(&s.table)?;
        if table.is_virtual() {
            return Err(invalid(format!(
                "{}.{} is a system table and cannot be modified",
                table.keyspace, table.name
            )));
        }
        if table.is_counter() {
            return Err(invalid(
                "INSERT statements are not allowed on counter tables, use UPDATE instead",
            ));
        }
        if s.columns.len() != s.values.len() {
            return Err(invalid("Unmatched column names/values"));
        }
        let mut w = Where {
            pk: vec![None; table.partition_key.len()],
            ..Where::default()
        };
        let mut ck: Vec<Option<Val>> = vec![None; table.clustering.len()];
        let mut ops = Vec::new();
        let mut seen = vec![false; table.columns.len()];
        for (name, term) in s.columns.iter().zip(&s.values) {
            let (ci, col) = Self::column_for_write(&table, name)?;
            let (cname, ty, kind, pos) = (col.name.clone(), col.ty.clone(), col.kind, col.position);
            if std::mem::replace(&mut seen[ci], true) {
                return Err(invalid(format!(
                    "Multiple definitions found for column {cname}"
                )));
            }
            let v = self.term(term, &cname, &ty, &table)?;
            match kind {
                ColumnKind::PartitionKey => w.pk[pos as usize] = Some(Restr::Eq(v)),
                ColumnKind::Clustering => ck[pos as usize] = Some(v),
                _ => ops.push(Op::Set { col: ci, val: v }),
            }
        }
        let static_only = !ops.is_empty()
            && ops
                .iter()
                .all(|o| table.columns[o.col()].kind == ColumnKind::Static)
            && ck.iter().all(|c| c.is_none());
        for v in ck.into_iter() {
            match v {
                Some(v) => {
                    w.ck_points.push(PointRestr::Single(Restr::Eq(v)));
                    w.ck_covered += 1;
                }
                None => break,
            }
        }
        Self::check_write_where(&table, &w, static_only, WriteKind::Insert)?;
        let (ttl, timestamp, timeout) = self.using(&s.using, &table)?;
        let condition = if s.if_not_exists {
            Some(CondPlan::NotExists)
        } else {
            None
        };
        Ok(WritePlan {
            table,
            kind: WriteKind::Insert,
            where_: w,
            ops,
            ttl,
            timestamp,
            timeout,
            condition,
            static_only,
            canonical_binds: Vec::new(),
        })
    }

    /// Analyses an UPDATE.
    pub fn update(&mut self, s: &Update) -> Result<WritePlan, DetailedError> {
        let table = self.table(&s.table)?;
        if table.is_virtual() {
            return Err(invalid(format!(
                "{}.{} is a system table and cannot be modified",
                table.keyspace, table.name
            )));
        }
        let mut ops = Vec::with_capacity(s.assignments.len());
        for a in &s.assignments {
            ops.push(self.assignment(&table, a)?);
        }
        let w = self.where_clause(&table, &s.where_clause, false)?;
        let static_only = !ops.is_empty()
            && ops
                .iter()
                .all(|o| table.columns[o.col()].kind == ColumnKind::Static);
        Self::check_write_where(&table, &w, static_only, WriteKind::Update)?;
        // As Cassandra: a clustering key on a write of static columns only is a mistake.
        if static_only && s.condition.is_none() && w.restricts_clustering() {
            return Err(invalid("Invalid restrictions on clustering columns since the UPDATE statement modifies only static columns"));
        }
        let (ttl, timestamp, timeout) = self.using(&s.using, &table)?;
        if table.is_counter() {
            if ttl.is_some() {
                return Err(invalid("Cannot provide custom TTL for counter updates"));
            }
            if timestamp.is_some() {
                return Err(invalid(
                    "Cannot provide custom timestamp for counter updates",
                ));
            }
        }
        let condition = self.condition(&table, &s.condition)?;
        Ok(WritePlan {
            table,
            kind: WriteKind::Update,
            where_: w,
            ops,
            ttl,
            timestamp,
            timeout,
            condition,
            static_only,
            canonical_binds: Vec::new(),
        })
    }

    fn assignment(&mut self, table: &TableDef, a: &Assignment) -> Result<Op, DetailedError> {
        let name = match a {
            Assignment::Set { column, .. }
            | Assignment::SetElement { column, .. }
            | Assignment::Add { column, .. }
            | Assignment::Subtract { column, .. }
            | Assignment::Prepend { column, .. } => column,
        };
        let (ci, col) = Self::column_for_write(table, name)?;
        if col.kind.is_primary_key() {
            return Err(invalid(format!(
                "PRIMARY KEY part {name} found in SET part"
            )));
        }
        let ty = col.ty.clone();
        let cname = col.name.clone();
        let multi = ty.is_multi_cell_collection();
        Ok(match a {
            Assignment::Set { value, .. } => {
                if ty.is_counter() {
                    return Err(invalid(format!(
                        "Cannot set the value of counter column {cname} (counters can only be incremented/decremented, not set)"
                    )));
                }
                Op::Set {
                    col: ci,
                    val: self.term(value, &cname, &ty, table)?,
                }
            }
            Assignment::SetElement { key, value, .. } => {
                let (kty, vty, kname, vname) = match &ty {
                    CqlType::List(e) => (
                        CqlType::native(NativeType::Int),
                        (**e).clone(),
                        format!("idx({cname})"),
                        format!("value({cname})"),
                    ),
                    CqlType::Map(k, v) => (
                        (**k).clone(),
                        (**v).clone(),
                        format!("key({cname})"),
                        format!("value({cname})"),
                    ),
                    _ => {
                        return Err(invalid(format!(
                            "Invalid operation ({cname}[..] = ..) for non list/map column {cname}"
                        )))
                    }
                };
                let key = self.term(key, &kname, &kty, table)?;
                let val = self.term(value, &vname, &vty, table)?;
                Op::SetElement { col: ci, key, val }
            }
            Assignment::Add { value, .. } | Assignment::Subtract { value, .. } => {
                let negate = matches!(a, Assignment::Subtract { .. });
                if ty.is_counter() {
                    let val = self.term(value, &cname, &ty, table)?;
                    Op::Counter {
                        col: ci,
                        val,
                        negate,
                    }
                } else if multi {
                    let operand_ty = match (&ty, negate) {
                        (CqlType::Map(k, _), true) => CqlType::Set(k.clone()),
                        _ => ty.clone(),
                    };
                    let val = self.term(value, &cname, &operand_ty, table)?;
                    if negate {
                        Op::Remove { col: ci, val }
                    } else {
                        Op::Append { col: ci, val }
                    }
                } else {
                    return Err(invalid(format!(
                        "Invalid operation ({cname} = {cname} {} ?) for non counter column {cname}",
                        if negate { "-" } else { "+" }
                    )));
                }
            }
            Assignment::Prepend { value, .. } => {
                if !matches!(ty, CqlType::List(_)) {
                    return Err(invalid(format!(
                        "Invalid operation ({cname} = ? + {cname}) for non list column {cname}"
                    )));
                }
                Op::Prepend {
                    col: ci,
                    val: self.term(value, &cname, &ty, table)?,
                }
            }
        })
    }

    /// Analyses a DELETE.
    pub fn delete(&mut self, s: &Delete) -> Result<WritePlan, DetailedError> {
        let table = self.table(&s.table)?;
        if table.is_virtual() {
            return Err(invalid(format!(
                "{}.{} is a system table and cannot be modified",
                table.keyspace, table.name
            )));
        }
        let mut ops = Vec::with_capacity(s.targets.len());
        for t in &s.targets {
            let (ci, col) = Self::column_for_write(&table, &t.column)?;
            if col.kind.is_primary_key() {
                return Err(invalid(format!(
                    "Invalid identifier {} for deletion (should not be a PRIMARY KEY part)",
                    col.name
                )));
            }
            let (cname, ty) = (col.name.clone(), col.ty.clone());
            match &t.element {
                None => ops.push(Op::Delete { col: ci }),
                Some(k) => {
                    let kty = match &ty {
                        CqlType::List(_) => CqlType::native(NativeType::Int),
                        CqlType::Map(k, _) => (**k).clone(),
                        CqlType::Set(e) => (**e).clone(),
                        _ => {
                            return Err(invalid(format!(
                                "Invalid element deletion on non-collection column {cname}"
                            )))
                        }
                    };
                    let key = self.term(k, &format!("key({cname})"), &kty, &table)?;
                    ops.push(Op::DeleteElement { col: ci, key });
                }
            }
        }
        let w = self.where_clause(&table, &s.where_clause, false)?;
        let static_only = !ops.is_empty()
            && ops
                .iter()
                .all(|o| table.columns[o.col()].kind == ColumnKind::Static);
        Self::check_write_where(&table, &w, static_only, WriteKind::Delete)?;
        if static_only && s.condition.is_none() && w.restricts_clustering() {
            return Err(invalid("Invalid restrictions on clustering columns since the DELETE statement modifies only static columns"));
        }
        if !ops.is_empty()
            && !static_only
            && (w.ck_slice.is_some() || w.ck_covered < table.clustering.len())
        {
            return Err(invalid(
                "Range deletions are not supported for specific columns",
            ));
        }
        let (ttl, timestamp, timeout) = self.using(&s.using, &table)?;
        if ttl.is_some() {
            return Err(invalid("A TTL is not supported on DELETE"));
        }
        let condition = self.condition(&table, &s.condition)?;
        Ok(WritePlan {
            table,
            kind: WriteKind::Delete,
            where_: w,
            ops,
            ttl: None,
            timestamp,
            timeout,
            condition,
            static_only,
            canonical_binds: Vec::new(),
        })
    }

    /// Analyses one statement of a BATCH.
    pub fn batch_statement(&mut self, s: &BatchStatement) -> Result<WritePlan, DetailedError> {
        match s {
            BatchStatement::Insert(i) => self.insert(i),
            BatchStatement::Update(u) => self.update(u),
            BatchStatement::Delete(d) => self.delete(d),
        }
    }

    /// Analyses a batch's own USING clause (TIMESTAMP and TIMEOUT only).
    pub fn batch_using(
        &mut self,
        using: &Using,
        first: Option<&TableDef>,
    ) -> Result<(Option<Val>, Option<Val>), DetailedError> {
        if using.ttl.is_some() {
            return Err(invalid(
                "Global TTL on the BATCH statement is not supported.",
            ));
        }
        let Some(table) = first else {
            return Ok((None, None));
        };
        let ts = match &using.timestamp {
            Some(t) => Some(self.term(
                t,
                "[timestamp]",
                &CqlType::native(NativeType::Bigint),
                table,
            )?),
            None => None,
        };
        let timeout = match &using.timeout {
            Some(t) => Some(self.timeout_term(t, table)?),
            None => None,
        };
        Ok((ts, timeout))
    }
}

fn restr_filter(ci: usize, r: Restr) -> Filter {
    let rhs = match r {
        Restr::Eq(v) => {
            return Filter {
                col: ci,
                op: Operator::Eq,
                rhs: FilterRhs::Val(v),
            }
        }
        Restr::In(v) => FilterRhs::List(v),
        Restr::InBind(b) => FilterRhs::InBind(b),
    };
    Filter {
        col: ci,
        op: Operator::In,
        rhs,
    }
}

fn set_bound(slice: &mut CkSlice, op: Operator, val: TupleVal) -> Result<(), DetailedError> {
    let (slot, inclusive) = match op {
        Operator::Gt => (&mut slice.lower, false),
        Operator::Ge => (&mut slice.lower, true),
        Operator::Lt => (&mut slice.upper, false),
        Operator::Le => (&mut slice.upper, true),
        _ => return Err(invalid("Invalid slice operator")),
    };
    if slot.is_some() {
        return Err(invalid(
            "More than one restriction was found for the same bound of a clustering slice",
        ));
    }
    *slot = Some(SliceBound { val, inclusive });
    Ok(())
}

fn contains_marker(t: &Term) -> bool {
    match t {
        Term::Bind(_) | Term::Function { .. } => true,
        Term::Literal(_) | Term::Reference(_) => false,
        Term::List(v) | Term::Set(v) | Term::Tuple(v) => v.iter().any(contains_marker),
        Term::Map(v) => v
            .iter()
            .any(|(a, b)| contains_marker(a) || contains_marker(b)),
        Term::Cast(_, inner) => contains_marker(inner),
    }
}

/// The deterministic statement id: MD5 of keyspace + query, as Cassandra computes it.
pub fn statement_id(keyspace: Option<&str>, query: &str) -> [u8; 16] {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    if let Some(ks) = keyspace {
        h.update(ks.as_bytes());
    }
    h.update(query.as_bytes());
    h.finalize().into()
}

/// The partition-key bind indexes for token-aware routing (empty unless all are `= ?`).
fn pk_indexes(w: &Where) -> Vec<u16> {
    let mut out = Vec::with_capacity(w.pk.len());
    for r in &w.pk {
        match r {
            Some(Restr::Eq(Val::Bind(i))) => match u16::try_from(*i) {
                Ok(i) => out.push(i),
                Err(_) => return Vec::new(),
            },
            _ => return Vec::new(),
        }
    }
    out
}

fn ok_table_kind(plan: &SelectPlan) -> OpKind {
    if plan.table.is_virtual() {
        OpKind::Other
    } else if plan.where_.pk_complete() {
        OpKind::Read
    } else {
        OpKind::Range
    }
}

/// Builds a [`Prepared`] from a parsed statement.
pub(crate) fn analyze(
    schema: &Schema,
    keyspace: Option<&str>,
    query: &str,
    id: [u8; 16],
    parsed: sluice_cql::ast::ParsedStatement,
) -> Result<Prepared, DetailedError> {
    let mut a = Analyzer::new(schema, keyspace, parsed.bind_count);
    let mut result_columns = Vec::new();
    let mut pk_idx = Vec::new();
    let mut lwt = false;
    let mut table_id = None;
    let mut keyspace_ref = None;
    let (mut plan, kind) = match &parsed.statement {
        Statement::Select(s) => {
            let mut plan = a.select(s)?;
            result_columns = Analyzer::result_specs(&plan, s);
            if s.json {
                // One `[json]` text column; the row's columns become the object's keys.
                plan.json = Some(
                    result_columns
                        .iter()
                        .map(|c| (c.name.clone(), c.ty.clone()))
                        .collect(),
                );
                result_columns = vec![ColumnSpec {
                    keyspace: plan.table.keyspace.clone(),
                    table: plan.table.name.clone(),
                    name: "[json]".into(),
                    ty: CqlType::native(NativeType::Text),
                }];
            }
            if !plan.table.is_virtual() {
                pk_idx = pk_indexes(&plan.where_);
            }
            table_id = Some(plan.table.id);
            keyspace_ref = Some(plan.table.keyspace.clone());
            let kind = ok_table_kind(&plan);
            (Plan::Select(Box::new(plan)), kind)
        }
        Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
            let plan = match &parsed.statement {
                Statement::Insert(s) => a.insert(s)?,
                Statement::Update(s) => a.update(s)?,
                Statement::Delete(s) => a.delete(s)?,
                _ => unreachable!("matched above"),
            };
            pk_idx = pk_indexes(&plan.where_);
            table_id = Some(plan.table.id);
            keyspace_ref = Some(plan.table.keyspace.clone());
            if plan.condition.is_some() {
                lwt = true;
                result_columns = crate::write::lwt_result_specs(&plan.table);
            }
            (Plan::Write(Box::new(plan)), OpKind::Write)
        }
        Statement::Batch(b) => {
            let mut writes = Vec::with_capacity(b.statements.len());
            for st in &b.statements {
                writes.push(a.batch_statement(st)?);
            }
            let (timestamp, timeout) =
                a.batch_using(&b.using, writes.first().map(|w| &*w.table))?;
            if writes.iter().any(|w| w.condition.is_some()) {
                lwt = true;
                if let Some(first) = writes.first() {
                    result_columns = crate::write::lwt_result_specs(&first.table);
                }
            }
            (
                Plan::Batch(Box::new(BatchPlan {
                    kind: b.kind,
                    writes,
                    timestamp,
                    timeout,
                })),
                OpKind::Write,
            )
        }
        Statement::Transaction(t) => {
            let (plan, specs) = crate::transaction::analyze(&mut a, t, parsed.bind_count)?;
            result_columns = specs;
            (Plan::Transaction(Box::new(plan)), OpKind::Write)
        }
        Statement::Use(_)
        | Statement::Describe(_)
        | Statement::CreateRole(_)
        | Statement::AlterRole(_)
        | Statement::DropRole(_)
        | Statement::ListRoles(_)
        | Statement::GrantPermissions(_)
        | Statement::RevokePermissions(_)
        | Statement::ListPermissions(_)
        | Statement::GrantRole(_)
        | Statement::RevokeRole(_) => (
            Plan::Dynamic(Box::new(parsed.statement.clone())),
            OpKind::Other,
        ),
        _ => (
            Plan::Dynamic(Box::new(parsed.statement.clone())),
            OpKind::Schema,
        ),
    };
    let bind_specs = a.finish()?;
    // A statement of a protocol BATCH is bound without `exec::order_values`, so a write
    // carries what it needs to put its values in canonical order itself.
    if let Plan::Write(w) = &mut plan {
        w.canonical_binds = bind_specs
            .iter()
            .enumerate()
            .filter(|(_, s)| sluice_types::contains_set_or_map(&s.ty))
            .map(|(i, s)| (i, s.ty.clone()))
            .collect();
    }
    let set_or_map_markers = bind_specs
        .iter()
        .any(|s| sluice_types::contains_set_or_map(&s.ty));
    let const_timeout = crate::exec::constant_timeout(plan.timeout());
    let access = crate::auth::required_access(&plan, lwt, keyspace);
    let changes_auth = matches!(
        &parsed.statement,
        Statement::CreateRole(_)
            | Statement::AlterRole(_)
            | Statement::DropRole(_)
            | Statement::GrantPermissions(_)
            | Statement::RevokePermissions(_)
            | Statement::GrantRole(_)
            | Statement::RevokeRole(_)
    );
    Ok(Prepared {
        id,
        keyspace: keyspace.map(str::to_string),
        query: query.to_string(),
        bind_specs,
        pk_indexes: pk_idx,
        result_columns: result_columns.into(),
        lwt,
        kind,
        table_id,
        table_keyspace: keyspace_ref,
        plan,
        const_timeout,
        set_or_map_markers,
        last_used: std::sync::atomic::AtomicU64::new(0),
        schema_version: schema.version,
        access,
        changes_auth,
    })
}

/// `INSERT INTO t JSON '...'`: the JSON object is rewritten into an ordinary INSERT of
/// typed literals (columns it omits are set to null, Cassandra's `DEFAULT NULL`).
mod json_insert {
    use super::invalid;
    use crate::catalog::TableDef;
    use serde_json::Value as J;
    use sluice_cql::ast::{Insert, Literal, Term};
    use sluice_protocol::DetailedError;
    use sluice_types::{CqlType, NativeType as N};

    /// The equivalent INSERT with a column list and literal values.
    pub(super) fn rewrite(s: &Insert, table: &TableDef) -> Result<Insert, DetailedError> {
        let text =
            match s.values.first() {
                Some(Term::Literal(Literal::String(t))) => t,
                Some(Term::Bind(_)) => return Err(invalid(
                    "INSERT JSON with a bind marker is not supported; use a JSON string literal",
                )),
                _ => return Err(invalid("INSERT JSON expects a JSON string")),
            };
        let parsed: J = serde_json::from_str(text)
            .map_err(|e| invalid(format!("Could not decode JSON string as a map: {e}")))?;
        let J::Object(obj) = parsed else {
            return Err(invalid("Could not decode JSON string as a map"));
        };
        let mut columns = Vec::with_capacity(table.columns.len());
        let mut values = Vec::with_capacity(table.columns.len());
        for (key, v) in &obj {
            // Keys are identifiers: case-insensitive unless written with inner quotes.
            let name = match key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
                Some(quoted) => quoted.to_string(),
                None => key.to_lowercase(),
            };
            let (_, col) = table.column(&name).ok_or_else(|| {
                invalid(format!(
                    "JSON values map contains unrecognized column: {key}"
                ))
            })?;
            values.push(term(&col.ty, v)?);
            columns.push(col.name.clone());
        }
        for c in &table.columns {
            if !c.kind.is_primary_key() && !columns.contains(&c.name) {
                columns.push(c.name.clone());
                values.push(Term::Literal(Literal::Null));
            }
        }
        Ok(Insert {
            table: s.table.clone(),
            columns,
            values,
            json: false,
            if_not_exists: s.if_not_exists,
            using: s.using.clone(),
        })
    }

    fn bad(ty: &CqlType, v: &J) -> DetailedError {
        invalid(format!("Unable to make {ty} from {v}"))
    }

    /// A JSON value as a literal term of `ty`.
    fn term(ty: &CqlType, v: &J) -> Result<Term, DetailedError> {
        Ok(match (ty.unfrozen(), v) {
            (_, J::Null) => Term::Literal(Literal::Null),
            (CqlType::List(e), J::Array(a)) => {
                Term::List(a.iter().map(|x| term(e, x)).collect::<Result<_, _>>()?)
            }
            (CqlType::Set(e), J::Array(a)) => {
                Term::Set(a.iter().map(|x| term(e, x)).collect::<Result<_, _>>()?)
            }
            (CqlType::Tuple(ts), J::Array(a)) if a.len() <= ts.len() => Term::Tuple(
                a.iter()
                    .zip(ts)
                    .map(|(x, t)| term(t, x))
                    .collect::<Result<_, _>>()?,
            ),
            (CqlType::Map(k, vt), J::Object(o)) => Term::Map(
                o.iter()
                    .map(|(key, x)| Ok((key_term(k, key)?, term(vt, x)?)))
                    .collect::<Result<_, DetailedError>>()?,
            ),
            (CqlType::Native(n), J::Bool(b)) if *n == N::Boolean => {
                Term::Literal(Literal::Bool(*b))
            }
            (CqlType::Native(_), J::Number(x)) => Term::Literal(if x.is_i64() || x.is_u64() {
                Literal::Integer(x.to_string())
            } else {
                Literal::Float(x.to_string())
            }),
            (CqlType::Native(n), J::String(s)) => string_term(*n, s).ok_or_else(|| bad(ty, v))?,
            _ => return Err(bad(ty, v)),
        })
    }

    /// A map key (JSON object keys are strings).
    fn key_term(ty: &CqlType, key: &str) -> Result<Term, DetailedError> {
        match ty.unfrozen() {
            CqlType::Native(n) => {
                string_term(*n, key).ok_or_else(|| bad(ty, &J::String(key.to_string())))
            }
            _ => {
                let v: J =
                    serde_json::from_str(key).map_err(|_| bad(ty, &J::String(key.to_string())))?;
                term(ty, &v)
            }
        }
    }

    /// A string in Cassandra's JSON form for a native type.
    fn string_term(n: N, s: &str) -> Option<Term> {
        let lit = match n {
            N::Uuid | N::Timeuuid => Literal::Uuid(*uuid::Uuid::parse_str(s).ok()?.as_bytes()),
            N::Blob => {
                let hex = s.strip_prefix("0x")?;
                if hex.len() % 2 != 0 {
                    return None;
                }
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()?;
                Literal::Blob(bytes)
            }
            N::Boolean => match s.to_ascii_lowercase().as_str() {
                "true" => Literal::Bool(true),
                "false" => Literal::Bool(false),
                _ => return None,
            },
            N::Tinyint | N::Smallint | N::Int | N::Bigint | N::Varint | N::Counter => {
                Literal::Integer(s.to_string())
            }
            N::Float | N::Double | N::Decimal => Literal::Float(s.to_string()),
            N::Duration => Literal::Duration(s.to_string()),
            _ => Literal::String(s.to_string()),
        };
        Some(Term::Literal(lit))
    }
}
