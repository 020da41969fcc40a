//! Sets and maps bound by a driver are used in canonical order (elements and keys sorted by
//! their type's CQL order, unique), exactly as the same value written as a literal.

use super::*;
use sluice_types::Value as V;

/// A bound `set<int>` (or frozen) serialized in the given order, duplicates kept: what a
/// driver sends for a Python set (hash order) or a list bound to a set.
fn int_set(items: &[i32]) -> Value {
    Value::Set(Bytes::from(iset(items).to_bytes()))
}

fn iset(items: &[i32]) -> V {
    V::Set(items.iter().copied().map(V::Int).collect())
}

/// A bound `map<int, text>` serialized in the given order.
fn int_text_map(pairs: &[(i32, &str)]) -> Value {
    Value::Set(Bytes::from(
        V::Map(
            pairs
                .iter()
                .map(|(k, v)| (V::Int(*k), V::Text((*v).into())))
                .collect(),
        )
        .to_bytes(),
    ))
}

fn bytes_of(v: &Value) -> Bytes {
    match v {
        Value::Set(b) => b.clone(),
        _ => panic!("not a value"),
    }
}

fn ints_of(cell: &Option<Bytes>) -> Vec<i32> {
    crate::codec::split_collection(cell.as_ref().expect("non-null set"))
        .unwrap()
        .iter()
        .map(|x| i32::from_be_bytes(x.as_ref().try_into().unwrap()))
        .collect()
}

fn map_of(cell: &Option<Bytes>) -> Vec<(i32, String)> {
    crate::codec::split_map(cell.as_ref().expect("non-null map"))
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                i32::from_be_bytes(k.as_ref().try_into().unwrap()),
                String::from_utf8(v.to_vec()).unwrap(),
            )
        })
        .collect()
}

async fn keyspace(h: &mut H) {
    h.ok("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
}

#[tokio::test]
async fn bound_sets_and_maps_in_regular_columns_are_stored_sorted_and_unique() {
    let mut h = H::new();
    keyspace(&mut h).await;
    h.ok("CREATE TABLE ks.c (k int PRIMARY KEY, s set<int>, fs frozen<set<int>>, m map<int, text>, fm frozen<map<int, text>>)").await;
    let unsorted_set = int_set(&[3, -1, 2, 3, -1]);
    let unsorted_map = int_text_map(&[(3, "c"), (-1, "a"), (3, "z")]);
    h.exec(
        "INSERT INTO ks.c (k, s, fs, m, fm) VALUES (1, ?, ?, ?, ?)",
        vec![
            unsorted_set.clone(),
            unsorted_set.clone(),
            unsorted_map.clone(),
            unsorted_map.clone(),
        ],
    )
    .await
    .unwrap();
    h.ok("INSERT INTO ks.c (k, s, fs, m, fm) VALUES (2, {-1, 2, 3}, {-1, 2, 3}, {-1: 'a', 3: 'z'}, {-1: 'a', 3: 'z'})").await;
    let r = h
        .select("SELECT s, fs, m, fm FROM ks.c WHERE k IN (1, 2)", vec![])
        .await;
    assert_eq!(r.len(), 2);
    // Sorted in int order (-1 first, not last as its bytes would be) and deduplicated;
    // the last of a repeated map key wins, as in Cassandra.
    assert_eq!(ints_of(&r[0][0]), vec![-1, 2, 3]);
    assert_eq!(ints_of(&r[0][1]), vec![-1, 2, 3]);
    assert_eq!(map_of(&r[0][2]), vec![(-1, "a".into()), (3, "z".into())]);
    assert_eq!(map_of(&r[0][3]), vec![(-1, "a".into()), (3, "z".into())]);
    // Byte for byte what the literal gives.
    assert_eq!(r[0], r[1]);

    // Adding a bound set to a set and a map to a map: elements land sorted and once.
    h.exec(
        "UPDATE ks.c SET s = s + ?, m = m + ? WHERE k = 1",
        vec![int_set(&[5, 0, 5]), int_text_map(&[(7, "x"), (0, "o")])],
    )
    .await
    .unwrap();
    let r = h.select("SELECT s, m FROM ks.c WHERE k = 1", vec![]).await;
    assert_eq!(ints_of(&r[0][0]), vec![-1, 0, 2, 3, 5]);
    assert_eq!(
        map_of(&r[0][1]),
        vec![
            (-1, "a".into()),
            (0, "o".into()),
            (3, "z".into()),
            (7, "x".into())
        ]
    );

    // A condition compares the canonical value with the stored one.
    let r = h
        .rows_of(
            "UPDATE ks.c SET s = {} WHERE k = 2 IF fs = ?",
            vec![int_set(&[3, 2, -1, 2])],
        )
        .await;
    assert_eq!(cells(&r)[0][0].as_deref(), Some(&[1u8][..]));

    // Filtering on a frozen column with a bound value finds the row.
    let r = h
        .select(
            "SELECT k FROM ks.c WHERE fm = ? ALLOW FILTERING",
            vec![int_text_map(&[(3, "z"), (-1, "a")])],
        )
        .await;
    let mut ks: Vec<i32> = r.iter().map(|row| cint(&row[0])).collect();
    ks.sort_unstable();
    assert_eq!(ks, vec![1, 2]);
}

#[tokio::test]
async fn a_bound_frozen_set_clustering_key_addresses_the_literal_row() {
    let mut h = H::new();
    keyspace(&mut h).await;
    h.ok("CREATE TABLE ks.ck (k int, c frozen<set<int>>, v text, PRIMARY KEY (k, c))")
        .await;
    h.ok("INSERT INTO ks.ck (k, c, v) VALUES (1, {-1, 1}, 'literal')")
        .await;
    // The same set bound in another order, with a duplicate: the same row.
    h.exec(
        "INSERT INTO ks.ck (k, c, v) VALUES (1, ?, 'bound')",
        vec![int_set(&[1, -1, 1])],
    )
    .await
    .unwrap();
    h.exec(
        "INSERT INTO ks.ck (k, c, v) VALUES (1, ?, 'other')",
        vec![int_set(&[7, -7])],
    )
    .await
    .unwrap();
    let r = h.select("SELECT c, v FROM ks.ck WHERE k = 1", vec![]).await;
    // Two rows, clustered by set order: {-7, 7} < {-1, 1}.
    assert_eq!(r.len(), 2);
    assert_eq!(ints_of(&r[0][0]), vec![-7, 7]);
    assert_eq!(ints_of(&r[1][0]), vec![-1, 1]);
    assert_eq!(ctext(&r[1][1]), "bound");
    // Equality, IN and ranges with bound sets in driver order.
    let r = h
        .select(
            "SELECT v FROM ks.ck WHERE k = 1 AND c = ?",
            vec![int_set(&[1, -1])],
        )
        .await;
    assert_eq!(r.len(), 1);
    assert_eq!(ctext(&r[0][0]), "bound");
    let in_list = Value::Set(Bytes::from(
        V::List(vec![iset(&[1, -1]), iset(&[7, -7, 7])]).to_bytes(),
    ));
    let r = h
        .select("SELECT v FROM ks.ck WHERE k = 1 AND c IN ?", vec![in_list])
        .await;
    assert_eq!(r.len(), 2);
    let r = h
        .select(
            "SELECT v FROM ks.ck WHERE k = 1 AND c >= ?",
            vec![int_set(&[1, -1])],
        )
        .await;
    assert_eq!(r.len(), 1);
    assert_eq!(ctext(&r[0][0]), "bound");
    // Deleting by the bound key removes the literal row.
    h.exec(
        "DELETE FROM ks.ck WHERE k = 1 AND c = ?",
        vec![int_set(&[1, 1, -1])],
    )
    .await
    .unwrap();
    let r = h.select("SELECT v FROM ks.ck WHERE k = 1", vec![]).await;
    assert_eq!(r.len(), 1);
    assert_eq!(ctext(&r[0][0]), "other");
}

#[tokio::test]
async fn a_bound_frozen_set_partition_key_has_the_literal_token_and_row() {
    let mut h = H::new();
    keyspace(&mut h).await;
    h.ok("CREATE TABLE ks.pk (p frozen<set<int>> PRIMARY KEY, v text)")
        .await;
    h.ok("INSERT INTO ks.pk (p, v) VALUES ({-1, 1}, 'literal')")
        .await;
    let insert = "INSERT INTO ks.pk (p, v) VALUES (?, ?)";
    h.exec(insert, vec![int_set(&[1, -1]), text("bound")])
        .await
        .unwrap();
    let r = h.select("SELECT p, v, token(p) FROM ks.pk", vec![]).await;
    assert_eq!(r.len(), 1, "one partition, not two");
    assert_eq!(ints_of(&r[0][0]), vec![-1, 1]);
    assert_eq!(ctext(&r[0][1]), "bound");
    let literal_token = cbig(&r[0][2]);
    // Routing sees the canonical key too, with positional and with named values.
    let p = h.engine.prepare(None, insert).unwrap();
    let positional = QueryParameters {
        values: vec![int_set(&[1, -1, 1]), text("x")],
        ..QueryParameters::default()
    };
    let route = h.engine.route_params(&p, &positional).unwrap();
    assert_eq!(route.token, Some(literal_token));
    // And `route` on raw positional values, as the server calls it before the full decode.
    let raw = h.engine.route(&p, &positional.values).unwrap();
    assert_eq!(raw.token, Some(literal_token));
    let p = h
        .engine
        .prepare(None, "SELECT v FROM ks.pk WHERE p = :key")
        .unwrap();
    let named = QueryParameters {
        values: vec![int_set(&[1, -1])],
        names: Some(vec!["key".into()]),
        ..QueryParameters::default()
    };
    assert_eq!(
        h.engine.route_params(&p, &named).unwrap().token,
        Some(literal_token)
    );
    let ctx = h.ctx();
    match h.engine.execute(&mut h.session, &p, &named, &ctx).await {
        Ok(ResultMessage::Rows(rows)) => assert_eq!(ctext(&cells(&rows)[0][0]), "bound"),
        other => panic!("expected rows, got {other:?}"),
    }
}

#[tokio::test]
async fn protocol_batch_statements_bind_canonical_values() {
    let mut h = H::new();
    keyspace(&mut h).await;
    h.ok("CREATE TABLE ks.b (k int, c frozen<set<int>>, s set<int>, m map<int, text>, PRIMARY KEY (k, c))").await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.b (k, c, s, m) VALUES (?, ?, ?, ?)")
        .unwrap();
    let entry = |k: i32, c: &[i32]| BatchEntry {
        statement: BatchQuery::Prepared(Bytes::copy_from_slice(&p.id)),
        values: vec![
            int(k),
            int_set(c),
            int_set(&[2, -2, 2]),
            int_text_map(&[(9, "b"), (-9, "a")]),
        ],
    };
    let b = BatchRequest {
        batch_type: 1,
        entries: vec![
            entry(1, &[3, -3]),
            // A text entry with a marker, also bound without `order_values`.
            BatchEntry {
                statement: BatchQuery::Text(Bytes::from_static(
                    b"UPDATE ks.b SET s = s + ? WHERE k = 1 AND c = {-3, 3}",
                )),
                values: vec![int_set(&[1, 0, 1])],
            },
        ],
        consistency: Consistency::One,
        serial_consistency: None,
        default_timestamp: None,
    };
    let ctx = RequestContext::now();
    h.engine.batch(&mut h.session, &b, &ctx).await.unwrap();
    let r = h
        .select("SELECT c, s, m FROM ks.b WHERE k = 1", vec![])
        .await;
    assert_eq!(r.len(), 1, "the text entry updated the same row");
    assert_eq!(ints_of(&r[0][0]), vec![-3, 3]);
    assert_eq!(ints_of(&r[0][1]), vec![-2, 0, 1, 2]);
    assert_eq!(map_of(&r[0][2]), vec![(-9, "a".into()), (9, "b".into())]);
    // A conditional batch: the condition and the key are canonical too.
    let cond = h
        .engine
        .prepare(
            None,
            "UPDATE ks.b SET m = m + {0: 'z'} WHERE k = ? AND c = ? IF s = ?",
        )
        .unwrap();
    let b = BatchRequest {
        entries: vec![BatchEntry {
            statement: BatchQuery::Prepared(Bytes::copy_from_slice(&cond.id)),
            values: vec![int(1), int_set(&[3, -3, 3]), int_set(&[2, 1, 0, -2])],
        }],
        ..b
    };
    match h.engine.batch(&mut h.session, &b, &ctx).await.unwrap() {
        ResultMessage::Rows(rows) => assert_eq!(cells(&rows)[0][0].as_deref(), Some(&[1u8][..])),
        other => panic!("expected rows, got {other:?}"),
    }
    let r = h.select("SELECT m FROM ks.b WHERE k = 1", vec![]).await;
    assert_eq!(
        map_of(&r[0][0]),
        vec![(-9, "a".into()), (0, "z".into()), (9, "b".into())]
    );
}

#[tokio::test]
async fn nested_frozen_sets_and_markers_inside_literals_are_canonical() {
    let mut h = H::new();
    keyspace(&mut h).await;
    h.ok("CREATE TABLE ks.n (k int PRIMARY KEY, l list<frozen<set<int>>>, mk map<frozen<set<int>>, int>, t tuple<int, frozen<set<int>>>, lm map<int, text>)").await;
    let l = Value::Set(Bytes::from(
        V::List(vec![iset(&[2, 1]), iset(&[0])]).to_bytes(),
    ));
    // {2, 1} and {1, 2} are one key once sorted: the entries merge, the last value wins.
    let mk = Value::Set(Bytes::from(
        V::Map(vec![
            (iset(&[5]), V::Int(0)),
            (iset(&[2, 1]), V::Int(1)),
            (iset(&[1, 2]), V::Int(2)),
        ])
        .to_bytes(),
    ));
    let t = Value::Set(Bytes::from(
        V::Tuple(vec![Some(V::Int(4)), Some(iset(&[9, -9]))]).to_bytes(),
    ));
    h.exec(
        "INSERT INTO ks.n (k, l, mk, t, lm) VALUES (1, ?, ?, ?, {?: 'first', 1: 'x', ?: 'last'})",
        vec![l, mk, t, int(3), int(3)],
    )
    .await
    .unwrap();
    h.ok("INSERT INTO ks.n (k, l, mk, t, lm) VALUES (2, [{1, 2}, {0}], {{1, 2}: 2, {5}: 0}, (4, {-9, 9}), {3: 'last', 1: 'x'})").await;
    let r = h
        .select("SELECT l, mk, t, lm FROM ks.n WHERE k IN (1, 2)", vec![])
        .await;
    assert_eq!(r.len(), 2);
    assert_eq!(r[0], r[1], "bound and literal forms store the same bytes");
    assert_eq!(map_of(&r[0][3]), vec![(1, "x".into()), (3, "last".into())]);
    // Sanity: the literal row itself is canonical.
    assert_eq!(
        r[1][1].as_deref(),
        Some(&V::Map(vec![(iset(&[1, 2]), V::Int(2)), (iset(&[5]), V::Int(0))]).to_bytes()[..])
    );
    // Already canonical values are passed through as they are.
    let canonical = int_set(&[-1, 2]);
    let owned = crate::exec::canonical_values(
        std::iter::once((0, &sluice_types::CqlType::parse("set<int>").unwrap())),
        std::borrow::Cow::Borrowed(std::slice::from_ref(&canonical)),
    );
    assert!(matches!(owned, std::borrow::Cow::Borrowed(_)));
    assert_eq!(bytes_of(&owned[0]), bytes_of(&canonical));
}
