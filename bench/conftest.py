"""The GPU fixtures the gates share with the test suite (tests/conftest.py)."""

from tests.conftest import K, device  # noqa: F401
