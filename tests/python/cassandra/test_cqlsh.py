"""cqlsh -e against a real node: DDL, DML, SELECT and server-side DESCRIBE."""

import os
import subprocess
import sys
from pathlib import Path

CQLSH = str(Path(sys.executable).parent / "cqlsh")


def cqlsh(node, statement):
    r = subprocess.run(
        [CQLSH, "127.0.0.1", str(node.port), "--request-timeout", "20", "-e", statement],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CQLSH_NO_BUNDLED": "1"},
    )
    assert r.returncode == 0, f"cqlsh failed ({r.returncode}): {r.stdout}\n{r.stderr}\n{node.server_log()}"
    return r.stdout


def test_create_insert_select_describe(node):
    cqlsh(node, "CREATE KEYSPACE IF NOT EXISTS cq WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    cqlsh(node, "CREATE TABLE IF NOT EXISTS cq.t (pk int, ck text, v double, PRIMARY KEY (pk, ck))")
    cqlsh(node, "INSERT INTO cq.t (pk, ck, v) VALUES (1, 'a', 1.5)")
    cqlsh(node, "INSERT INTO cq.t (pk, ck, v) VALUES (1, 'b', 2.5)")
    out = cqlsh(node, "SELECT pk, ck, v FROM cq.t WHERE pk = 1")
    assert "(2 rows)" in out
    assert "1.5" in out and "2.5" in out
    keyspaces = cqlsh(node, "DESCRIBE KEYSPACES")
    assert "cq" in keyspaces.split()
    assert "system" in keyspaces.split()
    table = cqlsh(node, "DESCRIBE TABLE cq.t")
    assert "CREATE TABLE cq.t" in table
    assert "PRIMARY KEY (pk, ck)" in table


def test_syntax_error_is_reported(node):
    r = subprocess.run(
        [CQLSH, "127.0.0.1", str(node.port), "-e", "SELEKT * FROM system.local"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0
    assert "SyntaxException" in r.stderr or "Syntax" in r.stderr
