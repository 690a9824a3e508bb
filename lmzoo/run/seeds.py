"""Several seeds of one config trained as one jitted step (``train.seeds=[0,1,2]``), each a run of its own.

Seed ``s`` is the run ``python -m lmzoo.train seed=<s> run_dir=<run_dir>/seed<s>`` would be: its directory holds
its own config.yaml (with its ``seed``; ``train.seeds`` empty), metrics, TensorBoard events and checkpoints, its
model starts from its own initialisation and reads its own data order, so ``lmzoo.eval``, ``lmzoo.compare`` and
a later single-seed resume treat it as any run. The seeds' training states and batches are stacked on a leading
axis and one jitted call (``jax.vmap`` over the single run's call) steps them all: N seeds pay one dispatch, one
batch transfer and one flag read a call. Each seed's losses equal its single run's to float rounding (the
vmapped program may fuse its arithmetic differently); log rows, validations and checkpoints are each seed's own.

Divergence is each seed's own: the step's guard keeps a seed's state when its own loss or gradient norm is not
finite, and a seed with ``train.max_nonfinite`` such steps in a row stops (its directory keeps its last finite
checkpoint and its logs; the warning names it) while the others train on. Its slot in the stacked call is still
computed, and nothing of it is used. When the others finish, the run fails with ``Diverged``, naming each seed
that stopped.

``train.lrs=[1e-3,3e-3]`` does the same over AdamW's peak learning rate (``optim.lr``): each in
``run_dir/lr<lr>`` (``run_dir/lr<lr>/seed<s>`` with ``train.seeds``: every learning rate with every seed), its
config.yaml recording its ``optim.lr``. The learning rate is an argument of the vmapped call: the group's optimizer
is the run's with a peak of 1, its updates times each run's own rate (the same state, so a run's checkpoints
resume alone; its losses equal its single run's to float rounding). Runs of one group may differ in nothing else.

Re-running the same command resumes every seed, from the newest step every seed saved: a seed that saved a later
checkpoint (the run was killed between the seeds' saves) has it moved to ``checkpoints_ahead/`` and its logs cut
back, so the seeds go on together.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from lmzoo.config import Config, ConfigError, lr_folder
from lmzoo.faults import Diverged, check_unlocked
from lmzoo.run.base import StepCalls, released_on_failure
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.record.directory import RunDir
from lmzoo.run.optim import make_optimizer
from lmzoo.run.packing import StateArrays, choose_packing, step_on_packed

log = logging.getLogger("lmzoo.train")


def seed_config(cfg: Config, seed: int) -> Config:
    """The single run that is seed ``seed`` of ``cfg``'s group: its own seed, in ``run_dir/seed<seed>``."""
    return dataclasses.replace(cfg, seed=seed, run_dir=str(Path(cfg.run_dir) / f"seed{seed}"),
                               train=dataclasses.replace(cfg.train, seeds=[]))


def member_configs(cfg: Config) -> list[Config]:
    """The single runs of ``cfg``'s group: every ``train.lrs`` (or ``optim.lr``) with every ``train.seeds`` (or
    ``seed``), in ``run_dir[/lr<lr>][/seed<s>]``."""
    if not cfg.train.lrs:
        return [seed_config(cfg, seed) for seed in cfg.train.seeds]
    runs = []
    for lr in cfg.train.lrs:
        at_lr = dataclasses.replace(cfg, run_dir=str(Path(cfg.run_dir) / lr_folder(lr)),
                                    optim=dataclasses.replace(cfg.optim, lr=lr),
                                    train=dataclasses.replace(cfg.train, lrs=[]))
        runs += [seed_config(at_lr, seed) for seed in cfg.train.seeds] if cfg.train.seeds else [at_lr]
    return runs


def group_config(runs: list[Config]) -> Config:
    """The group that trains ``runs`` (single runs alike but for their seeds, AdamW learning rates and run
    directories) as one: the first run's settings. ConfigError where two differ in anything else."""
    first = runs[0]
    apart = lambda c: dataclasses.replace(c, seed=first.seed, run_dir=first.run_dir,  # noqa: E731
                                          optim=dataclasses.replace(c.optim, lr=first.optim.lr))
    for other in runs[1:]:
        if apart(other) != first:
            raise ConfigError(f"run_dir {other.run_dir!r} differs from {first.run_dir!r} in more than its seed and "
                              f"optim.lr: runs of one group share every other setting")
    if len({c.optim.lr for c in runs}) > 1 and first.optim.name != "adamw":
        raise ConfigError(f"runs of other optim.lr train as one group with optim.name=adamw only, not "
                          f"{first.optim.name}: train each as a run of its own")
    return first


def scaled(tx: optax.GradientTransformation, factor) -> optax.GradientTransformation:
    """``tx`` with its updates times ``factor`` (a traced value), keeping ``tx``'s state as it is."""
    def update(updates, state, params=None):
        updates, state = tx.update(updates, state, params)
        return jax.tree.map(lambda u: u * factor.astype(u.dtype), updates), state

    return optax.GradientTransformation(tx.init, update)


def align_checkpoints(runs: list[RunDir]) -> None:
    """Set aside (into ``checkpoints_ahead/``) each seed's checkpoints after the newest step all seeds saved."""
    saved = {}
    for run in runs:
        if run.checkpoints.is_dir():
            check_unlocked(run.lock_path)
            checkpointer = Checkpointer(run.checkpoints)
            try:
                saved[run] = set(checkpointer.all_steps())
            finally:
                checkpointer.close()
        else:
            saved[run] = set()
    common = max(set.intersection(*saved.values()), default=-1)
    for run, steps in saved.items():
        ahead = sorted(s for s in steps if s > common)
        if not ahead:
            continue
        checkpointer = Checkpointer(run.checkpoints)
        try:
            for step in ahead:
                checkpointer.set_aside(step, run.path / "checkpoints_ahead")
        finally:
            checkpointer.close()
        log.warning("warning: %s: checkpoints %s are ahead of the other seeds' newest; moved to checkpoints_ahead/",
                    run.path, ahead)


class SeedPosition:
    """A seed's data position as its ``Trainer`` asks for it (``Trainer.data_position``): its place in the group's
    feed, which reads every seed's batches."""

    def __init__(self, group: SeedGroup, index: int):
        self.group, self.index = group, index

    def position(self):
        member = self.group.members[self.index]
        return member.train_iter.get_state() if self.group.feed is None else self.group.feed.position()[self.index]


def take_seed(tree, index: int):
    """Seed ``index``'s part of a tree stacked over seeds."""
    return jax.tree.map(lambda x: x[index], tree)


class SeedGroup(StepCalls):
    """The runs of ``cfg.train.seeds`` and ``train.lrs`` (or the ``runs`` given): each a ``Trainer`` of its own run
    (its directory, data, records), and their states stacked and stepped as one. Offers ``train`` the same
    ``Steps`` (``lmzoo.run.base``) as a ``Trainer``."""

    def __init__(self, cfg: Config, runs: list[Config] | None = None, *, open_run: Callable[[Config], StepCalls]):
        """``runs``: the group's single runs (by default ``member_configs``'); ``open_run``: the ``Trainer`` of one
        (without a progress bar of its own; ``lmzoo.run.loop.open_steps`` gives it)."""
        self.cfg = cfg
        self.held = ExitStack()
        with released_on_failure(self.held):
            self._start(cfg, runs or member_configs(cfg), open_run)

    def _start(self, cfg: Config, configs: list[Config], open_run: Callable[[Config], StepCalls]) -> None:
        align_checkpoints([RunDir(c.run_dir) for c in configs])
        self.members: list[StepCalls] = []  # each a lmzoo.run.loop.Trainer
        for c in configs:
            member = open_run(c)
            self.held.callback(member.close)
            self.members.append(member)
        first = self.members[0]
        steps = {m.run_dir.name: m.step for m in self.members}
        if len(set(steps.values())) > 1:  # a seed whose newest common checkpoint was damaged fell back further
            raise ConfigError(f"the seeds resume at different steps {steps}; resume each alone "
                              f"(run_dir=<its directory> seed=<s>) to a common step, or start afresh")
        self.step, self.steps_per_call, self.mesh = first.step, first.steps_per_call, first.mesh
        for member in self.members[1:]:
            member.eval_fn = first.eval_fn  # one program scores every seed (the same model, other numbers)
        stacked = lambda sharding: NamedSharding(self.mesh, P(None, *sharding.spec))  # noqa: E731  (seeds first)
        state_shardings = [stacked(s) for s in jax.tree.leaves(first.shardings)]
        self.batch_sharding = stacked(first.call_sharding)
        leaves = [jax.device_put(jnp.stack(each), sharding)
                  for each, sharding in zip(zip(*(m.leaves for m in self.members)), state_shardings, strict=True)]
        # A group packs only when asked (train.pack_state=true): XLA fuses the vmapped step on [seeds, n] buffers
        # otherwise than on its own arrays, so a seed's numbers move by float rounding, and its dispatch is
        # already shared by every seed of the group.
        packs = "false" if cfg.train.pack_state == "auto" else cfg.train.pack_state
        self.arrays = StateArrays(leaves, choose_packing(packs, leaves, state_shardings, self.mesh, lead=1))
        for member in self.members:
            member.leaves = None
            member.feed = SeedPosition(self, self.members.index(member))
        self.lrs_vary = len({c.optim.lr for c in configs}) > 1
        self.step_fn, self.call_args = self.stacked_call(first, configs, state_shardings)
        self.feed = None
        self.unread_flag = None
        self.window: list[dict] = []  # each call's metrics since the last log row, on the device
        self.stopped: dict[int, Diverged] = {}  # seeds that diverged, by index
        self.open_bar(f"{cfg.attn.name} x{len(self.members)} runs", cfg.train.progress)
        self.window_start = time.perf_counter()  # of the steps since the last log row, as each seed's row reports
        for member in self.members:
            member.name = f"{self.label(member)}: "

    def stacked_call(self, first: StepCalls, configs: list[Config], state_shardings) -> tuple:
        """(the jitted call of every run's step, the arguments besides state and batches it takes): with one
        learning rate every run's own call, else the call at a learning rate given per run."""
        packing = self.arrays.packing
        packed_shardings = state_shardings if packing is None else packing.shardings
        out_shardings = (packed_shardings, NamedSharding(self.mesh, P()))
        on_packed = lambda call: call if packing is None else partial(step_on_packed, packing, call)  # noqa: E731
        if not self.lrs_vary:
            return jax.jit(on_packed(jax.vmap(first.call)), donate_argnums=0, out_shardings=out_shardings), ()
        unit = make_optimizer(dataclasses.replace(first.cfg.optim, lr=1.0), first.cfg.train.steps)
        at_lr = lambda leaves, batches, lr: first.make_call(scaled(unit, lr))(leaves, batches)  # noqa: E731
        lrs = jnp.asarray([c.optim.lr for c in configs], jnp.float32)
        return (jax.jit(on_packed(jax.vmap(at_lr)), donate_argnums=0, out_shardings=out_shardings),
                (jax.device_put(lrs, NamedSharding(self.mesh, P())),))

    def label(self, member: StepCalls) -> str:
        """How logs name a run of the group: its seed, and its learning rate where they vary."""
        return (f"lr {member.cfg.optim.lr:g} " if self.lrs_vary else "") + f"seed {member.cfg.seed}"

    def live(self) -> list[tuple[int, StepCalls]]:
        """The seeds still training, with their places in the stacked state."""
        return [(i, m) for i, m in enumerate(self.members) if i not in self.stopped]

    def pull_batches(self):
        """Every seed's next call's batches from its own iterator, stacked [seeds, ...] and sent in one transfer."""
        per_seed = [m.host_batches() for m in self.members]
        return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *per_seed), self.batch_sharding)

    def read_position(self) -> list:
        return [m.train_iter.get_state() for m in self.members]

    def keep(self, metrics: dict) -> None:
        """A call's metrics (stacked [seeds(, k), ...], on the device) for the seeds' next log rows; every seed
        has taken the group's steps."""
        for member in self.members:
            member.step = self.step
        self.window.append(metrics)

    def check_flags(self, last: int, flags: np.ndarray) -> None:
        """Each seed's flags in order (``Trainer.check_finite``); a seed that diverges stops, the others go on
        (``Diverged`` here once every seed has stopped)."""
        flags = flags.reshape(len(self.members), -1)  # [seeds, steps of the call]
        for i, member in self.live():
            try:
                for step, finite in zip(range(last - flags.shape[1] + 1, last + 1), flags[i]):
                    member.check_finite(bool(finite), step)
            except Diverged as e:
                self.stopped[i] = e
                log.error("%s stopped: %s; the other runs train on", self.label(member), e)
        if len(self.stopped) == len(self.members):
            raise Diverged(self.diverged_message())

    def diverged_message(self) -> str:
        return "; ".join(f"{self.label(self.members[i])}: {e}" for i, e in sorted(self.stopped.items()))

    def hand_state(self, index: int, member: StepCalls) -> None:
        """Give a seed its part of the stacked state, for its validation or checkpoint."""
        member.leaves = [x[index] for x in self.leaves]

    def record(self, metrics: dict) -> None:
        """Each seed's log row and validation, if due: its metrics are its part of the stacked ones."""
        log_due, eval_due = self.due(self.cfg.train.log_every), self.due(self.cfg.train.eval_every)
        if not (log_due or eval_due):
            return
        self.settle()
        now = time.perf_counter()
        last = jax.device_get(metrics)
        if log_due:
            self.hand_window()
        for i, member in self.live():
            if eval_due:
                self.hand_state(i, member)
            member.window_start = self.window_start + (time.perf_counter() - now)  # every seed's row: the group's time
            member.record(take_seed(last, i))
        if log_due:
            self.window_start = now

    def hand_window(self) -> None:
        """Give each seed its part of the calls since the last log row (losses, a mix's per-source terms): for its
        row, or for its checkpoint to keep (``Trainer.log_window``)."""
        window, self.window = jax.device_get(self.window), []
        for i, member in self.live():
            for call in window:
                member.window_losses.append(call["loss"][i])
                member.source_metrics.add(take_seed(call, i), self.steps_per_call)

    def save(self) -> None:
        self.settle()
        self.hand_window()
        for i, member in self.live():
            self.hand_state(i, member)
            member.save()

    def saved_where(self) -> str:
        return (f"of every seed ({', '.join(str(m.run_dir) for m in self.members)}); "
                f"run the same command to resume")

    def report_end(self) -> None:
        """Where each finished seed's run is; ``Diverged`` naming the seeds that stopped, if any."""
        for _, member in self.live():
            member.report_end()
        if self.stopped:
            raise Diverged(self.diverged_message())

    def outcome(self, interrupted: bool) -> dict:
        return {"runs": {str(m.run_dir): m.summary(interrupted=interrupted) for _, m in self.live()},
                **({} if self.lrs_vary else
                   {"seeds": {m.cfg.seed: m.summary(interrupted=interrupted) for _, m in self.live()}})}
