"""Cassandra as an oracle: random schemas and statement sequences run on Sluice and on a reference
Cassandra, every answer and every error class compared.

    python tests/oracle/oracle.py --seed 7 --statements 200 \
        --sluice 127.0.0.1:9042 --cassandra 127.0.0.1:9142

Without --sluice it starts the debug binary (SLUICE_BIN or target/debug/sluice) on a free port
with a data dir under /tmp/oracle. A seed fixes the schema and the statements, so the same
command replays the same run. On a mismatch the sequence is shrunk (ddmin over the statements
before the first mismatching one) and a short reproduction is printed with both answers.

Each run creates one fresh keyspace on both servers, one table per seed and per shrink trial,
and drops the keyspace at the end.
"""

import argparse
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import ConstantReconnectionPolicy, RetryPolicy, RoundRobinPolicy
from cassandra.query import SimpleStatement, tuple_factory

ROOT = Path(__file__).resolve().parents[2]

# Write timestamps are fixed numbers (not the clock) so that a replay writes the same cells, and
# distinct so that no two writes tie (ties are settled by value, an order not worth depending on).
TIMESTAMP_BASE = 1_700_000_000_000_000
# Large enough that nothing expires during a run; TTL() answers are compared with a tolerance.
TTL_SECONDS = (86_400, 172_800, 604_800)
TTL_TOLERANCE_SECONDS = 120

TEXTS = ("a", "b", "bb", "c", "x", "zz")
FETCH_SIZES = (None, None, 1, 2, 3, 5, 100)
PK_IN = re.compile(r"\bp\d IN \(")
USING_RE = re.compile(r" USING (TIMESTAMP \d+|TTL \d+)( AND (TIMESTAMP \d+|TTL \d+))?")


# ---------------------------------------------------------------------------------------------
# Schema


class Column:
    """A column of the generated table: its name, CQL type and kind."""

    def __init__(self, name, cql_type, kind, order="ASC"):
        self.name, self.type, self.kind, self.order = name, cql_type, kind, order

    @property
    def is_collection(self):
        return self.type.startswith(("list<", "set<", "map<"))


class Schema:
    """A random table: one or two partition key columns, zero to two clustering columns, an
    optional static column and a random subset of regular columns (always `v int`)."""

    def __init__(self, rng):
        pk_types = [rng.choice(["int", "int", "text"]) for _ in range(rng.choice([1, 1, 2]))]
        self.pk = [Column(f"p{i}", t, "pk") for i, t in enumerate(pk_types)]
        ck_count = rng.choice([0, 1, 1, 2, 2])
        self.ck = [
            Column(f"c{i}", rng.choice(["int", "int", "text"]), "ck", rng.choice(["ASC", "ASC", "DESC"]))
            for i in range(ck_count)
        ]
        regular = [Column("v", "int", "regular")]
        optional = [
            Column("b", "bigint", "regular"),
            Column("d", "double", "regular"),
            Column("t", "text", "regular"),
            Column("f", "boolean", "regular"),
            Column("x", "blob", "regular"),
            Column("l", "list<int>", "regular"),
            Column("s", "set<text>", "regular"),
            Column("m", "map<int, text>", "regular"),
        ]
        regular += [c for c in optional if rng.random() < 0.6]
        self.regular = regular
        self.static = [Column("st", "int", "static")] if self.ck and rng.random() < 0.6 else []

    @property
    def columns(self):
        return self.pk + self.ck + self.static + self.regular

    @property
    def scalar_values(self):
        """Non-key columns that hold one value (aggregates, filtering)."""
        return [c for c in self.static + self.regular if not c.is_collection]

    def create(self, keyspace, table):
        cols = ", ".join(
            f"{c.name} {c.type}{' static' if c.kind == 'static' else ''}" for c in self.columns
        )
        pk = ", ".join(c.name for c in self.pk)
        pk = f"({pk})" if len(self.pk) > 1 else pk
        key = ", ".join([pk] + [c.name for c in self.ck])
        options = ""
        if self.ck and any(c.order == "DESC" for c in self.ck):
            order = ", ".join(f"{c.name} {c.order}" for c in self.ck)
            options = f" WITH CLUSTERING ORDER BY ({order})"
        return f"CREATE TABLE {keyspace}.{table} ({cols}, PRIMARY KEY ({key})){options}"


# ---------------------------------------------------------------------------------------------
# Statement generator


def literal(rng, cql_type):
    """A CQL literal of `cql_type`, from small domains so that writes collide."""
    if cql_type == "int":
        return str(rng.randint(-2, 9))
    if cql_type == "bigint":
        return str(rng.choice([-(2**40), -7, 0, 3, 2**33, 2**50 + 1]))
    if cql_type == "double":
        return repr(rng.randint(-8, 8) * 0.5)
    if cql_type == "text":
        return "'" + rng.choice(TEXTS) + "'"
    if cql_type == "boolean":
        return rng.choice(["true", "false"])
    if cql_type == "blob":
        return rng.choice(["0x", "0x00", "0x01", "0xff", "0x0102"])
    if cql_type == "list<int>":
        return "[" + ", ".join(str(rng.randint(0, 5)) for _ in range(rng.randint(0, 3))) + "]"
    if cql_type == "set<text>":
        return "{" + ", ".join(f"'{rng.choice(TEXTS)}'" for _ in range(rng.randint(0, 3))) + "}"
    if cql_type == "map<int, text>":
        # Distinct keys: Cassandra keeps an arbitrary one of duplicate keys in a map literal.
        items = [f"{k}: '{rng.choice(TEXTS)}'" for k in rng.sample(range(5), rng.randint(0, 3))]
        return "{" + ", ".join(items) + "}"
    raise ValueError(cql_type)


def key_literal(rng, col):
    """A key value from a smaller domain than `literal`, so that partitions and rows repeat."""
    if col.type == "int":
        return str(rng.randint(0, 4))
    return "'" + rng.choice(TEXTS[:4]) + "'"


class Generator:
    """Draws statements for one schema. Statements are templates with `{t}` for the table, so
    that a shrink trial can replay them against a fresh table."""

    def __init__(self, rng, schema, count):
        self.rng, self.schema = rng, schema
        # Cassandra 5.0 fails GROUP BY reads that stop next to a range tombstone (Read_failure,
        # "open RT bound as its last item"; see the record): a sequence has one or the other.
        self.range_deletes = bool(schema.ck) and rng.random() < 0.5
        self.timestamps = iter(rng.sample(range(1, 50 * count + 100), 2 * count + 10))
        self.used = []

    def timestamp(self):
        """A fresh timestamp, or now and then that of an earlier write: Cassandra settles such
        ties deterministically (a deletion, then an expiring cell, then the greater value)."""
        if self.used and self.rng.random() < 0.08:
            return self.rng.choice(self.used)
        ts = TIMESTAMP_BASE + next(self.timestamps) * 1000
        self.used.append(ts)
        return ts

    def using(self, ttl_ok=True):
        ttl = ttl_ok and self.rng.random() < 0.2
        parts = [f"TIMESTAMP {self.timestamp()}"]
        if ttl:
            parts.append(f"TTL {self.rng.choice(TTL_SECONDS)}")
        self.rng.shuffle(parts)
        return " USING " + " AND ".join(parts)

    def pk_where(self, allow_in=True):
        rng, conds = self.rng, []
        for c in self.schema.pk:
            if allow_in and rng.random() < 0.2:
                values = sorted({key_literal(rng, c) for _ in range(rng.randint(1, 3))})
                conds.append(f"{c.name} IN ({', '.join(values)})")
            else:
                conds.append(f"{c.name} = {key_literal(rng, c)}")
        return conds

    def full_key_where(self):
        return self.pk_where(allow_in=False) + [f"{c.name} = {key_literal(self.rng, c)}" for c in self.schema.ck]

    def ck_restrictions(self, for_delete=False):
        """Restrictions on the clustering columns: a prefix of equalities, then maybe a slice or
        an IN on the next column (or a multi-column slice)."""
        rng, ck, conds = self.rng, self.schema.ck, []
        if not ck:
            return conds
        prefix = rng.randint(0, len(ck))
        for c in ck[:prefix]:
            conds.append(f"{c.name} = {key_literal(rng, c)}")
        if prefix < len(ck):
            c = ck[prefix]
            r = rng.random()
            if r < 0.5:
                lo, hi = sorted(key_literal(rng, c) for _ in range(2))
                bounds = rng.choice(["lower", "upper", "both"])
                # No empty slices (`c > 2 AND c < 2`): Cassandra answers them before it checks
                # whether the query may be paged (see the record).
                strict = lo != hi or bounds != "both"
                if bounds != "upper":
                    conds.append(f"{c.name} {rng.choice(['>', '>=']) if strict else '>='} {lo}")
                if bounds != "lower":
                    conds.append(f"{c.name} {rng.choice(['<', '<=']) if strict else '<='} {hi}")
            elif r < 0.7 and not for_delete:
                values = sorted({key_literal(rng, c) for _ in range(rng.randint(1, 3))})
                conds.append(f"{c.name} IN ({', '.join(values)})")
            elif r < 0.8 and prefix == 0 and len(ck) == 2 and ck[0].order == ck[1].order:
                # Sluice rejects multi-column slices over mixed clustering orders (see the record).
                op = rng.choice([">", ">=", "<", "<="])
                tup = ", ".join(key_literal(rng, x) for x in ck)
                conds.append(f"({ck[0].name}, {ck[1].name}) {op} ({tup})")
        return conds

    # -- writes --

    def insert(self):
        rng, s = self.rng, self.schema
        cols = s.pk + s.ck + [c for c in s.static + s.regular if rng.random() < 0.6]
        values = [
            key_literal(rng, c) if c.kind in ("pk", "ck")
            else "null" if rng.random() < 0.1 else literal(rng, c.type)
            for c in cols
        ]
        names = ", ".join(c.name for c in cols)
        return f"INSERT INTO {{t}} ({names}) VALUES ({', '.join(values)}){self.using()}"

    def assignment(self, c):
        rng = self.rng
        if c.type == "list<int>":
            choice = rng.randint(0, 4)
            if choice == 0:
                return f"{c.name} = {c.name} + {literal(rng, c.type)}"
            if choice == 1:
                return f"{c.name} = {c.name} - {literal(rng, c.type)}"
            if choice == 2:
                return f"{c.name}[{rng.randint(0, 2)}] = {rng.randint(0, 5)}"
            if choice == 3:
                return f"{c.name} = {literal(rng, c.type)} + {c.name}"
        elif c.type == "set<text>":
            choice = rng.randint(0, 2)
            if choice == 0:
                return f"{c.name} = {c.name} + {literal(rng, c.type)}"
            if choice == 1:
                return f"{c.name} = {c.name} - {literal(rng, c.type)}"
        elif c.type == "map<int, text>":
            choice = rng.randint(0, 3)
            if choice == 0:
                return f"{c.name} = {c.name} + {literal(rng, c.type)}"
            if choice == 1:
                return f"{c.name}[{rng.randint(0, 4)}] = '{rng.choice(TEXTS)}'"
            if choice == 2:
                keys = ", ".join(str(rng.randint(0, 4)) for _ in range(rng.randint(1, 2)))
                return f"{c.name} = {c.name} - {{{keys}}}"
        if rng.random() < 0.1:
            return f"{c.name} = null"
        return f"{c.name} = {literal(rng, c.type)}"

    def update(self):
        rng, s = self.rng, self.schema
        static_only = s.static and rng.random() < 0.25
        pool = s.static if static_only else s.static + s.regular
        targets = rng.sample(pool, rng.randint(1, min(3, len(pool))))
        sets = ", ".join(self.assignment(c) for c in targets)
        where = self.pk_where(allow_in=False) if static_only else self.full_key_where()
        return f"UPDATE {{t}}{self.using()} SET {sets} WHERE {' AND '.join(where)}"

    def delete(self):
        rng, s = self.rng, self.schema
        using = self.using(ttl_ok=False)
        kind = rng.random()
        if kind < 0.15 or not s.ck:
            # whole partition (or row, when there are no clustering columns)
            return f"DELETE FROM {{t}}{using} WHERE {' AND '.join(self.pk_where())}"
        if kind < 0.4:
            return f"DELETE FROM {{t}}{using} WHERE {' AND '.join(self.full_key_where())}"
        if kind < 0.65 and self.range_deletes:
            conds = self.ck_restrictions(for_delete=True)
            return f"DELETE FROM {{t}}{using} WHERE {' AND '.join(self.pk_where(allow_in=False) + conds)}"
        if kind < 0.75 and s.static:
            return f"DELETE st FROM {{t}}{using} WHERE {' AND '.join(self.pk_where(allow_in=False))}"
        cols = rng.sample(s.regular, rng.randint(1, min(2, len(s.regular))))
        targets = []
        for c in cols:
            if c.type == "map<int, text>" and rng.random() < 0.5:
                targets.append(f"{c.name}[{rng.randint(0, 4)}]")
            elif c.type == "list<int>" and rng.random() < 0.5:
                targets.append(f"{c.name}[{rng.randint(0, 2)}]")
            else:
                targets.append(c.name)
        return f"DELETE {', '.join(targets)} FROM {{t}}{using} WHERE {' AND '.join(self.full_key_where())}"

    # -- reads --

    def selection(self):
        rng, s = self.rng, self.schema
        r = rng.random()
        if r < 0.4:
            return "*"
        cols = [c.name for c in rng.sample(s.columns, rng.randint(1, len(s.columns)))]
        if rng.random() < 0.1:
            cols.append(f"token({', '.join(c.name for c in s.pk)})")
        if rng.random() < 0.3:
            c = rng.choice(s.regular)
            if not c.is_collection:
                cols.append(f"writetime({c.name})")
            if rng.random() < 0.5 and not c.is_collection:
                cols.append(f"ttl({c.name})")
        return ", ".join(cols)

    def select(self):
        rng, s = self.rng, self.schema
        kind = rng.random()
        where, tail, order = [], [], ""
        if kind < 0.55:
            where = self.pk_where() + self.ck_restrictions()
            if s.ck and rng.random() < 0.25:
                direction = rng.choice(["ASC", "DESC"])
                order = " ORDER BY " + ", ".join(f"{c.name} {direction if c.order == 'ASC' else ('DESC' if direction == 'ASC' else 'ASC')}" for c in s.ck)
        elif kind < 0.7:
            pass  # full scan
        elif kind < 0.75:
            pk = ", ".join(c.name for c in s.pk)
            bound = rng.choice([-(2**62), -(2**40), 0, 2**40, 2**62])
            where = [f"token({pk}) {rng.choice(['>', '>=', '<', '<='])} {bound}"]
        elif kind < 0.9:
            c = rng.choice(s.scalar_values)
            op = rng.choice(["=", ">", "<", ">="])
            where = [f"{c.name} {op} {literal(rng, c.type)}"]
            if rng.random() < 0.4:
                where = self.pk_where() + where
            tail.append("ALLOW FILTERING")
        else:
            pk = ", ".join(c.name for c in s.pk)
            cols = pk + (", st" if s.static and rng.random() < 0.5 else "")
            limit = f" LIMIT {rng.randint(1, 4)}" if rng.random() < 0.3 else ""
            return f"SELECT DISTINCT {cols} FROM {{t}}{limit}"
        if s.ck and rng.random() < 0.2:
            tail.insert(0, f"PER PARTITION LIMIT {rng.randint(1, 3)}")
        if rng.random() < 0.25:
            tail.insert(len(tail) - ("ALLOW FILTERING" in tail), f"LIMIT {rng.randint(1, 6)}")
        text = f"SELECT {self.selection()} FROM {{t}}"
        if where:
            text += " WHERE " + " AND ".join(where)
        text += order
        if tail:
            text += " " + " ".join(tail)
        return text

    def aggregate(self):
        rng, s = self.rng, self.schema
        numeric = [c for c in s.scalar_values if c.type in ("int", "bigint", "double")]
        funcs = ["count(*)"]
        for c in rng.sample(numeric, min(len(numeric), 2)):
            funcs += [f"{f}({c.name})" for f in rng.sample(["sum", "avg", "min", "max", "count"], 2)]
        text_cols = [c for c in s.scalar_values if c.type == "text"]
        if text_cols and rng.random() < 0.3:
            funcs.append(f"max({text_cols[0].name})")
        where, group = [], []
        r = rng.random()
        if r < 0.4:
            where = self.pk_where() + (self.ck_restrictions() if rng.random() < 0.5 else [])
        elif r < 0.55:
            c = rng.choice(s.scalar_values)
            where = [f"{c.name} > {literal(rng, c.type)}"]
        if rng.random() < 0.4 and not self.range_deletes:
            depth = rng.randint(1, len(s.pk) + len(s.ck)) if rng.random() < 0.5 else len(s.pk)
            group = [c.name for c in (s.pk + s.ck)[:depth]]
        select = ", ".join(group + funcs)
        text = f"SELECT {select} FROM {{t}}"
        if where:
            text += " WHERE " + " AND ".join(where)
        if group:
            text += " GROUP BY " + ", ".join(group)
        if group and s.ck and rng.random() < 0.2:
            text += f" PER PARTITION LIMIT {rng.randint(1, 2)}"
        if group and rng.random() < 0.2:
            text += f" LIMIT {rng.randint(1, 4)}"
        # Cassandra 5.0 fails paged GROUP BY queries (Protocol_error on a table without
        # clustering columns, Read_failure after a range deletion; see the record): not paged.
        self.unpaged = bool(group)
        if r >= 0.4 and r < 0.55:
            text += " ALLOW FILTERING"
        return text

    def invalid(self):
        """Statements both servers must reject, and with the same error class."""
        rng, s = self.rng, self.schema
        forms = [
            f"SELECT * FROM {{t}} WHERE v = {literal(rng, 'int')}",  # filtering without ALLOW FILTERING
            f"INSERT INTO {{t}} (v) VALUES (1) USING TIMESTAMP {self.timestamp()}",  # no key
            f"SELECT nosuch FROM {{t}}",
            f"UPDATE {{t}} USING TIMESTAMP {self.timestamp()} SET {s.pk[0].name} = {key_literal(rng, s.pk[0])} WHERE {' AND '.join(self.full_key_where())}",
            "SELECT * FROM {t} WHERE",
        ]
        if s.ck:
            forms.append(f"SELECT * FROM {{t}} ORDER BY {s.ck[0].name} DESC")
        if len(s.ck) == 2:
            forms.append(
                f"SELECT * FROM {{t}} WHERE {' AND '.join(self.pk_where(allow_in=False))} AND {s.ck[1].name} = 1"
            )
        return rng.choice(forms)

    def batch(self):
        """A logged or unlogged batch of writes with one timestamp for all of them."""
        rng = self.rng
        parts = []
        for _ in range(rng.randint(1, 4)):
            w = rng.choice([self.insert, self.update, self.delete])()
            parts.append(USING_RE.sub("", w))
        kind = rng.choice(["", "UNLOGGED "])
        return f"BEGIN {kind}BATCH USING TIMESTAMP {self.timestamp()} " + "; ".join(parts) + "; APPLY BATCH"

    def statement(self):
        r = self.rng.random()
        if r < 0.04:
            return self.batch(), None
        if r < 0.25:
            return self.insert(), None
        if r < 0.38:
            return self.update(), None
        if r < 0.50:
            return self.delete(), None
        if r < 0.82:
            return self.select(), self.rng.choice(FETCH_SIZES)
        if r < 0.96:
            text, fetch_size = self.aggregate(), self.rng.choice(FETCH_SIZES)
            return text, None if self.unpaged else fetch_size
        return self.invalid(), None


def generate(seed, count):
    """The schema and `count` statements (template, fetch size) of a seed."""
    rng = random.Random(seed)
    schema = Schema(rng)
    gen = Generator(rng, schema, count)
    return schema, [gen.statement() for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# Runner and comparer


def normalize(value):
    """Driver values as plain, comparable Python values."""
    if value is None:
        return None
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else value
    if isinstance(value, (list, tuple)):
        return ("list", tuple(normalize(v) for v in value))
    if hasattr(value, "items"):
        return ("map", tuple((normalize(k), normalize(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)) or type(value).__name__ == "SortedSet":
        return ("set", tuple(normalize(v) for v in value))
    return value


class Answer:
    """What a server answered: column names and rows, or an error code."""

    def __init__(self, columns=None, rows=None, error=None, message=None):
        self.columns, self.rows, self.error, self.message = columns, rows, error, message

    def __repr__(self):
        if self.error is not None:
            return f"error {self.error} ({self.message})"
        return f"columns {self.columns}, {len(self.rows)} rows: {self.rows}"


def error_code(exc):
    """The native protocol error code of a driver exception (client-side errors by name)."""
    if isinstance(exc, NoHostAvailable) and exc.errors:
        exc = next(iter(exc.errors.values()))
    code = getattr(exc, "code", None)
    if code is not None:
        return f"0x{code:04x}"
    return type(exc).__name__


# Overloaded says the request was not executed (a server shedding load on a busy machine):
# the statement is sent again rather than compared.
OVERLOADED = "0x1001"


def run(session, text, fetch_size):
    """Runs one statement, reading every page; an error is an answer too. A Protocol_error
    closes the connection, so a following `NoHostAvailable` waits for the reconnection."""
    statement = SimpleStatement(text, fetch_size=fetch_size) if fetch_size else SimpleStatement(text)
    for _ in range(100):
        try:
            rs = session.execute(statement)
            rows = [tuple(normalize(v) for v in row) for row in rs]
            return Answer(columns=tuple(rs.column_names or ()), rows=rows)
        except NoHostAvailable as exc:
            if exc.errors and error_code(exc) != OVERLOADED:
                return Answer(error=error_code(exc), message=str(exc)[:300])
            time.sleep(0.2)
        except Exception as exc:  # every server error is an answer to compare
            if error_code(exc) == OVERLOADED:
                time.sleep(0.2)
                continue
            return Answer(error=error_code(exc), message=str(exc)[:300])
    return Answer(error="NoHostAvailable", message="no answer but Overloaded or no connection for 20 s")


def unordered(text):
    """Whether CQL leaves the order of the rows open: an IN on the partition key without
    ORDER BY returns partitions in an order the server chooses."""
    return bool(PK_IN.search(text)) and "ORDER BY" not in text and "LIMIT" not in text


def ttl_columns(columns):
    return [i for i, c in enumerate(columns or ()) if c.startswith("ttl(")]


def same(text, a, b):
    """Whether two answers agree: same error code, or same columns and rows (in order where
    CQL defines one; TTL() within a tolerance)."""
    if a.error is not None or b.error is not None:
        return a.error == b.error
    if a.columns != b.columns or len(a.rows) != len(b.rows):
        return False
    rows_a, rows_b = a.rows, b.rows
    ttl = ttl_columns(a.columns)
    if ttl:
        for ra, rb in zip(rows_a, rows_b):
            for i in ttl:
                if (ra[i] is None) != (rb[i] is None):
                    return False
                if ra[i] is not None and abs(ra[i] - rb[i]) > TTL_TOLERANCE_SECONDS:
                    return False
        rows_a = [tuple(v for i, v in enumerate(r) if i not in ttl) for r in rows_a]
        rows_b = [tuple(v for i, v in enumerate(r) if i not in ttl) for r in rows_b]
    if unordered(text):
        return sorted(map(repr, rows_a)) == sorted(map(repr, rows_b))
    return rows_a == rows_b


class Servers:
    """Sessions to Sluice and Cassandra, and the keyspace of this run on both."""

    def __init__(self, sluice, cassandra, keyspace):
        self.keyspace = keyspace
        self.clusters, self.sessions = [], []
        for host, port in (sluice, cassandra):
            profile = ExecutionProfile(
                load_balancing_policy=RoundRobinPolicy(),
                retry_policy=RetryPolicy(),
                consistency_level=ConsistencyLevel.ONE,
                request_timeout=60,
                row_factory=tuple_factory,
            )
            cluster = Cluster(
                [host], port=port, protocol_version=4, connect_timeout=30,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                schema_metadata_enabled=False, token_metadata_enabled=False,
                max_schema_agreement_wait=30,
                reconnection_policy=ConstantReconnectionPolicy(0.2),
            )
            self.clusters.append(cluster)
            self.sessions.append(cluster.connect())
        for s in self.sessions:
            s.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
            s.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                      "{'class': 'SimpleStrategy', 'replication_factor': 1}")

    def both(self, text, fetch_size=None):
        return [run(s, text, fetch_size) for s in self.sessions]

    def close(self):
        for s in self.sessions:
            try:
                s.execute(f"DROP KEYSPACE IF EXISTS {self.keyspace}")
            except Exception as exc:
                print(f"warning: DROP KEYSPACE {self.keyspace} failed: {exc}", file=sys.stderr)
        for c in self.clusters:
            c.shutdown()


class Case:
    """One seed: its schema and statements, replayed on fresh tables of a shared keyspace."""

    def __init__(self, servers, seed, schema, statements, verbose=False):
        self.servers, self.seed, self.schema, self.statements = servers, seed, schema, statements
        self.trials = 0
        self.verbose = verbose

    def replay(self, indexes, stop_at_first=True):
        """Runs the statements at `indexes` on a fresh table; returns the first mismatch as
        (index, text, sluice answer, cassandra answer), or None."""
        table = f"t{self.seed}_{self.trials}"
        self.trials += 1
        ks = self.servers.keyspace
        ddl = self.schema.create(ks, table)
        for answer in self.servers.both(ddl):
            if answer.error is not None:
                raise RuntimeError(f"{ddl}: {answer}")
        mismatch = None
        try:
            for i in indexes:
                template, fetch_size = self.statements[i]
                text = template.replace("{t}", f"{ks}.{table}")
                a, b = self.servers.both(text, fetch_size)
                if self.verbose:
                    print(f"  [{i}] {text}  fetch={fetch_size}\n      sluice: {a}\n      cassandra: {b}")
                if not same(text, a, b):
                    mismatch = (i, text, a, b)
                    if stop_at_first:
                        break
        finally:
            self.servers.both(f"DROP TABLE IF EXISTS {ks}.{table}")
        return mismatch

    def shrink(self, failing_index, budget):
        """ddmin over the statements before `failing_index`: the smallest subsequence found
        within `budget` trials after which that statement still answers differently."""
        last = failing_index
        current = list(range(failing_index))
        n = 2

        def fails(subset):
            if self.trials >= budget:
                return False
            m = self.replay(subset + [last])
            return m is not None and m[0] == last

        if fails([]):
            return [last]
        while len(current) >= 1 and self.trials < budget:
            chunk = max(1, math.ceil(len(current) / n))
            parts = [current[i:i + chunk] for i in range(0, len(current), chunk)]
            reduced = False
            for part in parts:
                if fails(part):
                    current, n, reduced = part, 2, True
                    break
            if not reduced:
                for part in parts:
                    rest = [i for i in current if i not in part]
                    if fails(rest):
                        current, n, reduced = rest, max(n - 1, 2), True
                        break
            if not reduced:
                if n >= len(current):
                    break
                n = min(len(current), n * 2)
        return current + [last]


def report(case, indexes):
    """A reproduction: the CQL of the shrunk sequence, and both answers to the last statement."""
    ks = case.servers.keyspace
    print(f"--- reproduction (seed {case.seed}, {len(indexes)} statements) ---")
    print(case.schema.create(ks, "t").rstrip() + ";")
    for i in indexes:
        template, fetch_size = case.statements[i]
        suffix = f"   -- fetch_size {fetch_size}" if fetch_size else ""
        print(template.replace("{t}", f"{ks}.t") + ";" + suffix)
    m = case.replay(indexes)
    if m is None:
        print("(the shrunk sequence no longer mismatches on a fresh replay: flaky?)")
        return
    print(f"sluice:    {m[2]}")
    print(f"cassandra: {m[3]}")


def run_seed(servers, seed, count, shrink_budget, verbose=False):
    """Runs one seed; returns True when every answer agreed."""
    schema, statements = generate(seed, count)
    case = Case(servers, seed, schema, statements, verbose)
    t0 = time.time()
    m = case.replay(range(len(statements)))
    if m is None:
        print(f"seed {seed}: {count} statements agree ({time.time() - t0:.1f} s)", flush=True)
        return True
    index, text, a, b = m
    print(f"seed {seed}: MISMATCH at statement {index}: {text}\n  sluice:    {a}\n  cassandra: {b}", flush=True)
    shrunk = case.shrink(index, shrink_budget) if shrink_budget else list(range(index + 1))
    report(case, shrunk)
    return False


# ---------------------------------------------------------------------------------------------
# Sluice process


def free_port():
    for _ in range(1000):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


class SluiceProcess:
    """The Sluice binary on a free port of 127.0.0.1 with a data dir under /tmp/oracle."""

    def __init__(self):
        binary = os.environ.get("SLUICE_BIN") or str(ROOT / "target" / "debug" / "sluice")
        base = Path(os.environ.get("ORACLE_TMP", "/tmp/oracle"))
        base.mkdir(parents=True, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="sluice-", dir=base)
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}",
             "--data-dir", os.path.join(self.dir, "data"), "--shards", "2",
             "--shard-aware-port", "off", "--metrics-listen", "off",
             "--durability", "periodic", "--log", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sluice did not listen within 30 s")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def address(text):
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1, help="first seed")
    p.add_argument("--seeds", type=int, default=1, help="number of consecutive seeds")
    p.add_argument("--statements", type=int, default=100, help="statements per seed")
    p.add_argument("--sluice", help="host:port of a running Sluice (default: start the debug binary)")
    p.add_argument("--cassandra", default=os.environ.get("ORACLE_CASSANDRA", "127.0.0.1:9142"))
    p.add_argument("--shrink-budget", type=int, default=120, help="most replays spent shrinking")
    p.add_argument("--print", action="store_true", help="print the statements of the seed and exit")
    p.add_argument("--verbose", action="store_true", help="print every statement and both answers")
    args = p.parse_args(argv)

    if args.print:
        for seed in range(args.seed, args.seed + args.seeds):
            schema, statements = generate(seed, args.statements)
            print(schema.create("ks", "t") + ";")
            for template, fetch_size in statements:
                print(template.replace("{t}", "ks.t") + ";" + (f"   -- fetch_size {fetch_size}" if fetch_size else ""))
        return 0

    sluice_proc = None if args.sluice else SluiceProcess()
    sluice = address(args.sluice) if args.sluice else ("127.0.0.1", sluice_proc.port)
    keyspace = f"oracle_{os.getpid()}_{args.seed}"
    failures = []
    t0 = time.time()
    try:
        servers = Servers(sluice, address(args.cassandra), keyspace)
        try:
            for seed in range(args.seed, args.seed + args.seeds):
                if not run_seed(servers, seed, args.statements, args.shrink_budget, args.verbose):
                    failures.append(seed)
                if sluice_proc and not sluice_proc.alive():
                    print("sluice exited during the run", file=sys.stderr)
                    failures.append("crash")
                    break
        finally:
            servers.close()
    finally:
        if sluice_proc:
            sluice_proc.stop()
    print(f"{args.seeds} seeds x {args.statements} statements in {time.time() - t0:.0f} s; "
          f"mismatching seeds: {failures or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
