"""Optional dependencies, imported where they are the tool. Training, evaluation and the
sentence-transformers export run without TensorFlow; seqio tasks and mixtures, TFDS sources,
in-graph tokenisation, SavedModel export, `data_summary`, a corpus of ids from `prepare_corpus`
and remote (gs://) paths need it. Prepared corpora need ArrayRecord (installed with the package). A job that needs a
package this Python cannot import stops before any work, in one line naming what asked for it."""
from __future__ import annotations

import importlib

from sentemb_jax.errors import SentembError

TENSORFLOW_STACK = ("tensorflow", "tensorflow_text", "seqio")
INSTALL = "pip install -e '.[tf]' (TensorFlow, tensorflow-text and seqio at our pins)"


class MissingDependency(SentembError):
    """A package the configuration asks for cannot be imported (exit 1)."""


def require(modules: str | tuple[str, ...], needed_by: str, instead: str = "", install: str = INSTALL):
    """Import `modules` (cached by Python after the first time) or raise MissingDependency naming
    `needed_by` (the binding or job that asked) and, if given, what runs without them. Returns the
    last module imported."""
    for name in (modules,) if isinstance(modules, str) else modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise MissingDependency(f"{needed_by} needs {name}, which this Python cannot import ({e.__class__.__name__}: "
                                    f"{e}); install it with {install}" + (f", or {instead}" if instead else "")) from None
    return module


def array_record(needed_by: str):
    """ArrayRecord's reader and writer module, for prepared corpora only: a job reading text files
    runs where it is not installed (a GPU host's own Python, say)."""
    return require("array_record.python.array_record_module", needed_by,
                   install="pip install array-record==0.8.6 (our pin; setup.py installs it)")


def require_tensorflow(needed_by: str, instead: str = "") -> None:
    """The TensorFlow stack (tensorflow, tensorflow_text, seqio) for `needed_by`."""
    require(TENSORFLOW_STACK, needed_by, instead)
