"""A bounded differential run against a reference Cassandra: every answer of Sluice must equal
Cassandra's. Runs only when ORACLE_CASSANDRA (host:port of the reference) is set, as in
scripts/test.sh; ORACLE_SEEDS and ORACLE_STATEMENTS bound the run."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle  # noqa: E402

CASSANDRA = os.environ.get("ORACLE_CASSANDRA")


@pytest.mark.skipif(not CASSANDRA, reason="ORACLE_CASSANDRA (a reference Cassandra) not set")
def test_sluice_answers_as_cassandra(capsys):
    seeds = int(os.environ.get("ORACLE_SEEDS", "40"))
    statements = int(os.environ.get("ORACLE_STATEMENTS", "200"))
    code = oracle.main([
        "--seed", os.environ.get("ORACLE_FIRST_SEED", "1"), "--seeds", str(seeds),
        "--statements", str(statements), "--cassandra", CASSANDRA, "--shrink-budget", "40",
    ])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, f"Sluice and Cassandra answered differently:\n{out[-6000:]}"


def test_a_seed_replays_the_same_statements():
    assert oracle.generate(7, 300)[1] == oracle.generate(7, 300)[1]
    assert oracle.generate(7, 300)[1] != oracle.generate(8, 300)[1]


def test_the_comparer_tells_answers_apart():
    A = oracle.Answer
    rows = [(1, "a"), (2, "b")]
    scan = "SELECT * FROM {t}"
    assert oracle.same(scan, A(("k", "v"), rows), A(("k", "v"), list(rows)))
    assert not oracle.same(scan, A(("k", "v"), rows), A(("k", "v"), rows[::-1]))
    assert not oracle.same(scan, A(("k", "v"), rows), A(("k", "w"), rows))
    assert not oracle.same(scan, A(("k", "v"), rows), A(("k", "v"), rows[:1]))
    # An IN on the partition key leaves the order open, unless LIMIT picks rows by it.
    assert oracle.same("SELECT * FROM {t} WHERE p0 IN (1, 2)", A(("k",), rows), A(("k",), rows[::-1]))
    assert not oracle.same("SELECT * FROM {t} WHERE p0 IN (1, 2) LIMIT 1", A(("k",), rows), A(("k",), rows[::-1]))
    # Error classes by code; messages are not compared.
    assert oracle.same(scan, A(error="0x2200", message="x"), A(error="0x2200", message="y"))
    assert not oracle.same(scan, A(error="0x2200"), A(error="0x2000"))
    assert not oracle.same(scan, A(error="0x2200"), A(("k", "v"), []))
    # TTL() within the tolerance, and null against a value never.
    ttl = ("k", "ttl(v)")
    assert oracle.same(scan, A(ttl, [(1, 86400)]), A(ttl, [(1, 86398)]))
    assert not oracle.same(scan, A(ttl, [(1, 86400)]), A(ttl, [(1, 80000)]))
    assert not oracle.same(scan, A(ttl, [(1, 86400)]), A(ttl, [(1, None)]))
