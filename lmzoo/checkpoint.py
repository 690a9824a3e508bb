"""Orbax checkpoints of the whole training state: model, optimizer, step and data position."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


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

    def save(self, step: int, train_state: Any, data_state: dict) -> None:
        if step in self.manager.all_steps():
            return
        args = ocp.args.Composite(train=ocp.args.StandardSave(train_state), data=ocp.args.JsonSave(data_state))
        self.manager.save(step, args=args, force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """(train pytree shaped and sharded like ``like``, data state) saved at ``step``."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(train=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        return restored["train"], restored["data"]

    def close(self) -> None:
        self.manager.close()
