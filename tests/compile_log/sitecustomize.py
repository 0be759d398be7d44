"""Loaded at start-up by the Python processes whose PYTHONPATH holds this folder (tests/conftest.py,
when SENTEMB_TEST_COMPILE_LOG is set): logs their JAX compile phases (sentemb_test_compile_log)."""
import sentemb_test_compile_log  # noqa: F401
