"""Orbax checkpoints of the whole training state: model, optimizer, step and data position.

Every checkpoint also holds a digest (SHA-256) of each part of the state and of the data position,
because a damaged data file can restore without any error as wrong numbers. Restoring checks the
digest, and the newest checkpoint that restores and matches it is used: a damaged newest one (its
digest missing included: nothing could verify it) is named in one line and passed over. Evaluation restores
the model's part alone (``restore_model``): the optimizer state stays on disk. A state holding NaN or inf is
never saved.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import logging
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from lmzoo.faults import Diverged, RunFault, WriteFault, debugging, first_line

log = logging.getLogger("lmzoo.checkpoint")
MODEL_PARTS = ("params", "extra")
# Orbax's words for restoring into arrays of another shape (a changed model, not a damaged file).
OTHER_SHAPES = re.compile(r"Requested shape: (\(.*?\)) is not compatible with the stored shape: (\(.*?\))")
ROTATION_RETRIES = 20  # listings of a live run's steps before giving up on reading one


def while_rotating(list_steps: Callable[[], Any]) -> Any:
    """``list_steps()`` (making or reloading a manager), listed again when a step it found vanished before it was read.

    Orbax lists the step directories and then reads each one's time; a trainer keeping its newest checkpoints can
    delete one in between, and the listing then fails on a step that no longer matters.
    """
    for attempt in range(ROTATION_RETRIES):
        try:
            return list_steps()
        except FileNotFoundError:
            if attempt == ROTATION_RETRIES - 1:
                raise
            time.sleep(0.05)


class CorruptCheckpoint(RunFault):
    """A checkpoint that restores with an error, or whose values do not match its digest."""


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, {"params", "extra"}): the model's part of the training state, keyed as checkpoints hold it.

    ``extra`` is every non-parameter variable (e.g. fixed random features), saved but never optimised.
    """
    graphdef, params, extra = nnx.split(model, nnx.Param, ...)
    return graphdef, {"params": params, "extra": extra}


def restore_args(like: Any, *, partial: bool = False) -> ocp.args.PyTreeRestore:
    """Restore into the shapes, dtypes and shardings of ``like``; ``partial``: only the subtrees it has.

    Partial restores are what the PyTree handler offers (the Standard one does not), so saves use it too:
    a manager serves each item with the one handler it first used for it.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    per_leaf = ocp.checkpoint_utils.construct_restore_args(abstract)
    return ocp.args.PyTreeRestore(abstract, restore_args=per_leaf, partial_restore=partial)


def to_host(tree: Any) -> Any:
    """Every array of ``tree`` whole, as NumPy, on this process: gathered from the other processes
    where the mesh splits it across them (fsdp or tensor over several hosts)."""
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def digest(tree: Any) -> str:
    """SHA-256 of the leaves' bytes, shapes and dtypes in tree order."""
    sha = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        array = np.asarray(leaf)
        sha.update(f"{array.dtype}{array.shape}".encode())
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def data_digest(data_state: dict) -> str:
    """SHA-256 of the data position as JSON with sorted keys (how it is saved, whatever its key order)."""
    return hashlib.sha256(json.dumps(data_state, sort_keys=True).encode()).hexdigest()


def stored_parameters(step_dir: Path) -> set[str] | None:
    """The names of the parameter arrays a checkpoint holds ("blocks.0.mixer.q_proj.kernel"), from Orbax's
    metadata file; None where that cannot be read (a damaged checkpoint)."""
    try:
        tree = json.loads((step_dir / "train" / "_METADATA").read_text())["tree_metadata"]
        paths = [ast.literal_eval(key) for key in tree]
    except (OSError, ValueError, KeyError, TypeError, SyntaxError):
        return None
    return {parameter_name(path[1:]) for path in paths if isinstance(path, tuple) and path[:1] == ("params",)}


def parameter_name(path: tuple) -> str:
    names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return ".".join(names[:-1] if names[-1:] == ["value"] else names)  # an nnx Variable's array is its value


def other_parameters(step_dir: Path, like: Any) -> str | None:
    """How the parameters a checkpoint holds differ from those of ``like`` (a training state or a model's, whose
    ``params`` are built by the current settings), in a few words; None where they are the same or unknown."""
    stored = stored_parameters(step_dir)
    built = {parameter_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(like["params"])[0]}
    if stored is None or stored == built:
        return None
    sample = lambda names: ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")  # noqa: E731
    said = [f"stored, not built: {sample(stored - built)}" if stored - built else "",
            f"built, not stored: {sample(built - stored)}" if built - stored else ""]
    return "; ".join(part for part in said if part)


def all_finite(tree: Any) -> bool:
    return all(np.isfinite(x).all() for x in jax.tree.leaves(tree) if np.issubdtype(x.dtype, np.inexact))


def silence_closed_loop_callbacks() -> None:
    """Drop the "Event loop is closed" errors that TensorStore's threads report, for each read still in flight,
    after a failed Orbax restore has closed its event loop; every other unraisable error is still shown."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_callbacks", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    hook.drops_closed_loop_callbacks = True
    sys.unraisablehook = hook


class UnretrievedWriteErrors(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" records: once one write of a checkpoint fails, Orbax
    awaits none of the others, and their failures (the same full disk, already reported in one line) would be
    logged as tracebacks whenever their tasks are collected. Installed only after a write has failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Task exception was never retrieved")


def silence_unretrieved_write_errors() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, UnretrievedWriteErrors) for f in asyncio_log.filters):
        asyncio_log.addFilter(UnretrievedWriteErrors())


@contextmanager
def orbax_errors_unlogged():
    """Orbax logs a failed write's whole traceback before raising it; the raised error becomes one line, so the
    log stays quiet (``LMZOO_DEBUG=1`` keeps it)."""
    absl = logging.getLogger("absl")
    level = absl.level
    if not debugging():
        absl.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        absl.setLevel(level)


def write_error(error: BaseException) -> str:
    """What made a write fail, in a few words: a full disk and a lost permission named plainly."""
    text = str(error)
    if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in text:
        return "the disk is full: no space left on device"
    if getattr(error, "errno", None) in (errno.EACCES, errno.EROFS) or "Permission denied" in text:
        return "permission denied"
    return first_line(error)


class Checkpointer:
    """Saves ``{"train": pytree, "data": json, "digest": json}`` under ``<run_dir>/checkpoints/<step>``.

    Saving is synchronous so a checkpoint on disk is always complete when ``save`` returns,
    which is what makes an interrupt (SIGTERM, Ctrl-C) safe to act on right away. Orbax writes
    each checkpoint into a temporary directory and renames it when complete, so a process killed
    mid-save leaves no checkpoint that looks complete.
    """

    def __init__(self, directory: Path | str, *, keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self.manager = while_rotating(lambda: ocp.CheckpointManager(self.directory, options=options))

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, train_state: Any, data_state: dict) -> None:
        if step in self.manager.all_steps():
            return
        host = to_host(train_state)
        if not all_finite(host):
            raise Diverged(f"step {step}: the training state holds NaN or inf; not saving it")
        sums = {**{part: digest(value) for part, value in host.items()}, "data": data_digest(data_state)}
        args = ocp.args.Composite(train=ocp.args.PyTreeSave(train_state), data=ocp.args.JsonSave(data_state),
                                  digest=ocp.args.JsonSave(sums))
        silence_closed_loop_callbacks()  # a failing write reports them from TensorStore's threads
        try:
            with orbax_errors_unlogged():
                self.manager.save(step, args=args, force=True)
                self.manager.wait_until_finished()
        except Exception as e:  # a full disk or a lost permission, reported from deep inside Orbax and TensorStore
            if debugging():
                raise
            silence_unretrieved_write_errors()
            raise WriteFault(f"checkpoint {step} could not be written in {self.directory} ({write_error(e)}); "
                             "the earlier checkpoints are intact") from None

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """(train pytree shaped and sharded like ``like``, data state) saved at ``step``, verified."""
        items = {"train": restore_args(like), "data": ocp.args.JsonRestore()}
        restored = self._restore_verified(step, items, parts=list(like), like=like)
        return restored["train"], restored["data"]

    def restore_model(self, step: int, model: nnx.Module) -> nnx.Module:
        """``model`` with the parameters and state saved at ``step``, verified; the optimizer state is never read."""
        graphdef, like = split_model(model)
        restored = self._restore_verified(step, {"train": restore_args(like, partial=True)}, parts=MODEL_PARTS,
                                          like=like)
        return nnx.merge(graphdef, restored["train"]["params"], restored["train"]["extra"])

    def _restore_verified(self, step: int, items: dict, parts, like: Any) -> dict:
        """Restore ``items`` of ``step``; CorruptCheckpoint if Orbax fails, the digest is missing, or a part
        (or the data position, when restored) differs from its digest.

        The data position of checkpoints saved before the digest covered it is trusted as it restores.
        """
        silence_closed_loop_callbacks()  # before: a failing restore reports them while it raises
        if not (self.directory / str(step) / "digest").is_dir():
            raise CorruptCheckpoint(f"checkpoint {step} has no digest/ to verify it against (a save cut short, "
                                    "or files removed)")
        items = {**items, "digest": ocp.args.JsonRestore()}
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # Orbax and TensorStore raise many types for damaged files; LMZOO_DEBUG=1 shows them
            if debugging():
                raise
            if other := other_parameters(self.directory / str(step), like):  # intact, but of another model
                raise RunFault(f"checkpoint {step} in {self.directory} holds other parameters than these settings "
                               f"build ({other}): the model settings (or the run's config.yaml) changed since it was "
                               "saved; the checkpoints are intact, resume with the settings they were trained with"
                               ) from None
            if shapes := OTHER_SHAPES.search(str(e)):  # intact, but made by other model settings
                raise RunFault(f"checkpoint {step} in {self.directory} holds arrays of other shapes than these "
                               f"settings build (stored {shapes[2]}, built {shapes[1]}): the model settings (or the "
                               "run's config.yaml) changed since it was saved; the checkpoints are intact, resume with "
                               "the settings they were trained with") from None
            raise CorruptCheckpoint(f"checkpoint {step} cannot be restored ({first_line(e)})") from e
        sums = restored["digest"]
        for part in parts:
            if digest(to_host(restored["train"][part])) != sums.get(part):
                raise CorruptCheckpoint(f"checkpoint {step} is damaged: its '{part}' differ from the digest saved "
                                        "with them")
        if "data" in restored and "data" in sums and data_digest(restored["data"]) != sums["data"]:
            raise CorruptCheckpoint(f"checkpoint {step} is damaged: its data position differs from the digest "
                                    "saved with it")
        return restored

    def restore_newest_intact(self, restore: Callable[[int], Any], *, on_damaged: Callable[[int, str], None],
                              trainer: str | None = None):
        """``(step, restore(step))`` for the newest step that restores intact, or None if there are no checkpoints.

        ``on_damaged(step, message)`` then hears about each newer, damaged checkpoint passed over; with none
        intact, RunFault names the newest one's fault. ``trainer`` names the process training the run now
        (its lock's holder): it saves new checkpoints and deletes old ones meanwhile, so the steps are listed
        afresh and a checkpoint that vanished while it was read is a rotated one, not a damaged one.
        """
        for _ in range(ROTATION_RETRIES):
            while_rotating(self.manager.reload)  # the steps on disk now, not when the manager was made
            steps, damaged = self.all_steps(), []
            for step in reversed(steps):
                try:
                    restored = restore(step)
                except CorruptCheckpoint as e:
                    if trainer is not None and self.rotated_away(step):
                        break  # list again: the trainer saved newer ones
                    damaged.append((step, str(e)))
                    continue
                for bad_step, message in damaged:
                    on_damaged(bad_step, message)
                return step, restored
            else:
                break
        if not steps:
            return None
        if trainer is not None:
            raise RunFault(f"no checkpoint of {self.directory} could be read while {trainer} trains the run "
                           f"(steps {', '.join(map(str, steps))}); try again, or after the training ends")
        raise RunFault(f"no intact checkpoint in {self.directory} (steps {', '.join(map(str, steps))}; the newest: "
                       f"{damaged[0][1]}); move the checkpoints away to start afresh")

    def rotated_away(self, step: int) -> bool:
        """Whether ``step`` was deleted by the trainer keeping its newest checkpoints (give its delete a moment)."""
        for _ in range(10):
            if not (self.directory / str(step)).exists():
                return True
            time.sleep(0.05)
        return False

    def set_aside(self, step: int, where: Path) -> Path:
        """Move a damaged checkpoint out of the managed directory (the run will save that step anew)."""
        where.mkdir(parents=True, exist_ok=True)
        target = where / str(step)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(self.directory / str(step)), target)
        self.manager.reload()
        return target

    def close(self) -> None:
        self.manager.close()
