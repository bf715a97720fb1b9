"""The file-source model (:mod:`tests.integration.properties.test_file_source_model`) with real epochs:
each epoch runs through :func:`run_stage` on the shared local Spark session (Spark lists,
plans and reads the files, a file sink stages Parquet), then decides commit and commits.
A small slice: a few short examples over ordered prefixes, the same invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis.stateful import run_state_machine_as_test

from airflow_seatunnel_ckpt.core import Decision
from airflow_seatunnel_ckpt.spark import StageSpec, run_stage
from airflow_seatunnel_ckpt.spark.sources.files import SourceError
from tests.integration.properties.settings import model_settings
from tests.integration.properties.test_file_source_model import OrderedPrefixesModel

pytestmark = [pytest.mark.properties, pytest.mark.spark]

#: The shared session of the running test (a state machine cannot take fixtures).
SESSION: dict[str, Any] = {}


class SparkFileSourceModel(OrderedPrefixesModel):
    """Epochs through the Spark stage runtime instead of the core alone: ordered glob prefixes."""

    def out(self) -> Path:
        return self.root / "out"

    def spec(self, run_id: str) -> StageSpec:
        source = {"type": "file", "path": f"file://{self.input}", "format": "parquet", "schema": "id long",
                  **self.options}
        return StageSpec(pipeline="orders", participant="ingest", run_id=run_id, attempt=1,
                         stage="tests.integration.properties.stages:copy_files", sources={"files": source},
                         sinks={"out": {"type": "file", "path": f"file://{self.out()}"}},
                         store={"storage_url": f"file://{self.root}/store", "full_checkpoint_interval": 3},
                         key_groups=4)

    def run_epoch(self) -> list[str]:
        self.runs += 1
        run_id = f"run-{self.runs}"
        epoch = self.pipeline.begin(run_id).epoch  # run_stage finds the same epoch for the run
        self.mark_owed(self.source().backfill_due(self.pipeline.restore_point().epoch, epoch))
        try:
            result = run_stage(self.spec(run_id), SESSION["spark"])
        except SourceError as exc:
            self.refused(epoch, exc)
            return self.run_epoch()
        assert result.epoch == epoch
        decision = self.pipeline.decide(epoch, Decision.COMMIT, "all prepared", by="model")
        assert decision.decision is Decision.COMMIT
        self.pipeline.commit(epoch)
        files = list(result.sources["files"].get("files", []))
        for name in files:
            self.consumed[name] = self.current[name]
        self.horizon = self.watermark()
        return files

    def sink_ids(self) -> list[int]:
        ids: list[int] = []
        for f in sorted(self.out().glob("epoch=*/*.parquet")):
            ids += pq.read_table(f).column("id").to_pylist()
        return ids


def test_spark_epochs_deliver_every_file_record_once(spark: Any) -> None:
    SESSION["spark"] = spark
    try:
        run_state_machine_as_test(SparkFileSourceModel, settings=model_settings(fast_examples=2, fast_steps=6))
    finally:
        SESSION.clear()
