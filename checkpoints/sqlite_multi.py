"""The hot path's one-round-trip queries on SQLite: a cursor that runs them statement by statement.

checkpoints.runs writes each hot transaction (the claim, checkpoints A and B, B with the inline claim,
the terminal write; and checkpoints.create_one_trip a submit's) as ONE multi-statement MySQL query that
ends in its own COMMIT, every statement after the fenced UPDATE conditional on it (`SET @fenced =
ROW_COUNT()`, `... WHERE @fenced = 1`). SQLite has no network round trip to save, but the same text
spares it SQLAlchemy Core's per-statement work (about a third of a SQLite step's CPU, issue 17) and
keeps ONE copy of each fenced transaction for both stores.

`MultiCursor.execute` splits such a query and runs its statements in order on the pysqlite connection,
inside the transaction checkpoints.db.raw_txn began (BEGIN IMMEDIATE for a writer). The dialects differ
in a few words only, each translated once per query text (`_translate`):

- `%s` placeholders become `?`;
- `SET @name = ROW_COUNT()` keeps the rows the statement before it matched (SQLite's rowcount of an
  UPDATE counts the rows its WHERE matched, as MySQL's does with FOUND_ROWS), and every later `@name`
  is bound to that number as a parameter (never spliced into the text);
- `FROM DUAL` goes (SQLite selects without FROM), and so does `FOR UPDATE` (a writer already holds the
  database's one write lock since BEGIN IMMEDIATE; a reader in WAL mode reads a snapshot);
- `INSERT IGNORE INTO` becomes `INSERT OR IGNORE INTO` (a row whose key exists is skipped; the submit's
  account row, checkpoints.create_one_trip);
- `COMMIT` commits the connection's transaction, if one is open (MySQL's COMMIT with none is no error; a
  statement after it runs on its own, as a read after a COMMIT does on MySQL).

Each statement gives one result, as the MySQL drivers' `nextset()` does, so checkpoints.db.results reads
both alike: (rowcount, lastrowid, rows). A failing statement raises at once; raw_txn then rolls the
transaction back, so nothing of it is written (a MySQL server, too, stops at the first error, before the
COMMIT at the end of the query)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

_SET = re.compile(r"SET @(\w+) = ROW_COUNT\(\)")
_VAR_OR_PARAM = re.compile(r"@(\w+)|%s")


@dataclass(frozen=True)
class _Statement:
    sql: str  # SQLite's text; "" for a SET, "COMMIT" for the commit
    binds: tuple[str | None, ...]  # per `?`: None = the next caller parameter, else the variable's name
    sets: str | None = None  # SET @sets = ROW_COUNT()


@functools.lru_cache(maxsize=256)
def _translate(query: str) -> tuple[tuple[_Statement, ...], int]:
    """The query's statements in SQLite's words, and how many parameters the caller gives for them."""
    statements: list[_Statement] = []
    known: set[str] = set()  # variables set so far: one set by an earlier query is no count of this one
    for text in (part.strip() for part in query.split(";")):
        if not text:
            continue
        found = _SET.fullmatch(text)
        if found and statements:
            statements.append(_Statement("", (), sets=found.group(1)))
            known.add(found.group(1))
            continue
        if found or "ROW_COUNT()" in text or "LAST_INSERT_ID" in text:
            raise ValueError(f"no SQLite translation for: {text}")
        binds = tuple(None if m.group(0) == "%s" else m.group(1) for m in _VAR_OR_PARAM.finditer(text))
        if not known.issuperset(name for name in binds if name is not None):
            raise ValueError(f"a variable used before this query sets it: {text}")
        sql = (_VAR_OR_PARAM.sub("?", text).replace(" FROM DUAL", "").replace(" FOR UPDATE", "")
               .replace("INSERT IGNORE INTO ", "INSERT OR IGNORE INTO "))
        statements.append(_Statement(sql, binds))
    return tuple(statements), sum(name is None for st in statements for name in st.binds)


class _Result(NamedTuple):
    """One statement's result, as a MySQL driver's cursor shows it after `nextset()`."""

    rowcount: int
    lastrowid: Any
    rows: list[Any] | None  # None: the statement returned no rows at all (not a SELECT)
    description: Any


_NO_ROWS = _Result(0, None, None, None)  # a SET or a COMMIT


class MultiCursor:
    """A DBAPI-cursor-shaped runner of one multi-statement query at a time on a pysqlite connection:
    `execute`, then `rowcount`/`lastrowid`/`description`/`fetchone`/`fetchall` of the current result and
    `nextset()` to the next, as PyMySQL's cursor with CLIENT_MULTI_STATEMENTS."""

    def __init__(self, dbapi_conn: Any) -> None:
        self._conn = dbapi_conn
        self._cur = dbapi_conn.cursor()
        self._results: list[_Result] = []
        self._at = 0
        self._rows_read = 0

    def execute(self, query: str, params: tuple[Any, ...] | list[Any] = ()) -> None:
        statements, placeholders = _translate(query)
        if len(params) != placeholders:
            raise ValueError(f"{len(params)} parameters for a query of {placeholders} placeholders")
        given = iter(params)
        values: dict[str, int] = {}
        results: list[_Result] = []
        cur = self._cur
        for st in statements:
            if st.sets is not None:
                values[st.sets] = results[-1].rowcount
                results.append(_NO_ROWS)
            elif st.sql == "COMMIT":
                if self._conn.in_transaction:  # as MySQL's: a COMMIT with nothing begun is no error
                    self._conn.execute("COMMIT")
                results.append(_NO_ROWS)
            else:
                cur.execute(st.sql, [next(given) if name is None else values[name] for name in st.binds])
                described = cur.description
                rows = cur.fetchall() if described else None
                results.append(_Result(cur.rowcount, cur.lastrowid, rows, described))
        self._results, self._at, self._rows_read = results, 0, 0

    @property
    def rowcount(self) -> int:
        return self._results[self._at].rowcount

    @property
    def lastrowid(self) -> Any:
        return self._results[self._at].lastrowid

    @property
    def description(self) -> Any:
        return self._results[self._at].description

    def fetchall(self) -> list[Any]:
        rows = self._results[self._at].rows or []
        out, self._rows_read = rows[self._rows_read:], len(rows)
        return out

    def fetchone(self) -> Any:
        rows = self._results[self._at].rows or []
        if self._rows_read >= len(rows):
            return None
        self._rows_read += 1
        return rows[self._rows_read - 1]

    def nextset(self) -> bool:
        if self._at + 1 >= len(self._results):
            return False
        self._at, self._rows_read = self._at + 1, 0
        return True

    def close(self) -> None:
        self._cur.close()

