"""Sets and maps bound by the Python driver are stored in CQL order, as Cassandra does: a
Python set is serialized in hash order and a dict in insertion order, yet the server keeps
set elements and map keys sorted by their type and unique, so a bound set and the same set
written as a literal are one clustering key."""

import json

import pytest
from cassandra.query import BatchStatement, BatchType


@pytest.fixture(scope="module")
def session(cql_session):
    with cql_session(
        "pycanon",
        "CREATE TABLE IF NOT EXISTS pycanon.c ("
        " k int, fs frozen<set<int>>, s set<int>, m map<int, text>, PRIMARY KEY (k, fs))",
        use_keyspace=True,
    ) as s:
        yield s


def stored(session, k):
    """The rows of partition `k` as the server orders and serializes them. SELECT JSON is
    text the server writes, so it shows the stored element order; the driver would sort a
    set it decodes (`sortedset`) and hide it."""
    rows = session.execute(f"SELECT JSON fs, s, m FROM c WHERE k = {k}")
    # Objects as lists of pairs, so that a map's key order is compared too.
    return [dict(json.loads(r[0], object_pairs_hook=list)) for r in rows]


def test_bound_python_set_and_dict_come_back_in_cql_order(session):
    ins = session.prepare("INSERT INTO c (k, fs, s, m) VALUES (?, ?, ?, ?)")
    py_set = {3, -1, 2}
    # CPython iterates small ints by hash and hash(-1) == -2: the driver sends -1 last.
    assert list(py_set) != sorted(py_set)
    py_dict = {3: "c", -1: "a", 2: "b"}
    session.execute(ins, (1, py_set, py_set, py_dict))
    assert stored(session, 1) == [
        {"fs": [-1, 2, 3], "s": [-1, 2, 3], "m": [("-1", "a"), ("2", "b"), ("3", "c")]}
    ]
    row = session.execute("SELECT fs, s, m FROM c WHERE k = 1").one()
    assert list(row.fs) == [-1, 2, 3]
    assert list(row.s) == [-1, 2, 3]
    # The driver keeps a map in wire order.
    assert list(row.m.items()) == [(-1, "a"), (2, "b"), (3, "c")]


def test_bound_and_literal_frozen_set_are_the_same_clustering_key(session):
    session.execute("INSERT INTO c (k, fs, m) VALUES (2, {-1, 2, 3}, {0: 'literal'})")
    ins = session.prepare("INSERT INTO c (k, fs, m) VALUES (?, ?, ?)")
    session.execute(ins, (2, {3, -1, 2}, {0: "bound"}))
    # A list bound to a set is sent with its duplicates: stored once each.
    session.execute(ins, (2, [5, -5, 5], {0: "dup"}))
    assert stored(session, 2) == [
        # Clustered in set order: {-5, 5} before {-1, 2, 3}, since -5 < -1.
        {"fs": [-5, 5], "s": None, "m": [("0", "dup")]},
        {"fs": [-1, 2, 3], "s": None, "m": [("0", "bound")]},
    ]
    sel = session.prepare("SELECT m FROM c WHERE k = ? AND fs = ?")
    assert session.execute(sel, (2, {2, 3, -1})).one().m == {0: "bound"}
    assert session.execute(sel, (2, [5, -5])).one().m == {0: "dup"}
    literal = session.execute("SELECT m FROM c WHERE k = 2 AND fs = {-1, 2, 3}").one()
    assert literal.m == {0: "bound"}


def test_batched_statements_bind_sets_in_cql_order(session):
    ins = session.prepare("INSERT INTO c (k, fs, s) VALUES (?, ?, ?)")
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    batch.add(ins, (3, {30, -30, 10}, [7, -7, 7]))
    session.execute(batch)
    assert stored(session, 3) == [{"fs": [-30, 10, 30], "s": [-7, 7], "m": None}]
