"""The Connect slice: which Spark Connect tests the default run (CI) takes.

A pytest plugin (``pytest_plugins`` in tests/conftest.py), so that it sees every collected test,
the stage tests of tests/spark and the Connect tests of tests/operators alike.

Two kinds of test leave the default run and carry ``connect_all``: the Connect run of a stage
test parametrised by ``runtime`` (tests/spark/conftest.py) that is not marked ``connect_slice``,
and a Connect test marked ``connect_all`` itself, whose scenario another test of the default
run covers (the marker's ``reason`` says which). ``-m connect_all``, ``RELIABILITY_FULL=1`` or
naming the test on the command line runs them (docs/RELIABILITY.md, "The Connect slice").
"""

from __future__ import annotations

import pytest

#: A Connect run costs about ten classic runs (a server session per stage run, whose Python
#: workers start and import anew; docs/RELIABILITY.md, "The Connect slice"), and the stage
#: code after the session is made is the same on both runtimes.
CONNECT_ALL = "connect_all"
CONNECT_SLICE = "connect_slice"


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers of the Connect slice (``--strict-markers``)."""
    config.addinivalue_line(
        "markers", f"{CONNECT_SLICE}(why): the test's Connect run is in the default run; why names what it "
                   "proves on Connect beyond the classic run")
    config.addinivalue_line(
        "markers", f"{CONNECT_ALL}(reason=...): a Connect run outside the default slice; `-m {CONNECT_ALL}` runs "
                   "these (RELIABILITY_FULL=1 runs them with everything else); reason names the test of the "
                   "default run that covers its scenario")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``connect_all`` every Connect run of a stage test not marked ``connect_slice``, and
    leave those and the tests marked ``connect_all`` out unless ``-m`` names ``connect_all``,
    ``RELIABILITY_FULL=1`` is set or the command line names the test itself.

    The default run keeps a fixed Connect slice: the runtime-equality test, the crash tests
    not marked ``connect_all``, and one marked test per source, sink and Connect-specific path.
    """
    from tests.conftest import FULL_CAMPAIGNS

    keep = FULL_CAMPAIGNS or CONNECT_ALL in (config.option.markexpr or "")
    named = {arg.split("::", 1)[1] for arg in config.args if "::" in arg}
    drop = []
    for item in items:
        if item.get_closest_marker(CONNECT_ALL) is None:
            callspec = getattr(item, "callspec", None)
            if callspec is None or callspec.params.get("runtime") != "connect":
                continue
            if item.get_closest_marker(CONNECT_SLICE) is not None:
                continue
            item.add_marker(getattr(pytest.mark, CONNECT_ALL))
        if not keep and item.nodeid.split("::", 1)[1] not in named:
            drop.append(item)
    if drop:
        dropped = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=drop)
