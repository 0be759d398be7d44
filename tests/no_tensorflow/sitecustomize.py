"""A host without TensorFlow, for the Python processes whose PYTHONPATH starts with this folder
(run_utils.without_tensorflow): Python loads this module at start-up, and from then on importing
tensorflow, tensorflow_text, seqio or tensorflow_datasets raises ImportError (and
importlib.util.find_spec says they are not installed), as where they were never installed."""
import os
import sys

# SENTEMB_TEST_ALSO_UNIMPORTABLE (comma-separated) adds packages a GPU host's own Python lacks too
# (array_record: tests/test_accelerator_report.py).
for _name in ("tensorflow", "tensorflow_text", "seqio", "tensorflow_datasets",
              *filter(None, os.environ.get("SENTEMB_TEST_ALSO_UNIMPORTABLE", "").split(","))):
    sys.modules[_name] = None

if os.environ.get("SENTEMB_TEST_COMPILE_LOG"):  # this module shadows tests/compile_log/sitecustomize.py
    import sentemb_test_compile_log  # noqa: F401
