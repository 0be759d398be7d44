"""One error hierarchy for the whole package (the bottom layer: it imports nothing of ours).

Every error we raise on purpose is a `SentembError`; `exit_code` is what the command line
(`sentemb_jax.main`) exits with: 2 for a bad command line or configuration (nothing ran), 1 for
a bad input found by the job (a data file, a checkpoint, a model directory), 128 + signal for a
run stopped by SIGTERM / Ctrl-C after checkpointing. The classes keep their historical Python
bases (ValueError / RuntimeError), so code that caught those still catches them.
"""
from __future__ import annotations

import signal

_NO_VALUE = object()


class SentembError(Exception):
    """Base of every error sentemb_jax raises on purpose (the message says what and where).

    An error about one configured argument names it as the API does - `DataConfig(batch_size=0)`
    for a value, `DataConfig.data_dir` for where a path came from - through `{where}` in its
    message; `api`, `param` and `value` say which. The command line (`sentemb_jax.main`) words the
    same place as the gin binding that set it (`render(where)`): the library knows no gin."""

    exit_code = 1

    def __init__(self, message: str = "", *, api: str | None = None, param: str | None = None, value=_NO_VALUE,
                 source: bool = False, key: str = ""):
        """source=True: `{where}` says where a value came from (`API.param`; main: `set by gin binding
        ...`) rather than showing it (`API(param=value)`; main: `gin binding ... = value`). key: the
        entry of a mapping argument the value is (`['nli_triples']`)."""
        self.template, self.api, self.param, self.value, self.source = message, api, param, value, source
        self.key = key
        super().__init__(self.render())

    @property
    def has_value(self) -> bool:
        return self.value is not _NO_VALUE

    def api_place(self) -> str:
        """`API(param=value)` for a value, `API.param` for where something came from."""
        if self.source or not self.has_value:
            return f"{self.api}.{self.param}{self.key}"
        return f"{self.api}({self.param}{self.key}={self.value!r})"

    def render(self, where: str | None = None) -> str:
        if self.api is None or "{where}" not in self.template:
            return self.template
        return self.template.replace("{where}", where or self.api_place())

    def __reduce__(self):  # pickles (worker processes) with its place
        return (_rebuild, (type(self), self.template, self.api, self.param, self.value, self.source, self.key))


def _rebuild(cls, template, api, param, value, source, key):
    err = cls.__new__(cls)
    SentembError.__init__(err, template, api=api, param=param, value=value, source=source, key=key)
    return err


class UsageError(SentembError):
    """Bad command line or gin configuration: an unknown binding, a syntax error, a missing value."""

    exit_code = 2


class ConfigError(SentembError, ValueError):
    """A configured number, choice or path outside what it allows."""

    exit_code = 2


class DataError(SentembError, ValueError):
    """A data file that is missing or malformed; the message names the file and line."""


class CheckpointError(SentembError, ValueError):
    """A checkpoint that cannot be loaded or saved; the message names the file and tensors."""


class TokenizerError(SentembError, ValueError):
    """A tokenizer directory that cannot be loaded, or input that cannot be tokenised."""


class InputTypeError(SentembError, TypeError, ValueError):
    """An input of a type the call does not take (a set, bytes, a generator, a dict other than
    {'text': str}, an item that is not a str); the message names the argument and the value.
    sentence-transformers raises ValueError for these, our earlier versions TypeError: it is both,
    so code catching either still catches it."""


class InvalidTextError(SentembError, ValueError):
    """A text that cannot be tokenised (not valid Unicode); the message names the item."""


class VocabularyError(SentembError, ValueError):
    """A model directory whose vocabulary cannot be used in the TF input pipeline."""


class UndefinedScoreError(SentembError, ValueError):
    """A correlation that is not defined (an empty split, constant gold scores, constant or NaN
    model scores): said with the reason instead of reporting `nan`."""


class TrainingError(SentembError, RuntimeError):
    """A training run that cannot start or continue (the message says why)."""


def signal_name(number: int) -> str:
    """'SIGSEGV' for 11; 'signal 77' for a number the platform's enum does not know."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Interrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C outside the train loop (which checkpoints first and raises Preempted): the
    phase under way stops. A KeyboardInterrupt, so that `except Exception` lets it through. A phase
    that stops children or keeps finished work (prepare_corpus's shards) appends a line to `kept`
    on its way out; the command line prints them (exit code 128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum
        self.kept: list[str] = []

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Preempted(SentembError):
    """The run stopped on a signal after checkpointing `step` (exit code 128 + signum)."""

    def __init__(self, signum: int, step: int, checkpoint_dir: str):
        self.signum, self.step, self.checkpoint_dir = signum, step, checkpoint_dir
        super().__init__(f"{signal_name(signum)} after step {step}; its checkpoint is in {checkpoint_dir} - "
                         "run the same command to resume from it")

    def __reduce__(self):
        return (Preempted, (self.signum, self.step, self.checkpoint_dir))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
