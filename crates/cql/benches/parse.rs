//! Parse cost of typical statements (the unprepared-query path parses on every cache miss).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn bench_parse(c: &mut Criterion) {
    let cases = [
        ("simple_select", "SELECT pk, ck, v FROM ks.t WHERE pk = ? AND ck >= ? LIMIT 10"),
        ("system_local", "SELECT * FROM system.local WHERE key='local'"),
        ("insert", "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?) USING TTL 3600"),
        (
            "counter_update",
            "UPDATE \"counter1\" SET \"C0\"=\"C0\"+?,\"C1\"=\"C1\"+? WHERE KEY=?",
        ),
        (
            "create_table",
            "CREATE TABLE IF NOT EXISTS ks.t (pk bigint, ck bigint, v blob, m map<text, frozen<list<int>>>, \
             PRIMARY KEY ((pk), ck)) WITH CLUSTERING ORDER BY (ck DESC) AND compression = {}",
        ),
    ];
    for (name, text) in cases {
        c.bench_function(name, |b| {
            b.iter(|| sluice_cql::parse(black_box(text)).unwrap())
        });
    }
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
