//! SELECT execution: partition reads, scans, filtering, projection, aggregates and paging.

use crate::analyze::{Filter, FilterRhs, SelItem, SelectPlan, Val};
use crate::catalog::{invalid, ColumnKind, TableDef};
use crate::codec;
use crate::exec::{self, Binder, R};
use crate::paging::{PagingState, Position};
use crate::result::RowsBuilder;
use crate::{system, Engine, Prepared, RequestContext};
use bytes::Bytes;
use sluice_cql::ast::Operator;
use sluice_protocol::{DetailedError, QueryParameters, ResultMessage};
use sluice_storage::{ClusteringSlice, ReadCell, ReadRow, ScanStart};
use sluice_types::CqlType;
use std::cmp::Ordering;
use std::ops::Bound;

/// Rows read from storage per call when filtering (rows may be dropped, so read ahead).
const CHUNK: usize = 1000;

/// Rows a paged read may examine before it returns a short page (bounds one request's work).
const MAX_EXAMINED_PER_PAGE: usize = 20_000;

/// Rows an aggregate or unpaged read examines between two yields of the shard's event loop
/// (and deadline checks): one storage call's worth, a fraction of a millisecond.
const SLICE_EXAMINED: usize = CHUNK;

/// The largest result of an unpaged read (a protocol v4 frame body is at most 256 MB): a
/// bigger one answers an error rather than a silently short result or unbounded memory.
const MAX_UNPAGED_RESULT_BYTES: usize = if cfg!(test) { 1 << 20 } else { 256 << 20 };

/// Result bytes after which a client page ends (with a paging state) whatever its fetch
/// size, as ScyllaDB cuts pages by size: a page of big rows stays bounded in memory and
/// well under the frame limit. A page holds at least one row.
pub(crate) const MAX_PAGE_BYTES: usize = if cfg!(test) { 1 << 20 } else { 8 << 20 };

/// The error of an unpaged result past [`MAX_UNPAGED_RESULT_BYTES`].
const UNPAGED_TOO_LARGE: &str = "The result of this unpaged query is larger than a response frame may be; page it (set a fetch size)";

/// A filter with its values resolved.
pub(crate) struct ResolvedFilter {
    col: usize,
    op: Operator,
    vals: Vec<Bytes>,
}

impl ResolvedFilter {
    /// The filtered column.
    pub(crate) fn col(&self) -> usize {
        self.col
    }
}

/// Resolves filter values once per request.
pub(crate) fn resolve_filters(
    b: &Binder,
    filters: &[Filter],
) -> Result<Vec<ResolvedFilter>, DetailedError> {
    let mut out = Vec::with_capacity(filters.len());
    for f in filters {
        let vals = match &f.rhs {
            FilterRhs::Val(v) => match b.get(v) {
                R::V(x) => vec![x],
                R::Null => Vec::new(),
                R::Unset => return Err(invalid("Invalid unset value in a WHERE or IF clause")),
            },
            FilterRhs::List(vs) => {
                let mut out = Vec::with_capacity(vs.len());
                for v in vs {
                    if let R::V(x) = b.get(v) {
                        out.push(x);
                    }
                }
                out
            }
            FilterRhs::InBind(i) => match b.get(&Val::Bind(*i)) {
                R::V(list) => {
                    codec::split_collection(&list).ok_or_else(|| invalid("Invalid IN list"))?
                }
                _ => return Err(invalid("Invalid null or unset IN list")),
            },
        };
        out.push(ResolvedFilter {
            col: f.col,
            op: f.op,
            vals,
        });
    }
    Ok(out)
}

/// Evaluates one filter on a column value.
pub(crate) fn filter_matches(
    t: &TableDef,
    f: &ResolvedFilter,
    value: Option<&Bytes>,
) -> Result<bool, DetailedError> {
    let ty = &t.columns[f.col].ty;
    let Some(value) = value else {
        // A null matches `= null` (a null term resolves to no values) and nothing else.
        return Ok(f.op == Operator::Eq && f.vals.is_empty());
    };
    let cmp = |x: &Bytes| sluice_types::compare(ty, value, x);
    Ok(match f.op {
        Operator::Eq => f.vals.first().is_some_and(|x| cmp(x) == Ordering::Equal),
        Operator::Neq => f.vals.first().is_some_and(|x| cmp(x) != Ordering::Equal),
        Operator::Lt => f.vals.first().is_some_and(|x| cmp(x) == Ordering::Less),
        Operator::Le => f.vals.first().is_some_and(|x| cmp(x) != Ordering::Greater),
        Operator::Gt => f.vals.first().is_some_and(|x| cmp(x) == Ordering::Greater),
        Operator::Ge => f.vals.first().is_some_and(|x| cmp(x) != Ordering::Less),
        Operator::In => f.vals.iter().any(|x| cmp(x) == Ordering::Equal),
        Operator::Contains | Operator::ContainsKey => {
            let Some(x) = f.vals.first() else {
                return Ok(false);
            };
            match (ty.unfrozen(), f.op) {
                (CqlType::List(e) | CqlType::Set(e), Operator::Contains) => {
                    codec::split_collection(value)
                        .unwrap_or_default()
                        .iter()
                        .any(|v| sluice_types::compare(e, v, x) == Ordering::Equal)
                }
                (CqlType::Map(_, vt), Operator::Contains) => codec::split_map(value)
                    .unwrap_or_default()
                    .iter()
                    .any(|(_, v)| sluice_types::compare(vt, v, x) == Ordering::Equal),
                (CqlType::Map(kt, _), Operator::ContainsKey) => codec::split_map(value)
                    .unwrap_or_default()
                    .iter()
                    .any(|(k, _)| sluice_types::compare(kt, k, x) == Ordering::Equal),
                _ => false,
            }
        }
        Operator::Like => return Err(invalid("LIKE restrictions are not supported")),
    })
}

/// A row as the projection sees it.
pub(crate) trait RowSource {
    /// The value of a column (collections assembled), None for null.
    fn value(&self, t: &TableDef, col: usize) -> Option<Bytes>;
    /// The cell of a single-cell column, for writetime()/ttl().
    fn cell(&self, t: &TableDef, col: usize) -> Option<&ReadCell>;
    /// The partition token.
    fn token(&self) -> i64;
}

/// A row read from storage.
pub(crate) struct StoredRow<'a> {
    /// Partition key components.
    pub pk: &'a [Bytes],
    /// The row (None for a static-only row).
    pub row: Option<&'a ReadRow>,
    /// The static row.
    pub stat: Option<&'a ReadRow>,
    /// Token.
    pub token: i64,
}

fn cells_of(row: &ReadRow, id: u16) -> impl Iterator<Item = &ReadCell> {
    let start = row.cells.partition_point(|c| c.column < id);
    row.cells[start..]
        .iter()
        .take_while(move |c| c.column == id)
}

/// Assembles the value of a column from its cells.
pub(crate) fn column_value(ty: &CqlType, row: &ReadRow, id: u16) -> Option<Bytes> {
    if ty.is_multi_cell_collection() {
        let mut cells: Vec<&ReadCell> = cells_of(row, id).filter(|c| c.path.is_some()).collect();
        if cells.is_empty() {
            return None;
        }
        // Storage orders element cells by the raw bytes of their path; CQL orders set
        // elements and map keys by their type (e.g. -1 before 1 for int). List paths are
        // built order-preserving by the writer, so lists keep storage order.
        let key_type = match ty {
            CqlType::Set(e) => Some(e.as_ref()),
            CqlType::Map(k, _) => Some(k.as_ref()),
            _ => None,
        };
        if let Some(kt) = key_type {
            cells.sort_by(|a, b| match (a.path.as_deref(), b.path.as_deref()) {
                (Some(x), Some(y)) => sluice_types::compare(kt, x, y),
                _ => Ordering::Equal,
            });
        }
        return Some(match ty {
            CqlType::Set(_) => codec::collection(cells.iter().filter_map(|c| c.path.as_deref())),
            CqlType::List(_) => codec::collection(cells.iter().map(|c| c.value.as_ref())),
            _ => codec::map(
                cells
                    .iter()
                    .filter_map(|c| Some((c.path.as_deref()?, c.value.as_ref()))),
            ),
        });
    }
    cells_of(row, id)
        .find(|c| c.path.is_none())
        .map(|c| c.value.clone())
}

impl RowSource for StoredRow<'_> {
    fn value(&self, t: &TableDef, col: usize) -> Option<Bytes> {
        let c = &t.columns[col];
        match c.kind {
            ColumnKind::PartitionKey => self.pk.get(c.position as usize).cloned(),
            ColumnKind::Clustering => self.row?.clustering.get(c.position as usize).cloned(),
            ColumnKind::Static => column_value(&c.ty, self.stat?, c.id),
            ColumnKind::Regular => column_value(&c.ty, self.row?, c.id),
        }
    }

    fn cell(&self, t: &TableDef, col: usize) -> Option<&ReadCell> {
        let c = &t.columns[col];
        let row = match c.kind {
            ColumnKind::Static => self.stat?,
            ColumnKind::Regular => self.row?,
            _ => return None,
        };
        cells_of(row, c.id).find(|x| x.path.is_none())
    }

    fn token(&self) -> i64 {
        self.token
    }
}

struct SysRow<'a>(&'a [Option<Bytes>]);

impl RowSource for SysRow<'_> {
    fn value(&self, _t: &TableDef, col: usize) -> Option<Bytes> {
        self.0.get(col).cloned().flatten()
    }
    fn cell(&self, _t: &TableDef, _col: usize) -> Option<&ReadCell> {
        None
    }
    fn token(&self) -> i64 {
        0
    }
}

/// Aggregation state.
struct Agg {
    count: i64,
    per_item: Vec<Option<Bytes>>,
    counts: Vec<i64>,
    /// Per item: integer and floating sums (`sum`/`avg`); `counts` holds the value count.
    sums: Vec<(i128, FloatSum)>,
    first: bool,
    /// GROUP BY columns, and the key of the group being aggregated.
    group_by: Vec<usize>,
    group: Option<Vec<Option<Bytes>>>,
}

impl Agg {
    fn new(n: usize, group_by: &[usize]) -> Agg {
        Agg {
            count: 0,
            per_item: vec![None; n],
            counts: vec![0; n],
            sums: vec![(0, FloatSum::default()); n],
            first: true,
            group_by: group_by.to_vec(),
            group: None,
        }
    }
}

/// A float or double sum in `f64` with Kahan's compensation, computed as Cassandra's
/// `FloatSumAggregate` does so that sums over many rows agree to the last digit.
#[derive(Debug, Clone, Copy, Default)]
struct FloatSum {
    sum: f64,
    compensation: f64,
    /// The plain sum, which is the answer when infinities of one sign make the other NaN.
    simple: f64,
}

impl FloatSum {
    fn add(&mut self, x: f64) {
        self.simple += x;
        let tmp = x - self.compensation;
        let rounded = self.sum + tmp;
        self.compensation = (rounded - self.sum) - tmp;
        self.sum = rounded;
    }

    /// The sum. Cassandra adds the compensation back rather than subtracting it; the same
    /// is done here, since the point is its answer.
    fn total(&self) -> f64 {
        let t = self.sum + self.compensation;
        if t.is_nan() && self.simple.is_infinite() {
            self.simple
        } else {
            t
        }
    }
}

/// Collects output rows under page and limit budgets.
struct Out<'a> {
    t: &'a TableDef,
    items: &'a [SelItem],
    rows: RowsBuilder,
    agg: Option<Agg>,
    now_secs: u32,
    filters: &'a [ResolvedFilter],
    /// LIMIT of a GROUP BY query (in groups).
    group_limit: Option<usize>,
    /// PER PARTITION LIMIT of a GROUP BY query, which counts groups (as in Cassandra).
    group_ppl: Option<usize>,
    /// The partition key of the last group begun, and how many groups began in it.
    group_partition: Option<Vec<Option<Bytes>>>,
    partition_groups: usize,
    /// SELECT JSON column names and types.
    json: Option<&'a [(String, CqlType)]>,
}

impl<'a> Out<'a> {
    fn new(
        t: &'a TableDef,
        items: &'a [SelItem],
        aggregate: bool,
        group_by: &[usize],
        filters: &'a [ResolvedFilter],
        now_secs: u32,
    ) -> Self {
        Out {
            t,
            items,
            rows: RowsBuilder::new(items.len()),
            agg: aggregate.then(|| Agg::new(items.len(), group_by)),
            now_secs,
            filters,
            group_limit: None,
            group_ppl: None,
            group_partition: None,
            partition_groups: 0,
            json: None,
        }
    }

    /// True when a GROUP BY query has all the groups its LIMIT lets it return.
    fn groups_full(&self) -> bool {
        self.group_limit.is_some_and(|l| self.rows.len() >= l)
    }

    /// Counts a new group against a GROUP BY query's PER PARTITION LIMIT; false when its
    /// partition already has all its groups (its rows are then skipped).
    fn admit_group(&mut self, r: &dyn RowSource) -> bool {
        let Some(limit) = self.group_ppl else {
            return true;
        };
        let t = self.t;
        let partition: Vec<Option<Bytes>> =
            t.partition_key.iter().map(|&c| r.value(t, c)).collect();
        if self.group_partition.as_ref() != Some(&partition) {
            self.group_partition = Some(partition);
            self.partition_groups = 0;
        }
        if self.partition_groups >= limit {
            return false;
        }
        self.partition_groups += 1;
        true
    }

    /// Checks the filters.
    fn passes(&self, r: &dyn RowSource) -> Result<bool, DetailedError> {
        for f in self.filters {
            if !filter_matches(self.t, f, r.value(self.t, f.col).as_ref())? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Projects and appends one row (or folds it into the aggregate).
    fn emit(&mut self, r: &dyn RowSource) {
        let t = self.t;
        if let Some(agg) = &self.agg {
            if !agg.group_by.is_empty() {
                let key: Vec<Option<Bytes>> = agg.group_by.iter().map(|&c| r.value(t, c)).collect();
                let had_group = agg.group.is_some();
                if agg.group.as_ref() != Some(&key) {
                    if !self.admit_group(r) {
                        return;
                    }
                    if had_group {
                        self.flush_group();
                    }
                }
                if let Some(agg) = &mut self.agg {
                    agg.group = Some(key);
                }
            }
        }
        if let Some(agg) = &mut self.agg {
            agg.count += 1;
            for (i, item) in self.items.iter().enumerate() {
                match item {
                    SelItem::Count(c) => {
                        if r.value(t, *c).is_some() {
                            agg.counts[i] += 1;
                        }
                    }
                    SelItem::Max(c) | SelItem::Min(c) => {
                        if let Some(v) = r.value(t, *c) {
                            let ty = &t.columns[*c].ty;
                            let better = match &agg.per_item[i] {
                                None => true,
                                Some(cur) => {
                                    let o = sluice_types::compare(ty, &v, cur);
                                    if matches!(item, SelItem::Max(_)) {
                                        o == Ordering::Greater
                                    } else {
                                        o == Ordering::Less
                                    }
                                }
                            };
                            if better {
                                agg.per_item[i] = Some(v);
                            }
                        }
                    }
                    SelItem::Sum(c) | SelItem::Avg(c) => {
                        if let Some(v) = r.value(t, *c) {
                            let (si, sf) = &mut agg.sums[i];
                            let ty = &t.columns[*c].ty;
                            let num = numeric_float(ty, &v).map_or_else(|| numeric(&v), Num::Float);
                            match num {
                                Num::Int(x) => *si += x as i128,
                                Num::Float(x) => sf.add(x),
                                Num::None => continue,
                            }
                            agg.counts[i] += 1;
                        }
                    }
                    SelItem::CountAll => {}
                    other => {
                        if agg.first {
                            agg.per_item[i] = scalar(t, other, r, self.now_secs);
                        }
                    }
                }
            }
            agg.first = false;
            return;
        }
        if self.json.is_some() {
            let cells: Vec<Option<Bytes>> = self
                .items
                .iter()
                .map(|i| scalar(t, i, r, self.now_secs))
                .collect();
            self.push_row(&cells);
            return;
        }
        for item in self.items {
            let v = scalar(t, item, r, self.now_secs);
            self.rows.cell(v.as_deref());
        }
    }

    /// Appends a projected row (as one JSON cell for SELECT JSON).
    fn push_row(&mut self, cells: &[Option<Bytes>]) {
        match self.json {
            Some(cols) => {
                let text = crate::json::row_json(cols, cells);
                self.rows.cell(Some(text.as_bytes()));
            }
            None => {
                for c in cells {
                    self.rows.cell(c.as_deref());
                }
            }
        }
    }

    /// Writes the current group's row and starts the next group.
    fn flush_group(&mut self) {
        let Some(agg) = self.agg.take() else { return };
        let group_by = agg.group_by.clone();
        self.agg = Some(agg);
        self.finish_aggregate();
        self.agg = Some(Agg::new(self.items.len(), &group_by));
    }

    fn finish_aggregate(&mut self) {
        if let Some(agg) = self.agg.take() {
            let mut cells = Vec::with_capacity(self.items.len());
            if !agg.group_by.is_empty() && agg.count == 0 {
                // GROUP BY over no rows yields no rows.
                return;
            }
            if self.groups_full() {
                // LIMIT counts groups.
                return;
            }
            for (i, item) in self.items.iter().enumerate() {
                let v = match item {
                    SelItem::CountAll => Some(codec::bigint(agg.count)),
                    SelItem::Count(_) => Some(codec::bigint(agg.counts[i])),
                    SelItem::Sum(c) | SelItem::Avg(c) => {
                        let (si, sf) = (agg.sums[i].0, agg.sums[i].1.total());
                        let n = agg.counts[i].max(1);
                        let avg = matches!(item, SelItem::Avg(_));
                        let (si, sf) = if avg {
                            (si / n as i128, sf / n as f64)
                        } else {
                            (si, sf)
                        };
                        Some(encode_numeric(&self.t.columns[*c].ty, si, sf))
                    }
                    _ => agg.per_item[i].clone(),
                };
                cells.push(v);
            }
            self.push_row(&cells);
        }
    }
}

fn scalar(t: &TableDef, item: &SelItem, r: &dyn RowSource, now_secs: u32) -> Option<Bytes> {
    match item {
        SelItem::Col(c) => r.value(t, *c),
        SelItem::WriteTime(c) => r.cell(t, *c).map(|x| codec::bigint(x.timestamp)),
        SelItem::Ttl(c) => r
            .cell(t, *c)
            .and_then(|x| x.expiry)
            .map(|(exp, _)| codec::int(exp.saturating_sub(now_secs) as i32)),
        SelItem::Token => Some(codec::bigint(r.token())),
        SelItem::CountAll
        | SelItem::Count(_)
        | SelItem::Max(_)
        | SelItem::Min(_)
        | SelItem::Sum(_)
        | SelItem::Avg(_) => None,
    }
}

/// A numeric cell, decoded by width (the analyser only admits numeric columns).
enum Num {
    Int(i64),
    Float(f64),
    None,
}

fn numeric(v: &[u8]) -> Num {
    match v.len() {
        1 => Num::Int(v[0] as i8 as i64),
        2 => Num::Int(i16::from_be_bytes([v[0], v[1]]) as i64),
        4 => Num::Int(i32::from_be_bytes([v[0], v[1], v[2], v[3]]) as i64),
        8 => Num::Int(i64::from_be_bytes([
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
        ])),
        _ => Num::None,
    }
}

fn numeric_float(ty: &CqlType, v: &[u8]) -> Option<f64> {
    match ty {
        CqlType::Native(sluice_types::NativeType::Float) => {
            Some(f32::from_be_bytes(v.try_into().ok()?) as f64)
        }
        CqlType::Native(sluice_types::NativeType::Double) => {
            Some(f64::from_be_bytes(v.try_into().ok()?))
        }
        _ => None,
    }
}

/// Encodes a sum or average in the column's type (integers wrap as Cassandra's do).
fn encode_numeric(ty: &CqlType, i: i128, f: f64) -> Bytes {
    use sluice_types::NativeType as N;
    match ty {
        CqlType::Native(N::Tinyint) => Bytes::copy_from_slice(&(i as i8).to_be_bytes()),
        CqlType::Native(N::Smallint) => Bytes::copy_from_slice(&(i as i16).to_be_bytes()),
        CqlType::Native(N::Int) => Bytes::copy_from_slice(&(i as i32).to_be_bytes()),
        CqlType::Native(N::Float) => Bytes::copy_from_slice(&(f as f32).to_be_bytes()),
        CqlType::Native(N::Double) => codec::double(f),
        _ => codec::bigint(i as i64),
    }
}

/// Remaining budgets of one request.
struct Budget {
    page_left: usize,
    /// Result bytes after which the page is full ([`MAX_PAGE_BYTES`] for a client page,
    /// [`MAX_UNPAGED_RESULT_BYTES`] for an internal one).
    page_bytes_cap: usize,
    /// Result bytes so far, as of the last [`Budget::take`].
    page_bytes: usize,
    limit_left: Option<usize>,
    /// Rows one read call may examine before it returns where to resume: a client page
    /// ends there (short, with a paging state), an internally paged read goes on.
    examine_cap: usize,
    /// The request's deadline, checked before every storage call: a long scan whose
    /// client has given up stops instead of burning CPU.
    deadline: Option<std::time::Instant>,
    consistency: sluice_protocol::Consistency,
}

impl Budget {
    fn check_deadline(&self) -> Result<(), DetailedError> {
        if exec::expired(self.deadline) {
            return Err(exec::read_timeout(self.consistency));
        }
        Ok(())
    }

    /// Counts one row emitted; `result_bytes` is the result's size with it.
    fn take(&mut self, result_bytes: usize) {
        self.page_bytes = result_bytes;
        self.page_left = self.page_left.saturating_sub(1);
        if let Some(l) = &mut self.limit_left {
            *l = l.saturating_sub(1);
        }
    }
    fn limit_done(&self) -> bool {
        self.limit_left == Some(0)
    }
    fn full(&self) -> bool {
        self.page_left == 0 || self.page_bytes >= self.page_bytes_cap || self.limit_done()
    }
    fn want(&self, ppl_left: Option<usize>, filtering: bool) -> usize {
        if filtering {
            return CHUNK;
        }
        let mut w = self.page_left.min(CHUNK);
        if let Some(l) = self.limit_left {
            w = w.min(l);
        }
        if let Some(p) = ppl_left {
            w = w.min(p);
        }
        w.max(1)
    }
}

fn stmt_hash(p: &Prepared) -> u64 {
    u64::from_be_bytes([
        p.id[0], p.id[1], p.id[2], p.id[3], p.id[4], p.id[5], p.id[6], p.id[7],
    ])
}

/// Executes a SELECT. A SERIAL or LOCAL_SERIAL one answers only once what it read is
/// durable (a plain read may show writes not yet acknowledged, as Cassandra's can).
pub(crate) async fn execute_select(
    engine: &Engine,
    p: &Prepared,
    s: &SelectPlan,
    b: &Binder<'_>,
    params: &QueryParameters,
    ctx: &RequestContext,
) -> Result<ResultMessage, DetailedError> {
    let result = select_applied(engine, p, s, b, params, ctx).await?;
    let serial = matches!(
        params.consistency,
        sluice_protocol::Consistency::Serial | sluice_protocol::Consistency::LocalSerial
    );
    if serial && !s.table.is_virtual() {
        // One partition: only its store's journal matters.
        let token = match s.where_.pk_complete() {
            true => match exec::partition_keys(b, &s.table, &s.where_)?.as_slice() {
                [pk] => Some(pk.token),
                _ => None,
            },
            false => None,
        };
        crate::write::wait_seen_durable(engine, token, ctx.deadline, || {
            exec::read_timeout(params.consistency)
        })
        .await?;
    }
    Ok(result)
}

/// Executes a SELECT on the applied state.
async fn select_applied(
    engine: &Engine,
    p: &Prepared,
    s: &SelectPlan,
    b: &Binder<'_>,
    params: &QueryParameters,
    ctx: &RequestContext,
) -> Result<ResultMessage, DetailedError> {
    let t = &*s.table;
    let limit = exec::positive_limit(b, &s.limit, "[limit]")?;
    let mut ppl = exec::positive_limit(b, &s.per_partition_limit, "[per_partition_limit]")?;
    if s.distinct {
        ppl = Some(1);
    }
    let page_size = params
        .page_size
        .filter(|&n| n > 0 && !s.aggregate)
        .map(|n| n as usize);
    let hash = stmt_hash(p);
    let state = match &params.paging_state {
        Some(bytes) if page_size.is_some() => Some(PagingState::decode(bytes, hash)?),
        _ => None,
    };
    let filters = resolve_filters(b, &s.where_.filters)?;
    let now_secs = (ctx.now_micros.max(0) / 1_000_000) as u32;
    let mut out = Out::new(t, &s.items, s.aggregate, &s.group_by, &filters, now_secs);
    if let Some(cols) = &s.json {
        out.json = Some(cols);
        out.rows = RowsBuilder::new(1);
    }
    // An aggregate or unpaged read pages internally over every row; a client page is bounded.
    let internal = page_size.is_none();
    let mut budget = Budget {
        page_left: page_size.unwrap_or(usize::MAX),
        // An unpaged result stops growing at its bound and answers the error below.
        page_bytes_cap: if internal {
            MAX_UNPAGED_RESULT_BYTES
        } else {
            MAX_PAGE_BYTES
        },
        page_bytes: 0,
        limit_left: match &state {
            Some(st) => st.limit_left.map(|l| l as usize),
            None => limit,
        },
        examine_cap: if internal {
            SLICE_EXAMINED
        } else {
            MAX_EXAMINED_PER_PAGE
        },
        deadline: ctx.deadline,
        consistency: params.consistency,
    };
    if s.aggregate {
        budget.limit_left = None;
        if !s.group_by.is_empty() {
            out.group_limit = limit;
            if !s.distinct {
                // PER PARTITION LIMIT counts groups here, not rows.
                out.group_ppl = ppl.take();
            }
        }
    }
    if exec::expired(ctx.deadline) {
        return Err(exec::read_timeout(params.consistency));
    }
    let next = if t.is_virtual() {
        let schema = engine.schema();
        let rows = if t.system == Some(system::SystemTable::TokenReplicas) {
            token_replica_rows(engine, t, &filters, &schema)?
        } else {
            system::rows(
                t,
                &schema,
                engine.node(),
                &engine.ring(),
                &engine.auth().data(),
                &|peer| engine.peer_schema_version(peer),
            )
        };
        let skip = match state.as_ref().map(|s| &s.pos) {
            Some(Position::Offset(n)) => *n as usize,
            Some(_) => return Err(invalid("Invalid paging state")),
            None => 0,
        };
        let mut next = None;
        for (i, r) in rows.iter().enumerate().skip(skip) {
            let src = SysRow(r);
            if !out.passes(&src)? {
                continue;
            }
            out.emit(&src);
            budget.take(out.rows.body_bytes());
            let seen = i + 1;
            if budget.limit_done() {
                break;
            }
            if budget.full() {
                if seen < rows.len() {
                    next = Some(Position::Offset(seen as u32));
                }
                break;
            }
        }
        next
    } else if s.where_.pk_complete() && s.ordered && !s.aggregate && {
        exec::partition_keys(b, t, &s.where_)?.len() > 1
    } {
        if page_size.is_some() {
            return Err(invalid("Cannot page queries with both ORDER BY and a IN restriction on the partition key; you must either remove the ORDER BY or the IN and sort client side, or disable paging for this query"));
        }
        let level = (budget.consistency, budget.deadline);
        Box::pin(read_in_ordered(
            engine, s, b, &mut out, limit, ppl, now_secs, level,
        ))
        .await?;
        None
    } else {
        let mut resume = state;
        loop {
            let pos = if s.where_.pk_complete() {
                // Boxed: a partition read's future stays as small as it was.
                Box::pin(read_partitions(
                    engine,
                    s,
                    b,
                    &mut out,
                    &mut budget,
                    ppl,
                    resume.as_ref(),
                    now_secs,
                ))
                .await?
            } else {
                // Boxed: a partition read's future stays as small as it was.
                Box::pin(scan(
                    engine,
                    s,
                    b,
                    &mut out,
                    &mut budget,
                    ppl,
                    resume.as_ref(),
                    now_secs,
                ))
                .await?
            };
            match pos {
                // An internal read never ends at a slice: it lets the shard run its other
                // tasks, then goes on (or times out, never answering a partial result).
                Some(pos) if internal && !budget.limit_done() && !out.groups_full() => {
                    if out.rows.body_bytes() >= MAX_UNPAGED_RESULT_BYTES {
                        return Err(invalid(UNPAGED_TOO_LARGE));
                    }
                    tokio::task::yield_now().await;
                    budget.check_deadline()?;
                    debug_assert!(
                        resume.as_ref().is_none_or(|r| r.pos != pos),
                        "a slice made no progress"
                    );
                    resume = Some(PagingState {
                        stmt: hash,
                        limit_left: None,
                        pos,
                    });
                }
                pos => {
                    // Also when the bound was reached on the very last row.
                    if internal && out.rows.body_bytes() >= MAX_UNPAGED_RESULT_BYTES {
                        return Err(invalid(UNPAGED_TOO_LARGE));
                    }
                    break pos;
                }
            }
        }
    };
    out.finish_aggregate();
    let paging_state = match next {
        Some(pos) if page_size.is_some() && !budget.limit_done() => Some(
            PagingState {
                stmt: hash,
                limit_left: budget.limit_left.map(|l| l as u32),
                pos,
            }
            .encode(),
        ),
        _ => None,
    };
    let rows = out
        .rows
        .finish(p.result_columns.clone(), paging_state, params.skip_metadata);
    Ok(ResultMessage::Rows(rows))
}

/// `pk IN (...) ORDER BY ck`: reads every partition, then merges rows in clustering
/// order (unpaged only, as in Cassandra).
#[allow(clippy::too_many_arguments)]
async fn read_in_ordered(
    engine: &Engine,
    s: &SelectPlan,
    b: &Binder<'_>,
    out: &mut Out<'_>,
    limit: Option<usize>,
    ppl: Option<usize>,
    now_secs: u32,
    level: (sluice_protocol::Consistency, Option<std::time::Instant>),
) -> Result<(), DetailedError> {
    let t = &*s.table;
    let keys = exec::partition_keys(b, t, &s.where_)?;
    let ranges = exec::clustering_ranges(b, t, &s.where_)?;
    if ranges.is_empty() {
        return Ok(());
    }
    let slice = ClusteringSlice {
        ranges,
        reversed: s.reversed,
    };
    let mut all: Vec<(Vec<Bytes>, Vec<Option<Bytes>>)> = Vec::new();
    // The rows are sorted before any is returned, so they are bounded like an unpaged result.
    let mut held_bytes = 0usize;
    for pk in &keys {
        let mut ppl_left = ppl;
        let mut after: Option<Vec<Bytes>> = None;
        loop {
            // A partition this node does not hold is read on one of its replicas.
            let read = crate::remote_read::read_partition_slice(
                engine,
                t,
                (pk.token, &pk.key),
                &slice,
                after.as_deref(),
                CHUNK,
                now_secs,
                level,
            )
            .await?;
            for row in &read.rows {
                after = Some(row.clustering.clone());
                if ppl_left == Some(0) {
                    break;
                }
                let src = StoredRow {
                    pk: &pk.components,
                    row: Some(row),
                    stat: read.static_row.as_ref(),
                    token: pk.token,
                };
                if !out.passes(&src)? {
                    continue;
                }
                let cells: Vec<Option<Bytes>> = out
                    .items
                    .iter()
                    .map(|i| scalar(t, i, &src, now_secs))
                    .collect();
                held_bytes += cells.iter().flatten().map(Bytes::len).sum::<usize>();
                if held_bytes > MAX_UNPAGED_RESULT_BYTES {
                    return Err(invalid(UNPAGED_TOO_LARGE));
                }
                all.push((row.clustering.clone(), cells));
                if let Some(p) = &mut ppl_left {
                    *p -= 1;
                }
            }
            if !read.more || ppl_left == Some(0) {
                break;
            }
        }
    }
    // A stable sort keeps partition order among equal clustering keys.
    all.sort_by(|x, y| {
        let o = exec::compare_clustering(t, &x.0, &y.0);
        if s.reversed {
            o.reverse()
        } else {
            o
        }
    });
    for (_, cells) in all.iter().take(limit.unwrap_or(usize::MAX)) {
        out.push_row(cells);
    }
    Ok(())
}

/// Most (keyspace, token) pairs one `system_views.token_replicas` read may ask for.
const MAX_TOKEN_REPLICA_KEYS: usize = 1024;

/// `system_views.token_replicas` rows for the keys the statement asks for: the table has a
/// row for every (keyspace, token) pair, so it is read only with `keyspace_name` and
/// `token_value` given by `=` or `IN`.
fn token_replica_rows(
    engine: &Engine,
    t: &TableDef,
    filters: &[ResolvedFilter],
    schema: &crate::catalog::Schema,
) -> Result<Vec<system::SystemRow>, DetailedError> {
    const NEEDS_KEYS: &str = "system_views.token_replicas is read by key: \
        WHERE keyspace_name = ? AND token_value = ? (or IN)";
    let values = |column: &str| {
        filters
            .iter()
            .find(|f| {
                t.columns[f.col].name == column && matches!(f.op, Operator::Eq | Operator::In)
            })
            .map(|f| f.vals.as_slice())
    };
    let (Some(keyspaces), Some(tokens)) = (values("keyspace_name"), values("token_value")) else {
        return Err(invalid(NEEDS_KEYS));
    };
    if keyspaces.len().saturating_mul(tokens.len()) > MAX_TOKEN_REPLICA_KEYS {
        return Err(invalid(
            "system_views.token_replicas: at most 1024 (keyspace, token) pairs per read",
        ));
    }
    let mut keys = Vec::with_capacity(keyspaces.len() * tokens.len());
    for ks in keyspaces {
        let ks = std::str::from_utf8(ks).map_err(|_| invalid("keyspace_name is not UTF-8"))?;
        for token in tokens {
            let token =
                codec::as_i64(token).ok_or_else(|| invalid("token_value is not a bigint"))?;
            keys.push((ks, token));
        }
    }
    Ok(system::token_replica_rows(
        t,
        schema,
        engine.node(),
        &engine.ring(),
        &keys,
    ))
}

/// Whether a partition with no rows yields its static row alone.
fn static_only_allowed(s: &SelectPlan) -> bool {
    s.table.has_statics() && !s.where_.restricts_clustering()
}

#[allow(clippy::too_many_arguments)]
async fn read_partitions(
    engine: &Engine,
    s: &SelectPlan,
    b: &Binder<'_>,
    out: &mut Out<'_>,
    budget: &mut Budget,
    ppl: Option<usize>,
    state: Option<&PagingState>,
    now_secs: u32,
) -> Result<Option<Position>, DetailedError> {
    let t = &*s.table;
    let keys = exec::partition_keys(b, t, &s.where_)?;
    let ranges = exec::clustering_ranges(b, t, &s.where_)?;
    if ranges.is_empty() {
        return Ok(None);
    }
    let slice = ClusteringSlice {
        ranges,
        reversed: s.reversed,
    };
    let (start, mut after, mut resume_ppl) = match state.map(|s| &s.pos) {
        Some(Position::Partition {
            index,
            after,
            ppl_left,
        }) => (*index as usize, after.clone(), ppl_left.map(|p| p as usize)),
        Some(_) => return Err(invalid("Invalid paging state")),
        None => (0, None, None),
    };
    let filtering = !out.filters.is_empty();
    let no_clustering = t.clustering.is_empty();
    let mut examined = 0usize;
    for (idx, pk) in keys.iter().enumerate().skip(start) {
        let mut ppl_left = resume_ppl.take().or(ppl);
        let mut after_here = after.take();
        loop {
            budget.check_deadline()?;
            let want = budget.want(ppl_left, filtering);
            // A partition this node does not hold is read on one of its replicas.
            let read = crate::remote_read::read_partition_slice(
                engine,
                t,
                (pk.token, &pk.key),
                &slice,
                after_here.as_deref(),
                want,
                now_secs,
                (budget.consistency, budget.deadline),
            )
            .await?;
            if after_here.is_none() && read.rows.is_empty() {
                if let (true, Some(st)) = (static_only_allowed(s), read.static_row.as_ref()) {
                    let src = StoredRow {
                        pk: &pk.components,
                        row: None,
                        stat: Some(st),
                        token: pk.token,
                    };
                    if out.passes(&src)? {
                        out.emit(&src);
                        budget.take(out.rows.body_bytes());
                    }
                }
                examined += 1;
                break;
            }
            let n = read.rows.len();
            for (ri, row) in read.rows.iter().enumerate() {
                after_here = Some(row.clustering.clone());
                let src = StoredRow {
                    pk: &pk.components,
                    row: Some(row),
                    stat: read.static_row.as_ref(),
                    token: pk.token,
                };
                if !out.passes(&src)? {
                    continue;
                }
                out.emit(&src);
                budget.take(out.rows.body_bytes());
                if let Some(p) = &mut ppl_left {
                    *p -= 1;
                }
                if budget.limit_done() {
                    return Ok(None);
                }
                let partition_done =
                    ppl_left == Some(0) || no_clustering || (ri + 1 == n && !read.more);
                if budget.full() {
                    if partition_done {
                        return Ok((idx + 1 < keys.len()).then_some(Position::Partition {
                            index: idx as u32 + 1,
                            after: None,
                            ppl_left: None,
                        }));
                    }
                    return Ok(Some(Position::Partition {
                        index: idx as u32,
                        after: after_here,
                        ppl_left: ppl_left.map(|p| p as u32),
                    }));
                }
                if ppl_left == Some(0) {
                    break;
                }
            }
            examined += n.max(1);
            if ppl_left == Some(0) || !read.more {
                break;
            }
            if examined >= budget.examine_cap {
                // The same bound on one call's work as a scan's, inside a big partition.
                return Ok(Some(Position::Partition {
                    index: idx as u32,
                    after: after_here,
                    ppl_left: ppl_left.map(|p| p as u32),
                }));
            }
        }
        if budget.full() || examined >= budget.examine_cap {
            return Ok((idx + 1 < keys.len()).then_some(Position::Partition {
                index: idx as u32 + 1,
                after: None,
                ppl_left: None,
            }));
        }
    }
    Ok(None)
}

fn token_bound(b: &Binder, v: &Option<(Val, bool)>) -> Result<Bound<i64>, DetailedError> {
    Ok(match v {
        None => Bound::Unbounded,
        Some((v, incl)) => match exec::opt_i64(b, v, "partition key token")? {
            None => return Err(invalid("Invalid null token")),
            Some(t) if *incl => Bound::Included(t),
            Some(t) => Bound::Excluded(t),
        },
    })
}

#[allow(clippy::too_many_arguments)]
async fn scan(
    engine: &Engine,
    s: &SelectPlan,
    b: &Binder<'_>,
    out: &mut Out<'_>,
    budget: &mut Budget,
    ppl: Option<usize>,
    state: Option<&PagingState>,
    now_secs: u32,
) -> Result<Option<Position>, DetailedError> {
    let t = &*s.table;
    let (lower, end) = match &s.where_.token {
        Some(tr) => (token_bound(b, &tr.lower)?, token_bound(b, &tr.upper)?),
        None => (Bound::Unbounded, Bound::Unbounded),
    };
    // The partition being continued across storage pages: (token, key, ppl left).
    let mut current: Option<(i64, Bytes, Option<usize>)> = None;
    let mut start = match state.map(|s| &s.pos) {
        None => ScanStart::Token(lower),
        Some(Position::ScanToken(bound)) => ScanStart::Token(*bound),
        Some(Position::ScanResume {
            token,
            key,
            after,
            ppl_left,
        }) => {
            current = Some((*token, key.clone(), ppl_left.map(|p| p as usize)));
            ScanStart::Resume {
                token: *token,
                partition_key: key.clone(),
                after: after.clone(),
            }
        }
        Some(_) => return Err(invalid("Invalid paging state")),
    };
    let filtering = !out.filters.is_empty();
    let no_clustering = t.clustering.is_empty();
    let pk_count = t.partition_key.len();
    let mut examined = 0usize;
    loop {
        let prev_start = start.clone();
        let resumed_inside = matches!(&start, ScanStart::Resume { after: Some(_), .. });
        budget.check_deadline()?;
        let want = budget.want(None, filtering);
        // The ring's ranges are read where they live: here, or on one of their replicas.
        let page = crate::remote_read::scan_page(
            engine,
            t,
            &start,
            end,
            want,
            now_secs,
            budget.consistency,
            budget.deadline,
        )
        .await?;
        let np = page.partitions.len();
        for (pi, part) in page.partitions.iter().enumerate() {
            let comps = codec::split_composite(&part.partition_key, pk_count)
                .ok_or_else(|| invalid("Stored partition key does not match the table's key"))?;
            let mut ppl_left = match &current {
                Some((tok, key, left)) if *tok == part.token && *key == part.partition_key => {
                    left.or(ppl)
                }
                _ => ppl,
            };
            current = None;
            // Only the partition the page resumed inside has shown its static row already; a
            // page that resumes after a partition's last row starts with the next partition.
            let first_in_resumed = pi == 0
                && resumed_inside
                && matches!(&start, ScanStart::Resume { token, partition_key, .. }
                    if *token == part.token && *partition_key == part.partition_key);
            if part.read.rows.is_empty() && !first_in_resumed {
                if let (true, Some(st)) = (static_only_allowed(s), part.read.static_row.as_ref()) {
                    let src = StoredRow {
                        pk: &comps,
                        row: None,
                        stat: Some(st),
                        token: part.token,
                    };
                    if out.passes(&src)? {
                        out.emit(&src);
                        budget.take(out.rows.body_bytes());
                        if budget.limit_done() {
                            return Ok(None);
                        }
                        if budget.full() {
                            return Ok(next_after_partition(&page, pi));
                        }
                    }
                }
                continue;
            }
            let n = part.read.rows.len();
            for (ri, row) in part.read.rows.iter().enumerate() {
                if ppl_left == Some(0) {
                    break;
                }
                let src = StoredRow {
                    pk: &comps,
                    row: Some(row),
                    stat: part.read.static_row.as_ref(),
                    token: part.token,
                };
                if !out.passes(&src)? {
                    continue;
                }
                out.emit(&src);
                budget.take(out.rows.body_bytes());
                if let Some(p) = &mut ppl_left {
                    *p -= 1;
                }
                if budget.limit_done() {
                    return Ok(None);
                }
                if budget.full() {
                    let partition_done = ppl_left == Some(0)
                        || no_clustering
                        || (ri + 1 == n && !part.read.more && !next_is_same(&page, part));
                    if partition_done {
                        return Ok(next_after_partition(&page, pi));
                    }
                    return Ok(Some(Position::ScanResume {
                        token: part.token,
                        key: part.partition_key.clone(),
                        after: Some(row.clustering.clone()),
                        ppl_left: ppl_left.map(|p| p as u32),
                    }));
                }
            }
            if pi + 1 == np {
                current = Some((part.token, part.partition_key.clone(), ppl_left));
            }
        }
        match page.next {
            None => return Ok(None),
            Some(next) => {
                // Skip the rest of a partition whose per-partition limit is used up.
                start = match (&next, &current) {
                    (
                        ScanStart::Resume {
                            token,
                            partition_key,
                            ..
                        },
                        Some((ct, ck, Some(0))),
                    ) if token == ct && partition_key == ck => {
                        ScanStart::Token(Bound::Excluded(*token))
                    }
                    _ => next,
                };
                if np == 0 && (start == ScanStart::Token(Bound::Unbounded) || start == prev_start) {
                    // Storage made no progress: stop rather than spin.
                    return Ok(None);
                }
                // A scan stops after examining a bounded number of rows and says where to
                // resume: a client gets a short (possibly empty) page with a paging state,
                // so that one request cannot scan a whole table; an internal read goes on.
                examined += page
                    .partitions
                    .iter()
                    .map(|p| p.read.rows.len().max(1))
                    .sum::<usize>();
                if examined >= budget.examine_cap {
                    return Ok(Some(match &start {
                        ScanStart::Token(b) => Position::ScanToken(*b),
                        ScanStart::Resume {
                            token,
                            partition_key,
                            after,
                        } => Position::ScanResume {
                            token: *token,
                            key: partition_key.clone(),
                            after: after.clone(),
                            ppl_left: match &current {
                                Some((t, k, left)) if t == token && k == partition_key => {
                                    left.map(|p| p as u32)
                                }
                                _ => None,
                            },
                        },
                    }));
                }
            }
        }
    }
}

fn next_is_same(page: &sluice_storage::ScanPage, part: &sluice_storage::ScannedPartition) -> bool {
    matches!(&page.next, Some(ScanStart::Resume { token, partition_key, after: Some(_) })
        if *token == part.token && *partition_key == part.partition_key)
}

/// The resume position after partition `pi` of a storage page is finished.
fn next_after_partition(page: &sluice_storage::ScanPage, pi: usize) -> Option<Position> {
    if let Some(nextp) = page.partitions.get(pi + 1) {
        if page
            .partitions
            .get(pi)
            .is_some_and(|p| p.token != nextp.token)
        {
            // From the next partition's token rather than resumed inside it: a resumed
            // partition does not show its static row alone, so a static-only one would vanish.
            return Some(Position::ScanToken(Bound::Included(nextp.token)));
        }
        return Some(Position::ScanResume {
            token: nextp.token,
            key: nextp.partition_key.clone(),
            after: None,
            ppl_left: None,
        });
    }
    match &page.next {
        None => None,
        Some(ScanStart::Token(b)) => Some(Position::ScanToken(*b)),
        Some(ScanStart::Resume {
            token,
            partition_key,
            after,
        }) => {
            let part = page.partitions.get(pi);
            if part.is_some_and(|p| p.token == *token && p.partition_key == *partition_key) {
                // The page ended inside the partition we just finished: skip past it.
                Some(Position::ScanToken(Bound::Excluded(*token)))
            } else {
                Some(Position::ScanResume {
                    token: *token,
                    key: partition_key.clone(),
                    after: after.clone(),
                    ppl_left: None,
                })
            }
        }
    }
}
