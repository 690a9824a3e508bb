"""The next calls' training batches, pulled from the data, stacked and moved to the device by a thread of their own.

The training loop's own thread then only dispatches: per call it takes one ready tree of device arrays from a
short queue. Each call's batches carry the data position from before them, so a checkpoint records where the
first batch not yet trained on begins (what a resume must read next), however far the thread has read ahead.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any, Callable

_STOP = object()


class BatchFeed:
    """``calls`` calls' batches, ``ahead`` of them at most ready before the loop takes them.

    ``pull()`` reads one call's batches and puts them on their way to the device; ``position()`` is the data
    position before the next ``pull``. Both run on the feed's thread, never on two threads at once; an error
    in either is raised by the ``take`` that would have returned its batches.
    """

    def __init__(self, pull: Callable[[], Any], position: Callable[[], Any], calls: int, *, ahead: int = 2):
        self._pull, self._position, self._calls = pull, position, calls
        self._ready: queue.Queue = queue.Queue(maxsize=ahead)
        self._positions: deque = deque()  # the position before each call's batches pulled or being pulled, untaken
        self._lock = threading.Lock()  # a position is recorded before its batches are pulled, under this lock
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lmzoo-batches", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for _ in range(self._calls):
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._positions.append(self._position())
                self._put(self._pull())
        except BaseException as e:  # noqa: BLE001  (raised again on the loop's thread, by ``take``)
            self._put((_STOP, e))

    def _put(self, item) -> None:
        while not self._stopped.is_set():
            try:
                self._ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def take(self):
        """The next call's batches (on the device, or on their way there); waits for them if need be."""
        item = self._ready.get()
        if isinstance(item, tuple) and len(item) == 2 and item[0] is _STOP:
            raise item[1]
        with self._lock:
            self._positions.popleft()
        return item

    def position(self):
        """The data position before the first batch not yet taken: where a resume must read on."""
        with self._lock:
            return self._positions[0] if self._positions else self._position()

    def close(self) -> None:
        """Stop reading ahead (the thread ends within a tenth of a second)."""
        self._stopped.set()
        self._thread.join(timeout=5)
