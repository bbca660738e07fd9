"""SQL tables as a data source: any SQLAlchemy URL with ``?table=NAME[&key=COLUMN]``.

``sqlite:///data.db?table=train`` or ``postgresql+psycopg://user@db/ml?table=train&key=id``:
``table`` (required) and ``key`` are flextrain's; every other query parameter goes to the
database driver. How a table becomes shards (:func:`make_sql_shards`):

* **keyed** (``key=`` given, else the table's one-column integer or text primary key): rows in
  key order, cut into shards of :data:`SHARD_ROWS` rows, each one's source naming its first
  key, so a worker reads ``WHERE key >= first ORDER BY key`` with a small offset -- an index
  range scan however large the table. The key must be unique and never NULL (checked).
* **unkeyed**: rows numbered in a stable order (SQLite's ``rowid``, else every column), read
  with ``LIMIT``/``OFFSET``: fine for small tables; give ``key=`` for large ones.

Workers read a task's rows through a server-side cursor (``stream_results``) in batches of
:data:`FETCH_ROWS` and get them as ``dict`` (column name -> value, as the driver returns it),
only the module's ``columns`` where it names them. The table must not change while a job
reads it: a range that comes back short is an error naming it, never a silent gap.

Passwords never travel in URLs: a source string, a log line, the job spec and the status
carry the URL without one (:func:`redact`), and :func:`engine_for` takes the password from
``FLEXTRAIN_DATA_PASSWORD`` (the CLI moves a password given in a URL there; on Kubernetes a
Secret named by ``spec.data.secretRef`` provides it), or the driver's own variables
(``PGPASSWORD``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flextrain.data.errors import DataError

__all__ = ["PASSWORD_ENV", "SHARD_ROWS", "TableRef", "is_sql_url", "make_sql_shards", "read_sql_range", "redact",
           "split_password"]

PASSWORD_ENV = "FLEXTRAIN_DATA_PASSWORD"
SHARD_ROWS = 4096  # rows per shard (the master cuts shards further into tasks)
FETCH_ROWS = 1000  # rows per fetch from a server-side cursor
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_KEY_TYPES = (int, str)


def is_sql_url(path: object) -> bool:
    """A ``dialect[+driver]://`` URL (files never look like one)."""
    return isinstance(path, str) and bool(_URL.match(path))


def redact(text: str) -> str:
    """``text`` with any password in its URL replaced by ``***`` (for messages)."""
    return re.sub(r"(://[^:/?#@]*:)[^@/?#]*@", r"\1***@", text)


def split_password(text: str) -> tuple[str, str | None]:
    """``(the URL without its password, the password or None)``."""
    m = re.match(r"^([^:]+://[^:/?#@]*):([^@/?#]*)@(.*)$", text)
    if not m:
        return text, None
    from urllib.parse import unquote

    return f"{m.group(1)}@{m.group(3)}", unquote(m.group(2))


@dataclass(frozen=True)
class TableRef:
    """One table: the driver's URL (no password, no flextrain parameters), table and key."""

    url: str
    table: str
    key: str | None = None

    @classmethod
    def parse(cls, text: str, *, what: str = "data") -> TableRef:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        shown = redact(text.split("#", 1)[0])
        try:
            url = make_url(split_password(text.split("#", 1)[0])[0])
        except ArgumentError as exc:
            raise DataError(f"{what} URL {shown} is not a database URL: {exc}") from None
        query = dict(url.query)
        table, key = query.pop("table", None), query.pop("key", None)
        if not table or not isinstance(table, str):
            raise DataError(f"{what} URL {shown} names no table: add ?table=NAME (and &key=COLUMN for a large table)")
        if key is not None and not isinstance(key, str):
            raise DataError(f"{what} URL {shown}: give key= once")
        url = url.set(query=query)
        return cls(url.render_as_string(hide_password=False), table, key)

    def source(self, *, key: str | None = None, first_key: Any = None, first_row: int = 0) -> str:
        """The source string of a shard: the URL with ``table``/``key``; a keyed shard adds its
        first key and row number as a JSON fragment."""
        from sqlalchemy.engine import make_url

        params = {"table": self.table, **({"key": key} if key else {})}
        url = make_url(self.url)
        text = url.update_query_dict(params).render_as_string(hide_password=False)
        if key is None:
            return text
        return text + "#" + json.dumps({"first_key": first_key, "first_row": first_row}, separators=(",", ":"))

    def shown(self) -> str:
        return f"table {self.table} of {redact(self.url)}"


# One engine and table description per process and URL: workers read many tasks.
_engines: dict[str, Any] = {}
_tables: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def engine_for(ref: TableRef):
    """A cached engine for ``ref.url``, its password from the environment."""
    with _lock:
        engine = _engines.get(ref.url)
        if engine is None:
            from sqlalchemy import create_engine
            from sqlalchemy.engine import make_url

            url = make_url(ref.url)
            password = os.environ.get(PASSWORD_ENV)
            if password and url.password is None and url.get_backend_name() != "sqlite":
                url = url.set(password=password)
            try:
                engine = create_engine(url, pool_pre_ping=True)
            except Exception as exc:  # an unknown dialect or a missing driver
                raise DataError(f"cannot use the database URL {redact(ref.url)}: {_words(exc)}") from None
            _engines[ref.url] = engine
        return engine


def _words(exc: BaseException) -> str:
    """The database's own words, one line, never a password."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    password = os.environ.get(PASSWORD_ENV)
    return redact(text.replace(password, "***") if password else text)


def _table(ref: TableRef, conn, *, what: str):
    key = (ref.url, ref.table)
    table = _tables.get(key)
    if table is None:
        from sqlalchemy import MetaData, Table, inspect
        from sqlalchemy.exc import NoSuchTableError

        schema, _, name = ref.table.rpartition(".")
        try:
            table = Table(name, MetaData(), autoload_with=conn, schema=schema or None)
        except NoSuchTableError:
            names = sorted(inspect(conn).get_table_names(schema=schema or None))
            raise DataError(f"{what}: no table {ref.table} in {redact(ref.url)} (its tables: "
                            f"{', '.join(names) or 'none'})") from None
        _tables[key] = table
    return table


def _connect(ref: TableRef, *, what: str):
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return engine_for(ref).connect()
    except SQLAlchemyError as exc:
        raise DataError(f"{what}: cannot connect to {redact(ref.url)}: {_words(exc)}") from None


def _check_columns(table, names: Sequence[str] | None, ref: TableRef, *, what: str, role: str = "column") -> None:
    missing = [n for n in names or () if n not in table.c]
    if missing:
        raise DataError(f"{what}: {ref.shown()} has no {role}{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing)} (its columns: {', '.join(table.c.keys())})")


def _key_of(table, ref: TableRef) -> str | None:
    """The key= given, else a one-column integer or text primary key, else None."""
    if ref.key:
        return ref.key
    pk = list(table.primary_key.columns)
    if len(pk) == 1:
        try:
            if pk[0].type.python_type in _KEY_TYPES:
                return pk[0].name
        except NotImplementedError:
            pass
    return None


def make_sql_shards(text: str, *, what: str = "data", columns: Sequence[str] | None = None,
                    shard_rows: int = SHARD_ROWS) -> list[tuple[str, int, int]]:
    """The shards of a table as ``(source, start, end)`` (see the module docstring); raises
    DataError naming the problem."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    ref = TableRef.parse(text, what=what)
    _check_sqlite_file(ref, what=what)
    with _connect(ref, what=what) as conn:
        try:
            table = _table(ref, conn, what=what)
            _check_columns(table, columns, ref, what=what)
            key = _key_of(table, ref)
            if key is None:
                n = conn.execute(select(func.count()).select_from(table)).scalar_one()
                source = ref.source()
                return [(source, a, min(a + shard_rows, n)) for a in range(0, n, shard_rows)] or _empty(ref, what)
            _check_columns(table, [key], ref, what=what, role="key column")
            col = table.c[key]
            n, distinct, present = conn.execute(select(func.count(), func.count(col.distinct()), func.count(col))
                                                .select_from(table)).one()
            if present != n:
                raise DataError(f"{what}: key column {key} of {ref.shown()} is NULL in {n - present} row(s): "
                                "a key must identify every row")
            if distinct != n:
                raise DataError(f"{what}: key column {key} of {ref.shown()} is not unique ({n} rows, {distinct} "
                                "distinct values): name a unique column with key=")
            firsts = []
            result = conn.execution_options(stream_results=True, yield_per=FETCH_ROWS).execute(
                select(col).order_by(col))
            for i, (value,) in enumerate(result):
                if i % shard_rows == 0:
                    if not isinstance(value, _KEY_TYPES) or isinstance(value, bool):
                        raise DataError(f"{what}: key column {key} of {ref.shown()} holds {type(value).__name__} "
                                        "values: flextrain cuts tables by integer or text keys")
                    firsts.append((i, value))
        except SQLAlchemyError as exc:
            raise DataError(f"{what}: reading {ref.shown()} failed: {_words(exc)}") from None
    shards = [(ref.source(key=key, first_key=value, first_row=i), i, min(i + shard_rows, n)) for i, value in firsts]
    return shards or _empty(ref, what)


def _check_sqlite_file(ref: TableRef, *, what: str) -> None:
    # SQLite creates a missing database file on connect: a typo would read as "no such table".
    from sqlalchemy.engine import make_url

    url = make_url(ref.url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not url.database.startswith("file:") and not os.path.isfile(url.database):
        raise DataError(f"{what}: SQLite database file not found: {url.database}")


def _empty(ref: TableRef, what: str) -> list:
    raise DataError(f"{what}: {ref.shown()} holds no rows")


def _parse_source(source: str) -> tuple[TableRef, dict | None]:
    text, _, fragment = source.partition("#")
    return TableRef.parse(text), (json.loads(fragment) if fragment else None)


def read_sql_range(source: str, start: int, end: int, *, columns: Sequence[str] | None = None) -> list[dict]:
    """Rows ``[start, end)`` of a shard's source as dicts (column -> value), ``columns`` only if given."""
    from sqlalchemy import literal_column, select
    from sqlalchemy.exc import SQLAlchemyError

    ref, bound = _parse_source(source)
    if end <= start:
        return []
    with _connect(ref, what="data") as conn:
        try:
            table = _table(ref, conn, what="data")
            _check_columns(table, columns, ref, what="data")
            picked = [table.c[name] for name in columns] if columns else list(table.c)
            if bound is not None:
                col = table.c[ref.key]
                stmt = (select(*picked).where(col >= bound["first_key"]).order_by(col)
                        .offset(start - bound["first_row"]).limit(end - start))
            else:
                pk = list(table.primary_key.columns)
                order = [literal_column("rowid")] if conn.dialect.name == "sqlite" else pk or list(table.c)
                stmt = select(*picked).order_by(*order).offset(start).limit(end - start)
            result = conn.execution_options(stream_results=True, yield_per=FETCH_ROWS).execute(stmt)
            rows = [dict(row._mapping) for row in result]
        except SQLAlchemyError as exc:
            raise DataError(f"reading rows [{start}, {end}) of {ref.shown()} failed: {_words(exc)}") from None
    if len(rows) != end - start:
        raise DataError(f"rows [{start}, {end}) of {ref.shown()}: got {len(rows)} rows, expected {end - start} -- "
                        "the table changed while the job read it (a job's table must stay as it was at the start)")
    return rows
