"""What the training loop drives: the ``Steps`` protocol, and the behaviour its two implementations share.

``lmzoo.run.loop.train`` trains anything that offers these steps; one run (``lmzoo.run.loop.Trainer``) and a
group of seeds or learning rates stepped as one (``lmzoo.run.seeds.SeedGroup``) both do. A ``Steps`` has
- ``step``: the optimizer steps taken (restored ones included), and ``steps_per_call``: how many one call takes;
- ``advance() -> metrics``: dispatch one call of ``steps_per_call`` steps on the next batches without waiting for
  the device; the metrics stay on the device until a log row reads them;
- ``settle()``: read the finiteness flags still unread (``advance`` reads them one call late); a run with
  ``train.max_nonfinite`` non-finite steps in a row raises ``lmzoo.faults.Diverged``. Everything that reads the
  state or writes records settles first;
- ``due(every) -> bool``: whether the step just taken is a multiple of ``every``, or the last one;
- ``record(metrics)``: the log row and validation due at the step just taken (``metrics``: the last call's);
- ``save()``: a checkpoint of the step just taken, the logs flushed first; ``save_and_stop() -> summary``:
  the same when the run was asked to stop, so that the same command resumes it;
- ``report_end()``: say where the finished run is (and fail, for a group whose every run diverged);
- ``summary(interrupted=False) -> dict``: what ``train`` returns (``step``, ``interrupted`` and the last validation,
  or each run's);
- ``close()``: give back what it holds (run locks, files, the feed's thread), also after a failure.

``StepCalls`` holds what both implement alike: the jitted call ``step_fn`` on the state's packed arrays, fed by a
``lmzoo.run.feed.BatchFeed`` thread, its flags read one call late.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from typing import Protocol

import jax
import numpy as np
from tqdm.auto import tqdm

from lmzoo.run.feed import BatchFeed
from lmzoo.run.packing import StateArrays

log = logging.getLogger("lmzoo.train")


class Steps(Protocol):
    """The training steps the loop drives (see the module's docstring)."""

    step: int
    steps_per_call: int

    def advance(self) -> dict: ...

    def settle(self) -> None: ...

    def due(self, every: int) -> bool: ...

    def record(self, metrics: dict) -> None: ...

    def save(self) -> None: ...

    def save_and_stop(self) -> dict: ...

    def report_end(self) -> None: ...

    def summary(self, *, interrupted: bool = False) -> dict: ...

    def close(self) -> None: ...


@contextmanager
def released_on_failure(held: ExitStack):
    """Give back what ``held`` holds if the block fails: a start that fails half way keeps no lock or file open."""
    try:
        yield
    except BaseException:
        held.close()
        raise


class StepCalls(ABC):
    """The ``Steps`` of a state stepped by one jitted call (``step_fn``: packed arrays and batches, then
    ``call_args``) per ``steps_per_call`` steps. A subclass sets ``cfg``, ``held`` (an ExitStack), ``mesh``,
    ``arrays`` (``StateArrays``), ``step_fn``, ``step``, ``steps_per_call``, ``feed`` and ``unread_flag`` (both None
    at the start) and ``bar``, and says how it pulls batches, keeps a call's metrics, checks its flags, where it
    saved and what it sums up."""

    cfg: object
    held: ExitStack
    arrays: StateArrays
    step_fn: Callable
    call_args: tuple = ()  # the step function's arguments besides the state and the batches

    @property
    def leaves(self) -> list:
        """The training state's arrays, in the pytree's order."""
        return self.arrays.leaves

    @leaves.setter
    def leaves(self, leaves: list) -> None:
        self.arrays.leaves = leaves
        self.arrays_changed()

    @property
    def packed(self) -> list:
        """The training state as ``step_fn`` takes and returns it: packed into buffers (``train.pack_state``), or
        its leaves."""
        return self.arrays.packed

    @packed.setter
    def packed(self, packed: list) -> None:
        self.arrays.packed = packed
        self.arrays_changed()

    def arrays_changed(self) -> None:
        """The state's arrays were replaced: drop whatever was made from the old ones."""

    called = False  # whether step_fn has run in this process (its first call compiles it)

    def open_bar(self, desc: str, show: bool) -> None:
        """The progress bar, from the step reached to ``train.steps``."""
        self.bar = tqdm(total=self.cfg.train.steps, initial=self.step, desc=desc, disable=not show, dynamic_ncols=True)
        self.held.callback(self.bar.close)

    def due(self, every: int) -> bool:
        """Whether the step just taken is a multiple of ``every``, or the last one."""
        return self.step % every == 0 or self.step == self.cfg.train.steps

    def advance(self) -> dict:
        """One call of ``train.steps_per_call`` optimizer steps on the next training batches, dispatched without
        waiting for the device: the host reads the call before's finiteness flags (done, or nearly) while this
        call runs, and the feed's thread has the batches after on their way to the device. Its metrics stay on the
        device (each stacked [k, ...] when a call takes k > 1 steps) until a log row reads them."""
        batches = self.take_batches()
        first = not self.called
        if first:
            log.info("compiling the training step: the first step waits for it (seconds to minutes on a CPU, by "
                     "variant and model; a later run of the same shapes loads it from the compilation cache)")
            started = time.perf_counter()
        with jax.set_mesh(self.mesh):  # the model keeps activations split by rows (sharding.constrain_rows)
            self.packed, metrics = self.step_fn(self.packed, batches, *self.call_args)
        if first:  # a jitted call compiles before it dispatches, so this is the compile (or the cache's load)
            log.info("compiled the training step in %.1f s", time.perf_counter() - started)
            self.called = True
        self.step += self.steps_per_call
        self.settle()  # the call before's flags: one read a call, one call late
        metrics["finite"].copy_to_host_async()  # on its way to the host as soon as the call ends
        self.unread_flag = (self.step, metrics["finite"])
        self.keep(metrics)
        self.bar.update(self.steps_per_call)
        return metrics

    @abstractmethod
    def keep(self, metrics: dict) -> None:
        """Keep a call's metrics (on the device) for the next log row."""

    def take_batches(self):
        """The next call's training batches on the device (or on their way there), from the feed's thread, which
        starts at the first call and reads exactly the calls left to train."""
        if self.feed is None:
            calls = (self.cfg.train.steps - self.step) // self.steps_per_call
            self.feed = BatchFeed(self.pull_batches, self.read_position, calls)
            self.held.callback(self.feed.close)
        return self.feed.take()

    @abstractmethod
    def pull_batches(self):
        """The next call's batches, on their way to the device (what the feed's thread reads)."""

    @abstractmethod
    def read_position(self):
        """Where the training iterators stand (what a checkpoint records of batches read up to here)."""

    def settle(self) -> None:
        """Read the last call's finiteness flags if they are still unread (``check_flags``, each with its own
        step, in order). ``advance`` reads them one call late; everything that reads the state or writes records
        settles first, so divergence stops the run at the step, with the message and the kept checkpoint, of
        reading every flag at once."""
        if self.unread_flag is not None:
            (last, flags), self.unread_flag = self.unread_flag, None
            self.check_flags(last, np.asarray(flags))

    @abstractmethod
    def check_flags(self, last: int, flags: np.ndarray) -> None:
        """Count the non-finite steps of the call that ended at step ``last`` (``flags``: one a step)."""

    def save_and_stop(self) -> dict:
        """The run was asked to stop: checkpoint where it stands, so the same command resumes it."""
        self.save()
        # lmzoo.train says how to resume
        log.info("interrupted: saved a checkpoint at step %d %s", self.step, self.saved_where())
        return self.summary(interrupted=True)

    @abstractmethod
    def saved_where(self) -> str:
        """Where ``save`` writes, for the line an interrupt leaves."""

    def summary(self, *, interrupted: bool = False) -> dict:
        """What ``train`` returns: step reached, whether interrupted, and the runs' outcome (``outcome``)."""
        return {"step": self.step, "interrupted": interrupted, **self.outcome(interrupted)}

    @abstractmethod
    def outcome(self, interrupted: bool) -> dict:
        """The last validation's metrics, or each run's summary."""

    @abstractmethod
    def save(self) -> None:
        """Checkpoint the step just taken, the logs flushed first."""

    def close(self) -> None:
        """Flush and close the outputs and give the run directories back."""
        self.held.close()
