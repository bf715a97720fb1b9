"""Randomised schedules: many DAG runs with random SIGKILLs, retries, zombies and recovery.

One schedule is a seeded sequence of DAG runs of the synthetic pipeline. Each task of a
run (stage, branch, commit, abort) and each recovery or retention run between DAG runs
is, with some probability, executed in a child process that is SIGKILLed at a random
store mutation. What happens next is drawn too, the way Airflow and an operator would
react: retry the task (next try number), re-run it with the same try number, give up and
let the abort task run, or give up and leave the epoch to the recovery DAG. Stale
attempts (zombies) are paused mid-write with SIGSTOP, overtaken by their retry, and woken
up later; finished runs are sometimes cleared and run again; new input arrives between
runs. At the end, recovery, fault-free runs until the input is drained, and retention
run, and the invariants are checked (:func:`invariants.check_world`): every input record
published exactly once in both sinks, each epoch all-or-nothing, no staging or temp left.

Run on demand (>= 200 schedules, both cores)::

    python -m tests.integration.reliability.schedules --schedules 200 --backend file --jobs 2
    python -m tests.integration.reliability.schedules --schedules 200 --backend s3 --jobs 2

or through pytest with ``RELIABILITY_SCHEDULES=200``; CI runs a small fixed-seed slice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_seatunnel_ckpt.core.errors import (
    DecisionConflictError,
    FencedAttemptError,
    NotPreparedError,
    PendingEpochError,
)
from tests.integration.reliability import crashdriver, invariants, synthetic
from tests.integration.reliability.synthetic import World

#: Failures a task may meet in a healthy pipeline; Airflow fails the task, the run goes on.
EXPECTED = (PendingEpochError, FencedAttemptError, DecisionConflictError, NotPreparedError)
EXPECTED_NAMES = {cls.__name__ for cls in EXPECTED}
#: Upper bound for the random crash point of each step (beyond its last mutation = no crash).
MAX_OPS = {"stage": 20, "decide": 9, "commit": 16, "abort": 30, "recover": 40, "retain": 60}


@dataclass
class ScheduleResult:
    """What one schedule did and whether every invariant held at its end."""

    seed: int
    backend: str
    runs: int = 0
    epochs: int = 0
    committed: int = 0
    aborted: int = 0
    kills: int = 0
    retries: int = 0
    same_attempt: int = 0
    gave_up: int = 0
    recoveries: int = 0
    retentions: int = 0
    zombies: int = 0
    clears: int = 0
    task_failures: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    unreferenced_parts: int = 0  #: parts of losing attempts left in retained checkpoints
    points: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = dict(self.points)
        return data


class Schedule:
    """One seeded schedule on one world."""

    def __init__(self, world: World, seed: int, backend: str, kill_rate: float = 0.3) -> None:
        self.world = world
        self.rng = random.Random(seed)
        self.kill_rate = kill_rate
        self.result = ScheduleResult(seed, backend)
        self.zombies: list[tuple[Any, str, str]] = []

    # -- executing one task ------------------------------------------------------------
    def execute(self, step: str, **args: Any) -> tuple[str, Any]:
        """Run a task, maybe SIGKILLed at a random mutation.

        Returns ``("ok", result)``, ``("killed", crash point)`` or ``("failed", error)``.
        """
        if self.rng.random() < self.kill_rate:
            crash_at = self.rng.randint(1, MAX_OPS[step])
            outcome = crashdriver.run_step(self.world, step, args, crash_at=crash_at)
            if outcome.killed:
                self.result.kills += 1
                self.result.points[f"{step}: {outcome.point}"] += 1
                return "killed", outcome.point
            if outcome.error:
                if outcome.error_type not in EXPECTED_NAMES:
                    raise AssertionError(f"task {step}({args}) failed unexpectedly: {outcome.error}")
                self.result.task_failures += 1
                return "failed", outcome.error
            return "ok", outcome.result
        try:
            return "ok", synthetic.STEPS[step](self.world, **args)
        except EXPECTED as exc:
            self.result.task_failures += 1
            return "failed", f"{type(exc).__name__}: {exc}"

    def react(self) -> str:
        """What happens after a killed task: retry, same-attempt, abort-task or abandon."""
        return self.rng.choices(["retry", "same-attempt", "abort-task", "abandon"], [55, 10, 15, 20])[0]

    # -- one DAG run ---------------------------------------------------------------------
    def dag_run(self, run_id: str, attempt: int = 1) -> int:
        """Stage, branch, commit/abort with faults. Returns the last stage attempt used."""
        self.result.runs += 1
        if self.rng.random() < 0.1:
            attempt = self.start_zombie(run_id, attempt)
        while True:
            status, value = self.execute("stage", run_id=run_id, attempt=attempt)
            if status == "ok":
                break
            if status == "failed":  # e.g. an earlier epoch still pending: the run fails
                return self.give_up(run_id, attempt, "abort-task")
            how = self.react()
            if how == "retry":
                self.result.retries += 1
                attempt += 1
            elif how == "same-attempt":
                self.result.same_attempt += 1
            else:
                return self.give_up(run_id, attempt, how)
        if self.rng.random() < 0.05:  # the run is slow: recovery times its epoch out meanwhile
            self.recovery(past_timeout=True)
        while True:
            status, value = self.execute("decide", run_id=run_id)
            if status == "ok":
                decision = value["decision"]
                break
            if status == "failed" or self.rng.random() < 0.3:
                return self.give_up(run_id, attempt, "abort-task" if self.rng.random() < 0.5 else "abandon")
            self.result.retries += 1
        step = "commit" if decision == "commit" else "abort"
        for _ in range(6):
            status, value = self.execute(step, run_id=run_id)
            if status == "ok":
                return attempt
            if status == "failed":
                step = "abort"  # e.g. recovery decided abort meanwhile: the abort task runs
                continue
            if self.rng.random() < 0.2:
                return self.give_up(run_id, attempt, "abandon")
            self.result.retries += 1
        return self.give_up(run_id, attempt, "abandon")

    def give_up(self, run_id: str, attempt: int, how: str) -> int:
        """The run fails: its abort task runs (maybe killed too), or nothing does."""
        self.result.gave_up += 1
        if how == "abort-task":
            self.execute("abort", run_id=run_id)
        return attempt

    def start_zombie(self, run_id: str, attempt: int) -> int:
        """Start the stage, freeze it mid-write (SIGSTOP), and let its retry overtake it."""
        pause_at = self.rng.randint(1, 14)
        process, out, op_log = crashdriver.start_step(
            self.world, "stage", {"run_id": run_id, "attempt": attempt}, pause_at=pause_at
        )
        try:
            crashdriver.wait_stopped(process, timeout=30)
        except RuntimeError:  # finished before the pause point: not a zombie after all
            outcome = crashdriver.finish("stage", process, out, op_log)
            if outcome.error and outcome.error_type not in EXPECTED_NAMES:
                raise AssertionError(f"stage failed unexpectedly: {outcome.error}") from None
            return attempt + 1
        self.result.zombies += 1
        self.zombies.append((process, out, op_log))
        return attempt + 1

    def wake_zombies(self) -> None:
        """The frozen stale attempts continue: they must be fenced or find the winner."""
        while self.zombies:
            process, out, op_log = self.zombies.pop(0)
            crashdriver.resume(process)
            outcome = crashdriver.finish("stage", process, out, op_log)
            # Besides being fenced, a zombie may find its staging removed under it by the
            # winner's commit (StorageError), or the checkpoint it restored from removed by
            # retention while it was frozen, newer epochs having committed meanwhile: it
            # fails, and nothing of it is published.
            if outcome.error and outcome.error_type not in EXPECTED_NAMES | {"StorageError"} \
                    and not self._base_retired(outcome.error_type, outcome.error):
                raise AssertionError(f"a zombie stage failed unexpectedly: {outcome.error}")

    def _base_retired(self, error_type: str | None, error: str) -> bool:
        """Whether ``error`` is a missing part of a checkpoint that retention retired."""
        found = re.search(r"/checkpoint_(\d+)/\S*: checkpoint part is missing", error)
        return (error_type == "CorruptCheckpointError" and found is not None
                and self.world.pipeline().txlog.is_retired(int(found.group(1))))

    def recovery(self, past_timeout: bool) -> None:
        self.result.recoveries += 1
        self.execute("recover", past_timeout=past_timeout)

    # -- the whole schedule ----------------------------------------------------------------
    def run(self, runs: int | None = None) -> ScheduleResult:
        started = time.monotonic()
        rng = self.rng
        try:
            self.world.add_input(rng.randint(1, 4), records=rng.randint(1, 5))
            last_attempt: dict[str, int] = {}
            for k in range(1, (runs or rng.randint(4, 8)) + 1):
                run_id = f"run-{k}"
                last_attempt[run_id] = self.dag_run(run_id)
                if self.zombies and rng.random() < 0.5:
                    self.wake_zombies()
                if rng.random() < 0.1:  # the user clears a finished run
                    self.result.clears += 1
                    old = rng.choice(sorted(last_attempt))
                    last_attempt[old] = self.dag_run(old, last_attempt[old] + 1)
                self.world.add_input(rng.randint(0, 3), records=rng.randint(1, 5))
                if rng.random() < 0.3:
                    self.recovery(past_timeout=rng.random() < 0.7)
                if rng.random() < 0.25:
                    self.result.retentions += 1
                    self.execute("retain", max_retain=rng.randint(1, 3))
            self.wake_zombies()
            self.finish()
        except Exception as exc:  # a broken invariant or an unexpected error: report it
            self.result.problems.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            for process, _, _ in self.zombies:
                if process.is_alive():
                    process.kill()
                process.join()
        self.result.seconds = round(time.monotonic() - started, 2)
        return self.result

    def finish(self) -> None:
        """Recovery, fault-free runs until all input is published, GC; then the invariants."""
        from tests.integration.reliability.scenarios import drain

        synthetic.recover(self.world, past_timeout=True)
        drain(self.world, prefix="final")
        problems = invariants.check_world(self.world, drained=True, clean=True)
        p = self.world.pipeline()
        states = [p.state(e) for e in p.epochs()]
        self.result.epochs = len(states)
        self.result.committed = sum(1 for s in states if s.value == "COMMITTED")
        self.result.aborted = sum(1 for s in states if s.value == "ABORTED")
        inputs = self.world.input_records()
        out = invariants.published(self.world)
        self.result.records = len(inputs)
        for sink in synthetic.SINKS:
            seen = Counter(r for e, entry in out[sink].items() if e >= 0 for r in entry["records"])
            self.result.lost += sum(1 for r in inputs if r not in seen)
            self.result.duplicated += sum(n - 1 for n in seen.values() if n > 1)
        self.result.unreferenced_parts = len(invariants.unreferenced_checkpoint_files(self.world))
        self.result.problems += problems


# -- running many ----------------------------------------------------------------------


def make_world(
    root: str,
    backend: str,
    name: str,
    bucket: str = "",
    storage_options: dict[str, Any] | None = None,
) -> World:
    from tests.integration.reliability.conftest import SETTINGS

    local = os.path.join(root, name)
    os.makedirs(local, exist_ok=True)
    base = f"file://{local}" if backend == "file" else f"{bucket}/{name}"
    return World(
        store_url=f"{base}/store",
        target_url=f"{base}/target",
        input_dir=f"{local}/input",
        storage_options=storage_options or {},
        settings=dict(SETTINGS),
    )


def run_one(
    seed: int,
    backend: str,
    root: str,
    bucket: str = "",
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run schedule ``seed`` in a fresh world below ``root``; returns its result as a dict."""
    world = make_world(root, backend, f"s{seed}", bucket, storage_options)
    try:
        return Schedule(world, seed, backend).run().to_dict()
    finally:
        shutil.rmtree(os.path.join(root, f"s{seed}"), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="first seed")
    parser.add_argument("--backend", choices=["file", "s3"], default="file")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report", help="append one JSON line per schedule to this file")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="schedules-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    server = None
    bucket, options = "", dict[str, Any]()
    if args.backend == "s3":
        server, bucket, options = _start_moto()
    started = time.monotonic()
    failures = 0
    totals: Counter[str] = Counter()
    points: Counter[str] = Counter()
    try:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [
                pool.submit(run_one, seed, args.backend, root, bucket, options)
                for seed in range(args.seed, args.seed + args.schedules)
            ]
            for future in as_completed(futures):
                result = future.result()
                if args.report:
                    with open(args.report, "a") as fh:
                        fh.write(json.dumps({"kind": "schedule", **result}, sort_keys=True) + "\n")
                for key in (
                    "runs",
                    "epochs",
                    "committed",
                    "aborted",
                    "kills",
                    "retries",
                    "same_attempt",
                    "gave_up",
                    "recoveries",
                    "retentions",
                    "zombies",
                    "clears",
                    "task_failures",
                    "records",
                    "lost",
                    "duplicated",
                    "unreferenced_parts",
                ):
                    totals[key] += result[key]
                points.update(result["points"])
                if result["problems"]:
                    failures += 1
                    print(
                        f"seed {result['seed']}: FAILED\n  " + "\n  ".join(result["problems"]),
                        flush=True,
                    )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.schedules} schedules on {args.backend} in {time.monotonic() - started:.0f}s, {failures} failed")
    print(json.dumps(dict(totals), sort_keys=True))
    print(f"distinct crash points hit: {len(points)}")
    for point, count in sorted(points.items()):
        print(f"  {count:5d}  {point}")
    return 1 if failures else 0


def _start_moto() -> tuple[Any, str, dict[str, Any]]:
    import logging
    import uuid

    import boto3
    from moto.server import ThreadedMotoServer

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ[key] = value
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"schedules-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    return server, f"s3://{bucket}", options


if __name__ == "__main__":
    sys.exit(main())
