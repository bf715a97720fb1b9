"""Randomised schedules of DAG runs with SIGKILLs, retries, zombies, clears and recovery.

CI runs a fixed-seed slice per backend; ``RELIABILITY_SCHEDULES=<n>`` runs ``n`` seeds
(``RELIABILITY_SEED`` is the first). For hundreds of schedules on all cores use
``python -m tests.integration.reliability.schedules --schedules 200 --jobs 2``.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.reliability import report
from tests.integration.reliability.conftest import WorldFactory
from tests.integration.reliability.schedules import Schedule

pytestmark = pytest.mark.crash

#: Seeds of the CI slice: zombies, clears, abandoned runs, recovery; 41 and 51 leave an
#: epoch COMMITTING when the next DAG run starts; 8 kills the first claim of a sink target
#: and 112 a record write in an epoch retention then settles (each left a temp file behind,
#: RELIABILITY finding 15).
CI_SEEDS = {"file": [1, 2, 3, 4, 5, 6, 8, 41, 51, 112], "s3": [3]}


def seeds(backend: str) -> list[int]:
    count = os.environ.get("RELIABILITY_SCHEDULES")
    if not count:
        return CI_SEEDS[backend]
    first = int(os.environ.get("RELIABILITY_SEED", "1"))
    return list(range(first, first + int(count)))


def test_random_schedules_publish_every_record_exactly_once(make_world: WorldFactory) -> None:
    failures = []
    totals = {"schedules": 0, "kills": 0, "records": 0}
    for seed in seeds(make_world.backend):
        result = Schedule(make_world(), seed, make_world.backend).run()
        report.record("schedule", **result.to_dict())
        totals["schedules"] += 1
        totals["kills"] += result.kills
        totals["records"] += result.records
        if result.problems or result.lost or result.duplicated:
            failures.append(f"seed {seed}: lost {result.lost}, duplicated {result.duplicated}: {result.problems}")
    assert not failures, "\n".join(failures)
    assert totals["kills"] > 0 and totals["records"] > 0, totals
