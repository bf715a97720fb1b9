"""Driver entry point of a stage, for ``spark-submit`` (or ``python -m``).

::

    spark-submit --master spark://host:7077 .../airflow_seatunnel_ckpt/spark/driver.py \\
        --spec-file spec.json [--result-file result.json]
    python -m airflow_seatunnel_ckpt.spark.driver --spec-file spec.json

The spec is a :class:`~airflow_seatunnel_ckpt.spark.spec.StageSpec` in JSON (it holds the
store's storage options, so it travels in a file, never on the command line). The result
-- the :class:`~airflow_seatunnel_ckpt.spark.spec.StageResult` -- is written atomically
to ``--result-file`` (a local path or an fsspec URL). Exit status 0 means the participant
is prepared for the epoch (by this or an earlier attempt).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence


def _write_result(target: str, data: dict[str, object]) -> None:
    from airflow_seatunnel_ckpt.core.storage import open_storage
    from airflow_seatunnel_ckpt.spark.locations import fsspec_url

    url = fsspec_url(target)
    folder, _, name = url.rpartition("/")
    open_storage(folder).write_atomic(name, json.dumps(data, indent=1).encode())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stage a spec file describes; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="airflow_seatunnel_ckpt.spark.driver", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--spec-file", required=True, help="StageSpec as JSON")
    parser.add_argument("--result-file", help="where to write the StageResult as JSON")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from airflow_seatunnel_ckpt.spark.runner import run_stage
    from airflow_seatunnel_ckpt.spark.session import stage_session
    from airflow_seatunnel_ckpt.spark.spec import StageSpec

    with open(args.spec_file, encoding="utf-8") as fh:
        spec = StageSpec.from_json(fh.read())
    # Under spark-submit the launcher's --master and --conf win; run directly, the spec's.
    spark = stage_session(spec, submitted=_under_spark_submit())
    try:
        result = run_stage(spec, spark)
        if args.result_file:
            _write_result(args.result_file, result.to_dict())
        print(
            json.dumps(
                {
                    "epoch": result.epoch,
                    "attempt": result.attempt,
                    "rows": result.rows,
                    "reused": result.reused,
                }
            )
        )
    finally:
        spark.stop()
    return 0


def _under_spark_submit() -> bool:
    """Whether this Python was started by spark-submit (which passes its gateway)."""
    import os

    return "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    # Run as a script (spark-submit), Python puts this file's folder first on sys.path,
    # where the package's modules would shadow top-level names: take it off.
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.exit(main())
