use super::*;
use crate::cql_type::NativeType;
use crate::value::{validate, Value};
use num_bigint::BigInt;
use proptest::prelude::*;

fn n(t: NativeType) -> CqlType {
    CqlType::Native(t)
}

fn set(t: CqlType) -> CqlType {
    CqlType::Set(Box::new(t))
}

fn list(t: CqlType) -> CqlType {
    CqlType::List(Box::new(t))
}

fn map(k: CqlType, v: CqlType) -> CqlType {
    CqlType::Map(Box::new(k), Box::new(v))
}

fn frozen(t: CqlType) -> CqlType {
    CqlType::Frozen(Box::new(t))
}

fn ints(v: &[i32]) -> Value {
    Value::Set(v.iter().copied().map(Value::Int).collect())
}

fn dec(unscaled: i64, scale: i32) -> Value {
    Value::Decimal {
        scale,
        unscaled: BigInt::from(unscaled),
    }
}

/// The canonical bytes of `v`, or `v`'s own bytes when already canonical.
fn canon(ty: &CqlType, v: &Value) -> Vec<u8> {
    let bytes = v.to_bytes();
    canonicalize(ty, &bytes).unwrap_or(bytes)
}

#[test]
fn sets_are_sorted_in_type_order_and_deduplicated() {
    let ty = set(n(NativeType::Int));
    // Byte order would put -1 (0xffffffff) last; int order puts it first.
    assert_eq!(
        canon(&ty, &ints(&[3, -1, 2, 3, -1])),
        ints(&[-1, 2, 3]).to_bytes()
    );
    // Already canonical (and empty): nothing to do.
    assert_eq!(canonicalize(&ty, &ints(&[-1, 2, 3]).to_bytes()), None);
    assert_eq!(canonicalize(&ty, &ints(&[]).to_bytes()), None);
    let frozen_text = frozen(set(n(NativeType::Text)));
    let texts = |v: &[&str]| Value::Set(v.iter().map(|s| Value::Text((*s).into())).collect());
    assert_eq!(
        canon(&frozen_text, &texts(&["b", "a", "b", ""])),
        texts(&["", "a", "b"]).to_bytes()
    );
}

#[test]
fn equal_set_elements_keep_the_first_and_equal_map_keys_the_last_value() {
    // 1.00 and 1.0 are equal decimals with different bytes: a TreeSet keeps the first.
    let ty = set(n(NativeType::Decimal));
    let v = Value::Set(vec![dec(100, 2), dec(0, 0), dec(10, 1)]);
    assert_eq!(
        canon(&ty, &v),
        Value::Set(vec![dec(0, 0), dec(100, 2)]).to_bytes()
    );
    let ty = map(n(NativeType::Int), n(NativeType::Text));
    let v = Value::Map(vec![
        (Value::Int(3), Value::Text("c".into())),
        (Value::Int(1), Value::Text("a".into())),
        (Value::Int(3), Value::Text("z".into())),
    ]);
    let want = Value::Map(vec![
        (Value::Int(1), Value::Text("a".into())),
        (Value::Int(3), Value::Text("z".into())),
    ]);
    assert_eq!(canon(&ty, &v), want.to_bytes());
    // TreeMap.put on an equal key keeps the key it has and replaces the value.
    let ty = map(n(NativeType::Decimal), n(NativeType::Int));
    let v = Value::Map(vec![
        (dec(10, 1), Value::Int(1)),
        (dec(100, 2), Value::Int(2)),
    ]);
    assert_eq!(
        canon(&ty, &v),
        Value::Map(vec![(dec(10, 1), Value::Int(2))]).to_bytes()
    );
}

#[test]
fn nested_frozen_collections_tuples_and_udts_are_canonicalized() {
    let fs = frozen(set(n(NativeType::Int)));
    // A list keeps its order; each of its frozen sets is sorted.
    let ty = list(fs.clone());
    let v = Value::List(vec![ints(&[2, 1]), ints(&[3]), ints(&[2, 1, 2])]);
    assert_eq!(
        canon(&ty, &v),
        Value::List(vec![ints(&[1, 2]), ints(&[3]), ints(&[1, 2])]).to_bytes()
    );
    // Map keys that are frozen sets: {2, 1} and {1, 2} are the same key once sorted, so
    // the entries merge (last value wins) and the keys sort by set order.
    let ty = map(fs.clone(), n(NativeType::Int));
    let v = Value::Map(vec![
        (ints(&[5]), Value::Int(0)),
        (ints(&[2, 1]), Value::Int(1)),
        (ints(&[1, 2]), Value::Int(2)),
    ]);
    assert_eq!(
        canon(&ty, &v),
        Value::Map(vec![
            (ints(&[1, 2]), Value::Int(2)),
            (ints(&[5]), Value::Int(0))
        ])
        .to_bytes()
    );
    // A set of frozen sets: elements are canonicalized before they are ordered.
    let ty = set(fs.clone());
    let v = Value::Set(vec![ints(&[9]), ints(&[2, 1]), ints(&[1, 2])]);
    assert_eq!(
        canon(&ty, &v),
        Value::Set(vec![ints(&[1, 2]), ints(&[9])]).to_bytes()
    );
    // Map values: a non-frozen map of frozen sets.
    let ty = map(n(NativeType::Int), fs.clone());
    let v = Value::Map(vec![(Value::Int(1), ints(&[3, -3]))]);
    assert_eq!(
        canon(&ty, &v),
        Value::Map(vec![(Value::Int(1), ints(&[-3, 3]))]).to_bytes()
    );
    // Tuples keep nulls and a short arity.
    let ty = CqlType::Tuple(vec![n(NativeType::Int), fs.clone(), fs.clone()]);
    let v = Value::Tuple(vec![None, Some(ints(&[2, 1]))]);
    let got = canon(&ty, &v);
    assert_eq!(
        got,
        Value::Tuple(vec![None, Some(ints(&[1, 2]))]).to_bytes()
    );
    assert!(validate(&ty, &got).is_ok());
    let udt = CqlType::Udt {
        keyspace: "ks".into(),
        name: "u".into(),
        fields: vec![("a".into(), fs.clone()), ("b".into(), n(NativeType::Text))],
    };
    let v = Value::Udt(vec![
        ("a".into(), Some(ints(&[7, 7, 0]))),
        ("b".into(), Some(Value::Text("x".into()))),
    ]);
    assert_eq!(
        canon(&udt, &v),
        Value::Udt(vec![
            ("a".into(), Some(ints(&[0, 7]))),
            ("b".into(), Some(Value::Text("x".into()))),
        ])
        .to_bytes()
    );
}

#[test]
fn types_without_sets_or_maps_are_never_inspected() {
    for ty in [
        n(NativeType::Int),
        list(n(NativeType::Int)),
        CqlType::Tuple(vec![n(NativeType::Text), list(n(NativeType::Int))]),
    ] {
        assert!(!contains_set_or_map(&ty));
        // Not even parsed: garbage is left for validate.
        assert_eq!(canonicalize(&ty, &[0xff, 1, 2]), None);
    }
    assert!(contains_set_or_map(&list(frozen(map(
        n(NativeType::Int),
        n(NativeType::Int)
    )))));
}

#[test]
fn malformed_values_are_left_unchanged_not_repaired() {
    let ty = set(n(NativeType::Int));
    let unsorted = ints(&[2, 1]).to_bytes();
    // Trailing bytes after an out-of-order set.
    let mut trailing = unsorted.clone();
    trailing.push(0);
    assert_eq!(canonicalize(&ty, &trailing), None);
    // Truncated, a forged count, a null element.
    assert_eq!(canonicalize(&ty, &unsorted[..unsorted.len() - 1]), None);
    assert_eq!(canonicalize(&ty, &[0, 0, 0, 9, 0, 0, 0, 0]), None);
    let null_elem = [0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(canonicalize(&ty, &null_elem), None);
    // A 4-byte decimal is invalid but compares equal to a valid zero: deduplication must
    // not drop it and hand back a valid value.
    let dty = set(n(NativeType::Decimal));
    let mut bad = Vec::new();
    crate::value::build_collection(
        [
            &[0u8, 0, 0, 1, 0][..],
            &[0u8, 0, 0, 0][..],
            &[0u8, 0, 0, 0][..],
        ]
        .into_iter(),
        &mut bad,
    );
    assert!(validate(&dty, &bad).is_err());
    assert_eq!(canonicalize(&dty, &bad), None);
}

/// Types holding sets and maps (and the types around them) over small domains, so that
/// generated values repeat elements.
fn arb_type() -> impl Strategy<Value = CqlType> {
    let leaf = prop_oneof![
        Just(n(NativeType::Int)),
        Just(n(NativeType::Text)),
        Just(n(NativeType::Decimal)),
        Just(n(NativeType::Boolean)),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(set),
            inner.clone().prop_map(list),
            (inner.clone(), inner.clone()).prop_map(|(k, v)| map(k, v)),
            proptest::collection::vec(inner.clone(), 1..3).prop_map(CqlType::Tuple),
            inner.prop_map(frozen),
        ]
    })
}

/// A value of `ty` in any order, with duplicates and equal-but-different decimals.
fn arb_value(ty: &CqlType) -> BoxedStrategy<Value> {
    match ty {
        CqlType::Native(NativeType::Int) => (-3i32..3).prop_map(Value::Int).boxed(),
        CqlType::Native(NativeType::Text) => "[ab]{0,2}".prop_map(Value::Text).boxed(),
        CqlType::Native(NativeType::Decimal) => (0i64..3, 0i32..2)
            .prop_map(|(u, s)| dec(u * 10i64.pow(s as u32), s))
            .boxed(),
        CqlType::Native(_) => any::<bool>().prop_map(Value::Boolean).boxed(),
        CqlType::Frozen(inner) => arb_value(inner),
        CqlType::List(e) => proptest::collection::vec(arb_value(e), 0..4)
            .prop_map(Value::List)
            .boxed(),
        CqlType::Set(e) => proptest::collection::vec(arb_value(e), 0..6)
            .prop_map(Value::Set)
            .boxed(),
        CqlType::Map(k, v) => proptest::collection::vec((arb_value(k), arb_value(v)), 0..5)
            .prop_map(Value::Map)
            .boxed(),
        CqlType::Tuple(items) => items
            .iter()
            .map(|t| proptest::option::of(arb_value(t)))
            .collect::<Vec<_>>()
            .prop_map(Value::Tuple)
            .boxed(),
        CqlType::Udt { .. } => unreachable!("not generated"),
    }
}

/// What the CQL literal path builds (sort by the type's order, deduplicate), computed on
/// decoded values: an independent statement of the canonical form.
fn literal_order(ty: &CqlType, v: Value) -> Value {
    match (ty, v) {
        (CqlType::Frozen(inner), v) => literal_order(inner, v),
        (CqlType::List(e), Value::List(items)) => {
            Value::List(items.into_iter().map(|i| literal_order(e, i)).collect())
        }
        (CqlType::Set(e), Value::Set(items)) => {
            let mut items: Vec<Value> = items.into_iter().map(|i| literal_order(e, i)).collect();
            items.sort_by(|a, b| compare(e, &a.to_bytes(), &b.to_bytes()));
            items.dedup_by(|later, kept| compare(e, &later.to_bytes(), &kept.to_bytes()).is_eq());
            Value::Set(items)
        }
        (CqlType::Map(kt, vt), Value::Map(pairs)) => {
            let mut pairs: Vec<(Value, Value)> = pairs
                .into_iter()
                .map(|(k, v)| (literal_order(kt, k), literal_order(vt, v)))
                .collect();
            pairs.sort_by(|a, b| compare(kt, &a.0.to_bytes(), &b.0.to_bytes()));
            let mut out: Vec<(Value, Value)> = Vec::new();
            for (k, v) in pairs {
                match out.last_mut() {
                    Some(last) if compare(kt, &last.0.to_bytes(), &k.to_bytes()).is_eq() => {
                        last.1 = v
                    }
                    _ => out.push((k, v)),
                }
            }
            Value::Map(out)
        }
        (CqlType::Tuple(types), Value::Tuple(items)) => Value::Tuple(
            types
                .iter()
                .zip(items)
                .map(|(t, i)| i.map(|i| literal_order(t, i)))
                .collect(),
        ),
        (_, v) => v,
    }
}

proptest! {
    #[test]
    fn canonical_form_is_the_literal_order_validates_and_is_idempotent(
        (ty, v) in arb_type().prop_flat_map(|t| (Just(t.clone()), arb_value(&t)))
    ) {
        let bytes = v.to_bytes();
        prop_assert!(validate(&ty, &bytes).is_ok());
        let want = literal_order(&ty, v).to_bytes();
        match canonicalize(&ty, &bytes) {
            // None exactly when the input already is the canonical form.
            None => prop_assert_eq!(&bytes, &want),
            Some(out) => {
                prop_assert_ne!(&out, &bytes);
                prop_assert_eq!(&out, &want);
            }
        }
        prop_assert!(validate(&ty, &want).is_ok());
        prop_assert_eq!(canonicalize(&ty, &want), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_only_valid_values_are_rewritten(
        ty in arb_type(),
        bytes in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        if let Some(out) = canonicalize(&ty, &bytes) {
            prop_assert!(validate(&ty, &bytes).is_ok());
            prop_assert!(validate(&ty, &out).is_ok());
            prop_assert_eq!(canonicalize(&ty, &out), None);
        }
    }
}
