"""The console's tests use the core tests' local store (``tests/core/conftest.py``)."""

from tests.core.conftest import local_spec

__all__ = ["local_spec"]
