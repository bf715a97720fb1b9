"""Run a stage on any Spark master through the Apache Spark provider's ``SparkSubmitHook``.

The hook launches ``spark-submit`` with this package's driver module
(:mod:`airflow_seatunnel_ckpt.spark.driver`); the spec travels in a private temporary
file and the result comes back through another. The Spark configuration of the spec goes
to ``--conf`` untouched. A stage in a single-file top-level module (typically beside the
DAG in Airflow's DAGs folder) travels with ``--py-files``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_seatunnel_ckpt.core.errors import CheckpointError, ConfigError
from airflow_seatunnel_ckpt.core.models import SinkManifest
from airflow_seatunnel_ckpt.spark.spec import StageResult, StageSpec

#: The script spark-submit runs.
DRIVER_SCRIPT = str(Path(__file__).with_name("driver.py"))


class SubmitError(CheckpointError):
    """``spark-submit`` failed or the driver reported no result."""


def spark_submit_binary_dir() -> str | None:
    """Directory of a ``spark-submit`` launcher: on PATH, else the one pyspark bundles."""
    found = shutil.which("spark-submit")
    if found:
        return os.path.dirname(found)
    try:
        from pyspark.find_spark_home import _find_spark_home

        candidate = Path(_find_spark_home()) / "bin"
    except Exception:
        return None
    return str(candidate) if (candidate / "spark-submit").exists() else None


def stage_module_files(stage: str) -> list[str]:
    """Files of the stage's module that ``spark-submit`` must ship for the driver to import it.

    Airflow puts the DAGs folder on ``sys.path`` of its tasks, not of the driver process
    ``spark-submit`` starts, so a stage module beside the DAG (``"my_stages:dedup"``)
    would not import there. A single-file top-level module, wherever it is found in this
    process, is therefore shipped with ``--py-files``. A module inside a package is left to
    the environment: install the package where the driver runs, or ship it with the
    ``py_files`` argument of the hook.
    """
    module_name = stage.partition(":")[0]
    if not module_name or "." in module_name:
        return []
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return []  # not importable here either: the driver reports the stage it cannot load
    if spec is None or spec.submodule_search_locations is not None or not spec.origin:
        return []
    origin = spec.origin
    return [origin] if origin.endswith(".py") and os.path.isfile(origin) else []


def _with_py_files(hook_kwargs: Mapping[str, Any], files: list[str]) -> dict[str, Any]:
    """``hook_kwargs`` with ``files`` added to its comma-separated ``py_files``."""
    kwargs = dict(hook_kwargs)
    listed = [f for f in str(kwargs.get("py_files") or "").split(",") if f]
    listed += [f for f in files if f not in listed]
    if listed:
        kwargs["py_files"] = ",".join(listed)
    return kwargs


def _hook_class() -> Any:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class StageSubmitHook(SparkSubmitHook):
        """``SparkSubmitHook`` whose master may be given directly instead of by connection."""

        def __init__(self, *, master: str | None = None, **kwargs: Any) -> None:
            self._master_override = master
            super().__init__(**kwargs)

        def _resolve_connection(self) -> dict[str, Any]:
            data: dict[str, Any] = super()._resolve_connection()
            if self._master_override:
                data["master"] = self._master_override
            return data

    return StageSubmitHook


def submit_stage(
    spec: StageSpec,
    conn_id: str | None = None,
    master: str | None = None,
    spark_binary: str = "spark-submit",
    *,
    hook_kwargs: Mapping[str, Any] | None = None,
    env_vars: Mapping[str, str] | None = None,
) -> StageResult:
    """Run ``spec``'s stage through ``spark-submit`` and return its result.

    :param conn_id: Airflow Spark connection (master, deploy mode, binary). Without it
        the master is ``master`` or, failing that, ``local[*]``.
    :param master: master URL overriding the connection's (e.g. ``spark://host:7077``).
    :param spark_binary: ``spark-submit`` (default), ``spark2-submit`` or
        ``spark3-submit``, looked up on PATH; when absent there, the launcher bundled
        with pyspark is used.
    :param hook_kwargs: further ``SparkSubmitHook`` arguments (``py_files``, ``jars``,
        ``executor_memory``...). The stage's own module is added to ``py_files`` when it
        is a single-file top-level module (see :func:`stage_module_files`).
    :param env_vars: environment of the spark-submit process.
    """
    if conn_id is None and master is None:
        master = "local[*]"
    with tempfile.TemporaryDirectory(prefix="seatunnel-ckpt-submit-") as tmp:
        spec_file = Path(tmp) / "spec.json"
        result_file = Path(tmp) / "result.json"
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(spec.to_json())
        env = {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            **(env_vars or {}),
        }
        launcher_dir = spark_submit_binary_dir() if shutil.which(spark_binary) is None else None
        if launcher_dir:
            env["PATH"] = os.pathsep.join(
                [launcher_dir, env.get("PATH", os.environ.get("PATH", ""))]
            )
        conf = {
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            **{str(k): str(v) for k, v in spec.spark_conf.items()},
        }
        kwargs: dict[str, Any] = {
            "conf": conf,
            "name": f"{spec.pipeline}-{spec.participant}"[:200],
            "env_vars": env,
            "spark_binary": spark_binary,
            **_with_py_files(hook_kwargs or {}, stage_module_files(spec.stage)),
        }
        hook = _hook_class()(
            master=master,
            conn_id=conn_id or "spark_default",
            application_args=["--spec-file", str(spec_file), "--result-file", str(result_file)],
            **kwargs,
        )
        try:
            hook.submit(DRIVER_SCRIPT)
        except Exception as exc:
            raise SubmitError(
                f"spark-submit of stage {spec.stage!r} (pipeline {spec.pipeline!r}, run "
                f"{spec.run_id!r}, attempt {spec.attempt}) failed: {exc}"
            ) from exc
        if not result_file.exists():
            raise SubmitError(
                f"spark-submit of stage {spec.stage!r} finished but the driver wrote no result to "
                f"{result_file}; see the spark-submit log"
            )
        return result_from_dict(json.loads(result_file.read_text(encoding="utf-8")))


def result_from_dict(data: Mapping[str, Any]) -> StageResult:
    """Rebuild a :class:`StageResult` from :meth:`StageResult.to_dict` output."""
    try:
        return StageResult(
            pipeline=data["pipeline"],
            participant=data["participant"],
            epoch=int(data["epoch"]),
            attempt=int(data["attempt"]),
            run_id=data["run_id"],
            manifests=[SinkManifest.from_dict(m) for m in data["manifests"]],
            sources={k: dict(v) for k, v in data["sources"].items()},
            checkpoint_bytes=int(data["checkpoint_bytes"]),
            reused=bool(data["reused"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"not a stage result: {exc}") from exc
