//! Shared execution helpers: binding values, computing partition keys and clustering
//! ranges, and the timeout / unprepared errors.

use crate::analyze::{CkSlice, PointRestr, Restr, TupleVal, Val, ValFn, Where, WritePlan};
use crate::catalog::{invalid, TableDef};
use crate::codec;
use crate::Prepared;
use bytes::Bytes;
use sluice_protocol::{
    BoundValues, Consistency, DbError, DetailedError, QueryParameters, Value, ValueRef, WriteType,
};
use sluice_storage::Order;
use sluice_types::CqlType;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::ops::Bound;
use std::time::Duration;

/// The most partitions or clustering points one statement may expand to.
pub(crate) const MAX_CARTESIAN: usize = 1000;

/// A resolved value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum R {
    /// A value.
    V(Bytes),
    /// null.
    Null,
    /// unset.
    Unset,
}

/// Resolves plan values against the request's bound values.
pub(crate) struct Binder<'a> {
    values: &'a [Value],
    now_micros: i64,
}

impl<'a> Binder<'a> {
    /// A binder over positional values.
    pub fn new(values: &'a [Value], now_micros: i64) -> Self {
        Binder { values, now_micros }
    }

    /// "Now" for this request.
    pub fn now_micros(&self) -> i64 {
        self.now_micros
    }

    /// The positional values this binder resolves markers against.
    pub fn values(&self) -> &'a [Value] {
        self.values
    }

    /// The same request (same "now") over other values.
    pub fn with_values<'v>(&self, values: &'v [Value]) -> Binder<'v> {
        Binder {
            values,
            now_micros: self.now_micros,
        }
    }

    /// The bytes of a constant or bound value, without copying: None for null, unset and
    /// values that must be computed (functions, composite literals).
    pub fn borrowed<'s>(&'s self, v: &'s Val) -> Option<&'s [u8]> {
        match v {
            Val::Const(Some(b)) => Some(b),
            Val::Bind(i) => match self.values.get(*i) {
                Some(Value::Set(b)) => Some(b),
                _ => None,
            },
            _ => None,
        }
    }

    /// Resolves one value.
    pub fn get(&self, v: &Val) -> R {
        match v {
            Val::Const(Some(b)) => R::V(b.clone()),
            Val::Const(None) => R::Null,
            Val::Bind(i) => match self.values.get(*i) {
                Some(Value::Set(b)) => R::V(b.clone()),
                Some(Value::Null) => R::Null,
                Some(Value::Unset) | None => R::Unset,
            },
            Val::Func(f) => R::V(eval_fn(*f, self.now_micros)),
            Val::Composite(c) => self.composite(&c.0, &c.1),
        }
    }

    /// Serializes a composite literal. Null or unset elements of collections are dropped
    /// (collections cannot hold nulls); tuple items may be null.
    fn composite(&self, kind: &crate::analyze::CompositeKind, items: &[Val]) -> R {
        use crate::analyze::CompositeKind as K;
        let vals: Vec<Option<Bytes>> = items
            .iter()
            .map(|v| match self.get(v) {
                R::V(b) => Some(b),
                R::Null | R::Unset => None,
            })
            .collect();
        R::V(match kind {
            K::Tuple => {
                let refs: Vec<Option<&[u8]>> = vals.iter().map(|v| v.as_deref()).collect();
                codec::tuple(&refs)
            }
            K::List => codec::collection(vals.iter().flatten().map(|b| b.as_ref())),
            K::Set(ty) => {
                let mut e: Vec<&Bytes> = vals.iter().flatten().collect();
                e.sort_by(|a, b| sluice_types::compare(ty, a, b));
                e.dedup_by(|a, b| sluice_types::compare(ty, a, b).is_eq());
                codec::collection(e.into_iter().map(|b| b.as_ref()))
            }
            K::Map(kty) => {
                let mut pairs: Vec<(&Bytes, &Bytes)> = vals
                    .chunks(2)
                    .filter_map(|p| match p {
                        [Some(k), Some(v)] => Some((k, v)),
                        _ => None,
                    })
                    .collect();
                // On duplicate keys the last one written wins, as for a literal map.
                pairs.reverse();
                pairs.sort_by(|a, b| sluice_types::compare(kty, a.0, b.0));
                pairs.dedup_by(|a, b| sluice_types::compare(kty, a.0, b.0).is_eq());
                codec::map(pairs.into_iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
            }
        })
    }

    /// Resolves a value that must be present and non-null (key components).
    pub fn required(&self, v: &Val, what: &str) -> Result<Bytes, DetailedError> {
        match self.get(v) {
            R::V(b) => Ok(b),
            R::Null => Err(invalid(format!("Invalid null value for {what}"))),
            R::Unset => Err(invalid(format!("Invalid unset value for {what}"))),
        }
    }
}

fn eval_fn(f: ValFn, now_micros: i64) -> Bytes {
    match f {
        ValFn::TimeUuid => {
            let secs = now_micros.div_euclid(1_000_000) as u64;
            let nanos = (now_micros.rem_euclid(1_000_000) * 1000) as u32;
            let ts = uuid::Timestamp::from_unix(uuid::NoContext, secs, nanos);
            let node: [u8; 6] = *b"sluice";
            let mut u = *uuid::Uuid::new_v1(ts, &node).as_bytes();
            // Randomise the clock sequence so that uuids generated in the same µs differ.
            let r = uuid::Uuid::new_v4();
            u[8] = (u[8] & 0xc0) | (r.as_bytes()[8] & 0x3f);
            u[9] = r.as_bytes()[9];
            Bytes::copy_from_slice(&u)
        }
        ValFn::RandomUuid => Bytes::copy_from_slice(uuid::Uuid::new_v4().as_bytes()),
        ValFn::CurrentTimestamp => codec::bigint(now_micros.div_euclid(1000)),
        ValFn::CurrentDate => {
            let days = now_micros.div_euclid(86_400_000_000);
            Bytes::copy_from_slice(&((days + (1i64 << 31)) as u32).to_be_bytes())
        }
    }
}

/// Puts named values in marker order and sets and maps in canonical order (see
/// [`canonical_values`]); positional values already canonical pass through without a copy.
pub(crate) fn order_values<'a>(
    p: &Prepared,
    params: &'a QueryParameters,
) -> Result<Cow<'a, [Value]>, DetailedError> {
    let Some(names) = &params.names else {
        if params.values.len() != p.bind_specs.len() {
            return Err(invalid(format!(
                "There were {} markers(?) in CQL but {} bound variables",
                p.bind_specs.len(),
                params.values.len()
            )));
        }
        return Ok(canonical_positional(p, &params.values));
    };
    let mut out = Vec::with_capacity(p.bind_specs.len());
    for spec in &p.bind_specs {
        let pos = names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(&spec.name))
            .ok_or_else(|| invalid(format!("No value for bind variable {}", spec.name)))?;
        out.push(params.values.get(pos).cloned().unwrap_or(Value::Unset));
    }
    let markers = p.bind_specs.iter().map(|s| &s.ty).enumerate();
    Ok(canonical_values(markers, Cow::Owned(out)))
}

/// Positional values with sets and maps in canonical order (see [`canonical_values`]), for
/// routing and the limiter: the token of a frozen-collection partition key must be the one
/// execution writes under, whatever order the driver serialized it in.
pub(crate) fn canonical_positional<'v>(p: &Prepared, values: &'v [Value]) -> Cow<'v, [Value]> {
    if !p.set_or_map_markers {
        return Cow::Borrowed(values);
    }
    let markers = p.bind_specs.iter().map(|s| &s.ty).enumerate();
    canonical_values(markers, Cow::Borrowed(values))
}

/// Bound values with every set and map, nested ones included, in canonical order: set
/// elements and map keys sorted by their type's CQL order and unique, as Cassandra binds
/// them and as a CQL literal is built. A driver serializes a set in its own iteration
/// order, possibly with duplicates; without this, `{1, -1}` bound and `{-1, 1}` written as
/// a literal would be different keys. `markers` gives the type of each marker index to
/// check: a marker whose type holds no set or map costs one type check, and values are
/// copied only when one of them changes. Malformed values are left for validation.
pub(crate) fn canonical_values<'v, 't>(
    markers: impl Iterator<Item = (usize, &'t CqlType)>,
    mut values: Cow<'v, [Value]>,
) -> Cow<'v, [Value]> {
    for (i, ty) in markers {
        if !sluice_types::contains_set_or_map(ty) {
            continue;
        }
        let Some(Value::Set(bytes)) = values.get(i) else {
            continue;
        };
        if let Some(canonical) = sluice_types::canonicalize(ty, bytes) {
            if let Some(slot) = values.to_mut().get_mut(i) {
                *slot = Value::Set(Bytes::from(canonical));
            }
        }
    }
    values
}

/// Checks every bound value against its receiver type.
pub(crate) fn validate_values(p: &Prepared, values: &[Value]) -> Result<(), DetailedError> {
    for (spec, v) in p.bind_specs.iter().zip(values) {
        if let Value::Set(b) = v {
            if sluice_types::validate(&spec.ty, b).is_err() {
                return Err(invalid(format!(
                    "Invalid value for column {} of type {}",
                    spec.name, spec.ty
                )));
            }
        }
    }
    Ok(())
}

/// An `int` value (None for null/unset).
pub(crate) fn opt_i32(b: &Binder, v: &Val, what: &str) -> Result<Option<i32>, DetailedError> {
    match b.get(v) {
        R::V(bytes) => codec::as_i32(&bytes)
            .map(Some)
            .ok_or_else(|| invalid(format!("Invalid value for {what}"))),
        _ => Ok(None),
    }
}

/// A `bigint` value (None for null/unset).
pub(crate) fn opt_i64(b: &Binder, v: &Val, what: &str) -> Result<Option<i64>, DetailedError> {
    match b.get(v) {
        R::V(bytes) => codec::as_i64(&bytes)
            .map(Some)
            .ok_or_else(|| invalid(format!("Invalid value for {what}"))),
        _ => Ok(None),
    }
}

/// The `USING TIMEOUT` duration.
pub(crate) fn timeout_of(b: &Binder, v: &Val) -> Result<Option<Duration>, DetailedError> {
    // A bound or constant value is decoded in place, without a reference-counted copy.
    if let Some(bytes) = b.borrowed(v) {
        return decode_timeout(bytes).map(Some);
    }
    let R::V(bytes) = b.get(v) else {
        return Ok(None);
    };
    decode_timeout(&bytes).map(Some)
}

/// The timeout a statement written with a constant `USING TIMEOUT` has, decided once at
/// analysis: `None` when it depends on a bind marker and must be bound per request.
pub(crate) fn constant_timeout(v: Option<&Val>) -> Option<Result<Option<Duration>, DetailedError>> {
    match v {
        None | Some(Val::Const(None)) => Some(Ok(None)),
        Some(Val::Const(Some(bytes))) => Some(decode_timeout(bytes).map(Some)),
        Some(_) => None,
    }
}

/// Decodes a `duration` value as a request timeout (no months, not negative).
pub(crate) fn decode_timeout(bytes: &[u8]) -> Result<Duration, DetailedError> {
    // Directly, not through `Value::decode`: a bound timeout is decoded for every request
    // that carries one, before its deadline is checked.
    match sluice_types::value::decode_duration(bytes) {
        Ok(d) => {
            if d.months != 0 || d.days < 0 || d.nanos < 0 {
                return Err(invalid(
                    "Timeout must be a positive duration without months",
                ));
            }
            let nanos = (d.days as u64)
                .saturating_mul(86_400_000_000_000)
                .saturating_add(d.nanos as u64);
            Ok(Duration::from_nanos(nanos))
        }
        _ => Err(invalid("Invalid timeout duration")),
    }
}

/// One partition a statement touches.
#[derive(Debug, Clone)]
pub(crate) struct PartitionKey {
    /// Murmur3 token.
    pub token: i64,
    /// Serialized (routing) key.
    pub key: Bytes,
    /// Components, in partition key order.
    pub components: Vec<Bytes>,
}

fn expand_restr(b: &Binder, r: &Restr, what: &str) -> Result<Vec<Bytes>, DetailedError> {
    match r {
        Restr::Eq(v) => Ok(vec![b.required(v, what)?]),
        Restr::In(vs) => vs.iter().map(|v| b.required(v, what)).collect(),
        Restr::InBind(i) => match b.get(&Val::Bind(*i)) {
            R::V(list) => codec::split_collection(&list)
                .ok_or_else(|| invalid(format!("Invalid IN list for {what}"))),
            R::Null => Err(invalid(format!("Invalid null value for {what}"))),
            R::Unset => Err(invalid(format!("Invalid unset value for {what}"))),
        },
    }
}

fn cartesian(parts: Vec<Vec<Vec<Bytes>>>) -> Result<Vec<Vec<Bytes>>, DetailedError> {
    let mut acc: Vec<Vec<Bytes>> = vec![Vec::new()];
    for options in parts {
        if acc.len().saturating_mul(options.len()) > MAX_CARTESIAN {
            return Err(invalid(format!(
                "Too many combinations of IN values (more than {MAX_CARTESIAN})"
            )));
        }
        let mut next = Vec::with_capacity(acc.len() * options.len());
        for a in &acc {
            for o in &options {
                let mut v = a.clone();
                v.extend(o.iter().cloned());
                next.push(v);
            }
        }
        acc = next;
    }
    Ok(acc)
}

/// True when a value depends on the moment it is bound (`now()`, `uuid()`...).
fn val_uses_now(v: &Val) -> bool {
    match v {
        Val::Func(_) => true,
        Val::Composite(c) => c.1.iter().any(val_uses_now),
        Val::Const(_) | Val::Bind(_) => false,
    }
}

/// True when the partition key is computed from the moment it is bound, so that routing
/// must read the clock (otherwise it need not).
pub(crate) fn pk_uses_now(w: &Where) -> bool {
    w.pk.iter().flatten().any(|r| match r {
        Restr::Eq(v) => val_uses_now(v),
        Restr::In(vs) => vs.iter().any(val_uses_now),
        Restr::InBind(_) => false,
    })
}

/// True when every partition key component is restricted by `=`.
fn pk_all_eq(w: &Where) -> bool {
    !w.pk.is_empty() && w.pk.iter().all(|r| matches!(r, Some(Restr::Eq(_))))
}

/// Component `k` of a partition key whose components are all restricted by `=`.
fn eq_component(b: &Binder, t: &TableDef, w: &Where, k: usize) -> Result<Bytes, DetailedError> {
    let Some(Restr::Eq(v)) = &w.pk[k] else {
        unreachable!("callers check pk_all_eq")
    };
    let name = &t.columns[t.partition_key[k]].name;
    let v = b.required(v, name)?;
    if v.len() > u16::MAX as usize {
        return Err(invalid(format!(
            "Key length exceeds 65535 bytes for {name}"
        )));
    }
    Ok(v)
}

/// The serialized (routing) key of a partition key's components.
fn routing_key_of(comps: &[Bytes]) -> Bytes {
    match comps {
        [single] => single.clone(),
        many => {
            let refs: Vec<&[u8]> = many.iter().map(|c| c.as_ref()).collect();
            Bytes::from(sluice_types::routing_key(&refs))
        }
    }
}

/// The token of the one partition a partition key restricted by `=` on every component
/// denotes. None when some component is not `=` (IN, missing). A single-component key given
/// as a constant or a bound value, the common case on the request path, is hashed where it
/// lies: no copy, no reference count.
pub(crate) fn single_partition_token(
    b: &Binder,
    t: &TableDef,
    w: &Where,
) -> Option<Result<i64, DetailedError>> {
    if !pk_all_eq(w) {
        return None;
    }
    if let [Some(Restr::Eq(v))] = &w.pk[..] {
        if let Some(key) = b.borrowed(v).filter(|k| k.len() <= u16::MAX as usize) {
            return Some(Ok(sluice_types::murmur3_token(key)));
        }
    }
    let key = (0..w.pk.len())
        .map(|k| eq_component(b, t, w, k))
        .collect::<Result<Vec<_>, _>>()
        .map(|comps| routing_key_of(&comps));
    Some(key.map(|key| sluice_types::murmur3_token(&key)))
}

/// The token of a single-column partition key restricted by `=` to a constant or a bound
/// value, read from `values` as they are: None for anything else (composite keys, `IN`,
/// functions, null, oversized keys), which [`single_partition_token`] handles. The caller
/// makes sure `values` need no canonical reordering (no set or map markers).
#[inline]
pub(crate) fn single_column_key_token<V: BoundValues + ?Sized>(
    values: &V,
    w: &Where,
) -> Option<i64> {
    let [Some(Restr::Eq(v))] = &w.pk[..] else {
        return None;
    };
    let key: &[u8] = match v {
        Val::Const(Some(b)) => b,
        Val::Bind(i) => match values.value(*i) {
            Some(ValueRef::Set(b)) => b,
            _ => return None,
        },
        _ => return None,
    };
    (key.len() <= u16::MAX as usize).then(|| sluice_types::murmur3_token(key))
}

/// The partitions a fully restricted partition key denotes (deduplicated, in order).
pub(crate) fn partition_keys(
    b: &Binder,
    t: &TableDef,
    w: &Where,
) -> Result<Vec<PartitionKey>, DetailedError> {
    // Fast path: every component is `=` (the common single-partition statement).
    if pk_all_eq(w) {
        let components = (0..w.pk.len())
            .map(|k| eq_component(b, t, w, k))
            .collect::<Result<Vec<_>, _>>()?;
        let key = routing_key_of(&components);
        return Ok(vec![PartitionKey {
            token: sluice_types::murmur3_token(&key),
            key,
            components,
        }]);
    }
    let mut parts = Vec::with_capacity(w.pk.len());
    for (k, r) in w.pk.iter().enumerate() {
        let name = &t.columns[t.partition_key[k]].name;
        let r = r
            .as_ref()
            .ok_or_else(|| invalid(format!("Some partition key parts are missing: {name}")))?;
        let vals = expand_restr(b, r, name)?;
        if vals.iter().any(|v| v.len() > u16::MAX as usize) {
            return Err(invalid(format!(
                "Key length exceeds 65535 bytes for {name}"
            )));
        }
        parts.push(vals.into_iter().map(|v| vec![v]).collect());
    }
    let mut out: Vec<PartitionKey> = Vec::new();
    for comps in cartesian(parts)? {
        let key = routing_key_of(&comps);
        if out.iter().any(|p| p.key == key) {
            continue;
        }
        out.push(PartitionKey {
            token: sluice_types::murmur3_token(&key),
            key,
            components: comps,
        });
    }
    Ok(out)
}

/// If every write of a batch targets the same partition, its token.
pub(crate) fn single_batch_token<'a>(
    b: &Binder,
    writes: impl Iterator<Item = &'a WritePlan>,
) -> Option<i64> {
    let mut token = None;
    for w in writes {
        let keys = partition_keys(b, &w.table, &w.where_).ok()?;
        if keys.len() != 1 || token.is_some_and(|t| t != keys[0].token) {
            return None;
        }
        token = Some(keys[0].token);
    }
    token
}

fn expand_point(
    b: &Binder,
    t: &TableDef,
    start: usize,
    p: &PointRestr,
) -> Result<Vec<Vec<Bytes>>, DetailedError> {
    match p {
        PointRestr::Single(r) => {
            let name = &t.columns[t.clustering[start]].name;
            Ok(expand_restr(b, r, name)?
                .into_iter()
                .map(|v| vec![v])
                .collect())
        }
        PointRestr::Tuples(items, width) => items
            .iter()
            .map(|tv| tuple_components(b, tv, *width))
            .collect(),
        PointRestr::TuplesBind(i, width) => {
            let R::V(list) = b.get(&Val::Bind(*i)) else {
                return Err(invalid("Invalid null value in multi-column IN"));
            };
            let elems = codec::split_collection(&list)
                .ok_or_else(|| invalid("Invalid multi-column IN list"))?;
            elems
                .iter()
                .map(|e| {
                    let items = codec::split_tuple(e, *width)
                        .ok_or_else(|| invalid("Invalid tuple value"))?;
                    items
                        .into_iter()
                        .map(|i| i.ok_or_else(|| invalid("Invalid null value in tuple")))
                        .collect()
                })
                .collect()
        }
    }
}

/// The components of a tuple value.
pub(crate) fn tuple_components(
    b: &Binder,
    tv: &TupleVal,
    width: usize,
) -> Result<Vec<Bytes>, DetailedError> {
    match tv {
        TupleVal::Items(vals) => vals
            .iter()
            .map(|v| b.required(v, "clustering column"))
            .collect(),
        TupleVal::Bind(i) => {
            let R::V(bytes) = b.get(&Val::Bind(*i)) else {
                return Err(invalid("Invalid null value in tuple relation"));
            };
            let items =
                codec::split_tuple(&bytes, width).ok_or_else(|| invalid("Invalid tuple value"))?;
            items
                .into_iter()
                .map(|i| i.ok_or_else(|| invalid("Invalid null value in tuple")))
                .collect()
        }
    }
}

/// Compares two clustering prefixes in clustering order.
pub(crate) fn compare_clustering(t: &TableDef, a: &[Bytes], b: &[Bytes]) -> Ordering {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let Some((ty, order)) = t.layout.clustering.get(i) else {
            break;
        };
        let mut c = sluice_types::compare(ty, x, y);
        if *order == Order::Desc {
            c = c.reverse();
        }
        if c != Ordering::Equal {
            return c;
        }
    }
    a.len().cmp(&b.len())
}

/// A clustering range in clustering order (prefix bounds).
pub(crate) type CkRange = (Bound<Vec<Bytes>>, Bound<Vec<Bytes>>);

/// The clustering prefixes the point restrictions denote (one empty prefix if none).
pub(crate) fn clustering_points(
    b: &Binder,
    t: &TableDef,
    w: &Where,
) -> Result<Vec<Vec<Bytes>>, DetailedError> {
    // Fast path: single-column `=` on each restricted clustering column.
    if w.ck_points
        .iter()
        .all(|p| matches!(p, PointRestr::Single(Restr::Eq(_))))
    {
        let mut point = Vec::with_capacity(w.ck_points.len());
        for (i, p) in w.ck_points.iter().enumerate() {
            let PointRestr::Single(Restr::Eq(v)) = p else {
                unreachable!("checked above")
            };
            point.push(b.required(v, &t.columns[t.clustering[i]].name)?);
        }
        return Ok(vec![point]);
    }
    let mut parts = Vec::with_capacity(w.ck_points.len());
    let mut start = 0;
    for p in &w.ck_points {
        let width = match p {
            PointRestr::Single(_) => 1,
            PointRestr::Tuples(_, w) | PointRestr::TuplesBind(_, w) => *w,
        };
        parts.push(expand_point(b, t, start, p)?);
        start += width;
    }
    let mut points = cartesian(parts)?;
    points.sort_by(|x, y| compare_clustering(t, x, y));
    points.dedup();
    Ok(points)
}

/// The clustering ranges of a WHERE clause, sorted in clustering order. Empty means the
/// restrictions select nothing.
pub(crate) fn clustering_ranges(
    b: &Binder,
    t: &TableDef,
    w: &Where,
) -> Result<Vec<CkRange>, DetailedError> {
    let points = clustering_points(b, t, w)?;
    let Some(slice) = &w.ck_slice else {
        if w.ck_points.is_empty() {
            return Ok(vec![(Bound::Unbounded, Bound::Unbounded)]);
        }
        return Ok(points
            .into_iter()
            .map(|p| (Bound::Included(p.clone()), Bound::Included(p)))
            .collect());
    };
    let mut out = Vec::with_capacity(points.len());
    for p in points {
        out.push(slice_range(b, t, w.ck_covered, &p, slice)?);
    }
    Ok(out)
}

fn slice_range(
    b: &Binder,
    t: &TableDef,
    at: usize,
    prefix: &[Bytes],
    s: &CkSlice,
) -> Result<CkRange, DetailedError> {
    let desc = t
        .layout
        .clustering
        .get(at)
        .is_some_and(|(_, o)| *o == Order::Desc);
    let bound =
        |sb: &Option<crate::analyze::SliceBound>| -> Result<Bound<Vec<Bytes>>, DetailedError> {
            Ok(match sb {
                None if prefix.is_empty() => Bound::Unbounded,
                None => Bound::Included(prefix.to_vec()),
                Some(sb) => {
                    let mut v = prefix.to_vec();
                    v.extend(tuple_components(b, &sb.val, s.width)?);
                    if sb.inclusive {
                        Bound::Included(v)
                    } else {
                        Bound::Excluded(v)
                    }
                }
            })
        };
    let lower = bound(&s.lower)?;
    let upper = bound(&s.upper)?;
    // For a descending column, larger values come first in clustering order.
    Ok(if desc { (upper, lower) } else { (lower, upper) })
}

/// The Write_timeout error for a request whose deadline passed before it ran.
pub(crate) fn write_timeout(consistency: Consistency, write_type: WriteType) -> DetailedError {
    DetailedError::new(
        DbError::WriteTimeout {
            consistency,
            received: 0,
            block_for: 1,
            write_type,
        },
        "Operation timed out - received only 0 responses.",
    )
}

/// The Read_timeout error for a request whose deadline passed before it ran.
pub(crate) fn read_timeout(consistency: Consistency) -> DetailedError {
    DetailedError::new(
        DbError::ReadTimeout {
            consistency,
            received: 0,
            block_for: 1,
            data_present: false,
        },
        "Operation timed out - received only 0 responses.",
    )
}

/// True when the deadline has passed.
pub(crate) fn expired(deadline: Option<std::time::Instant>) -> bool {
    deadline.is_some_and(|d| std::time::Instant::now() >= d)
}

/// The Unprepared error echoing the id.
pub(crate) fn unprepared(id: &[u8]) -> DetailedError {
    DetailedError::new(DbError::unprepared(id), "Prepared query with ID not found (either the query was not prepared on this host (maybe the host has been restarted?) or you have prepared too many queries and it has been evicted from the internal cache)")
}

/// A positive LIMIT-like value.
pub(crate) fn positive_limit(
    b: &Binder,
    v: &Option<Val>,
    what: &'static str,
) -> Result<Option<usize>, DetailedError> {
    let Some(v) = v else { return Ok(None) };
    match opt_i32(b, v, what)? {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(_) => Err(DetailedError::new(
            DbError::Invalid,
            match what {
                "[per_partition_limit]" => "PER PARTITION LIMIT must be strictly positive",
                _ => "LIMIT must be strictly positive",
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeout rule as it reads through the general value decoder.
    fn timeout_through_value(bytes: &[u8]) -> Option<Duration> {
        let ty = CqlType::native(sluice_types::NativeType::Duration);
        match sluice_types::Value::decode(&ty, bytes) {
            Ok(sluice_types::Value::Duration(d))
                if d.months == 0 && d.days >= 0 && d.nanos >= 0 =>
            {
                Some(Duration::from_nanos(
                    (d.days as u64)
                        .saturating_mul(86_400_000_000_000)
                        .saturating_add(d.nanos as u64),
                ))
            }
            _ => None,
        }
    }

    #[test]
    fn a_bound_timeout_decodes_as_the_value_decoder_reads_it() {
        use sluice_types::datetime::Duration as CqlDuration;
        let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0, 0], vec![0, 0, 2, 0]];
        for (months, days, nanos) in [
            (0, 0, 1),
            (0, 0, 0),
            (0, 3, 5_000_000),
            (1, 0, 0),
            (0, -1, 0),
            (0, 0, -7),
            (-1, -1, -1),
            (0, i32::MAX, i64::MAX),
        ] {
            let mut b = Vec::new();
            sluice_types::value::encode_duration(
                CqlDuration {
                    months,
                    days,
                    nanos,
                },
                &mut b,
            );
            cases.push(b);
        }
        // Random bytes of every short length, and every byte pair.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..24 {
            for _ in 0..64 {
                cases.push(
                    (0..len)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect(),
                );
            }
        }
        for a in 0..=255u8 {
            for b in [0u8, 1, 2, 0x7f, 0x80, 0xc0, 0xff] {
                cases.push(vec![a, b, 0]);
                cases.push(vec![0, a, b]);
            }
        }
        let mut valid = 0;
        for bytes in &cases {
            let direct = decode_timeout(bytes).ok();
            assert_eq!(direct, timeout_through_value(bytes), "{bytes:?}");
            valid += usize::from(direct.is_some());
        }
        assert!(valid > 100, "the cases include valid timeouts ({valid})");
        assert_eq!(
            decode_timeout(&[0, 0, 2]).ok(),
            Some(Duration::from_nanos(1))
        );
    }

    #[test]
    fn cartesian_product_and_cap() {
        let a = vec![
            vec![Bytes::from_static(b"a")],
            vec![Bytes::from_static(b"b")],
        ];
        let c = vec![
            vec![Bytes::from_static(b"1")],
            vec![Bytes::from_static(b"2")],
        ];
        let out = cartesian(vec![a, c]).unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(
            out[1],
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"2")]
        );
        let many: Vec<Vec<Bytes>> = (0..40).map(|i| vec![Bytes::from(vec![i as u8])]).collect();
        assert!(cartesian(vec![many.clone(), many]).is_err());
    }

    #[test]
    fn binder_resolves_values() {
        let values = vec![
            Value::Set(Bytes::from_static(&[0, 0, 0, 7])),
            Value::Null,
            Value::Unset,
        ];
        let b = Binder::new(&values, 1_000_000);
        assert_eq!(
            b.get(&Val::Bind(0)),
            R::V(Bytes::from_static(&[0, 0, 0, 7]))
        );
        assert_eq!(b.get(&Val::Bind(1)), R::Null);
        assert_eq!(b.get(&Val::Bind(2)), R::Unset);
        assert_eq!(b.get(&Val::Bind(9)), R::Unset);
        assert!(b.required(&Val::Bind(1), "k").is_err());
        assert_eq!(opt_i32(&b, &Val::Bind(0), "x").unwrap(), Some(7));
        assert_eq!(
            b.get(&Val::Func(ValFn::CurrentTimestamp)),
            R::V(codec::bigint(1000))
        );
        let R::V(u) = b.get(&Val::Func(ValFn::TimeUuid)) else {
            panic!()
        };
        assert_eq!(u[6] >> 4, 1, "version 1 uuid");
    }

    #[test]
    fn unprepared_echoes_id() {
        let e = unprepared(&[1, 2, 3]);
        assert_eq!(e.code(), sluice_protocol::ErrorCode::Unprepared);
        match e.error {
            DbError::Unprepared { len, id } => {
                assert_eq!(len, 3);
                assert_eq!(&id[..3], &[1, 2, 3]);
            }
            _ => panic!("wrong extra"),
        }
    }
}
