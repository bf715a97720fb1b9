"""docs/GETTING_STARTED.md, run as written: its Python blocks, in order, on the servers they start.

A block whose first line is ``# <path>.py`` is a file the reader saves: it is written to
that path in a fresh working directory (on ``sys.path``, as a script's directory is); every
other block runs there, in order, in one namespace, and what each commented ``print``
prints must be its comment. Then the console's JSON must have the keys the page documents,
and the page's DAG runs once (``dag.test()``, as ``airflow dags test``) on the connections
``python -m airflow_seatunnel_ckpt.testing`` prints, before the page's last block stops the
servers.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_seatunnel_ckpt import cli
from airflow_seatunnel_ckpt.testing import airflow_connections

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[1] / "docs" / "GETTING_STARTED.md"
FILE_HEADER = re.compile(r"# ([\w/]+\.py)\n")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def _printed_as_commented(block: str) -> list[str | None]:
    """For each ``print(...)`` line of ``block``, the output its comment shows (None: no comment)."""
    return [line.partition("  # ")[2] or None for line in block.splitlines() if line.startswith("print(")]


def _keys(value: Any) -> Any:
    """The shape of a JSON value: its keys, nested (a list by the shape of its first item)."""
    if isinstance(value, dict):
        return {key: _keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_keys(value[0])] if value else []
    return None


def test_getting_started_takes_kafka_records_into_postgres_exactly_once_from_a_script_and_from_a_dag(
        spark: Any, run_dag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    scripts = []
    for block in _blocks("python"):
        header = FILE_HEADER.match(block)
        if header:
            (tmp_path / header.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / header.group(1)).write_text(block)
        else:
            scripts.append(block)
    *steps, stop = scripts
    assert "kafka.stop()" in stop and "postgres.stop()" in stop
    printed: list[str] = []
    namespace: dict[str, Any] = {"__name__": "getting_started",
                                 "print": lambda *args: printed.append(" ".join(map(str, args)))}
    try:
        for step in steps:
            exec(compile(step, str(DOC), "exec"), namespace)  # the page's own text
        expected = [shown for step in steps for shown in _printed_as_commented(step)]
        assert len(printed) == len(expected), printed
        assert [p for p, e in zip(printed, expected, strict=True) if e is not None] == [e for e in expected if e]
        kafka, postgres, pipeline = namespace["kafka"], namespace["postgres"], namespace["pipeline"]
        assert pipeline.committed_epochs() == [1, 2]

        # The console's JSON, shaped as the page shows it.
        store = Path("ckpt-store").resolve().as_uri()
        capsys.readouterr()
        assert cli.main(["--store", store, "epochs", "orders", "--json"]) == 0
        epochs = json.loads(capsys.readouterr().out)
        [documented] = json.loads(next(b for b in _blocks("json") if '"run_id": "second"' in b))
        assert [e["epoch"] for e in epochs] == [1, 2]
        assert _keys(epochs[1]) == _keys(documented), (epochs[1], documented)
        assert {k: epochs[1][k] for k in ("state", "run_id", "rows")} == {
            k: documented[k] for k in ("state", "run_id", "rows")}
        assert cli.main(["--store", store, "show", "orders", "2", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert set(shown) == {"status", "expectations", "input", "actions", "checkpoint"}
        assert set(shown["status"]) == set(documented) - {"logical_date", "rows", "expectations", "input"}
        assert set(shown["checkpoint"]) >= {"format_version", "epoch", "base_epoch", "run_id", "participants",
                                            "sources", "sinks", "operators"}
        assert set(shown["checkpoint"]["sources"]["orders"]["offsets"]) == {"start", "end", "topic_ids", "lost"}
        assert set(shown["checkpoint"]["sources"]["orders"]["chain"][0]) == {
            "path", "size", "crc32c", "epoch", "key_group", "kind"}

        # The page's DAG, on the connections `python -m airflow_seatunnel_ckpt.testing` prints.
        for name, value in airflow_connections(kafka, postgres).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("SEATUNNEL_CKPT_STORE", (tmp_path / "airflow-store").as_uri())  # the default store
        bag = DagBag(dag_folder=str(tmp_path / "dags" / "orders_from_kafka.py"))
        assert not bag.import_errors, bag.import_errors
        dag = bag.dags["orders_from_kafka"]
        dag.get_task("orders.prepared").poke_interval = 0.5
        assert run_dag(dag).state == "success"
        import psycopg

        with psycopg.connect(postgres.conninfo()) as conn:
            rows = conn.execute("SELECT order_id FROM public.orders_airflow").fetchall()
        assert sorted(r[0] for r in rows) == sorted(f"o{i}" for i in range(15))
    finally:
        if "kafka" in namespace and "postgres" in namespace:
            exec(compile(stop, str(DOC), "exec"), namespace)
        else:
            for server in ("kafka", "postgres"):
                if server in namespace:
                    namespace[server].stop()
        namespace.clear()  # the page's clients too, which would try the stopped broker again
        sys.modules.pop("orders_stage", None)


def test_python_m_testing_serves_both_servers_with_their_airflow_connections_until_sigterm() -> None:
    process = subprocess.Popen([sys.executable, "-m", "airflow_seatunnel_ckpt.testing"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                break
        exports = dict(re.findall(r"^export (AIRFLOW_CONN_\w+)='(.*)'$", "\n".join(lines), re.MULTILINE))
        kafka = json.loads(exports["AIRFLOW_CONN_LOCAL_KAFKA"])["extra"]["bootstrap.servers"]
        from confluent_kafka.admin import AdminClient

        assert AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=10).brokers
        import psycopg

        postgres = exports["AIRFLOW_CONN_LOCAL_POSTGRES"]
        with psycopg.connect(postgres) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(postgres, connect_timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
