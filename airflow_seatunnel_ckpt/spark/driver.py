"""Driver entry point of a stage, for ``spark-submit`` (or ``python -m``).

::

    spark-submit --master spark://host:7077 --files /private/dir/spec.json \\
        .../airflow_seatunnel_ckpt/spark/driver.py --spec-file spec.json

The spec file (a :class:`~airflow_seatunnel_ckpt.spark.spec.StageSpec` in JSON) is looked up on this host, else among
the files ``spark-submit`` shipped. Exit status 0: the participant is prepared for the epoch; the result also goes to
``--result-file`` (a path or fsspec URL) if given.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec


def _write_result(target: str, data: dict[str, object]) -> None:
    from airflow_seatunnel_ckpt.core.storage import open_storage
    from airflow_seatunnel_ckpt.spark.locations import fsspec_url

    url = fsspec_url(target)
    folder, _, name = url.rpartition("/")
    open_storage(folder).write_atomic(name, json.dumps(data, indent=1).encode())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stage a spec file describes; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="airflow_seatunnel_ckpt.spark.driver", description=__doc__.split("\n")[0])
    parser.add_argument("--spec-file", required=True, help="StageSpec as JSON")
    parser.add_argument("--result-file", help="where to write the StageResult as JSON")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--progress-interval", type=float, default=None,
                        help="seconds between two progress lines of the running Spark jobs (default 10)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from airflow_seatunnel_ckpt.spark.runner import run_stage
    from airflow_seatunnel_ckpt.spark.session import stage_session
    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    submitted = _under_spark_submit()
    spec_file = _local_or_shipped(args.spec_file, submitted)
    if not os.path.isfile(spec_file):
        raise SystemExit(f"spec file {args.spec_file!r} is neither a file on this host nor among the files "
                         "spark-submit shipped (--files); the stage task ships it: re-run the task")
    with open(spec_file, encoding="utf-8") as fh:
        spec = StageSpec.from_json(fh.read())
    _use_connections(spec, submitted)
    interval = {} if args.progress_interval is None else {"progress_interval": args.progress_interval}
    if spec.remote is not None:  # through Spark Connect: run_stage opens and releases its session
        _finish(run_stage(spec, **interval), args.result_file)
        return 0
    # Under spark-submit the launcher's --master and --conf win; run directly, the spec's.
    spark = stage_session(spec, submitted=submitted)
    try:
        _finish(run_stage(spec, spark, **interval), args.result_file)
    finally:
        spark.stop()
    return 0


def _finish(result: StageResult, result_file: str | None) -> None:
    """Hand the result back: to ``--result-file`` if given, and as one JSON line on standard output."""
    if result_file:
        _write_result(result_file, result.to_dict())
    print(json.dumps({"epoch": result.epoch, "attempt": result.attempt, "rows": result.rows,
                      "reused": result.reused}))


def _use_connections(spec: StageSpec, submitted: bool) -> None:
    """Let the PostgreSQL sources connect through the connections the submitting task resolved (``spec.connections``),
    each password file found on this host or among the shipped files."""
    if not spec.connections:
        return
    from psycopg.conninfo import make_conninfo

    from airflow_seatunnel_ckpt.core.sinks import register_secret_resolver
    from airflow_seatunnel_ckpt.core.sources.postgres_cdc import connections_resolver

    conninfos = {}
    for conn_id, given in spec.connections.items():
        conninfo, passfile = given.get("conninfo", ""), given.get("passfile")
        if passfile:
            passfile = _local_or_shipped(passfile, submitted)
            if not os.path.isfile(passfile):
                raise SystemExit(f"the password file of connection {conn_id!r} ({given['passfile']}) is neither a "
                                 "file on this host nor among the files spark-submit shipped (--files); the stage "
                                 "task writes it beside the spec: re-run the task")
            if os.stat(passfile).st_mode & 0o077:  # a shipped copy: libpq ignores a file others may read
                os.chmod(passfile, 0o600)
            conninfo = make_conninfo(conninfo, passfile=passfile)
        conninfos[conn_id] = conninfo
    register_secret_resolver(connections_resolver(conninfos))


def _local_or_shipped(path: str, submitted: bool) -> str:
    """``path`` if it is a file on this host (or not under spark-submit), else where ``--files`` shipped it."""
    if os.path.isfile(path) or not submitted:
        return path
    from pyspark.sql import SparkSession

    from airflow_seatunnel_ckpt.spark.classic import shipped_file

    SparkSession.builder.getOrCreate()  # shipped files are reachable once the application's SparkContext is up
    return shipped_file(os.path.basename(path))


def _under_spark_submit() -> bool:
    """Whether this Python was started by spark-submit (which passes its gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    # Run as a script (spark-submit), Python puts this file's folder first on sys.path,
    # where the package's modules would shadow top-level names: take it off.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.exit(main())
