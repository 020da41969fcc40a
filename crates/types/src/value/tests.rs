use super::*;
use proptest::prelude::*;

fn n(t: NativeType) -> CqlType {
    CqlType::Native(t)
}

fn list(t: CqlType) -> CqlType {
    CqlType::List(Box::new(t))
}

fn set(t: CqlType) -> CqlType {
    CqlType::Set(Box::new(t))
}

fn map(k: CqlType, v: CqlType) -> CqlType {
    CqlType::Map(Box::new(k), Box::new(v))
}

fn fmt(ty: &CqlType, b: &[u8]) -> String {
    let mut s = String::new();
    format_cql(ty, b, &mut s);
    s
}

fn coll(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    build_collection(items.iter().copied(), &mut out);
    out
}

fn v1_uuid(time: u64, low: [u8; 8]) -> [u8; 16] {
    let time_low = (time & 0xffff_ffff) as u32;
    let time_mid = ((time >> 32) & 0xffff) as u16;
    let time_hi = ((time >> 48) & 0x0fff) as u16 | 0x1000;
    let mut u = [0u8; 16];
    u[..4].copy_from_slice(&time_low.to_be_bytes());
    u[4..6].copy_from_slice(&time_mid.to_be_bytes());
    u[6..8].copy_from_slice(&time_hi.to_be_bytes());
    u[8..].copy_from_slice(&low);
    u
}

#[test]
fn validates_native_widths_and_contents() {
    use NativeType::*;
    assert!(validate(&n(Int), &[0, 0, 0, 1]).is_ok());
    assert!(validate(&n(Int), &[0, 0, 1]).is_err());
    assert!(validate(&n(Int), &[]).is_ok(), "empty value");
    assert!(validate(&n(Bigint), &[0; 7]).is_err());
    assert!(validate(&n(Smallint), &[0; 2]).is_ok());
    assert!(validate(&n(Tinyint), &[0; 2]).is_err());
    assert!(validate(&n(Boolean), &[1]).is_ok());
    assert!(validate(&n(Uuid), &[0; 15]).is_err());
    assert!(validate(&n(Ascii), b"abc").is_ok());
    assert!(validate(&n(Ascii), &[0x80]).is_err());
    assert!(validate(&n(Text), "żółw".as_bytes()).is_ok());
    assert!(validate(&n(Text), &[0xff, 0xfe]).is_err());
    assert!(validate(&n(Inet), &[127, 0, 0, 1]).is_ok());
    assert!(validate(&n(Inet), &[0; 16]).is_ok());
    assert!(validate(&n(Inet), &[0; 5]).is_err());
    assert!(validate(&n(Varint), &[0x80, 0]).is_ok());
    assert!(validate(&n(Decimal), &[0, 0, 0, 2, 5]).is_ok());
    assert!(validate(&n(Decimal), &[0, 0, 0, 2]).is_err());
    assert!(validate(&n(Time), &(datetime::NANOS_PER_DAY - 1).to_be_bytes()).is_ok());
    assert!(validate(&n(Time), &datetime::NANOS_PER_DAY.to_be_bytes()).is_err());
    assert!(validate(&n(Time), &(-1i64).to_be_bytes()).is_err());
    assert!(validate(&n(Timeuuid), &v1_uuid(5, [0; 8])).is_ok());
    let mut v4 = [0u8; 16];
    v4[6] = 0x40;
    assert!(validate(&n(Timeuuid), &v4).is_err());
    assert!(validate(&n(Uuid), &v4).is_ok());
}

#[test]
fn validates_durations() {
    let ty = n(NativeType::Duration);
    let enc = |m, d, ns| {
        let mut out = Vec::new();
        encode_duration(
            datetime::Duration {
                months: m,
                days: d,
                nanos: ns,
            },
            &mut out,
        );
        out
    };
    assert!(validate(&ty, &enc(1, 2, 3)).is_ok());
    assert!(validate(&ty, &enc(-1, 0, -3)).is_ok());
    assert!(validate(&ty, &enc(1, -2, 3)).is_err(), "mixed signs");
    assert!(validate(&ty, &[]).is_err());
    assert!(validate(&ty, &[0, 0]).is_err());
    let mut trailing = enc(1, 2, 3);
    trailing.push(0);
    assert!(validate(&ty, &trailing).is_err());
}

#[test]
fn vint_round_trip_at_every_width() {
    for shift in 0..64 {
        for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
            let mut out = Vec::new();
            write_unsigned_vint(v, &mut out);
            assert_eq!(read_unsigned_vint(&out), Some((v, out.len())), "{v}");
        }
    }
    for v in [0i64, 1, -1, 63, -64, 64, i64::MAX, i64::MIN, 1 << 40] {
        let mut out = Vec::new();
        write_signed_vint(v, &mut out);
        assert_eq!(read_signed_vint(&out), Some((v, out.len())));
    }
    // Cassandra encodes 0..=127 in one byte, 128 in two bytes (0x80 0x80).
    let mut out = Vec::new();
    write_unsigned_vint(128, &mut out);
    assert_eq!(out, vec![0x80, 0x80]);
}

#[test]
fn validates_collections_recursively() {
    let li = list(n(NativeType::Int));
    assert!(validate(&li, &coll(&[&[0, 0, 0, 1], &[0, 0, 0, 2]])).is_ok());
    assert!(validate(&li, &coll(&[&[0, 0, 1]])).is_err());
    let mut trailing = coll(&[&[0, 0, 0, 1]]);
    trailing.push(0);
    assert!(validate(&li, &trailing).is_err());
    // A huge count with no data must fail without allocating.
    assert!(validate(&li, &[0x7f, 0xff, 0xff, 0xff]).is_err());
    assert!(validate(&li, &[0xff, 0xff, 0xff, 0xff]).is_err());
    // Null elements are not allowed in collections.
    assert!(validate(&li, &[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]).is_err());
    let m = map(n(NativeType::Text), n(NativeType::Int));
    let mut good = Vec::new();
    build_map([(&b"a"[..], &[0u8, 0, 0, 1][..])].into_iter(), &mut good);
    assert!(validate(&m, &good).is_ok());
    assert!(validate(&m, &good[..good.len() - 1]).is_err());
    let tup = CqlType::Tuple(vec![n(NativeType::Int), n(NativeType::Text)]);
    let mut t = Vec::new();
    write_element(Some(&[0, 0, 0, 7]), &mut t);
    write_element(None, &mut t);
    assert!(validate(&tup, &t).is_ok());
    assert!(
        validate(&tup, &t[..8]).is_ok(),
        "short tuple: trailing items null"
    );
    write_element(Some(b"x"), &mut t);
    assert!(validate(&tup, &t).is_err(), "too many items");
    assert!(validate(
        &CqlType::Frozen(Box::new(li.clone())),
        &coll(&[&[1, 2, 3, 4]])
    )
    .is_ok());
}

fn sorted_by(ty: &CqlType, values: &[Vec<u8>]) {
    for (i, a) in values.iter().enumerate() {
        for (j, b) in values.iter().enumerate() {
            assert_eq!(
                compare(ty, a, b),
                i.cmp(&j),
                "{ty}: {} vs {}",
                fmt(ty, a),
                fmt(ty, b)
            );
        }
    }
}

#[test]
fn integer_orders_are_signed() {
    sorted_by(
        &n(NativeType::Int),
        &[
            vec![],
            (-5i32).to_be_bytes().to_vec(),
            0i32.to_be_bytes().to_vec(),
            7i32.to_be_bytes().to_vec(),
        ],
    );
    sorted_by(
        &n(NativeType::Bigint),
        &[i64::MIN, -1, 0, i64::MAX].map(|v: i64| v.to_be_bytes().to_vec()),
    );
    sorted_by(
        &n(NativeType::Tinyint),
        &[vec![0x80], vec![0xff], vec![0], vec![0x7f]],
    );
    sorted_by(
        &n(NativeType::Smallint),
        &[-300i16, 2, 300].map(|v| v.to_be_bytes().to_vec()),
    );
    sorted_by(
        &n(NativeType::Timestamp),
        &[-1000i64, 0, 1_700_000_000_000].map(|v| v.to_be_bytes().to_vec()),
    );
    sorted_by(&n(NativeType::Boolean), &[vec![0], vec![1]]);
    assert_eq!(
        compare(&n(NativeType::Boolean), &[1], &[2]),
        Ordering::Equal
    );
    sorted_by(
        &n(NativeType::Date),
        &[
            0u32,
            datetime::DATE_EPOCH - 1,
            datetime::DATE_EPOCH,
            u32::MAX,
        ]
        .map(|v| v.to_be_bytes().to_vec()),
    );
}

#[test]
fn varint_and_decimal_order_numerically() {
    let vi = |v: i128| BigInt::from(v).to_signed_bytes_be();
    let mut values: Vec<Vec<u8>> = [
        -70000i128,
        -256,
        -129,
        -128,
        -1,
        0,
        1,
        127,
        128,
        255,
        256,
        1 << 70,
    ]
    .into_iter()
    .map(vi)
    .collect();
    sorted_by(&n(NativeType::Varint), &values);
    // Non-minimal encodings compare by value: 0x00 0x01 == 0x01, 0xff 0xff == 0xff.
    assert_eq!(
        compare(&n(NativeType::Varint), &[0, 1], &[1]),
        Ordering::Equal
    );
    assert_eq!(
        compare(&n(NativeType::Varint), &[0xff, 0xff], &[0xff]),
        Ordering::Equal
    );
    assert_eq!(
        compare(&n(NativeType::Varint), &[0xff, 0x7f], &[0x80]),
        Ordering::Less
    );
    values.clear();

    let dec = |scale: i32, unscaled: i64| {
        Value::Decimal {
            scale,
            unscaled: BigInt::from(unscaled),
        }
        .to_bytes()
    };
    let ty = n(NativeType::Decimal);
    sorted_by(
        &ty,
        &[
            dec(0, -100),
            dec(2, -1),
            dec(0, 0),
            dec(3, 5),
            dec(1, 1),
            dec(0, 1),
            dec(-3, 2),
            dec(-2000000000, 1),
        ],
    );
    assert_eq!(
        compare(&ty, &dec(1, 10), &dec(2, 100)),
        Ordering::Equal,
        "1.0 == 1.00"
    );
    assert_eq!(
        compare(&ty, &dec(i32::MAX, 1), &dec(i32::MIN, 1)),
        Ordering::Less
    );
    assert_eq!(compare(&ty, &dec(0, 0), &dec(1000, 0)), Ordering::Equal);
}

#[test]
fn floats_follow_java_total_order() {
    let d = |v: f64| v.to_be_bytes().to_vec();
    sorted_by(
        &n(NativeType::Double),
        &[
            d(f64::NEG_INFINITY),
            d(-1.5),
            d(-0.0),
            d(0.0),
            d(1e-300),
            d(f64::INFINITY),
            d(f64::NAN),
        ],
    );
    assert_eq!(
        compare(&n(NativeType::Double), &d(f64::NAN), &d(-f64::NAN)),
        Ordering::Equal
    );
    let f = |v: f32| v.to_be_bytes().to_vec();
    sorted_by(&n(NativeType::Float), &[f(-2.0), f(0.5), f(f32::NAN)]);
}

#[test]
fn text_blob_inet_order_bytewise() {
    sorted_by(
        &n(NativeType::Text),
        &[
            b"".to_vec(),
            b"A".to_vec(),
            b"a".to_vec(),
            b"ab".to_vec(),
            "é".as_bytes().to_vec(),
        ],
    );
    sorted_by(
        &n(NativeType::Blob),
        &[vec![], vec![0], vec![0, 0], vec![0x80]],
    );
    sorted_by(
        &n(NativeType::Inet),
        &[vec![1, 2, 3, 4], vec![10, 0, 0, 1], vec![0xfe; 16]],
    );
}

#[test]
fn timeuuid_orders_by_timestamp_then_signed_bytes() {
    let ty = n(NativeType::Timeuuid);
    // Time 0x1_0000_0000 has a larger time_mid but a smaller time_low than 0xffff_ffff:
    // bytewise order would be wrong.
    let a = v1_uuid(0xffff_ffff, [0; 8]);
    let b = v1_uuid(0x1_0000_0000, [0; 8]);
    assert_eq!(a.cmp(&b), Ordering::Greater, "bytes disagree with time");
    let low_pos = v1_uuid(0x1_0000_0000, [0x7f, 0, 0, 0, 0, 0, 0, 0]);
    let low_neg = v1_uuid(0x1_0000_0000, [0x80, 0, 0, 0, 0, 0, 0, 0]);
    sorted_by(
        &ty,
        &[a.to_vec(), low_neg.to_vec(), b.to_vec(), low_pos.to_vec()],
    );
}

#[test]
fn uuid_orders_by_version_then_time_then_unsigned_bytes() {
    let ty = n(NativeType::Uuid);
    let t1 = v1_uuid(0xffff_ffff, [0; 8]);
    let t2 = v1_uuid(0x1_0000_0000, [0; 8]);
    let t2_high_low = v1_uuid(0x1_0000_0000, [0x80, 0, 0, 0, 0, 0, 0, 0]);
    let mut v4a = [0u8; 16];
    v4a[6] = 0x40;
    let mut v4b = v4a;
    v4b[0] = 0xff;
    let mut v4c = v4b;
    v4c[15] = 1;
    let mut v0 = [0u8; 16];
    v0[0] = 0xff;
    sorted_by(
        &ty,
        &[
            vec![],
            v0.to_vec(),
            t1.to_vec(),
            t2.to_vec(),
            t2_high_low.to_vec(),
            v4a.to_vec(),
            v4b.to_vec(),
            v4c.to_vec(),
        ],
    );
}

#[test]
fn collections_compare_elementwise_then_by_size() {
    let ty = CqlType::Frozen(Box::new(list(n(NativeType::Int))));
    let i = |v: i32| v.to_be_bytes();
    sorted_by(
        &ty,
        &[
            coll(&[]),
            coll(&[&i(-1)]),
            coll(&[&i(-1), &i(5)]),
            coll(&[&i(2)]),
            coll(&[&i(2), &i(0)]),
        ],
    );
    let m = map(n(NativeType::Int), n(NativeType::Text));
    let mk = |pairs: &[(i32, &str)]| {
        let mut out = Vec::new();
        let keys: Vec<[u8; 4]> = pairs.iter().map(|p| p.0.to_be_bytes()).collect();
        build_map(
            keys.iter()
                .zip(pairs)
                .map(|(k, p)| (&k[..], p.1.as_bytes())),
            &mut out,
        );
        out
    };
    sorted_by(&m, &[mk(&[(1, "a")]), mk(&[(1, "b")]), mk(&[(2, "a")])]);
    let tup = CqlType::Tuple(vec![n(NativeType::Int), n(NativeType::Text)]);
    let t = |a: Option<i32>, b: Option<&str>| {
        Value::Tuple(vec![a.map(Value::Int), b.map(|s| Value::Text(s.into()))]).to_bytes()
    };
    sorted_by(
        &tup,
        &[
            t(None, Some("z")),
            t(Some(-1), None),
            t(Some(-1), Some("a")),
            t(Some(3), Some("")),
        ],
    );
}

#[test]
fn formats_literals() {
    use NativeType::*;
    assert_eq!(fmt(&n(Text), b"it's"), "'it''s'");
    assert_eq!(fmt(&n(Ascii), b""), "''");
    assert_eq!(fmt(&n(Blob), &[0xca, 0xfe]), "0xcafe");
    assert_eq!(fmt(&n(Int), &(-42i32).to_be_bytes()), "-42");
    assert_eq!(fmt(&n(Int), &[]), "blobAsInt(0x)");
    assert_eq!(
        fmt(&n(Int), &[1, 2]),
        "0x0102",
        "invalid bytes are shown as a blob"
    );
    assert_eq!(fmt(&n(Double), &1.0f64.to_be_bytes()), "1.0");
    assert_eq!(fmt(&n(Double), &f64::NAN.to_be_bytes()), "NaN");
    assert_eq!(
        fmt(&n(Float), &f32::NEG_INFINITY.to_be_bytes()),
        "-Infinity"
    );
    assert_eq!(fmt(&n(Float), &1.5f32.to_be_bytes()), "1.5");
    assert_eq!(fmt(&n(Boolean), &[1]), "true");
    assert_eq!(
        fmt(
            &n(Varint),
            &BigInt::from(-1234567890123456789012i128).to_signed_bytes_be()
        ),
        "-1234567890123456789012"
    );
    let dec = |scale: i32, unscaled: i64| {
        Value::Decimal {
            scale,
            unscaled: BigInt::from(unscaled),
        }
        .to_bytes()
    };
    assert_eq!(fmt(&n(Decimal), &dec(2, 12345)), "123.45");
    assert_eq!(fmt(&n(Decimal), &dec(4, -5)), "-0.0005");
    assert_eq!(fmt(&n(Decimal), &dec(0, 7)), "7");
    assert_eq!(fmt(&n(Decimal), &dec(-3, 12)), "12E3");
    assert_eq!(fmt(&n(Decimal), &dec(100, 12)), "12E-100");
    let u: [u8; 16] = *b"\x12\x3e\x45\x67\xe8\x9b\x12\xd3\xa4\x56\x42\x66\x14\x17\x40\x00";
    assert_eq!(fmt(&n(Uuid), &u), "123e4567-e89b-12d3-a456-426614174000");
    assert_eq!(
        fmt(&n(Timestamp), &1_704_164_645_123i64.to_be_bytes()),
        "'2024-01-02T03:04:05.123Z'"
    );
    assert_eq!(
        fmt(&n(Timestamp), &i64::MAX.to_be_bytes()),
        i64::MAX.to_string()
    );
    assert_eq!(
        fmt(&n(Date), &datetime::DATE_EPOCH.to_be_bytes()),
        "'1970-01-01'"
    );
    assert_eq!(
        fmt(&n(Time), &3_723_000_000_001i64.to_be_bytes()),
        "'01:02:03.000000001'"
    );
    assert_eq!(fmt(&n(Inet), &[10, 0, 0, 1]), "'10.0.0.1'");
    let mut v6 = [0u8; 16];
    v6[15] = 1;
    assert_eq!(fmt(&n(Inet), &v6), "'::1'");
    let mut d = Vec::new();
    encode_duration(
        datetime::Duration {
            months: 14,
            days: 3,
            nanos: 90 * 60 * 1_000_000_000,
        },
        &mut d,
    );
    assert_eq!(fmt(&n(NativeType::Duration), &d), "1y2mo3d1h30m");
}

#[test]
fn formats_collections() {
    let i = |v: i32| v.to_be_bytes();
    assert_eq!(
        fmt(&list(n(NativeType::Int)), &coll(&[&i(1), &i(2)])),
        "[1, 2]"
    );
    assert_eq!(
        fmt(&set(n(NativeType::Text)), &coll(&[b"a", b"b'"])),
        "{'a', 'b'''}"
    );
    let mut m = Vec::new();
    build_map([(&b"k"[..], &i(5)[..])].into_iter(), &mut m);
    assert_eq!(
        fmt(&map(n(NativeType::Text), n(NativeType::Int)), &m),
        "{'k': 5}"
    );
    let tup = CqlType::Tuple(vec![n(NativeType::Int), n(NativeType::Text)]);
    let t = Value::Tuple(vec![Some(Value::Int(1)), None]).to_bytes();
    assert_eq!(fmt(&tup, &t), "(1, null)");
    let udt = CqlType::Udt {
        keyspace: "ks".into(),
        name: "addr".into(),
        fields: vec![
            ("street".into(), n(NativeType::Text)),
            ("Zip".into(), n(NativeType::Int)),
        ],
    };
    let u = Value::Udt(vec![
        ("street".into(), Some(Value::Text("x".into()))),
        ("Zip".into(), Some(Value::Int(9))),
    ])
    .to_bytes();
    assert_eq!(fmt(&udt, &u), "{street: 'x', \"Zip\": 9}");
    assert_eq!(fmt(&list(n(NativeType::Int)), &[0, 0, 0, 1]), "0x00000001");
    let v = Value::Map(vec![(
        Value::Text("a'b".into()),
        Value::List(vec![Value::Double(0.5)]),
    )]);
    assert_eq!(v.to_string(), "{'a''b': [0.5]}");
}

#[test]
fn decode_encode_round_trip() {
    use NativeType::*;
    let cases: Vec<(CqlType, Value)> = vec![
        (n(Int), Value::Int(-7)),
        (n(Bigint), Value::Bigint(i64::MIN)),
        (n(Counter), Value::Counter(3)),
        (n(Smallint), Value::Smallint(-2)),
        (n(Tinyint), Value::Tinyint(-128)),
        (n(Text), Value::Text("héllo".into())),
        (n(Ascii), Value::Ascii("hi".into())),
        (n(Blob), Value::Blob(vec![0, 1, 2])),
        (n(Boolean), Value::Boolean(true)),
        (n(Float), Value::Float(1.25)),
        (n(Double), Value::Double(-2.5)),
        (n(Varint), Value::Varint(BigInt::from(-(1i128 << 100)))),
        (
            n(Decimal),
            Value::Decimal {
                scale: 3,
                unscaled: BigInt::from(-12345),
            },
        ),
        (n(Timestamp), Value::Timestamp(1_700_000_000_000)),
        (n(Date), Value::Date(datetime::DATE_EPOCH + 5)),
        (n(Time), Value::Time(1)),
        (n(Uuid), Value::Uuid([7; 16])),
        (n(Timeuuid), Value::Timeuuid(v1_uuid(99, [1; 8]))),
        (n(Inet), Value::Inet("2001:db8::1".parse().unwrap())),
        (n(Inet), Value::Inet("192.168.0.1".parse().unwrap())),
        (
            n(NativeType::Duration),
            Value::Duration(datetime::Duration {
                months: -1,
                days: -2,
                nanos: -3,
            }),
        ),
        (n(Int), Value::Empty),
        (
            list(n(Text)),
            Value::List(vec![Value::Text("a".into()), Value::Text("".into())]),
        ),
        (set(n(Int)), Value::Set(vec![Value::Int(1), Value::Int(2)])),
        (
            map(n(Text), list(n(Int))),
            Value::Map(vec![(
                Value::Text("k".into()),
                Value::List(vec![Value::Int(3)]),
            )]),
        ),
        (
            CqlType::Tuple(vec![n(Int), n(Text)]),
            Value::Tuple(vec![None, Some(Value::Text("z".into()))]),
        ),
    ];
    for (ty, value) in cases {
        let bytes = value.to_bytes();
        assert!(validate(&ty, &bytes).is_ok(), "{ty} {value:?}");
        assert_eq!(Value::decode(&ty, &bytes).unwrap(), value, "{ty}");
    }
    assert!(Value::decode(&n(Int), &[1]).is_err());
    assert!(Value::decode(&list(n(Int)), &[0, 0, 0, 1, 0, 0, 0, 2, 0, 0]).is_err());
}

#[test]
fn splitters_match_builders() {
    let c = coll(&[b"ab", b""]);
    assert_eq!(collection_elements(&c).unwrap(), vec![&b"ab"[..], &b""[..]]);
    let mut m = Vec::new();
    build_map([(&b"k"[..], &b"v"[..])].into_iter(), &mut m);
    assert_eq!(map_entries(&m).unwrap(), vec![(&b"k"[..], &b"v"[..])]);
    let t = Value::Tuple(vec![Some(Value::Int(1)), None]).to_bytes();
    assert_eq!(
        tuple_items(&t, 3).unwrap(),
        vec![Some(&[0u8, 0, 0, 1][..]), None, None]
    );
    assert!(collection_elements(&[0, 0, 0]).is_err());
}

fn arb_type() -> impl Strategy<Value = CqlType> {
    let leaf = proptest::sample::select(NativeType::ALL.to_vec()).prop_map(CqlType::Native);
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| CqlType::List(Box::new(t))),
            inner.clone().prop_map(|t| CqlType::Set(Box::new(t))),
            (inner.clone(), inner.clone())
                .prop_map(|(k, v)| CqlType::Map(Box::new(k), Box::new(v))),
            proptest::collection::vec(inner.clone(), 1..3).prop_map(CqlType::Tuple),
            inner.prop_map(|t| CqlType::Frozen(Box::new(t))),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(ty in arb_type(), a in proptest::collection::vec(any::<u8>(), 0..40), b in proptest::collection::vec(any::<u8>(), 0..40)) {
        let valid = validate(&ty, &a).is_ok();
        let decoded = Value::decode(&ty, &a);
        prop_assert_eq!(valid, decoded.is_ok());
        if let Ok(v) = decoded {
            // Canonical re-encoding validates too (it may differ only for non-minimal varints).
            prop_assert!(validate(&ty, &v.to_bytes()).is_ok());
        }
        let mut s = String::new();
        format_cql(&ty, &a, &mut s);
        prop_assert!(!s.is_empty() || a.is_empty());
        prop_assert_eq!(compare(&ty, &a, &b), compare(&ty, &b, &a).reverse());
        prop_assert_eq!(compare(&ty, &a, &a), Ordering::Equal);
    }

    #[test]
    fn bigint_order_matches_integers(x in any::<i64>(), y in any::<i64>()) {
        let ty = CqlType::Native(NativeType::Bigint);
        prop_assert_eq!(compare(&ty, &x.to_be_bytes(), &y.to_be_bytes()), x.cmp(&y));
        let vt = CqlType::Native(NativeType::Varint);
        let (bx, by) = (BigInt::from(x).to_signed_bytes_be(), BigInt::from(y).to_signed_bytes_be());
        prop_assert_eq!(compare(&vt, &bx, &by), x.cmp(&y));
    }

    #[test]
    fn decimal_order_matches_scaled_integers(ux in -100_000i64..100_000, sx in -3i32..6, uy in -100_000i64..100_000, sy in -3i32..6) {
        // Compare x = ux * 10^-sx and y = uy * 10^-sy exactly with i128 at a common scale.
        let common = 6;
        let scaled = |u: i64, s: i32| i128::from(u) * 10i128.pow((common - s) as u32);
        let want = scaled(ux, sx).cmp(&scaled(uy, sy));
        let enc = |u: i64, s: i32| Value::Decimal { scale: s, unscaled: BigInt::from(u) }.to_bytes();
        prop_assert_eq!(compare(&CqlType::Native(NativeType::Decimal), &enc(ux, sx), &enc(uy, sy)), want);
    }
}
