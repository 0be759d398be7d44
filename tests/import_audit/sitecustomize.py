"""tests/no_tensorflow's host without TensorFlow, and a record of every attempt to import what it
hides, for the Python processes whose PYTHONPATH starts with this folder (tests/test_accelerator_report.py).
Only the first sitecustomize on the path loads: this one runs tests/no_tensorflow's, then keeps
an audit hook that appends a line to $SENTEMB_TEST_HIDDEN_IMPORTS for each `import` of a hidden
package (the import still fails, as where it was never installed). A process that catches the
ImportError and goes on leaves its line too: the record says who asked, not only who crashed."""
import os
import runpy
import sys
import traceback

runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "no_tensorflow",
                            "sitecustomize.py"), run_name="no_tensorflow_sitecustomize")
_HIDDEN = {name for name, module in sys.modules.items() if module is None and "." not in name}
_LOG = os.environ.get("SENTEMB_TEST_HIDDEN_IMPORTS")


def _audit(event: str, args: tuple) -> None:
    if event != "import" or not _LOG or str(args[0]).split(".")[0] not in _HIDDEN:
        return
    # the innermost frame outside the import machinery: the line that asked for the package
    frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    with open(_LOG, "a", encoding="utf-8") as f:
        f.write(f"{args[0]}\t{where}\t{' '.join(sys.argv)[:300]}\n")


sys.addaudithook(_audit)
