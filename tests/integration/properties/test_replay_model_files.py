"""The replay model (:mod:`tests.integration.properties.test_replay_model`) with file sinks: orders in a ``changes``
file sink read through its ``_EPOCHS`` pointer, totals in a ``snapshot`` file sink. After every epoch or
replay each input order is published once, with the amount of the stage that last processed its epoch,
and the next epoch still runs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.properties import test_replay_model
from tests.integration.properties.settings import run_model
from tests.integration.properties.test_replay_model import ReplayModel, scenario
from tests.spark.test_replay_files import FileLake

pytestmark = [pytest.mark.properties, pytest.mark.spark]


class FileReplayModel(ReplayModel):
    """Epochs and replays of the orders pipeline writing file sinks."""

    def __init__(self) -> None:
        super().__init__()
        self.lake = FileLake(Path(tempfile.mkdtemp(prefix="replay-files-model-")))


def test_replays_of_file_sinks_keep_every_order_once_with_the_last_stage_amount(spark: Any) -> None:
    test_replay_model.SESSION["spark"] = spark
    try:
        run_model(FileReplayModel, scenario, fast_examples=2, fast_steps=5)
    finally:
        test_replay_model.SESSION.clear()
