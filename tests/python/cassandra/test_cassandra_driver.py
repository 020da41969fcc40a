"""The Python cassandra-driver against a real node: prepared statements, batches, paging,
every native type and the collections round-tripping."""

import datetime
import decimal
import ipaddress
import os
import uuid

import pytest
from cassandra import InvalidRequest
from cassandra.query import BatchStatement, BatchType, SimpleStatement
from cassandra.util import Date, Duration, Time


@pytest.fixture(scope="module")
def session(cql_session):
    with cql_session("pyd", use_keyspace=True) as s:
        yield s


def test_system_local_is_served(session):
    row = session.execute("SELECT release_version, cql_version FROM system.local").one()
    assert row.release_version
    assert row.cql_version.startswith("3.")


def test_prepared_insert_and_select(session):
    session.execute("CREATE TABLE IF NOT EXISTS kv (k int PRIMARY KEY, v text)")
    ins = session.prepare("INSERT INTO kv (k, v) VALUES (?, ?)")
    sel = session.prepare("SELECT v FROM kv WHERE k = ?")
    for i in range(100):
        session.execute(ins, (i, f"value-{i}"))
    for i in (0, 42, 99):
        assert session.execute(sel, (i,)).one().v == f"value-{i}"
    assert session.execute(sel, (1000,)).one() is None


def test_batches(session):
    session.execute("CREATE TABLE IF NOT EXISTS b (p int, c int, v text, PRIMARY KEY (p, c))")
    ins = session.prepare("INSERT INTO b (p, c, v) VALUES (?, ?, ?)")
    logged = BatchStatement(batch_type=BatchType.LOGGED)
    for c in range(10):
        logged.add(ins, (1, c, f"l{c}"))
    session.execute(logged)
    unlogged = BatchStatement(batch_type=BatchType.UNLOGGED)
    for c in range(10):
        unlogged.add(ins, (2, c, f"u{c}"))
    unlogged.add(SimpleStatement("INSERT INTO b (p, c, v) VALUES (2, 100, 'text entry')"))
    session.execute(unlogged)
    rows = list(session.execute("SELECT c, v FROM b WHERE p = 1"))
    assert [r.c for r in rows] == list(range(10))
    rows = list(session.execute("SELECT c, v FROM b WHERE p = 2"))
    assert len(rows) == 11
    assert rows[-1].v == "text entry"


def test_paging_through_10000_rows(session):
    session.execute("CREATE TABLE IF NOT EXISTS paged (p int, c int, v int, PRIMARY KEY (p, c))")
    ins = session.prepare("INSERT INTO paged (p, c, v) VALUES (?, ?, ?)")
    futures = []
    for i in range(10_000):
        futures.append(session.execute_async(ins, (i % 10, i, i * 2)))
        if len(futures) >= 256:
            for f in futures:
                f.result()
            futures = []
    for f in futures:
        f.result()
    stmt = SimpleStatement("SELECT p, c, v FROM paged", fetch_size=1000)
    result = session.execute(stmt)
    # Paged on the server: the first page holds exactly fetch_size rows and says more follow.
    assert result.has_more_pages
    assert len(result.current_rows) == 1000
    seen = set()
    for row in result:
        assert row.v == row.c * 2
        seen.add(row.c)
    assert len(seen) == 10_000
    assert not result.has_more_pages
    one_part = session.execute(SimpleStatement("SELECT c FROM paged WHERE p = 3", fetch_size=100))
    cs = [r.c for r in one_part]
    assert cs == sorted(cs) and len(cs) == 1000


TYPES = [
    ("ascii", "plain ascii"),
    ("text", "unicode ✓ text"),
    ("varchar", "varchar value"),
    ("boolean", True),
    ("tinyint", -7),
    ("smallint", 32000),
    ("int", -2_000_000_000),
    ("bigint", 9_000_000_000_000_000_000),
    ("varint", 123456789012345678901234567890),
    ("float", 1.5),
    ("double", -2.25e100),
    ("decimal", decimal.Decimal("12345.6789")),
    ("blob", b"\x00\x01binary\xff"),
    ("uuid", uuid.UUID("12345678-1234-4234-8234-123456789abc")),
    ("timeuuid", uuid.UUID("d2177dd0-eaa2-11de-a572-001b779c76e3")),
    ("timestamp", datetime.datetime(2024, 5, 17, 12, 30, 45, 123000)),
    ("date", Date(datetime.date(2023, 2, 28))),
    ("time", Time(datetime.time(13, 14, 15, 161718))),
    ("duration", Duration(1, 2, 3_000_000_000)),
    ("inet", ipaddress.ip_address("192.168.10.20")),
    ("list<int>", [3, 1, 2]),
    ("set<text>", {"a", "b", "c"}),
    ("map<text, int>", {"x": 1, "y": 2}),
    ("frozen<list<text>>", ["f", "g"]),
    ("frozen<map<int, boolean>>", {1: True, 2: False}),
    ("frozen<set<bigint>>", {5, 6}),
]


def normalize(v):
    if isinstance(v, Date):
        return v.date()
    if isinstance(v, Time):
        return v.time()
    if hasattr(v, "items"):
        return dict(v.items())
    if isinstance(v, (set, frozenset)) or type(v).__name__ == "SortedSet":
        return set(v)
    if isinstance(v, ipaddress._BaseAddress):
        return str(v)
    return v


@pytest.mark.parametrize("cql_type,value", TYPES, ids=[t for t, _ in TYPES])
def test_type_round_trip(session, cql_type, value):
    name = "t_" + "".join(ch if ch.isalnum() else "_" for ch in cql_type)
    session.execute(f"CREATE TABLE IF NOT EXISTS {name} (k int PRIMARY KEY, v {cql_type})")
    ins = session.prepare(f"INSERT INTO {name} (k, v) VALUES (?, ?)")
    v = str(value) if cql_type == "inet" else value
    session.execute(ins, (1, v))
    got = session.execute(f"SELECT v FROM {name} WHERE k = 1").one().v
    assert normalize(got) == normalize(value)


def test_invalid_query_is_an_error_not_a_disconnect(session):
    with pytest.raises(InvalidRequest):
        session.execute("SELECT * FROM no_such_table_here")
    assert session.execute("SELECT key FROM system.local").one().key == "local"


def test_a_ten_megabyte_blob_round_trips_and_a_page_of_big_rows_is_cut(session):
    session.execute("CREATE TABLE IF NOT EXISTS blobs (p int, c int, v blob, PRIMARY KEY (p, c))")
    ins = session.prepare("INSERT INTO blobs (p, c, v) VALUES (?, ?, ?)")
    blob = os.urandom(10_000_000)
    session.execute(ins, (1, 0, blob))
    assert session.execute("SELECT v FROM blobs WHERE p = 1 AND c = 0").one().v == blob
    # Twenty rows of 1 MB at the driver's fetch size of 5000: pages end at the server's byte
    # bound (8 MiB), and every row comes back in order.
    for c in range(1, 21):
        session.execute(ins, (2, c, bytes([c]) * 1_000_000))
    result = session.execute(SimpleStatement("SELECT c, v FROM blobs WHERE p = 2", fetch_size=5000))
    first_page = len(result.current_rows)
    rows = list(result)
    assert [r.c for r in rows] == list(range(1, 21))
    assert all(r.v == bytes([r.c]) * 1_000_000 for r in rows)
    assert first_page < 20, f"one page of {first_page} rows of 1 MB"


def test_a_twelve_megabyte_value_is_accepted_under_the_default_limits(session):
    # Both the default frame and value limits are 16 MiB (a value over the value limit is
    # tested with smaller limits in crates/sluice/tests/limits.rs).
    session.execute("CREATE TABLE IF NOT EXISTS blobs (p int, c int, v blob, PRIMARY KEY (p, c))")
    ins = session.prepare("INSERT INTO blobs (p, c, v) VALUES (?, ?, ?)")
    session.execute(ins, (3, 0, b"\x01" * 12_000_000))
    assert len(session.execute("SELECT v FROM blobs WHERE p = 3").one().v) == 12_000_000
