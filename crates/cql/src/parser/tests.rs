use super::*;
use proptest::prelude::*;
use sluice_types::NativeType as N;

fn st(text: &str) -> Statement {
    match parse(text) {
        Ok(p) => p.statement,
        Err(e) => panic!("{text}\n  -> {e}"),
    }
}

fn binds(text: &str) -> usize {
    parse(text).unwrap().bind_count
}

fn select(text: &str) -> Select {
    match st(text) {
        Statement::Select(s) => s,
        other => panic!("not a select: {other:?}"),
    }
}

fn qn(ks: Option<&str>, name: &str) -> QualifiedName {
    QualifiedName {
        keyspace: ks.map(str::to_string),
        name: name.to_string(),
    }
}

fn bind(index: usize) -> Term {
    Term::Bind(BindMarker { index, name: None })
}

fn int(s: &str) -> Term {
    Term::Literal(Literal::Integer(s.to_string()))
}

fn string(s: &str) -> Term {
    Term::Literal(Literal::String(s.to_string()))
}

fn col(name: &str) -> Selector {
    Selector::Column {
        name: name.to_string(),
        alias: None,
    }
}

fn rel(column: &str, op: Operator, rhs: Term) -> Relation {
    Relation {
        lhs: RelationLhs::Column(column.to_string()),
        op,
        rhs: RelationRhs::Term(rhs),
    }
}

fn native(t: N) -> CqlType {
    CqlType::Native(t)
}

/// Every driver query of cql_server_spec.md §3.3 and §3.4 verbatim, with the table it
/// reads, its selector count (0 = `*`), its relation count and whether it has a timeout.
#[test]
fn driver_system_queries_verbatim() {
    let cases: &[(&str, &str, usize, usize, bool)] = &[
        ("SELECT * FROM system.peers", "system.peers", 0, 0, false),
        ("SELECT host_id, peer, data_center, rack, rpc_address, native_transport_address, release_version, schema_version FROM system.peers", "system.peers", 8, 0, false),
        ("SELECT * FROM system.local WHERE key='local'", "system.local", 0, 1, false),
        ("SELECT host_id, cluster_name, data_center, rack, partitioner, release_version, schema_version FROM system.local WHERE key='local'", "system.local", 7, 1, false),
        ("SELECT rpc_address FROM system.local WHERE key='local'", "system.local", 1, 1, false),
        ("SELECT peer, host_id, rpc_address, schema_version FROM system.peers", "system.peers", 4, 0, false),
        ("SELECT schema_version FROM system.local WHERE key='local'", "system.local", 1, 1, false),
        ("SELECT * FROM system.peers_v2", "system.peers_v2", 0, 0, false),
        ("SELECT host_id, peer, peer_port, data_center, rack, native_address, native_port, release_version, schema_version FROM system.peers_v2", "system.peers_v2", 9, 0, false),
        ("SELECT host_id, peer, peer_port, native_address, native_port, schema_version FROM system.peers_v2", "system.peers_v2", 6, 0, false),
        ("SELECT peer, data_center, host_id, rack, release_version, rpc_address, schema_version, tokens FROM system.peers", "system.peers", 8, 0, false),
        ("SELECT broadcast_address, cluster_name, data_center, host_id, listen_address, partitioner, rack, release_version, rpc_address, schema_version, tokens FROM system.local WHERE key='local'", "system.local", 11, 1, false),
        ("SELECT broadcast_address, cluster_name, data_center, host_id, listen_address, partitioner, rack, release_version, rpc_address, schema_version, tokens FROM system.local WHERE key='local' USING TIMEOUT 2000ms", "system.local", 11, 1, true),
        ("SELECT host_id, rpc_address, data_center, rack, tokens FROM system.peers", "system.peers", 5, 0, false),
        ("SELECT host_id, rpc_address, data_center, rack, tokens, cluster_name FROM system.local WHERE key='local'", "system.local", 6, 1, false),
        ("SELECT keyspace_name, replication, durable_writes FROM system_schema.keyspaces", "system_schema.keyspaces", 3, 0, false),
        ("SELECT keyspace_name, replication, durable_writes FROM system_schema.keyspaces where keyspace_name in ?", "system_schema.keyspaces", 3, 1, false),
        ("SELECT keyspace_name, type_name, field_names, field_types FROM system_schema.types where keyspace_name in ?", "system_schema.types", 4, 1, false),
        ("SELECT keyspace_name, table_name, column_name, kind, position, type FROM system_schema.columns where keyspace_name in ? USING TIMEOUT 30000ms", "system_schema.columns", 6, 1, true),
        ("SELECT keyspace_name, table_name FROM system_schema.tables", "system_schema.tables", 2, 0, false),
        ("SELECT keyspace_name, view_name, base_table_name FROM system_schema.views where keyspace_name in ?", "system_schema.views", 3, 1, false),
        ("SELECT keyspace_name, table_name, partitioner FROM system_schema.scylla_tables where keyspace_name in ?", "system_schema.scylla_tables", 3, 1, false),
        ("SELECT keyspace_name, initial_tablets FROM system_schema.scylla_keyspaces", "system_schema.scylla_keyspaces", 2, 0, false),
        ("SELECT keyspace_name, initial_tablets, consistency FROM system_schema.scylla_keyspaces USING TIMEOUT 30000ms", "system_schema.scylla_keyspaces", 3, 0, true),
        ("SELECT host_id, data_center, rack, schema_version, rpc_address FROM system.peers", "system.peers", 5, 0, false),
        ("SELECT * FROM system_schema.keyspaces", "system_schema.keyspaces", 0, 0, false),
        ("SELECT durable_writes, replication FROM system_schema.keyspaces WHERE keyspace_name = ?", "system_schema.keyspaces", 2, 1, false),
        ("SELECT * FROM system_schema.tables WHERE keyspace_name = ?", "system_schema.tables", 0, 1, false),
        ("SELECT * FROM system_schema.scylla_tables WHERE keyspace_name = ? AND table_name = ?", "system_schema.scylla_tables", 0, 2, false),
        ("SELECT * FROM system_schema.columns WHERE keyspace_name = ?", "system_schema.columns", 0, 1, false),
        ("SELECT * FROM system_schema.types WHERE keyspace_name = ?", "system_schema.types", 0, 1, false),
        ("SELECT * FROM system_schema.functions WHERE keyspace_name = ?", "system_schema.functions", 0, 1, false),
        ("SELECT * FROM system_schema.aggregates WHERE keyspace_name = ?", "system_schema.aggregates", 0, 1, false),
        ("SELECT * FROM system_schema.indexes WHERE keyspace_name = ?", "system_schema.indexes", 0, 1, false),
        ("SELECT * FROM system_schema.views WHERE keyspace_name = ?", "system_schema.views", 0, 1, false),
        ("SELECT * FROM system.peers WHERE peer='10.0.0.2'", "system.peers", 0, 1, false),
        ("SELECT * FROM system.peers_v2 WHERE peer='10.0.0.2' AND peer_port=7000", "system.peers_v2", 0, 2, false),
        ("SELECT peer, rpc_address, schema_version, host_id FROM system.peers", "system.peers", 4, 0, false),
        ("SELECT schema_version, host_id FROM system.local WHERE key='local'", "system.local", 2, 1, false),
        ("SELECT * FROM system_schema.triggers", "system_schema.triggers", 0, 0, false),
        ("SELECT * from system_virtual_schema.keyspaces", "system_virtual_schema.keyspaces", 0, 0, false),
        ("SELECT * from system_virtual_schema.tables", "system_virtual_schema.tables", 0, 0, false),
        ("SELECT * from system_virtual_schema.columns", "system_virtual_schema.columns", 0, 0, false),
        ("SELECT * FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = 't'", "system_schema.tables", 0, 2, false),
        ("SELECT * FROM system_schema.views WHERE keyspace_name = 'ks' AND view_name = 'v'", "system_schema.views", 0, 2, false),
        ("SELECT * FROM system_schema.types WHERE keyspace_name = 'ks' AND type_name = 'x'", "system_schema.types", 0, 2, false),
        ("SELECT * FROM system_schema.functions WHERE keyspace_name = 'ks' AND function_name = 'f' AND argument_types = ['int']", "system_schema.functions", 0, 3, false),
        ("SELECT * FROM system_schema.aggregates WHERE keyspace_name = 'ks' AND aggregate_name = 'a' AND argument_types = ['int', 'text']", "system_schema.aggregates", 0, 3, false),
        ("select * from system.local where key = 'local'", "system.local", 0, 1, false),
        ("SELECT cluster_name, release_version FROM system.local", "system.local", 2, 0, false),
    ];
    for &(text, table, nsel, nrel, timeout) in cases {
        let s = select(text);
        let (ks, name) = table.split_once('.').unwrap();
        assert_eq!(s.table, qn(Some(ks), name), "{text}");
        assert_eq!(s.selectors.len(), nsel, "{text}");
        assert_eq!(s.where_clause.len(), nrel, "{text}");
        assert_eq!(s.timeout.is_some(), timeout, "{text}");
        for sel in &s.selectors {
            assert!(matches!(sel, Selector::Column { .. }), "{text}: {sel:?}");
        }
    }
}

#[test]
fn driver_query_details() {
    let s = select("SELECT * FROM system.local WHERE key='local'");
    assert_eq!(
        s.where_clause,
        vec![rel("key", Operator::Eq, string("local"))]
    );
    let s = select("SELECT keyspace_name FROM system_schema.keyspaces where keyspace_name in ? USING TIMEOUT 30000ms");
    assert_eq!(
        s.where_clause,
        vec![Relation {
            lhs: RelationLhs::Column("keyspace_name".into()),
            op: Operator::In,
            rhs: RelationRhs::InMarker(BindMarker {
                index: 0,
                name: None
            }),
        }]
    );
    assert_eq!(
        s.timeout,
        Some(Term::Literal(Literal::Duration("30000ms".into())))
    );
    let s = select("SELECT * FROM system_schema.functions WHERE keyspace_name = 'ks' AND function_name = 'f' AND argument_types = ['int']");
    assert_eq!(
        s.where_clause[2],
        rel(
            "argument_types",
            Operator::Eq,
            Term::List(vec![string("int")])
        )
    );
    let s = select("SELECT * FROM system.peers_v2 WHERE peer='10.0.0.2' AND peer_port=7000");
    assert_eq!(
        s.where_clause[1],
        rel("peer_port", Operator::Eq, int("7000"))
    );
}

#[test]
fn tool_statements_verbatim() {
    // scylla-bench
    let Statement::CreateKeyspace(ck) = st("CREATE KEYSPACE IF NOT EXISTS scylla_bench WITH REPLICATION = { 'class' : 'NetworkTopologyStrategy', 'replication_factor' : 3 }") else { panic!() };
    assert_eq!(ck.name, "scylla_bench");
    assert!(ck.if_not_exists);
    assert_eq!(
        ck.properties,
        vec![Property {
            name: "replication".into(),
            value: OptionValue::Map(vec![
                (
                    "class".into(),
                    OptionValue::String("NetworkTopologyStrategy".into())
                ),
                ("replication_factor".into(), OptionValue::Number("3".into())),
            ]),
        }]
    );
    let Statement::CreateTable(ct) = st("CREATE TABLE IF NOT EXISTS scylla_bench.test (pk bigint, ck bigint, v blob, PRIMARY KEY(pk, ck)) WITH compression = { }") else { panic!() };
    assert_eq!(ct.name, qn(Some("scylla_bench"), "test"));
    assert_eq!(ct.partition_key, vec!["pk"]);
    assert_eq!(ct.clustering_key, vec!["ck"]);
    assert_eq!(ct.columns.len(), 3);
    assert_eq!(ct.columns[2].ty, native(N::Blob));
    assert_eq!(
        ct.properties,
        vec![Property {
            name: "compression".into(),
            value: OptionValue::Map(vec![])
        }]
    );
    let Statement::CreateTable(ct) = st("CREATE TABLE IF NOT EXISTS scylla_bench.test_counters (pk bigint, ck bigint, c1 counter, c2 counter, c3 counter, c4 counter, c5 counter, PRIMARY KEY(pk, ck)) WITH compression = { }") else { panic!() };
    assert_eq!(ct.columns[2].ty, native(N::Counter));
    assert_eq!(
        st("TRUNCATE TABLE scylla_bench.test"),
        Statement::Truncate(qn(Some("scylla_bench"), "test"))
    );
    assert_eq!(st("TRUNCATE t"), Statement::Truncate(qn(None, "t")));
    let Statement::Insert(ins) = st("INSERT INTO scylla_bench.test (pk, ck, v) VALUES (?, ?, ?)")
    else {
        panic!()
    };
    assert_eq!(ins.columns, vec!["pk", "ck", "v"]);
    assert_eq!(ins.values, vec![bind(0), bind(1), bind(2)]);
    let Statement::Update(up) = st("UPDATE scylla_bench.test_counters SET c1 = c1 + ?, c2 = c2 + ?, c3 = c3 + ?, c4 = c4 + ?, c5 = c5 + ? WHERE pk = ? AND ck = ?") else { panic!() };
    assert_eq!(up.assignments.len(), 5);
    assert_eq!(
        up.assignments[1],
        Assignment::Add {
            column: "c2".into(),
            value: bind(1)
        }
    );
    assert_eq!(up.where_clause[1], rel("ck", Operator::Eq, bind(6)));
    let s = select("SELECT pk, ck, v FROM scylla_bench.test WHERE pk = ? AND ck >= ? ORDER BY ck DESC LIMIT 100 BYPASS CACHE");
    assert_eq!(s.order_by, vec![("ck".into(), false)]);
    assert_eq!(s.limit, Some(int("100")));
    assert!(s.bypass_cache);
    let s =
        select("SELECT pk, ck, v FROM scylla_bench.test WHERE pk = ? AND ck IN (?, ?, ?) LIMIT 3");
    assert_eq!(
        s.where_clause[1].rhs,
        RelationRhs::InList(vec![bind(1), bind(2), bind(3)])
    );
    let s = select(
        "SELECT pk, ck, v FROM scylla_bench.test WHERE pk = ? AND ck >= ? AND ck < ? LIMIT 5",
    );
    assert_eq!(s.where_clause[2], rel("ck", Operator::Lt, bind(2)));
    let s = select("SELECT * FROM scylla_bench.test WHERE token(pk) >= ? AND token(pk) <= ?");
    assert_eq!(
        s.where_clause,
        vec![
            Relation {
                lhs: RelationLhs::Token(vec!["pk".into()]),
                op: Operator::Ge,
                rhs: RelationRhs::Term(bind(0))
            },
            Relation {
                lhs: RelationLhs::Token(vec!["pk".into()]),
                op: Operator::Le,
                rhs: RelationRhs::Term(bind(1))
            },
        ]
    );
    let Statement::Batch(b) = st("BEGIN UNLOGGED BATCH INSERT INTO scylla_bench.test (pk, ck, v) VALUES (?, ?, ?); INSERT INTO scylla_bench.test (pk, ck, v) VALUES (?, ?, ?); APPLY BATCH") else { panic!() };
    assert_eq!(b.kind, BatchKind::Unlogged);
    assert_eq!(b.statements.len(), 2);
    let BatchStatement::Insert(second) = &b.statements[1] else {
        panic!()
    };
    assert_eq!(second.values[0], bind(3));

    // cassandra-stress
    let Statement::CreateKeyspace(ck) = st("CREATE KEYSPACE IF NOT EXISTS \"keyspace1\" WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '1'} AND durable_writes = true;\n") else { panic!() };
    assert_eq!(ck.name, "keyspace1");
    assert_eq!(
        ck.properties[1],
        Property {
            name: "durable_writes".into(),
            value: OptionValue::Bool(true)
        }
    );
    assert_eq!(st("USE \"keyspace1\""), Statement::Use("keyspace1".into()));
    assert_eq!(st("USE \"Ks\""), Statement::Use("Ks".into()));
    assert_eq!(st("use KS"), Statement::Use("ks".into()));
    let Statement::CreateTable(ct) = st("CREATE TABLE IF NOT EXISTS standard1 (key blob PRIMARY KEY , \"C0\" blob, \"C1\" blob, \"C2\" blob, \"C3\" blob, \"C4\" blob) WITH compression = {}") else { panic!() };
    assert_eq!(ct.partition_key, vec!["key"]);
    assert!(ct.columns[0].primary_key);
    assert_eq!(ct.columns[1].name, "C0");
    let Statement::Update(up) = st("UPDATE \"standard1\" SET \"C0\" = ?,\"C1\" = ?,\"C2\" = ?,\"C3\" = ?,\"C4\" = ? WHERE KEY=?") else { panic!() };
    assert_eq!(up.table, qn(None, "standard1"));
    assert_eq!(
        up.assignments[0],
        Assignment::Set {
            column: "C0".into(),
            value: bind(0)
        }
    );
    assert_eq!(up.where_clause, vec![rel("key", Operator::Eq, bind(5))]);
    let s = select("SELECT \"C0\",\"C1\",\"C2\",\"C3\",\"C4\" FROM \"standard1\" WHERE KEY=?");
    assert_eq!(s.selectors[4], col("C4"));
    let Statement::Update(up) =
        st("UPDATE \"counter1\" SET \"C0\"=\"C0\"+?,\"C1\"=\"C1\"+? WHERE KEY=?")
    else {
        panic!()
    };
    assert_eq!(
        up.assignments[1],
        Assignment::Add {
            column: "C1".into(),
            value: bind(1)
        }
    );
    // gocql / cqlsh
    assert_eq!(
        st("DESCRIBE KEYSPACE ks WITH INTERNALS"),
        Statement::Describe(Describe::Keyspace {
            name: Some("ks".into()),
            only: false,
            with_internals: true
        })
    );
}

#[test]
fn select_forms() {
    let s = select("SELECT JSON DISTINCT pk FROM t");
    assert!(s.json && s.distinct);
    assert_eq!(s.selectors, vec![col("pk")]);
    // Unreserved keywords as column names.
    let s = select("SELECT json, distinct, key, ttl, writetime, count, type, values, filtering, clustering FROM t");
    assert!(!s.json && !s.distinct);
    assert_eq!(s.selectors.len(), 10);
    assert_eq!(s.selectors[0], col("json"));
    let s = select("SELECT json FROM t");
    assert!(!s.json);
    let s = select("SELECT a, b AS x, token(pk), writetime(c), ttl(c), count(*), count(1), CAST(x AS text), max(v) AS m FROM ks.t");
    assert_eq!(
        s.selectors[1],
        Selector::Column {
            name: "b".into(),
            alias: Some("x".into())
        }
    );
    assert_eq!(
        s.selectors[2],
        Selector::Function {
            name: "token".into(),
            args: vec![col("pk")],
            star: false,
            alias: None
        }
    );
    assert_eq!(
        s.selectors[5],
        Selector::Function {
            name: "count".into(),
            args: vec![],
            star: true,
            alias: None
        }
    );
    assert_eq!(
        s.selectors[6],
        Selector::Function {
            name: "count".into(),
            args: vec![Selector::Term(int("1"))],
            star: false,
            alias: None
        }
    );
    assert_eq!(
        s.selectors[7],
        Selector::Function {
            name: "castastext".into(),
            args: vec![col("x")],
            star: false,
            alias: None
        }
    );
    assert_eq!(
        s.selectors[8],
        Selector::Function {
            name: "max".into(),
            args: vec![col("v")],
            star: false,
            alias: Some("m".into())
        }
    );
    let s = select("SELECT pk, count(*) FROM ks.t WHERE pk IN (1, 2) GROUP BY pk ORDER BY ck ASC, d DESC PER PARTITION LIMIT 2 LIMIT ? ALLOW FILTERING BYPASS CACHE USING TIMEOUT ?");
    assert_eq!(s.group_by, vec!["pk"]);
    assert_eq!(s.order_by, vec![("ck".into(), true), ("d".into(), false)]);
    assert_eq!(s.per_partition_limit, Some(int("2")));
    assert_eq!(s.limit, Some(bind(0)));
    assert!(s.allow_filtering && s.bypass_cache);
    assert_eq!(s.timeout, Some(bind(1)));
    let s = select("SELECT * FROM t PER PARTITION LIMIT 2");
    assert_eq!(s.per_partition_limit, Some(int("2")));
}

#[test]
fn relation_forms() {
    let s = select("SELECT * FROM t WHERE (c1, c2) > (1, 2) AND (c1, c2) IN ((1, 2), (3, 4)) AND (c1,c2) IN ? AND token(a, b) > ? AND token(a) <= token(?) AND m CONTAINS ? AND m CONTAINS KEY 'k' AND c != 1 AND m['k'] = 5 AND x LIKE 'a%' AND z IN ()");
    let w = &s.where_clause;
    let tup = |a: &str, b: &str| RelationLhs::Tuple(vec![a.into(), b.into()]);
    assert_eq!(
        w[0],
        Relation {
            lhs: tup("c1", "c2"),
            op: Operator::Gt,
            rhs: RelationRhs::Term(Term::Tuple(vec![int("1"), int("2")]))
        }
    );
    assert_eq!(
        w[1].rhs,
        RelationRhs::InList(vec![
            Term::Tuple(vec![int("1"), int("2")]),
            Term::Tuple(vec![int("3"), int("4")])
        ])
    );
    assert_eq!(
        w[2],
        Relation {
            lhs: tup("c1", "c2"),
            op: Operator::In,
            rhs: RelationRhs::InMarker(BindMarker {
                index: 0,
                name: None
            })
        }
    );
    assert_eq!(w[3].lhs, RelationLhs::Token(vec!["a".into(), "b".into()]));
    assert_eq!(w[3].rhs, RelationRhs::Term(bind(1)));
    assert_eq!(
        w[4].rhs,
        RelationRhs::Term(Term::Function {
            name: "token".into(),
            args: vec![bind(2)]
        })
    );
    assert_eq!(w[5], rel("m", Operator::Contains, bind(3)));
    assert_eq!(w[6], rel("m", Operator::ContainsKey, string("k")));
    assert_eq!(w[7], rel("c", Operator::Neq, int("1")));
    assert_eq!(
        w[8],
        Relation {
            lhs: RelationLhs::Element("m".into(), string("k")),
            op: Operator::Eq,
            rhs: RelationRhs::Term(int("5"))
        }
    );
    assert_eq!(w[9], rel("x", Operator::Like, string("a%")));
    assert_eq!(w[10].rhs, RelationRhs::InList(vec![]));
    assert_eq!(binds("SELECT * FROM t WHERE (c1,c2) IN ? AND token(a, b) > ? AND token(a) <= token(?) AND m CONTAINS ?"), 4);
}

#[test]
fn insert_forms() {
    let Statement::Insert(ins) = st("INSERT INTO ks.t (a, b) VALUES (?, 1) IF NOT EXISTS USING TTL 86400 AND TIMESTAMP 123 AND TIMEOUT 10ms;") else { panic!() };
    assert!(ins.if_not_exists && !ins.json);
    assert_eq!(ins.values, vec![bind(0), int("1")]);
    assert_eq!(
        ins.using,
        Using {
            ttl: Some(int("86400")),
            timestamp: Some(int("123")),
            timeout: Some(Term::Literal(Literal::Duration("10ms".into()))),
        }
    );
    let Statement::Insert(ins) = st("INSERT INTO t (a) VALUES (:v) USING TTL :ttl") else {
        panic!()
    };
    assert_eq!(
        ins.values[0],
        Term::Bind(BindMarker {
            index: 0,
            name: Some("v".into())
        })
    );
    assert_eq!(
        ins.using.ttl,
        Some(Term::Bind(BindMarker {
            index: 1,
            name: Some("ttl".into())
        }))
    );
    let Statement::Insert(ins) = st("INSERT INTO t JSON '{\"a\": 1}'") else {
        panic!()
    };
    assert!(ins.json);
    assert_eq!(ins.values, vec![string("{\"a\": 1}")]);
    let Statement::Insert(ins) = st("INSERT INTO t (a, b, c, d, e, f, g, h) VALUES ([1, 2], {'x', 'y'}, {'k': 1.5}, (1, 'a'), 0xcafe, 123e4567-e89b-12d3-a456-426614174000, now(), (bigint) 5)") else { panic!() };
    assert_eq!(ins.values[0], Term::List(vec![int("1"), int("2")]));
    assert_eq!(ins.values[1], Term::Set(vec![string("x"), string("y")]));
    assert_eq!(
        ins.values[2],
        Term::Map(vec![(
            string("k"),
            Term::Literal(Literal::Float("1.5".into()))
        )])
    );
    assert_eq!(ins.values[3], Term::Tuple(vec![int("1"), string("a")]));
    assert_eq!(
        ins.values[4],
        Term::Literal(Literal::Blob(vec![0xca, 0xfe]))
    );
    let Term::Literal(Literal::Uuid(u)) = &ins.values[5] else {
        panic!()
    };
    assert_eq!(u[0..2], [0x12, 0x3e]);
    assert_eq!(
        ins.values[6],
        Term::Function {
            name: "now".into(),
            args: vec![]
        }
    );
    assert_eq!(
        ins.values[7],
        Term::Cast(native(N::Bigint), Box::new(int("5")))
    );
    let Statement::Insert(ins) =
        st("INSERT INTO t (a, b, c, d) VALUES (true, NULL, -Infinity, $$it's$$)")
    else {
        panic!()
    };
    assert_eq!(ins.values[0], Term::Literal(Literal::Bool(true)));
    assert_eq!(ins.values[1], Term::Literal(Literal::Null));
    assert_eq!(
        ins.values[2],
        Term::Literal(Literal::Float("-Infinity".into()))
    );
    assert_eq!(ins.values[3], string("it's"));
    let Statement::Insert(ins) = st("INSERT INTO t (a) VALUES (1) USING TTL 5 IF NOT EXISTS")
    else {
        panic!()
    };
    assert!(ins.if_not_exists);
    assert_eq!(ins.using.ttl, Some(int("5")));
    assert!(parse("INSERT INTO t (a) VALUES (1) USING TTL 5 USING TIMESTAMP 6").is_err());
    assert!(parse("INSERT INTO t (a) VALUES (1) USING TTL 5 AND TTL 6").is_err());
    let e = parse("INSERT INTO t (a, b) VALUES (1)").unwrap_err();
    assert_eq!(e.message, "Unmatched column names/values");
}

#[test]
fn update_forms() {
    let Statement::Update(up) = st("UPDATE ks.t USING TTL 5 AND TIMESTAMP ? SET a = ?, b = b + ?, c = [1] + c, m['k'] = 'v', l[0] = 1, s = s - {2}, n = n -1, q += 3, r -= ? WHERE k = ? IF a = 1 AND b > 2") else { panic!() };
    assert_eq!(up.using.ttl, Some(int("5")));
    assert_eq!(up.using.timestamp, Some(bind(0)));
    assert_eq!(
        up.assignments,
        vec![
            Assignment::Set {
                column: "a".into(),
                value: bind(1)
            },
            Assignment::Add {
                column: "b".into(),
                value: bind(2)
            },
            Assignment::Prepend {
                column: "c".into(),
                value: Term::List(vec![int("1")])
            },
            Assignment::SetElement {
                column: "m".into(),
                key: string("k"),
                value: string("v")
            },
            Assignment::SetElement {
                column: "l".into(),
                key: int("0"),
                value: int("1")
            },
            Assignment::Subtract {
                column: "s".into(),
                value: Term::Set(vec![int("2")])
            },
            Assignment::Subtract {
                column: "n".into(),
                value: int("1")
            },
            Assignment::Add {
                column: "q".into(),
                value: int("3")
            },
            Assignment::Subtract {
                column: "r".into(),
                value: bind(3)
            },
        ]
    );
    assert_eq!(
        up.condition,
        Some(Condition::Columns(vec![
            rel("a", Operator::Eq, int("1")),
            rel("b", Operator::Gt, int("2"))
        ]))
    );
    let Statement::Update(up) = st("UPDATE t SET a = a + 1 WHERE k = 1 IF EXISTS") else {
        panic!()
    };
    assert_eq!(up.condition, Some(Condition::Exists));
    let Statement::Update(up) = st("UPDATE t SET v = 'x' WHERE k = 1 IF m['a'] IN ('x', 'y')")
    else {
        panic!()
    };
    let Some(Condition::Columns(c)) = up.condition else {
        panic!()
    };
    assert_eq!(c[0].lhs, RelationLhs::Element("m".into(), string("a")));
    assert_eq!(c[0].op, Operator::In);
    let Statement::Update(up) = st("UPDATE t SET \"A\" = \"A\" + 1 WHERE k = 1") else {
        panic!()
    };
    assert_eq!(
        up.assignments[0],
        Assignment::Add {
            column: "A".into(),
            value: int("1")
        }
    );
    // A quoted "a" is not the column A.
    assert!(parse("UPDATE t SET \"A\" = a + 1 WHERE k = 1").is_err());
}

#[test]
fn update_with_other_column_on_rhs_fails() {
    let e = parse("UPDATE t SET a = b + 1 WHERE k = 1").unwrap_err();
    assert_eq!(e.column, 17, "{e}");
    assert_eq!(
        e.message,
        "Only expressions of the form X = X + <value> are supported"
    );
    // A function call is a term, not a column.
    let Statement::Update(up) = st("UPDATE t SET a = now() WHERE k = 1") else {
        panic!()
    };
    assert_eq!(
        up.assignments[0],
        Assignment::Set {
            column: "a".into(),
            value: Term::Function {
                name: "now".into(),
                args: vec![]
            }
        }
    );
}

#[test]
fn delete_and_batch_forms() {
    let Statement::Delete(d) =
        st("DELETE a, m['k'], l[1] FROM ks.t USING TIMESTAMP 99 WHERE k = ? AND c > 3 IF EXISTS")
    else {
        panic!()
    };
    assert_eq!(d.targets.len(), 3);
    assert_eq!(
        d.targets[1],
        DeleteTarget {
            column: "m".into(),
            element: Some(string("k"))
        }
    );
    assert_eq!(d.using.timestamp, Some(int("99")));
    assert_eq!(d.where_clause[1], rel("c", Operator::Gt, int("3")));
    assert_eq!(d.condition, Some(Condition::Exists));
    let Statement::Delete(d) = st("DELETE FROM t WHERE k = 1 IF v = 2") else {
        panic!()
    };
    assert!(d.targets.is_empty());
    assert!(matches!(d.condition, Some(Condition::Columns(_))));
    let Statement::Batch(b) = st("BEGIN BATCH USING TIMESTAMP 5 INSERT INTO t (a) VALUES (?) UPDATE t SET a = ? WHERE k = ?; DELETE FROM t WHERE k = ?; APPLY BATCH;") else { panic!() };
    assert_eq!(b.kind, BatchKind::Logged);
    assert_eq!(b.using.timestamp, Some(int("5")));
    assert_eq!(b.statements.len(), 3);
    assert!(
        matches!(&b.statements[2], BatchStatement::Delete(d) if d.where_clause[0] == rel("k", Operator::Eq, bind(3)))
    );
    assert_eq!(
        binds("BEGIN COUNTER BATCH UPDATE c SET n = n + ? WHERE k = ? APPLY BATCH"),
        2
    );
    let Statement::Batch(b) =
        st("BEGIN COUNTER BATCH UPDATE c SET n = n + 1 WHERE k = 1 APPLY BATCH")
    else {
        panic!()
    };
    assert_eq!(b.kind, BatchKind::Counter);
    assert!(parse("BEGIN BATCH SELECT * FROM t APPLY BATCH").is_err());
}

#[test]
fn ddl_forms() {
    let Statement::CreateTable(ct) = st("CREATE TABLE ks.t (a int, b text, c timestamp, d frozen<map<text, list<int>>>, s int STATIC, e tuple<int, text>, f set<uuid>, PRIMARY KEY ((a, b), c, e)) WITH CLUSTERING ORDER BY (c DESC, e ASC) AND COMPACT STORAGE AND comment = 'x' AND gc_grace_seconds = 10 AND per_partition_rate_limit = {'max_reads_per_second': 100} AND bloom_filter_fp_chance = 0.01 AND caching = {'keys': 'ALL'}") else { panic!() };
    assert!(!ct.if_not_exists);
    assert_eq!(ct.partition_key, vec!["a", "b"]);
    assert_eq!(ct.clustering_key, vec!["c", "e"]);
    assert_eq!(
        ct.clustering_order,
        vec![("c".into(), false), ("e".into(), true)]
    );
    assert!(ct.compact_storage);
    assert_eq!(
        ct.columns[3].ty,
        CqlType::parse("frozen<map<text, list<int>>>").unwrap()
    );
    assert!(ct.columns[4].is_static);
    assert_eq!(
        ct.columns[5].ty,
        CqlType::Tuple(vec![native(N::Int), native(N::Text)])
    );
    assert_eq!(ct.properties.len(), 5);
    assert_eq!(
        ct.properties[2].value,
        OptionValue::Map(vec![(
            "max_reads_per_second".into(),
            OptionValue::Number("100".into())
        )])
    );
    assert_eq!(ct.properties[3].value, OptionValue::Number("0.01".into()));
    let Statement::CreateTable(ct) = st("CREATE TABLE t (k int, v varchar, PRIMARY KEY (k))")
    else {
        panic!()
    };
    assert_eq!(ct.columns[1].ty, native(N::Text));
    assert!(ct.clustering_key.is_empty());
    assert!(parse("CREATE TABLE t (k int, v int)").is_err());
    assert!(parse("CREATE TABLE t (k int PRIMARY KEY, v int PRIMARY KEY)").is_err());
    assert!(parse("CREATE TABLE t (k address PRIMARY KEY)").is_err());

    let alter = |t: &str| match st(t) {
        Statement::AlterTable(a) => a,
        other => panic!("{other:?}"),
    };
    let add = |n: &str, t: N| ColumnDefinition {
        name: n.into(),
        ty: native(t),
        is_static: false,
        primary_key: false,
    };
    assert_eq!(
        alter("ALTER TABLE t ADD c int").action,
        AlterTableAction::Add(vec![add("c", N::Int)])
    );
    assert_eq!(
        alter("ALTER TABLE t ADD c int, d text").action,
        AlterTableAction::Add(vec![add("c", N::Int), add("d", N::Text)])
    );
    assert_eq!(
        alter("ALTER TABLE ks.t ADD (c int, d text)").action,
        AlterTableAction::Add(vec![add("c", N::Int), add("d", N::Text)])
    );
    assert_eq!(
        alter("ALTER TABLE t DROP c").action,
        AlterTableAction::Drop(vec!["c".into()])
    );
    assert_eq!(
        alter("ALTER TABLE t DROP (c, d)").action,
        AlterTableAction::Drop(vec!["c".into(), "d".into()])
    );
    assert_eq!(
        alter("ALTER TABLE t RENAME a TO b AND c TO d").action,
        AlterTableAction::Rename(vec![("a".into(), "b".into()), ("c".into(), "d".into())])
    );
    assert_eq!(
        alter("ALTER TABLE t ALTER c TYPE blob").action,
        AlterTableAction::AlterType("c".into(), native(N::Blob))
    );
    let a = alter("ALTER TABLE IF EXISTS t WITH per_partition_rate_limit = {'max_reads_per_second': 100, 'max_writes_per_second': 50}");
    assert!(a.if_exists);
    let AlterTableAction::With(props) = a.action else {
        panic!()
    };
    assert_eq!(props[0].name, "per_partition_rate_limit");

    assert_eq!(
        st("DROP TABLE IF EXISTS ks.t"),
        Statement::DropTable(Drop {
            name: qn(Some("ks"), "t"),
            if_exists: true
        })
    );
    assert_eq!(
        st("DROP KEYSPACE ks"),
        Statement::DropKeyspace(Drop {
            name: qn(None, "ks"),
            if_exists: false
        })
    );
    let Statement::AlterKeyspace(ak) = st("ALTER KEYSPACE ks WITH durable_writes = false") else {
        panic!()
    };
    assert_eq!(ak.properties[0].value, OptionValue::Bool(false));
    let Statement::CreateTable(ct) = st("CREATE TABLE ks.t (k int PRIMARY KEY) WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18 AND extensions = {'x': 0x01, \"Q\": 'v'}") else { panic!() };
    assert_eq!(
        ct.properties[0].value,
        OptionValue::String("5a1c395e-b41f-11e5-9f22-ba0be0483c18".into())
    );
    assert_eq!(
        ct.properties[1].value,
        OptionValue::Map(vec![
            ("x".into(), OptionValue::String("0x01".into())),
            ("Q".into(), OptionValue::String("v".into()))
        ])
    );
    let Statement::CreateKeyspace(ck) = st("CREATE KEYSPACE ks WITH replication = {'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': '2'}") else { panic!() };
    let OptionValue::Map(m) = &ck.properties[0].value else {
        panic!()
    };
    assert_eq!(m.len(), 3);
}

#[test]
fn describe_forms() {
    let d = |t: &str| match st(t) {
        Statement::Describe(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d("DESCRIBE CLUSTER"), Describe::Cluster);
    assert_eq!(d("DESC SCHEMA"), Describe::Schema { full: false });
    assert_eq!(d("DESCRIBE FULL SCHEMA"), Describe::Schema { full: true });
    assert_eq!(d("describe keyspaces"), Describe::Keyspaces);
    assert_eq!(
        d("DESCRIBE KEYSPACE"),
        Describe::Keyspace {
            name: None,
            only: false,
            with_internals: false
        }
    );
    assert_eq!(
        d("DESCRIBE ONLY KEYSPACE \"Ks\""),
        Describe::Keyspace {
            name: Some("Ks".into()),
            only: true,
            with_internals: false
        }
    );
    assert_eq!(d("DESCRIBE TABLES"), Describe::Tables);
    assert_eq!(
        d("DESCRIBE TABLE ks.t"),
        Describe::Table {
            name: qn(Some("ks"), "t"),
            with_internals: false
        }
    );
    assert_eq!(
        d("DESC TABLE t WITH INTERNALS;"),
        Describe::Table {
            name: qn(None, "t"),
            with_internals: true
        }
    );
    assert_eq!(d("DESCRIBE TYPES"), Describe::Types);
    assert_eq!(d("DESCRIBE FUNCTIONS"), Describe::Functions);
    assert_eq!(d("DESCRIBE AGGREGATES"), Describe::Aggregates);
    assert_eq!(
        d("DESCRIBE ks.t"),
        Describe::Name {
            name: qn(Some("ks"), "t"),
            with_internals: false
        }
    );
    assert_eq!(
        d("DESCRIBE mykeyspace"),
        Describe::Name {
            name: qn(None, "mykeyspace"),
            with_internals: false
        }
    );
}

#[test]
fn bind_markers_are_numbered_in_text_order() {
    let text = "UPDATE t USING TTL ? SET a = ?, m[?] = ? WHERE k = ? AND c IN ? IF v = :x";
    assert_eq!(binds(text), 7);
    let Statement::Update(up) = st(text) else {
        panic!()
    };
    assert_eq!(up.using.ttl, Some(bind(0)));
    assert_eq!(
        up.assignments[1],
        Assignment::SetElement {
            column: "m".into(),
            key: bind(2),
            value: bind(3)
        }
    );
    assert_eq!(
        up.where_clause[1].rhs,
        RelationRhs::InMarker(BindMarker {
            index: 5,
            name: None
        })
    );
    assert_eq!(binds("SELECT * FROM t"), 0);
}

#[test]
fn syntax_errors_carry_positions() {
    let e = parse("SELECT * FORM t").unwrap_err();
    assert_eq!((e.position, e.line, e.column), (9, 1, 9));
    assert_eq!(
        e.to_string(),
        "line 1:9 mismatched input 'FORM' expecting FROM (SELECT * [FORM] t)"
    );
    let e = parse("SELECT *\nFROM t\nWHERE k = = 1").unwrap_err();
    assert_eq!((e.line, e.column), (3, 10));
    assert_eq!(e.found, "=");
    let e = parse("SELECT * FROM t WHERE").unwrap_err();
    assert_eq!(e.found, "<EOF>");
    assert_eq!(e.position, 21);
    let e = parse("SELEC * FROM t").unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 1:0 no viable alternative at input 'SELEC' ([SELEC] * FROM...)"
    );
    let e = parse("SELECT a, b, c, d, e, f, g FROM t WHERE k == 1 AND x = 2").unwrap_err();
    assert_eq!(e.snippet, "e, f, g FROM t WHERE k =[=] 1 AND...");
    let e = parse("SELECT * FROM t WHERE").unwrap_err();
    assert_eq!(e.snippet, "SELECT * FROM t WHERE[]");
    let e = parse("SELECT 'abc").unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 1:7 unterminated string at input ''abc'"
    );
    let e = parse("SELECT * FROM t LIMIT 1 junk").unwrap_err();
    assert_eq!((e.column, e.found.as_str()), (24, "junk"));
    let e = parse("SELECT 'abc FROM t").unwrap_err();
    assert_eq!((e.column, e.message), (7, "unterminated string"));
    let e = parse("SELECT * FROM select").unwrap_err();
    assert_eq!(e.column, 14, "reserved keyword as a table name");
    assert!(parse("SELECT * FROM \"select\"").is_ok());
    let e = parse("INSERT INTO t (a) VALUES (0xabc)").unwrap_err();
    assert_eq!(e.column, 26);
    let e = parse("SELECT * FROM t WHERE k = 'é' AND").unwrap_err();
    assert_eq!(e.column, 33, "columns count characters, not bytes");
    assert_eq!(e.position, 34);
    assert!(parse("").is_err());
    assert!(parse(";").is_err());
}

#[test]
fn nesting_is_bounded() {
    let deep = format!(
        "INSERT INTO t (a) VALUES ({}1{})",
        "[".repeat(200),
        "]".repeat(200)
    );
    let e = parse(&deep).unwrap_err();
    assert_eq!(e.message, "nesting too deep");
    let ok = format!(
        "INSERT INTO t (a) VALUES ({}1{})",
        "[".repeat(20),
        "]".repeat(20)
    );
    assert!(parse(&ok).is_ok());
    let deep_type = format!(
        "CREATE TABLE t (k int PRIMARY KEY, v {}int{})",
        "list<".repeat(100),
        ">".repeat(100)
    );
    assert!(parse(&deep_type).is_err());
}

#[test]
fn scripts_split_on_semicolons() {
    let s = parse_script("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy'};\n-- comment\nUSE ks;; SELECT * FROM t WHERE k = ?").unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s[1].statement, Statement::Use("ks".into()));
    assert_eq!(s[2].bind_count, 1);
    assert!(parse_script("USE ks SELECT * FROM t").is_err());
    assert_eq!(parse_script("  ").unwrap(), vec![]);
}

fn create_role(text: &str) -> CreateRole {
    match st(text) {
        Statement::CreateRole(c) => c,
        other => panic!("not CREATE ROLE: {other:?}"),
    }
}

#[test]
fn create_role_with_every_option() {
    let c = create_role(
        "CREATE ROLE IF NOT EXISTS Alice WITH PASSWORD = 'pa''ss' AND LOGIN = true \
         AND SUPERUSER = false AND OPTIONS = {'k': 'v'}",
    );
    assert_eq!(c.name, "alice");
    assert!(c.if_not_exists);
    assert!(!c.user_syntax);
    assert_eq!(c.options.password.as_deref(), Some("pa'ss"));
    assert_eq!(c.options.login, Some(true));
    assert_eq!(c.options.superuser, Some(false));
    assert_eq!(
        c.options.options,
        Some(vec![("k".to_string(), OptionValue::String("v".into()))])
    );
    let c = create_role("CREATE ROLE 'Bob'");
    assert_eq!(c.name, "Bob");
    assert_eq!(c.options, RoleOptions::default());
    let c =
        create_role("create role \"Carol\" with hashed password = '$2a$10$x' and login = false");
    assert_eq!(c.name, "Carol");
    assert_eq!(c.options.hashed_password.as_deref(), Some("$2a$10$x"));
    assert_eq!(c.options.login, Some(false));
}

#[test]
fn role_option_errors() {
    assert!(parse("CREATE ROLE a WITH PASSWORD = 'x' AND PASSWORD = 'y'").is_err());
    assert!(parse("CREATE ROLE a WITH LOGIN = 'yes'").is_err());
    assert!(parse("CREATE ROLE a WITH COLOR = 'red'").is_err());
    assert!(parse("CREATE ROLE a WITH OPTIONS = 'x'").is_err());
    assert!(parse("CREATE ROLE select").is_err());
    assert!(parse("CREATE ROLE").is_err());
}

#[test]
fn create_and_alter_user() {
    let c = create_role("CREATE USER IF NOT EXISTS bob WITH PASSWORD 'secret' SUPERUSER");
    assert!(c.user_syntax);
    assert_eq!(c.name, "bob");
    assert_eq!(c.options.password.as_deref(), Some("secret"));
    assert_eq!(c.options.login, Some(true));
    assert_eq!(c.options.superuser, Some(true));
    let c = create_role("CREATE USER carl");
    assert_eq!(c.options.superuser, Some(false));
    assert_eq!(c.options.login, Some(true));
    let Statement::AlterRole(a) = st("ALTER USER bob WITH PASSWORD 'new' NOSUPERUSER") else {
        panic!("not ALTER");
    };
    assert_eq!(a.name, "bob");
    assert_eq!(a.options.password.as_deref(), Some("new"));
    assert_eq!(a.options.superuser, Some(false));
    assert_eq!(a.options.login, None);
}

#[test]
fn alter_drop_list_roles() {
    let Statement::AlterRole(a) =
        st("ALTER ROLE IF EXISTS r WITH SUPERUSER = true AND LOGIN = true")
    else {
        panic!("not ALTER ROLE");
    };
    assert!(a.if_exists);
    assert_eq!(a.options.superuser, Some(true));
    assert_eq!(a.options.login, Some(true));
    assert_eq!(
        st("DROP ROLE IF EXISTS r;"),
        Statement::DropRole(DropRole {
            name: "r".into(),
            if_exists: true
        })
    );
    assert_eq!(
        st("DROP USER 'R'"),
        Statement::DropRole(DropRole {
            name: "R".into(),
            if_exists: false
        })
    );
    assert_eq!(
        st("LIST ROLES"),
        Statement::ListRoles(ListRoles {
            of: None,
            recursive: true,
            users: false
        })
    );
    assert_eq!(
        st("LIST ROLES OF alice NORECURSIVE"),
        Statement::ListRoles(ListRoles {
            of: Some("alice".into()),
            recursive: false,
            users: false
        })
    );
    assert_eq!(
        st("list users"),
        Statement::ListRoles(ListRoles {
            of: None,
            recursive: true,
            users: true
        })
    );
}

#[test]
fn grant_and_revoke_permissions_on_every_resource() {
    let Statement::GrantPermissions(g) = st("GRANT SELECT ON ALL KEYSPACES TO reader") else {
        panic!("not GRANT");
    };
    assert_eq!(g.permissions, vec![Permission::Select]);
    assert!(!g.all);
    assert_eq!(g.resource, Resource::AllKeyspaces);
    assert_eq!(g.role, "reader");
    let Statement::GrantPermissions(g) = st("GRANT MODIFY PERMISSION ON KEYSPACE ks TO w") else {
        panic!("not GRANT");
    };
    assert_eq!(g.resource, Resource::Keyspace("ks".into()));
    let Statement::GrantPermissions(g) = st("GRANT ALL PERMISSIONS ON TABLE ks.t TO 'Admin'")
    else {
        panic!("not GRANT");
    };
    assert!(g.all);
    assert_eq!(g.permissions, Permission::ALL.to_vec());
    assert_eq!(g.resource, Resource::Table(qn(Some("ks"), "t")));
    assert_eq!(g.role, "Admin");
    let Statement::GrantPermissions(g) = st("GRANT ALL ON t TO x") else {
        panic!("not GRANT");
    };
    assert_eq!(g.resource, Resource::Table(qn(None, "t")));
    let Statement::RevokePermissions(r) =
        st("REVOKE CREATE, ALTER, DROP, AUTHORIZE ON ALL ROLES FROM x")
    else {
        panic!("not REVOKE");
    };
    assert_eq!(
        r.permissions,
        vec![
            Permission::Create,
            Permission::Alter,
            Permission::Drop,
            Permission::Authorize
        ]
    );
    assert_eq!(r.resource, Resource::AllRoles);
    let Statement::RevokePermissions(r) = st("REVOKE DESCRIBE ON ROLE bob FROM x") else {
        panic!("not REVOKE");
    };
    assert_eq!(r.resource, Resource::Role("bob".into()));
    assert!(parse("GRANT SELECT ON ALL TABLES TO x").is_err());
    assert!(parse("GRANT SELECT ks.t TO x").is_err());
    assert!(parse("GRANT SELECT ON ks.t x").is_err());
    assert!(parse("REVOKE SELECT ON ks.t TO x").is_err());
}

#[test]
fn grant_and_revoke_roles() {
    assert_eq!(
        st("GRANT reader TO alice"),
        Statement::GrantRole(RoleMembership {
            role: "reader".into(),
            grantee: "alice".into()
        })
    );
    assert_eq!(
        st("REVOKE 'Reader' FROM \"Alice\""),
        Statement::RevokeRole(RoleMembership {
            role: "Reader".into(),
            grantee: "Alice".into()
        })
    );
    assert!(parse("GRANT reader alice").is_err());
}

#[test]
fn list_permissions() {
    assert_eq!(
        st("LIST ALL PERMISSIONS"),
        Statement::ListPermissions(ListPermissions {
            permissions: Permission::ALL.to_vec(),
            resource: None,
            of: None,
            recursive: true
        })
    );
    assert_eq!(
        st("LIST SELECT ON KEYSPACE ks OF bob NORECURSIVE"),
        Statement::ListPermissions(ListPermissions {
            permissions: vec![Permission::Select],
            resource: Some(Resource::Keyspace("ks".into())),
            of: Some("bob".into()),
            recursive: false
        })
    );
    assert_eq!(
        st("LIST ALL OF bob"),
        Statement::ListPermissions(ListPermissions {
            permissions: Permission::ALL.to_vec(),
            resource: None,
            of: Some("bob".into()),
            recursive: true
        })
    );
    assert!(parse("LIST ROLES OF").is_err());
    assert!(parse("LIST nothing").is_err());
}

proptest! {
    #[test]
    fn parser_never_panics_on_arbitrary_text(s in "\\PC{0,80}") {
        let _ = parse(&s);
        let _ = parse_script(&s);
    }

    #[test]
    fn parser_never_panics_on_cql_shaped_text(
        words in proptest::collection::vec(
            proptest::sample::select(vec![
                "SELECT", "*", "FROM", "t", "WHERE", "k", "=", "?", "AND", "(", ")", "[", "]", "{", "}",
                ",", ":", "'x'", "1", "-1", "1.5", "0xab", "IN", "token", "UPDATE", "SET", "+", "-",
                "INSERT", "INTO", "VALUES", "IF", "NOT", "EXISTS", "USING", "TTL", "TIMEOUT", "10ms",
                "CREATE", "TABLE", "PRIMARY", "KEY", "list", "<", ">", "int", "frozen", "WITH", "BEGIN",
                "BATCH", "APPLY", "DESCRIBE", "KEYSPACE", ";", ".", "DELETE", "CAST", "AS", "\"Q\"", "$$d$$",
                "ROLE", "USER", "GRANT", "REVOKE", "LIST", "ROLES", "ALL", "ON", "TO", "OF", "PASSWORD",
                "LOGIN", "SUPERUSER", "KEYSPACES", "MODIFY", "PERMISSIONS", "NORECURSIVE", "ALTER", "DROP",
            ]),
            0..30,
        )
    ) {
        let text = words.join(" ");
        if let Ok(p) = parse(&text) {
            // Every `?` is a marker (`: name` adds named ones).
            prop_assert!(p.bind_count >= text.matches('?').count());
        }
    }
}
