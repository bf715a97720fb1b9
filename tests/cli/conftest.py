"""The console's tests use the core tests' local store (``tests/core/conftest.py``)."""

from tests.core.conftest import forget_memory_files, local_spec

__all__ = ["forget_memory_files", "local_spec"]
