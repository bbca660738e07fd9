"""Jobs over SQL tables: SQLite (the embedded default) and a real PostgreSQL server.

The digits model trains from a table to the accuracy it reaches from files; the counting model
(tests/e2e/zoo/counting_digits.py, ids from the table's ``id`` column) shows every row applied
exactly once per epoch through a killed worker; and a password given in the URL reaches the
workers but is written nowhere -- not the job directory, the status, the logs or the output.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from ft_helpers import COUNTING_MODEL, flextrain_cmd, read_status, run_flextrain, seen_counts, wait_for
from flextrain.data import decode_digits, read_records

pytestmark = pytest.mark.e2e

TABLE_MODEL = f"{Path(__file__).resolve().parent / 'zoo' / 'table_digits.py'}:Model"
COLUMNS = ", ".join(f"p{i} INTEGER" for i in range(64))


def digits_rows(directory: Path, limit: int | None = None) -> list[tuple]:
    records = [r for f in sorted(directory.glob("*.rio")) for r in read_records(f)][:limit]
    pixels, labels = decode_digits(records)
    return [(i, *(int(round(v * 16)) for v in row), int(label), "unused")
            for i, (row, label) in enumerate(zip(pixels, labels))]


def sqlite_table(db: Path, table: str, rows: list[tuple]) -> None:
    with sqlite3.connect(db) as c:
        c.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, {COLUMNS}, label INTEGER, note TEXT)")
        c.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * 67)})", rows)


@pytest.fixture(scope="module")
def sqlite_trained(digits_data, tmp_path_factory):
    """The digits model trained from SQLite tables by two workers: (database, job dir, process)."""
    root = tmp_path_factory.mktemp("sqlite-digits")
    db = root / "digits.db"
    sqlite_table(db, "train", digits_rows(digits_data / "train"))
    sqlite_table(db, "validation", digits_rows(digits_data / "validation"))
    job_dir = root / "job"
    proc = run_flextrain("train", "--model-def", TABLE_MODEL, "--training-data", f"sqlite:///{db}?table=train",
                         "--validation-data", f"sqlite:///{db}?table=validation", "--workers", "2", "--epochs", "6",
                         "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1",
                         "--job-dir", str(job_dir))
    return db, job_dir, proc


def test_digits_train_from_sqlite_tables_above_90_percent(sqlite_trained):
    _, job_dir, proc = sqlite_trained
    assert proc.returncode == 0, proc.stderr
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == status["progress"]["recordsTotal"] == 6 * 1438
    assert status["metrics"]["accuracy"] > 0.90


def test_predictions_are_written_back_to_a_table_one_row_per_record(sqlite_trained, tmp_path):
    from flextrain.data.sql_output import read_output_rows

    db, job_dir, trained = sqlite_trained
    assert trained.returncode == 0, trained.stderr
    out = f"sqlite:///{tmp_path / 'out.db'}?table=predictions"
    args = ("predict", "--model-def", TABLE_MODEL, "--prediction-data", f"sqlite:///{db}?table=validation",
            "--checkpoint", str(job_dir), "--output", out, "--workers", "2", "--global-batch-size", "32",
            "--steps-per-task", "2")
    proc = run_flextrain(*args, "--job-dir", str(tmp_path / "predict"))
    assert proc.returncode == 0, proc.stderr
    assert "359 predictions written" in read_status(tmp_path / "predict")["message"]
    rows = read_output_rows(out)
    assert [r["index"] for r in rows] == list(range(359))  # one row per record, in input order
    with sqlite3.connect(db) as c:
        labels = [label for (label,) in c.execute("SELECT label FROM validation ORDER BY id")]
    hits = sum(max(range(10), key=lambda k: r["prediction"][k]) == y for r, y in zip(rows, labels))
    assert hits / 359 > 0.9
    again = run_flextrain(*args, "--job-dir", str(tmp_path / "again"))  # never mixed with an earlier run's rows
    assert again.returncode == 2 and "already holds 359 predictions; choose a new or empty table" in again.stderr


def test_a_missing_table_and_a_missing_column_are_refused_at_submission(digits_data, tmp_path):
    db = tmp_path / "digits.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE narrow (id INTEGER PRIMARY KEY, label INTEGER)")
        c.execute("INSERT INTO narrow VALUES (0, 1)")
    proc = run_flextrain("train", "--model-def", TABLE_MODEL, "--training-data", f"sqlite:///{db}?table=train",
                         "--job-dir", str(tmp_path / "a"))
    assert proc.returncode == 2 and f"training data: no table train in sqlite:///{db} (its tables: narrow)" in proc.stderr
    proc = run_flextrain("train", "--model-def", TABLE_MODEL, "--training-data", f"sqlite:///{db}?table=narrow",
                         "--job-dir", str(tmp_path / "b"))
    assert proc.returncode != 0 and "table narrow of" in proc.stderr and "has no columns p0, p1" in proc.stderr
    assert "(its columns: id, label)" in proc.stderr


@pytest.fixture(scope="module")
def pg_digits(postgres, digits_data):
    """Tables ``counting`` (the first 1408 training digits) and ``validation`` in the PostgreSQL server."""
    columns = ", ".join(f"p{i} SMALLINT" for i in range(64))
    for table, rows in (("counting", digits_rows(digits_data / "train", 1408)),
                        ("validation", digits_rows(digits_data / "validation"))):
        values = ",\n".join(f"({', '.join(map(repr, row[:-1]))}, 'unused')" for row in rows)
        postgres.psql(f"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGINT PRIMARY KEY, {columns}, "
                      f"label SMALLINT, note TEXT); INSERT INTO {table} VALUES {values}; "
                      f"ALTER TABLE {table} OWNER TO flextrain;", database="flextrain")
    return postgres


def test_digits_train_from_postgresql_tables_above_90_percent(pg_digits, tmp_path, monkeypatch):
    import pg_server

    monkeypatch.setenv("FLEXTRAIN_DATA_PASSWORD", pg_server.PASSWORD)
    proc = run_flextrain("train", "--model-def", TABLE_MODEL, "--training-data", pg_digits.url(table="counting"),
                         "--validation-data", pg_digits.url(table="validation"), "--workers", "2", "--epochs", "8",
                         "--global-batch-size", "64", "--max-micro-batch", "32", "--lr", "0.1",
                         "--job-dir", str(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    status = read_status(tmp_path / "job")
    assert status["phase"] == "Succeeded" and status["progress"]["recordsDone"] == 8 * 1408
    assert status["metrics"]["accuracy"] > 0.90


def test_postgresql_rows_are_applied_exactly_once_through_a_kill_and_the_password_is_written_nowhere(
        pg_digits, tmp_path):
    import pg_server

    postgres, n, epochs, G = pg_digits, 1408, 3, 32
    job_dir = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEXTRAIN_DATA_PASSWORD", "PGPASSWORD")}
    env.update(FT_COUNT_G=str(G), FT_COUNT_RECORDS=str(n), FT_FEED_DELAY="0.01")
    cmd = flextrain_cmd("train", "--model-def", COUNTING_MODEL,
                        "--training-data", postgres.url(table="counting", password=True),
                        "--workers", "2", "--epochs", str(epochs), "--global-batch-size", str(G),
                        "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        def two_training():
            if not (job_dir / "status.json").exists():
                return None
            s = read_status(job_dir)
            rounds = s.get("roundHistory") or []
            return s["phase"] == "Running" and s["step"] > 15 and rounds and len(rounds[-1]["members"]) == 2 \
                and rounds[-1]
        members = wait_for(two_training, timeout=180, what="two workers training from PostgreSQL")["members"]
        os.kill(members[1]["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded" and status["progress"]["recordsDone"] == epochs * n
    seen, _ = seen_counts(job_dir)
    assert seen.tolist() == [float(epochs)] * n  # every row, exactly once per epoch
    assert len(status["roundHistory"]) >= 2  # the kill happened while the job ran
    # The password reached the workers (they read the table) but was written nowhere.
    secret = pg_server.PASSWORD.encode()
    assert secret not in (out + err).encode()
    for path in job_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    # The job spec keeps the URL without it (a resume needs FLEXTRAIN_DATA_PASSWORD or PGPASSWORD again).
    assert postgres.url(table="counting") in (job_dir / "jobspec.json").read_text()
