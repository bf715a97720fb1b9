"""The epoch index over any history: what the views read of the newest epochs is what the records say.

A history is any sequence of whole epochs (committed, aborted after preparing, left OPEN
until the next epoch's stage aborts it) with recovery and retention runs in between, which
settle with any batch size into index segments of any length (the summarised tail of a
long advance cut short too). After it:

* the newest K epochs found from the settled record and the epochs above it are the log's
  newest K, for every K;
* every summary the index holds is the epoch's records as ``summarise`` reads them (its
  checkpoint's bytes only while retention has not removed the checkpoint since);
* the next epoch still runs, and the views list it.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from airflow_seatunnel_ckpt.core import CheckpointConfig, CheckpointStore, Decision
from airflow_seatunnel_ckpt.core.protocol import epoch_index
from airflow_seatunnel_ckpt.core.protocol import settled as settled_module
from airflow_seatunnel_ckpt.core.store import StoredPipeline
from tests.core.epochs import Participant, prepare_participant, run_epoch
from tests.integration.properties.settings import DEEP_EXAMPLES

pytestmark = pytest.mark.properties

STEPS = st.lists(st.sampled_from(["commit", "commit", "abort", "open", "recover", "retain"]), min_size=8,
                 max_size=40)
#: A long history settled in two advances, the first cut short, with short segments.
LONG = [*(["commit", "commit", "abort", "commit", "open"] * 6), "recover", *(["commit", "abort"] * 5), "retain",
        "commit", "recover"]


def abort_left_open(p: StoredPipeline) -> None:
    """Abort the newest epoch if it is undecided, as the next run's stage does once its run is dead."""
    newest = p.newest_epochs(1)
    if newest and not p.state(newest[-1]).decided:
        p.abort(newest[-1], "its run is dead", by="model")


def run_history(p: StoredPipeline, steps: list[str]) -> None:
    """Carry ``steps`` out; an epoch left OPEN is aborted before the next one begins."""
    for i, step in enumerate(steps):
        abort_left_open(p)
        work = Participant(sinks={"orders": [b"o"] * (i % 3 + 1)}, changes={i % 4: i})
        if step == "commit":
            run_epoch(p, f"run-{i}", work)
        elif step in ("abort", "open"):
            epoch = p.begin(f"run-{i}").epoch
            prepare_participant(p, f"run-{i}", work, base=p.restore_point(), epoch=epoch)
            if step == "abort":
                p.decide(epoch, Decision.ABORT, "bad input", by="model")
                p.abort(epoch, "bad input", by="model")
        elif step == "recover":
            p.recover(dry_run=False)
        else:
            p.retain(max_retain=2)


@settings(max_examples=DEEP_EXAMPLES or 20, derandomize=not DEEP_EXAMPLES, deadline=None, database=None)
@example(steps=LONG, min_advance=8, segment=5, summarised=12)
@example(steps=LONG, min_advance=1, segment=1, summarised=256)
@given(steps=STEPS, min_advance=st.sampled_from([1, 3, 8]), segment=st.sampled_from([1, 2, 5, 64]),
       summarised=st.sampled_from([3, 256]))
def test_the_index_says_what_the_records_say_and_the_next_epoch_runs(
        steps: list[str], min_advance: int, segment: int, summarised: int) -> None:
    store = CheckpointStore(CheckpointConfig.from_mapping({"storage_url": f"memory://index-{uuid.uuid4().hex}/store"}))
    p = store.pipeline("orders")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settled_module, "MIN_ADVANCE", min_advance)
        mp.setattr(epoch_index, "SEGMENT_EPOCHS", segment)
        mp.setattr(epoch_index, "MAX_SUMMARISED", summarised)
        run_history(p, steps)

        everything = p.epochs()
        for last in (1, 2, 5, 30):
            assert p.newest_epochs(last) == everything[-last:]
        watermark = p.txlog.settled.read().record.watermark
        _, held = epoch_index.newest(p, 30)
        assert set(held) <= set(range(1, watermark + 1))
        for epoch, summary in held.items():
            records = epoch_index.summarise(p, epoch)
            if p.txlog.is_retired(epoch) and records.checkpoint_bytes is None:
                records = epoch_index.EpochSummary(**{**vars(records), "checkpoint_bytes": summary.checkpoint_bytes})
            assert summary == records, epoch

        abort_left_open(p)
        after = run_epoch(p, "next", Participant())
        assert p.newest_epochs(1) == [after] and p.state(after).value == "COMMITTED"
