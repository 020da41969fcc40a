"""Lightweight transactions through the Python cassandra-driver: results as Cassandra shapes
them, and compare-and-set from several threads racing plain writes to the same row."""

import threading

import pytest


@pytest.fixture(scope="module")
def session(cql_session):
    with cql_session("lwt", use_keyspace=True) as s:
        s.execute("CREATE TABLE IF NOT EXISTS c (k int PRIMARY KEY, v int, w int)")
        yield s


def test_insert_if_not_exists_reports_the_row_it_found(session):
    first = session.execute("INSERT INTO c (k, v, w) VALUES (1, 10, 0) IF NOT EXISTS")
    assert first.was_applied
    second = session.execute("INSERT INTO c (k, v, w) VALUES (1, 20, 0) IF NOT EXISTS")
    assert not second.was_applied
    assert second.one().v == 10
    assert session.execute("SELECT v FROM c WHERE k = 1").one().v == 10


def test_update_if_applies_only_on_a_match(session):
    session.execute("INSERT INTO c (k, v, w) VALUES (2, 1, 0)")
    miss = session.execute("UPDATE c SET v = 3 WHERE k = 2 IF v = 2")
    assert not miss.was_applied
    assert miss.one().v == 1
    assert session.execute("UPDATE c SET v = 2 WHERE k = 2 IF v = 1").was_applied
    assert session.execute("SELECT v FROM c WHERE k = 2").one().v == 2


def test_compare_and_set_increments_racing_plain_writes_lose_nothing(session):
    threads, increments, plain_writes = 4, 25, 100
    session.execute("INSERT INTO c (k, v, w) VALUES (3, 0, 0)")
    read = session.prepare("SELECT v FROM c WHERE k = 3")
    cas = session.prepare("UPDATE c SET v = ? WHERE k = 3 IF v = ?")
    plain = session.prepare("UPDATE c SET w = ? WHERE k = 3")
    errors = []

    def increment():
        try:
            done = 0
            while done < increments:
                seen = session.execute(read).one().v
                if session.execute(cas, (seen + 1, seen)).was_applied:
                    done += 1
        except Exception as e:  # reported by the assertion below
            errors.append(e)

    def write_plain():
        try:
            for i in range(plain_writes):
                session.execute(plain, (i,))
        except Exception as e:
            errors.append(e)

    workers = [threading.Thread(target=increment) for _ in range(threads)]
    workers.append(threading.Thread(target=write_plain))
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in workers)
    row = session.execute("SELECT v, w FROM c WHERE k = 3").one()
    assert row.v == threads * increments
    assert row.w == plain_writes - 1


def test_transactional_mode_shows_in_the_schema(session):
    session.execute(
        "CREATE TABLE IF NOT EXISTS f (k int PRIMARY KEY, v int) WITH transactional_mode = 'full'")
    session.cluster.refresh_table_metadata("lwt", "f")
    assert "f" in session.cluster.metadata.keyspaces["lwt"].tables
    described = session.execute("DESCRIBE TABLE lwt.f").one().create_statement
    assert "transactional_mode = 'full'" in described
    session.execute("INSERT INTO f (k, v) VALUES (1, 1)")
    assert session.execute("UPDATE f SET v = 2 WHERE k = 1 IF v = 1").was_applied
    assert session.execute("SELECT v FROM f WHERE k = 1").one().v == 2
