//! The canonical serialization of set and map values: set elements and map keys in the
//! CQL order of their type, each once, recursively inside lists, frozen collections,
//! tuples and user-defined types.
//!
//! A CQL literal is built in this form, but a value bound by a driver arrives in the order
//! the client serialized it (a Python `set` iterates in hash order) and may repeat
//! elements. Cassandra re-sorts bound sets and maps before using them
//! (`Sets.Value.fromSerialized`, `Maps.Value.fromSerialized`, and the sorting
//! `SetSerializer`/`MapSerializer` for nested values), so that a key, a condition or a
//! stored cell has one representation per value. Duplicates resolve as there: the first
//! of equal set elements is kept (a `TreeSet` ignores later equal adds); for equal map keys
//! the first key's bytes are kept with the last value (`TreeMap.put` replaces the value).

use super::{compare, no_trailing, Reader, ValueError};
use crate::cql_type::CqlType;
use std::borrow::Cow;
use std::cmp::Ordering;

/// True when `ty` is or contains a set or a map: only values of such a type can differ
/// from their canonical form (a type check, no value inspected). Inlined: the request path
/// asks it for every bound value, and a native type answers at the first match arm.
#[inline]
pub fn contains_set_or_map(ty: &CqlType) -> bool {
    match ty {
        CqlType::Native(_) => false,
        CqlType::Set(_) | CqlType::Map(_, _) => true,
        CqlType::Frozen(inner) | CqlType::List(inner) => contains_set_or_map(inner),
        CqlType::Tuple(items) => items.iter().any(contains_set_or_map),
        CqlType::Udt { fields, .. } => fields.iter().any(|(_, t)| contains_set_or_map(t)),
    }
}

/// The canonical serialization of a `ty` value, or `None` when `bytes` is already
/// canonical (decided in one pass, without allocating) or is not a valid `ty` value: that
/// is left unchanged for [`validate`](super::validate) to reject, never repaired. Element
/// contents are copied as they are; only their order and multiplicity change.
pub fn canonicalize(ty: &CqlType, bytes: &[u8]) -> Option<Vec<u8>> {
    if !contains_set_or_map(ty) {
        return None;
    }
    match is_canonical(ty, bytes) {
        Ok(true) | Err(_) => None,
        // Rare path: validate first, since deduplication could otherwise drop an invalid
        // element that compares equal to a valid one and so turn bad input into good.
        Ok(false) if super::validate(ty, bytes).is_err() => None,
        Ok(false) => {
            // Sorting keeps the size and deduplication only shrinks it.
            let mut out = Vec::with_capacity(bytes.len());
            write_canonical(ty, bytes, &mut out).ok()?;
            Some(out)
        }
    }
}

/// Whether a value is canonical. Stops at the first out-of-order element; an error means
/// the structure is malformed (the caller leaves such a value alone). Elements whose type
/// holds no set or map are compared, never descended into.
fn is_canonical(ty: &CqlType, bytes: &[u8]) -> Result<bool, ValueError> {
    match ty {
        CqlType::Native(_) => Ok(true),
        CqlType::Frozen(inner) => is_canonical(inner, bytes),
        CqlType::List(elem) => {
            if !contains_set_or_map(elem) {
                return Ok(true);
            }
            let mut r = Reader { buf: bytes };
            for _ in 0..r.count(4)? {
                if !is_canonical(elem, r.element()?)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        CqlType::Set(elem) => {
            let deep = contains_set_or_map(elem);
            let mut r = Reader { buf: bytes };
            let mut prev: Option<&[u8]> = None;
            for _ in 0..r.count(4)? {
                let e = r.element()?;
                if (deep && !is_canonical(elem, e)?) || prev.is_some_and(|p| !ascending(elem, p, e))
                {
                    return Ok(false);
                }
                prev = Some(e);
            }
            Ok(true)
        }
        CqlType::Map(kt, vt) => {
            let (kdeep, vdeep) = (contains_set_or_map(kt), contains_set_or_map(vt));
            let mut r = Reader { buf: bytes };
            let mut prev: Option<&[u8]> = None;
            for _ in 0..r.count(8)? {
                let k = r.element()?;
                let v = r.element()?;
                if (kdeep && !is_canonical(kt, k)?)
                    || (vdeep && !is_canonical(vt, v)?)
                    || prev.is_some_and(|p| !ascending(kt, p, k))
                {
                    return Ok(false);
                }
                prev = Some(k);
            }
            Ok(true)
        }
        CqlType::Tuple(items) => items_canonical(items.iter(), bytes),
        CqlType::Udt { fields, .. } => items_canonical(fields.iter().map(|(_, t)| t), bytes),
    }
}

/// Strictly ascending: in order and not a duplicate.
fn ascending(ty: &CqlType, a: &[u8], b: &[u8]) -> bool {
    compare(ty, a, b) == Ordering::Less
}

fn items_canonical<'t>(
    types: impl Iterator<Item = &'t CqlType>,
    bytes: &[u8],
) -> Result<bool, ValueError> {
    let mut r = Reader { buf: bytes };
    for ty in types {
        // A tuple cut short is valid: the missing trailing items are null.
        if r.is_empty() {
            break;
        }
        match r.bytes()? {
            Some(b) if contains_set_or_map(ty) && !is_canonical(ty, b)? => return Ok(false),
            _ => {}
        }
    }
    Ok(true)
}

/// Appends the canonical form of a `ty` value. Fails on anything structurally malformed,
/// trailing bytes included, so that a malformed value is never turned into a valid one.
fn write_canonical(ty: &CqlType, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), ValueError> {
    if !contains_set_or_map(ty) {
        out.extend_from_slice(bytes);
        return Ok(());
    }
    match ty {
        CqlType::Native(_) => out.extend_from_slice(bytes),
        CqlType::Frozen(inner) => write_canonical(inner, bytes, out)?,
        CqlType::List(elem) => {
            let mut r = Reader { buf: bytes };
            let n = r.count(4)?;
            out.extend_from_slice(&(n as i32).to_be_bytes());
            for _ in 0..n {
                write_canonical_element(elem, r.element()?, out)?;
            }
            no_trailing(&r)?;
        }
        CqlType::Set(elem) => {
            let mut r = Reader { buf: bytes };
            let n = r.count(4)?;
            // `count` bounded n by the input length, so this cannot be forced large.
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(canonical_cow(elem, r.element()?)?);
            }
            no_trailing(&r)?;
            // Stable sort, then `dedup_by` drops the later of equal neighbours: the first
            // occurrence of each element is kept.
            items.sort_by(|a, b| compare(elem, a, b));
            items.dedup_by(|later, kept| compare(elem, later, kept).is_eq());
            out.extend_from_slice(&(items.len() as i32).to_be_bytes());
            for e in &items {
                put_element(e, out);
            }
        }
        CqlType::Map(kt, vt) => {
            let mut r = Reader { buf: bytes };
            let n = r.count(8)?;
            let mut pairs = Vec::with_capacity(n);
            for _ in 0..n {
                let k = canonical_cow(kt, r.element()?)?;
                let v = canonical_cow(vt, r.element()?)?;
                pairs.push((k, v));
            }
            no_trailing(&r)?;
            pairs.sort_by(|a, b| compare(kt, &a.0, &b.0));
            // Equal keys: the kept (first) key takes the later value, so the last wins.
            pairs.dedup_by(|later, kept| {
                let equal = compare(kt, &later.0, &kept.0).is_eq();
                if equal {
                    std::mem::swap(&mut later.1, &mut kept.1);
                }
                equal
            });
            out.extend_from_slice(&(pairs.len() as i32).to_be_bytes());
            for (k, v) in &pairs {
                put_element(k, out);
                put_element(v, out);
            }
        }
        CqlType::Tuple(items) => write_items(items.iter(), bytes, out)?,
        CqlType::Udt { fields, .. } => write_items(fields.iter().map(|(_, t)| t), bytes, out)?,
    }
    Ok(())
}

/// The canonical form of one element, borrowed when its type holds no set or map.
fn canonical_cow<'a>(ty: &CqlType, bytes: &'a [u8]) -> Result<Cow<'a, [u8]>, ValueError> {
    if !contains_set_or_map(ty) {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut v = Vec::with_capacity(bytes.len());
    write_canonical(ty, bytes, &mut v)?;
    Ok(Cow::Owned(v))
}

/// Appends a `[bytes]` element (the length cannot overflow: it is at most the input's).
fn put_element(e: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(e.len() as i32).to_be_bytes());
    out.extend_from_slice(e);
}

/// Appends a `[bytes]` element in canonical form, writing the length once it is known.
fn write_canonical_element(
    ty: &CqlType,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write_canonical(ty, bytes, out)?;
    let len = (out.len() - at - 4) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn write_items<'t>(
    types: impl Iterator<Item = &'t CqlType>,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    let mut r = Reader { buf: bytes };
    for ty in types {
        // Keep a short tuple short: the canonical form changes order, never arity.
        if r.is_empty() {
            break;
        }
        match r.bytes()? {
            Some(b) => write_canonical_element(ty, b, out)?,
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    no_trailing(&r)
}

#[cfg(test)]
mod tests;
