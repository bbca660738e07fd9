"""SQL tables as a data source (flextrain.data.sql): SQLite here, the same code on a real PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest

from flextrain.cli.common import data_abs
from flextrain.data import DataError, DataOptions, make_shards, read_shard_range
from flextrain.data import sql
from flextrain.data.sql import PASSWORD_ENV, TableRef, redact, split_password

ROWS = 10_000


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "data.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE keyed (id INTEGER PRIMARY KEY, x REAL, label INTEGER)")
        c.executemany("INSERT INTO keyed VALUES (?, ?, ?)", [(3 * i, i / 2, i % 10) for i in range(ROWS)])
        c.execute("CREATE TABLE plain (x REAL, name TEXT)")
        c.executemany("INSERT INTO plain VALUES (?, ?)", [(float(i), f"r{i}") for i in range(5000)])
        c.execute("CREATE TABLE dup (k INTEGER, v INTEGER)")
        c.executemany("INSERT INTO dup VALUES (?, ?)", [(1, 1), (1, 2), (2, 3)])
        c.execute("CREATE TABLE nulls (k INTEGER, v INTEGER)")
        c.executemany("INSERT INTO nulls VALUES (?, ?)", [(None, 1), (2, 2)])
        c.execute("CREATE TABLE empty (k INTEGER PRIMARY KEY)")
    return path


def all_rows(shards, columns=None):
    return [row for s in shards for row in read_shard_range(s.source, s.start, s.end, columns=columns)]


def test_a_keyed_table_is_cut_by_key_and_read_back_whole_in_key_order(db):
    shards = make_shards(f"sqlite:///{db}?table=keyed")  # key: the integer primary key
    assert [(s.start, s.end) for s in shards] == [(0, 4096), (4096, 8192), (8192, ROWS)]
    assert shards[1].source.endswith('#{"first_key":12288,"first_row":4096}') and "key=id" in shards[1].source
    rows = all_rows(shards)
    assert rows == [{"id": 3 * i, "x": i / 2, "label": i % 10} for i in range(ROWS)]
    # A task is any sub-range of a shard; ranges crossing nothing but the shard's own rows.
    assert read_shard_range(shards[2].source, 9000, 9002) == [{"id": 27000, "x": 4500.0, "label": 0},
                                                              {"id": 27003, "x": 4500.5, "label": 1}]


def test_columns_are_projected(db):
    shards = make_shards(f"sqlite:///{db}?table=keyed&key=id", options=DataOptions())
    assert read_shard_range(shards[0].source, 5, 7, columns=["label"]) == [{"label": 5}, {"label": 6}]


def test_an_unkeyed_table_is_read_by_row_number(db):
    shards = make_shards(f"sqlite:///{db}?table=plain")
    assert [(s.start, s.end) for s in shards] == [(0, 4096), (4096, 5000)]
    assert len({s.source for s in shards}) == 1
    assert [r["name"] for r in all_rows(shards)] == [f"r{i}" for i in range(5000)]


def test_a_table_that_shrank_under_a_job_is_an_error_not_a_gap(db):
    shards = make_shards(f"sqlite:///{db}?table=plain")
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM plain WHERE rowid > 4990")
    with pytest.raises(DataError, match=r"rows \[4096, 5000\) of table plain .*got 894 rows, expected 904 -- the "
                                        "table changed"):
        read_shard_range(shards[1].source, 4096, 5000)


@pytest.mark.parametrize("url, message", [
    ("sqlite:///{db}?table=nope", r"training data: no table nope in sqlite:///.*data.db \(its tables: dup, empty, "
                                  r"keyed, nulls, plain\)"),
    ("sqlite:///{db}", r"names no table: add \?table=NAME"),
    ("sqlite:///{db}?table=dup&key=k", r"key column k of table dup .* is not unique \(3 rows, 2 distinct values\)"),
    ("sqlite:///{db}?table=nulls&key=k", r"key column k of table nulls .* is NULL in 1 row"),
    ("sqlite:///{db}?table=keyed&key=zz", r"table keyed of .* has no key column zz \(its columns: id, x, label\)"),
    ("sqlite:///{db}?table=empty", r"table empty of .* holds no rows"),
    ("sqlite:///{db}.missing?table=keyed", r"SQLite database file not found: .*data.db.missing"),
    ("nosuchdb://host/x?table=t", r"cannot use the database URL nosuchdb://host/x"),
])
def test_bad_tables_are_named(db, url, message):
    with pytest.raises(DataError, match=message):
        make_shards(url.format(db=db), what="training data")


def test_missing_columns_are_named_with_the_columns_the_table_has(db):
    with pytest.raises(DataError, match=r"table keyed of .* has no columns pixels, y \(its columns: id, x, label\)"):
        sql.make_sql_shards(f"sqlite:///{db}?table=keyed", columns=["pixels", "y"], what="training data")


def test_an_unreachable_server_is_named_without_its_password(monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    url = "postgresql+psycopg://me:hunter2@127.0.0.1:1/db?table=t"
    with pytest.raises(DataError) as info:
        make_shards(url, what="training data")
    text = str(info.value)
    assert "cannot connect to postgresql+psycopg://me@127.0.0.1:1/db" in text and "hunter2" not in text


def test_passwords_are_split_off_and_redacted():
    assert split_password("postgresql://u:p%40ss@h:5/db?table=t") == ("postgresql://u@h:5/db?table=t", "p@ss")
    assert split_password("sqlite:////tmp/x.db?table=t") == ("sqlite:////tmp/x.db?table=t", None)
    assert redact("postgresql://u:pw@h/db?table=t") == "postgresql://u:***@h/db?table=t"
    ref = TableRef.parse("postgresql+psycopg://u:pw@h/db?table=t&key=id&sslmode=require")
    assert (ref.table, ref.key) == ("t", "id") and "pw" not in ref.url and "sslmode=require" in ref.url


def test_submission_moves_the_password_to_the_environment_and_makes_sqlite_paths_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv(PASSWORD_ENV, "")  # restored after the test: data_abs sets it
    monkeypatch.chdir(tmp_path)
    assert data_abs("postgresql+psycopg://u:pw@h/db?table=t") == "postgresql+psycopg://u@h/db?table=t"
    import os

    assert os.environ[PASSWORD_ENV] == "pw"
    assert data_abs("sqlite:///rel/x.db?table=t") == f"sqlite:///{tmp_path}/rel/x.db?table=t"
    from flextrain.cli.common import CLIError

    with pytest.raises(CLIError, match=r"password differs"):
        data_abs("postgresql+psycopg://u:other@h/db?table=v")


def test_the_same_code_reads_a_real_postgresql_table(postgres, monkeypatch):
    postgres.psql("DROP TABLE IF EXISTS unit; CREATE TABLE unit (id BIGINT PRIMARY KEY, v DOUBLE PRECISION, s TEXT); "
                  "INSERT INTO unit SELECT g, g / 4.0, 'n' || g FROM generate_series(0, 9999) g; "
                  "ALTER TABLE unit OWNER TO flextrain; "
                  "CREATE TABLE unkeyed (v INTEGER); INSERT INTO unkeyed SELECT g FROM generate_series(1, 50) g; "
                  "ALTER TABLE unkeyed OWNER TO flextrain;", database="flextrain")
    import pg_server

    monkeypatch.setenv(PASSWORD_ENV, pg_server.PASSWORD)
    shards = make_shards(postgres.url(table="unit"))
    assert [(s.start, s.end) for s in shards] == [(0, 4096), (4096, 8192), (8192, 10000)]
    rows = all_rows(shards, columns=["id", "s"])
    assert rows == [{"id": i, "s": f"n{i}"} for i in range(10000)]
    assert sorted(r["v"] for r in all_rows(make_shards(postgres.url(table="unkeyed")))) == list(range(1, 51))
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    sql._engines.clear()
    with pytest.raises(DataError, match="password authentication failed") as info:
        make_shards(postgres.url(table="unit"))
    assert "wrong" not in str(info.value)


def test_a_job_spec_refuses_a_password_in_a_url_and_a_data_secret_outside_kubernetes():
    from flextrain.job import JobSpec, JobSpecError

    base = dict(name="j", model_def="m.py:M", job_dir="/j")
    with pytest.raises(JobSpecError, match=r"--validation-data: a database URL must not hold its password"):
        JobSpec.of(**base, training_data="/d", validation_data="postgresql://u:pw@h/db?table=v").validate()
    with pytest.raises(JobSpecError, match=r"--data-secret names a Kubernetes Secret"):
        JobSpec.of(**base, training_data="postgresql://u@h/db?table=t", data_secret="creds").validate()
    JobSpec.of(**base, training_data="postgresql://u@h/db?table=t").validate()  # no password: fine


def test_prediction_rows_of_a_retried_task_replace_its_earlier_ones(tmp_path):
    from flextrain.data.sql_output import check_output_rows, prepare_output_table, read_output_rows, write_task_rows

    url = f"sqlite:///{tmp_path / 'out.db'}?table=preds"
    prepare_output_table(url)  # created
    rows = [{"source": "s", "index": i, "prediction": [i, 0.5]} for i in range(3)]
    write_task_rows(url, 7, rows[:2])  # a first attempt that got part of the way
    write_task_rows(url, 7, rows)  # the retry replaces it
    write_task_rows(url, 8, [{"source": "s", "index": 3, "prediction": {"p": float("nan")}}])
    assert check_output_rows(url, [(7, "s", 0, 3), (8, "s", 3, 4)]) == 4
    got = read_output_rows(url)
    assert [r["index"] for r in got] == [0, 1, 2, 3] and got[0]["prediction"] == [0, 0.5]
    with pytest.raises(DataError, match=r"holds 0 rows of task 9 for the 2 records of s \[4, 6\)"):
        check_output_rows(url, [(7, "s", 0, 3), (9, "s", 4, 6)])
    with pytest.raises(DataError, match=r"already holds 4 predictions"):
        prepare_output_table(url)
    with sqlite3.connect(tmp_path / "out.db") as c:
        c.execute("CREATE TABLE other (a INTEGER)")
    with pytest.raises(DataError, match=r"exists with columns a; prediction output needs a new table"):
        prepare_output_table(f"sqlite:///{tmp_path / 'out.db'}?table=other")
