"""The step's batches prepared on a background thread, a bounded number ahead of the step.

The train loop's host work per step - the source's next batch, the method's features, packing
and `device_put` onto the mesh - runs here while the device runs the step before, so for a small
model on a fast accelerator the host no longer decides the speed. The order is the source's;
each prepared batch carries the source's position after it (`state_dict()`), and `state_dict()`
here is the position after the batch the step took last: a checkpoint records what was trained
on, never the batches prepared ahead, so a resumed run continues exactly. An error of the source
or of the preparation is raised in the loop's thread, at the batch where it happened; `close()`
stops the thread and drops what it prepared.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """Iterates (source batch, prepared batch) pairs of `iterator` (the iterator of `source`),
    `prepare` applied on a thread `depth` batches ahead."""

    def __init__(self, source: Any, iterator: Iterator[dict], prepare: Callable[[dict], dict], depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth {depth}: want at least 1")
        self.source, self._iterator, self._prepare = source, iterator, prepare
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._state = source.state_dict()
        self._thread = threading.Thread(target=self._produce, name="input-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for batch in self._iterator:
                if not self._put((batch, self._prepare(batch), self.source.state_dict())):
                    return
            self._put(_END)
        except BaseException as e:  # raised again in the loop's thread, at this batch
            self._put(_Failure(e))

    def __iter__(self):
        return self

    def __next__(self) -> tuple[dict, dict]:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # a later next() ends too
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.error
        batch, prepared, self._state = item
        return batch, prepared

    def state_dict(self) -> dict:
        """The source's position after the last batch taken from here."""
        return self._state

    def close(self) -> None:
        """Stop the thread (it may be waiting on a full queue) and close the source's iterator."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
