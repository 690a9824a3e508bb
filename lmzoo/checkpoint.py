"""Orbax checkpoints of the whole training state: model, optimizer, step and data position.

Evaluation restores the model's part alone (``restore_model``): the optimizer state stays on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from flax import nnx


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


class Checkpointer:
    """Saves ``{"train": pytree, "data": json}`` under ``<run_dir>/checkpoints/<step>``.

    Saving is synchronous so a checkpoint on disk is always complete when ``save`` returns,
    which is what makes an interrupt (SIGTERM, Ctrl-C) safe to act on right away.
    """

    def __init__(self, directory: Path | str, *, keep: int = 3):
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(Path(directory).absolute(), options=options)

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, train_state: Any, data_state: dict) -> None:
        if step in self.manager.all_steps():
            return
        args = ocp.args.Composite(train=ocp.args.PyTreeSave(train_state), data=ocp.args.JsonSave(data_state))
        self.manager.save(step, args=args, force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """(train pytree shaped and sharded like ``like``, data state) saved at ``step``."""
        args = ocp.args.Composite(train=restore_args(like), data=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        return restored["train"], restored["data"]

    def restore_model(self, step: int, model: nnx.Module) -> nnx.Module:
        """``model`` with the parameters and state saved at ``step``; the optimizer state is never read."""
        graphdef, like = split_model(model)
        restored = self.manager.restore(step, args=ocp.args.Composite(train=restore_args(like, partial=True)))
        return nnx.merge(graphdef, restored["train"]["params"], restored["train"]["extra"])

    def close(self) -> None:
        self.manager.close()
