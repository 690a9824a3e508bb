"""Training one model, resumably: the ``Trainer`` and its loop (``train``), under ``lmzoo.train``'s command.

The run directory (``lmzoo.record.directory.RunDir``) holds the config, checkpoints, TensorBoard events and
the metrics log. Training a run directory that holds a run resumes it from its newest intact
checkpoint, on the same data (a changed corpus is refused unless ``data.allow_changed=true``);
SIGTERM or Ctrl-C saves a checkpoint before ``train`` returns. A step whose loss or gradient norm
is not finite leaves the state as it was; ``train.max_nonfinite`` of them in a row stop the run. The host
never waits for a step before dispatching the next: it reads each step's finiteness one step late, and moves
the next batch to the device while a step runs (``Trainer.advance``). With ``train.steps_per_call=k`` one jitted
call runs k steps (a scan over k batches stacked on the device), so the host's fixed costs of a call (dispatch,
flag read, batch transfer) are paid once per k steps; the loop logs, validates and saves between calls only.
Each call takes and returns the state packed into a buffer per dtype (``train.pack_state``, ``lmzoo.run.packing``),
so that its dispatch handles a few arrays rather than every leaf; the state is unpacked only when read.
One trainer at a time holds a run directory (``lmzoo.faults.RunLock``).

``train`` drives the ``Steps`` of ``lmzoo.run.base``: one run's ``Trainer``, or with ``train.seeds``/``train.lrs``
a ``lmzoo.run.seeds.SeedGroup`` of Trainers stepped as one (``open_steps`` picks). A Trainer's step function and
its source of training batches are constructor arguments (``jitted_call`` and ``training_batches`` by default;
scripts/benchmark_loop.py gives others).

A resume may change how training goes on; the learning-rate schedule is a function of the step alone
(``lmzoo.run.optim``), so raising ``train.steps`` and setting ``optim.decay_start`` at a stable-phase
checkpoint of a WSD (or constant) run continues it into a decay. Every check of the saved run a resume passes
is in ``lmzoo.record.resuming``. The changed keys are recorded in ``resumes.jsonl``; a change that makes the
learning rate jump at the resumed step is named in a warning (``lmzoo.run.optim.check_continuation``), and a
change of optimizer (whose state the checkpoint could not hold) is refused, as is turning ``train.state_passing``
on or off (its checkpoints hold each batch row's carried state, and its data position is a place in the stream's
lanes). A run whose ``data.tokenizer=bpe`` keeps its tokenizer (``tokenizer.json``), and its resumes tokenise with it.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict
from functools import partial
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from omegaconf import OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from lmzoo.config import Config, ConfigError
from lmzoo.data import build_data
from lmzoo.data.corpus import with_saved_tokenizer
from lmzoo.data.tokenizers import BPE
from lmzoo.faults import Diverged, RunLock
from lmzoo.scoring.catalog import SCORES, measurement
from lmzoo.scoring.probes import attention_stats, logged_probes
from lmzoo.scoring.lengths import LengthScores, score_length
from lmzoo.model import LM, count_params
from lmzoo.record.checkpoints import Checkpointer
from lmzoo.record.directory import RunDir, describe_changes
from lmzoo.record.resuming import (
    check_checkpoints_fit, check_data, check_resume_step, prepare_run_dir, record_settings,
)
from lmzoo.run.base import StepCalls, Steps, released_on_failure
from lmzoo.run.logger import MetricsLogger
from lmzoo.run.optim import check_continuation, learning_rate_schedule
from lmzoo.run.packing import StateArrays, choose_packing, step_on_packed
from lmzoo.run.seeds import SeedGroup, group_config
from lmzoo.run.steps import eval_step, init_train_state, train_step
from lmzoo.schema import flatten
from lmzoo.sharding import batch_sharding, make_mesh, state_shardings
from lmzoo.stats.bootstrap import BLOCKS

log = logging.getLogger("lmzoo.train")
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax reports every file it writes at INFO
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" on every start


def probe_metrics(model: LM, tokens, segment_ids=None) -> dict:
    """The logged probes (``lmzoo.scoring.catalog.PROBES``): overall means, and per layer (mean over heads) for
    TensorBoard."""
    return logged_probes(attention_stats(model, tokens, segment_ids))


def validation_scores(scores: LengthScores, bits_per_byte: float) -> dict:
    """The logged scores of the validation targets (``lmzoo.scoring.catalog.SCORES``), then bpb's 95% interval."""
    summary = scores.summary(bits_per_byte)
    val = {m.logged: summary[m.name] for m in SCORES if m.logged}
    interval, bpb = scores.bpb_interval(bits_per_byte), measurement("bpb").logged
    val.update({f"{bpb}_lo": interval.lo, f"{bpb}_hi": interval.hi})
    return val


# ----------------------------------------------------------------------------- plumbing


class StopRequest:
    """SIGTERM / first Ctrl-C ask the loop to checkpoint and stop; a second Ctrl-C aborts."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------- setup


BatchSource = Callable[[Config, object], Iterator]  # (config, data) -> the endless training batches, resumable


def open_data(cfg: Config, run: RunDir, resuming: bool, batches: BatchSource):
    """(data, training iterator (``batches``'), validation windows at the training length); bad data settings
    become ConfigErrors. A resumed run tokenises with its own saved tokenizer."""
    spec = with_saved_tokenizer(cfg.data, run.tokenizer_path) if resuming else cfg.data
    try:
        data = build_data(spec, seed=cfg.seed, shard_index=jax.process_index(), shard_count=jax.process_count())
        train_iter = batches(cfg, data)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    try:
        val_windows = data.validation_windows([cfg.data.seq_len], cfg.train.eval_tokens)[cfg.data.seq_len]
    except ValueError as e:
        raise ConfigError(f"train.eval_tokens={cfg.train.eval_tokens}: {e}") from e
    return data, train_iter, val_windows


def training_batches(cfg: Config, data):
    """The endless training batches: shuffled windows, or with ``train.state_passing`` the stream's lanes
    (each row continuing the row before it)."""
    if not cfg.train.state_passing:
        return data.train_iterator(cfg.train.batch_size)
    if not data.streams:
        raise ConfigError(f"train.state_passing=true needs a text corpus whose documents run on from batch to batch; "
                          f"data.source={cfg.data.source} has no such stream")
    return data.stream_iterator(cfg.train.batch_size)


def join_processes(cfg: Config) -> None:
    """Connect this process to the others of one run (before JAX touches a device). On a cluster
    JAX reads where and who from its environment (SLURM's); ``train.coordinator_address``,
    ``num_processes`` and ``process_id`` say it explicitly (e.g. several processes on one machine)."""
    t = cfg.train
    # CPU devices of different processes talk through gloo
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(t.coordinator_address, t.num_processes, t.process_id)


def training_mesh(cfg: Config) -> Mesh:
    """``train.mesh`` over every device; the batch must split evenly over its row axes."""
    mesh = make_mesh(cfg.train.mesh)
    row_groups = mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.train.batch_size % row_groups:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} is not divisible by the {row_groups} devices that "
                          f"split the batch (train.mesh.data x train.mesh.fsdp)")
    return mesh


def keep_tokenizer(run: RunDir, cfg: Config, tokenizer) -> None:
    """A BPE trained for this run is copied into it, so its resumes, evaluations and samples use that one."""
    if getattr(cfg.data, "tokenizer", None) != BPE or Path(tokenizer.path) == run.tokenizer_path:
        return
    run.write_text(run.tokenizer_path.name, Path(tokenizer.path).read_text())


def write_run_info(run: RunDir, cfg: Config, data, model: LM, n_params: int) -> None:
    """What the model is and where it trains."""
    run.write_run_info({
        "variant": cfg.attn.name, "params": n_params, "state_size": model.state_size(cfg.data.seq_len),
        "state_size_per_layer": [b.mixer.state_size(cfg.data.seq_len) for b in model.blocks],
        "devices": jax.device_count(), "platform": jax.default_backend(),
        "document_boundaries": data.document_boundaries,  # synthetic tasks: "none", one sequence each
        "kernels": model.mixer_kernels(cfg.train.batch_size // cfg.train.grad_accum, cfg.data.seq_len,
                                       documents=data.document_boundaries != "none"),
    })


def check_and_record_start(run: RunDir, cfg: Config, data, model: LM, start: int) -> None:
    """Check the step a run starts from (restored, or 0) against its record, then record this start: the data
    it reads, its tokenizer, the settings a resume changed and the run info. Process 0 alone, where the hosts of
    a multi-host run share the directory; ConfigError (or RunFault) where the resume is refused."""
    check_resume_step(run, start, cfg.train.steps_per_call)
    if jax.process_index() != 0:
        return
    check_data(run, data.fingerprint, step=start, allow_changed=cfg.data.allow_changed)
    keep_tokenizer(run, cfg, data.tokenizer)
    if start:
        check_continuation(run, cfg, start)
    if changes := record_settings(cfg, start):
        log.info("resumed with changed settings: %s (recorded in %s)", describe_changes(changes), run.resumes_path)
    write_run_info(run, cfg, data, model, count_params(model))


def open_logger(run: RunDir, cfg: Config, n_params: int, start_step: int) -> MetricsLogger:
    logger = MetricsLogger(run, start_step=start_step, enabled=jax.process_index() == 0, logger=cfg.logger,
                           label=cfg.label)
    plain = lambda v: v if isinstance(v, (int, float, str, bool)) else str(v)  # noqa: E731  (TensorBoard's hparams)
    hparams = {**{k: plain(v) for k, v in flatten(asdict(cfg)).items()}, "params": n_params}
    logger.log_config(OmegaConf.to_yaml(OmegaConf.structured(cfg)), hparams, ["loss", "bpb"])
    return logger


# ----------------------------------------------------------------------------- loop


def step_on_leaves(state_def, step, leaves: list, batch):
    """``step`` (state, batch) -> (state, metrics) on the state's leaves. A jitted call flattens its arguments'
    trees and builds its results' on the host at every call, and a state of nnx Variables takes longer to
    flatten than a small model's step takes on an accelerator."""
    state, metrics = step(jax.tree.unflatten(state_def, leaves), batch)
    if jax.tree.structure(state) != state_def:  # checked once, when traced: the leaves must keep their places
        raise TypeError(f"the training step changed the state's structure:\n{jax.tree.structure(state)}\n"
                        f"!= {state_def}")
    return jax.tree.leaves(state), metrics


def scan_steps(step, leaves: list, batches):
    """``step`` (leaves, batch) -> (leaves, metrics) over k stacked batches ([k, B, ...] leaves) in one program:
    (the leaves after the last step, each metric stacked [k, ...])."""
    return jax.lax.scan(step, leaves, batches)


def jitted_call(trainer: Trainer) -> Callable:
    """A ``Trainer``'s step function unless it is given another: its call (``make_call``) jitted, on the state as
    the trainer keeps it (packed, ``train.pack_state``, or its leaves; donated), returning it laid out alike."""
    call = trainer.call
    if trainer.arrays.packing is not None:  # the call takes and returns the state as a few buffers
        call = partial(step_on_packed, trainer.arrays.packing, call)
    replicated = NamedSharding(trainer.mesh, P())
    return jax.jit(call, donate_argnums=0, out_shardings=(trainer.packed_shardings, replicated))  # its layout


LOG_WINDOW = "lmzoo_log_window"  # the key of a checkpoint's data state that keeps the steps since the last log row


def window_values(window: list) -> np.ndarray:
    """The losses of a log window's calls (each a scalar, k stacked steps, or a window taken back), in order."""
    return np.concatenate([np.ravel(x) for x in jax.device_get(window)])


def with_log_window(position, window: dict | None):
    """The data state a checkpoint saves: the data position, and the log window where one is open."""
    if window is None or not isinstance(position, dict):
        return position
    return {**position, LOG_WINDOW: window}


def split_log_window(data_state) -> tuple:
    """(the data position, the log window or None) of a restored data state (``with_log_window``)."""
    if not isinstance(data_state, dict) or LOG_WINDOW not in data_state:
        return data_state, None
    position = dict(data_state)
    return position, position.pop(LOG_WINDOW)


class Trainer(StepCalls):
    """One run: its training state on the devices, and the ``Steps`` (``lmzoo.run.base``) of the loop in ``train``.

    ``step_fn``: given the trainer, the call that steps it ((packed state, batches) -> (packed state, metrics));
    by default its jitted training steps. ``batches``: given the config and the data, the endless training
    batches (an iterator with ``get_state``/``set_state``); by default ``training_batches``.
    """

    def __init__(self, cfg: Config, *, progress: bool | None = None,
                 step_fn: Callable[[Trainer], Callable] = jitted_call, batches: BatchSource = training_batches):
        if cfg.train.seeds or cfg.train.lrs:
            raise ConfigError(f"train.seeds={cfg.train.seeds} train.lrs={cfg.train.lrs}: several runs train through "
                              f"lmzoo.run.loop.train (python -m lmzoo.train), not one Trainer")
        self.progress = cfg.train.progress if progress is None else progress  # a group of seeds shows one bar
        self.name = ""  # what the console's lines start with: a seed of a group names itself
        if cfg.train.distributed:
            join_processes(cfg)
        self.cfg = cfg
        self.run = prepare_run_dir(cfg)
        self.run_dir = self.run.path
        self.held = ExitStack()  # what ``close`` gives back: the run lock first of all
        if jax.process_index() == 0:  # the hosts of one multi-host run share its directory
            self.held.enter_context(RunLock(self.run.lock_path))
        with released_on_failure(self.held):
            self._start(cfg, step_fn, batches)

    def _start(self, cfg: Config, step_fn: Callable[[Trainer], Callable], batches: BatchSource) -> None:
        self.mesh = training_mesh(cfg)
        replicated = NamedSharding(self.mesh, P())
        self.row_sharding = batch_sharding(self.mesh)
        self.steps_per_call = cfg.train.steps_per_call
        # A call's batches stacked [k, B, ...]: each split by rows like one batch, the leading axis whole.
        self.stacked_sharding = NamedSharding(self.mesh, P(None, *self.row_sharding.spec))
        self.checkpointer = Checkpointer(self.run.checkpoints, keep=cfg.train.keep_checkpoints)
        self.held.callback(self.checkpointer.close)
        resuming = bool(self.checkpointer.all_steps()) and self.run.config_path.exists()
        if resuming:
            check_checkpoints_fit(self.run, cfg)
        data, self.train_iter, self.val_windows = open_data(cfg, self.run, resuming, batches)
        model = LM(cfg, data.tokenizer.vocab_size, rngs=nnx.Rngs(cfg.seed))
        self.n_params = n_params = count_params(model)
        log.info("run_dir %s: %s, %s parameters", self.run_dir, cfg.attn.name, f"{n_params:,}")

        self.graphdef, state, tx = init_train_state(cfg, model)
        self.shardings = state_shardings(state, self.mesh, cfg.train.mesh.rules)
        if "carried" in state:  # each batch row's carried state lives where the row does
            self.shardings["carried"] = jax.tree.map(lambda _: batch_sharding(self.mesh), state["carried"])
        self.arrays = StateArrays()  # packed once the packing is chosen, below
        self.state = jax.device_put(state, self.shardings)
        start = self.resume()
        check_and_record_start(self.run, cfg, data, model, start)

        self.source_metrics = data.source_metrics(cfg.data.seq_len, cfg.train.eval_tokens)  # a mix's loss/<name>
        self.state_def = jax.tree.structure(self.state)
        self.call = self.make_call(tx)
        leaf_shardings = jax.tree.leaves(self.shardings)
        self.arrays.packing = packing = choose_packing(cfg.train.pack_state, self.leaves, leaf_shardings, self.mesh)
        self.packed_shardings = leaf_shardings if packing is None else packing.shardings  # what step_fn takes
        self.step_fn = step_fn(self)
        self.eval_fn = jax.jit(partial(eval_step, self.graphdef), out_shardings=replicated)  # every host reads all
        rows = cfg.train.batch_size // jax.process_count()
        self.process_rows = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        first_windows = self.val_windows(np.arange(max(1, cfg.train.probe_batch)))
        probed = slice(0, cfg.train.probe_batch)
        self.probe_tokens = first_windows["inputs"][probed]
        self.probe_segments = first_windows["segment_ids"][probed] if "segment_ids" in first_windows else None
        self.bits_per_byte = 1.0 / (math.log(2) * data.bytes_per_token)
        self.schedules = {"lr": learning_rate_schedule(cfg.optim, cfg.train.steps)}
        if cfg.optim.name == "muon":
            self.schedules["lr_muon"] = learning_rate_schedule(cfg.optim, cfg.train.steps, peak=cfg.optim.muon_lr)
        self.logger = open_logger(self.run, cfg, n_params, start)
        self.held.callback(self.logger.close)

        self.step, self.last_val = int(self.state["step"]), {}
        self.window_losses, self.window_start = [], time.perf_counter()  # each call's losses since the last log row
        self.nonfinite_in_a_row, self.window_nonfinite = 0, 0
        self.untimed_steps = 0  # steps of the window taken before a resume: in its losses, not in its time
        self.take_back_window(self.restored_window)
        self.unread_flag = None  # (step, the flags of the call that ended there): the last call's, until ``settle``
        self.feed = None  # the next calls' batches, read ahead by a thread of their own (``lmzoo.run.feed``)
        self.open_bar(cfg.attn.name, self.progress)

    def make_call(self, tx) -> Callable:
        """(leaves, batches) -> (leaves, metrics): one call's steps with the optimizer ``tx``, unjitted
        (``lmzoo.run.seeds`` maps it over the runs of a group)."""
        cfg = self.cfg
        step = partial(train_step, self.graphdef, tx, micro_batches=cfg.train.grad_accum, z_loss=cfg.train.z_loss,
                       terms=self.source_metrics.step_terms)
        call = partial(step_on_leaves, self.state_def, step)
        if self.steps_per_call > 1:  # one step a call stays the plain step, without a scan around it
            call = partial(scan_steps, call)
        return call

    def resume(self) -> int:
        """Continue from the newest intact checkpoint; the step restored (0 without checkpoints).

        Damaged newer checkpoints are named, passed over and moved to ``damaged_checkpoints/``
        (the run will save those steps anew); with none intact the run stops (RunFault).
        """
        damaged, self.restored_window = [], None

        def pass_over(step: int, message: str) -> None:
            damaged.append(step)
            log.warning("warning: %s; trying an older checkpoint", message)

        found = self.checkpointer.restore_newest_intact(
            lambda step: self.checkpointer.restore(step, self.state), on_damaged=pass_over)
        if found is None:
            if self.run.read_metrics():
                log.warning("warning: %s has logged steps but no checkpoint: starting afresh from step 0 "
                            "(the logs are cut back to it)", self.run_dir)
            return 0
        step, (self.state, data_state) = found
        data_state, self.restored_window = split_log_window(data_state)
        self.train_iter.set_state(data_state)
        if jax.process_index() == 0:
            for bad in damaged:
                self.checkpointer.set_aside(bad, self.run.damaged_checkpoints)
        log.info("resumed %s from step %d", self.run_dir, step)
        return step

    # The training state is held as its pytree (``state``) or as its arrays (``arrays``: leaves, or packed as
    # ``step_fn`` takes them), each made from the other when read and kept until it changes. The loop steps the
    # packed form only; it is unpacked when something reads the state (validation, checkpoints).

    @property
    def state(self) -> dict:
        """The training state (params, extra, opt, step[, carried]) as checkpoints hold it."""
        if self._state is None:
            self._state = jax.tree.unflatten(self.state_def, self.arrays.leaves)
        return self._state

    @state.setter
    def state(self, state: dict) -> None:
        self._state = state
        self.arrays.leaves = jax.tree.leaves(state)

    def arrays_changed(self) -> None:
        """The pytree made from the old arrays is stale: ``state`` remakes it when read."""
        self._state = None

    def log_window(self) -> dict | None:
        """The steps since the last log row (their losses, exactly; the non-finite ones among them; a mix's
        per-source terms), or None when a row was just logged. A checkpoint between two rows keeps them, so that
        the first row after resuming from it averages the steps an uninterrupted run's row does."""
        if not self.window_losses:
            return None
        return {"losses": window_values(self.window_losses).tolist(), "nonfinite": self.window_nonfinite,
                "sources": self.source_metrics.held()}

    def take_back_window(self, window: dict | None) -> None:
        """The window a checkpoint kept (``log_window``), as if its steps had been taken by this process."""
        if window is None:
            return
        self.window_losses = [np.asarray(window["losses"], np.float32)]
        self.window_nonfinite = window["nonfinite"]
        self.source_metrics.hold(window["sources"])
        self.untimed_steps = len(window["losses"])

    def keep(self, metrics: dict) -> None:
        """A call's losses for the next log row's mean, and a mix's per-source terms."""
        self.window_losses.append(metrics["loss"])
        self.source_metrics.add(metrics, self.steps_per_call)

    def read_position(self):
        """The training iterator's state (the feed's thread reads batches ahead of it)."""
        return self.train_iter.get_state()

    def pull_batches(self):
        """The next call's batches from the training iterator, on their way to the device (one transfer)."""
        return self.batch_to_device(self.host_batches(), self.call_sharding)

    @property
    def call_sharding(self) -> NamedSharding:
        """How a call's batches lie on the devices: one batch split by rows, or k of them stacked [k, B, ...]."""
        return self.row_sharding if self.steps_per_call == 1 else self.stacked_sharding

    def host_batches(self) -> dict:
        """The next call's batches from the training iterator, on the host: one batch, or with k steps a call
        k batches stacked into [k, B, ...] leaves."""
        if self.steps_per_call == 1:
            return next(self.train_iter)
        batches = [next(self.train_iter) for _ in range(self.steps_per_call)]
        return jax.tree.map(lambda *leaves: np.stack(leaves), *batches)

    def batch_to_device(self, batch: dict, sharding: NamedSharding | None = None) -> dict:
        """This process's rows of a batch (a tree of arrays or one array; by default split like one batch, or
        stacked batches with their ``sharding``) on the devices, split by rows: where one process feeds every
        row, one transfer of the whole batch (about half the host's time of one transfer per array)."""
        sharding = sharding or self.row_sharding
        if jax.process_count() == 1:
            return jax.device_put(batch, sharding)
        return jax.tree.map(partial(jax.make_array_from_process_local_data, sharding), batch)

    def data_position(self):
        """The training iterator's state after the batches of the steps taken (batches the feed has read ahead
        are not among them): what a checkpoint records, so that a resume reads the same batches."""
        return self.train_iter.get_state() if self.feed is None else self.feed.position()

    def check_flags(self, last: int, flags: np.ndarray) -> None:
        """``check_finite`` for each step of the call that ended at ``last``, in order."""
        flags = np.atleast_1d(flags)  # one per step of the call
        for step, finite in zip(range(last - len(flags) + 1, last + 1), flags):
            self.check_finite(bool(finite), step)

    def check_finite(self, finite: bool, step: int | None = None) -> None:
        """Count a step (default: the last one taken) the jitted step skipped for a non-finite loss or gradient;
        Diverged after too many in a row."""
        step = self.step if step is None else step
        if finite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.window_nonfinite += 1
        log.warning("warning: step %d: loss or gradient norm is not finite; its update was skipped (%d in a row)",
                    step, self.nonfinite_in_a_row)
        if self.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            last = self.checkpointer.latest_step()
            where = f"step {last} in {self.run.checkpoints}" if last is not None else "none saved yet"
            raise Diverged(f"diverged at step {step}: {self.nonfinite_in_a_row} steps in a row with a non-finite "
                           f"loss or gradient norm (train.max_nonfinite={self.cfg.train.max_nonfinite}); "
                           f"last finite checkpoint: {where}; lower optim.lr to retry")

    def train_metrics(self, metrics: dict) -> dict:
        """Loss and throughput over the steps since the last row; the other metrics of the last step."""
        self.settle()
        metrics = self.last_step(metrics)
        losses = window_values(self.window_losses)  # waits for the steps to finish
        finite_losses = losses[np.isfinite(losses)]  # the steps that updated the model
        loss = float(np.mean(finite_losses)) if len(finite_losses) else float("nan")
        elapsed = time.perf_counter() - self.window_start
        steps = losses.size - self.untimed_steps  # those this process took (and timed)
        row = {
            "loss": loss, "bpb": loss * self.bits_per_byte, "ppl": math.exp(min(loss, 50.0)),
            **{name: float(schedule(self.step - 1)) for name, schedule in self.schedules.items()},
            "grad_norm": float(metrics["grad_norm"]),
            "tokens_per_s": self.cfg.train.batch_size * self.cfg.data.seq_len * steps / elapsed,
            "step_time_s": elapsed / steps,
            "accuracy": float(metrics["accuracy"]),
            **{k: float(v) for k, v in metrics.items() if k.startswith("aux/") or k == "z_loss"},
            "nonfinite_steps": self.window_nonfinite,
            **self.source_metrics.pop(),
        }
        self.window_losses, self.window_start, self.window_nonfinite = [], time.perf_counter(), 0
        self.untimed_steps = 0
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        log.info("%sstep %d: loss %.4f  lr %.3g  grad_norm %.3g  tokens/s %.0f", self.name, self.step, loss, row["lr"],
                 row["grad_norm"], row["tokens_per_s"])
        return row

    def last_step(self, metrics: dict) -> dict:
        """The metrics of a call's last step (a call of k > 1 steps stacks them [k, ...]; read to the host)."""
        if self.steps_per_call == 1:
            return metrics
        return jax.tree.map(lambda x: x[-1], jax.device_get(metrics))

    def score(self, *arrays: np.ndarray) -> dict:
        """Per-target loss and correctness of a global batch of validation windows (inputs, targets and any
        segment ids); this process feeds its rows."""
        local = [self.batch_to_device(x[self.process_rows]) for x in arrays]
        with jax.set_mesh(self.mesh):
            return jax.device_get(self.eval_fn(self.state, *local))

    def score_windows(self, windows) -> LengthScores:
        """Block sums of validation ``windows``, ``train.batch_size`` windows at a time, as training validates."""
        return score_length(self.score, windows, rows=self.cfg.train.batch_size, blocks=BLOCKS, n_buckets=1)

    def validate(self) -> dict:
        """Loss, bits per byte (with its 95% interval) and accuracy on the ``train.eval_tokens``
        validation targets, scored as ``lmzoo.eval`` scores the training length; the attention probes."""
        self.settle()
        scores = self.score_windows(self.val_windows)
        val = validation_scores(scores, self.bits_per_byte)
        val.update(self.source_metrics.validation(self.score_windows, scored=(self.val_windows, scores)))
        if len(self.probe_tokens):
            model = nnx.merge(self.graphdef, self.state["params"], self.state["extra"])
            val.update(probe_metrics(model, self.probe_tokens, self.probe_segments))
        self.last_val = val
        log.info("%sstep %d: val_loss %.4f  val_bpb %.4f [%.4f, %.4f]", self.name, self.step, val["val_loss"],
                 val["val_bpb"], val["val_bpb_lo"], val["val_bpb_hi"])
        return val

    def record(self, metrics: dict) -> None:
        """The log row and validation due at the step just taken (``metrics``: the last call's), if any."""
        row = self.train_metrics(metrics) if self.due(self.cfg.train.log_every) else {}
        if self.due(self.cfg.train.eval_every):
            row.update(self.validate())
        self.log(row, metrics)

    def log(self, row: dict, metrics: dict) -> None:
        """Write a row when this step logged or validated; a validation-only row still gets the step's loss."""
        if row:
            if "loss" not in row:
                row["loss"] = float(self.last_step(metrics)["loss"])
            self.logger.log(self.step, row)

    def save(self) -> None:
        """Checkpoint the current step, the logs first: whatever a kill leaves on disk, the logs reach
        at least the newest checkpoint, and a resume cuts them back to it. A step that diverged saves nothing."""
        self.settle()
        self.logger.flush()
        self.checkpointer.save(self.step, self.state, with_log_window(self.data_position(), self.log_window()))

    def saved_where(self) -> str:
        return f"in {self.run_dir}"

    def report_end(self) -> None:
        """Where the finished run is, for eval and generate to be pointed at."""
        self.bar.close()  # first: the line goes below the finished bar, not onto it
        log.info("run_dir %s: %s, %s parameters, trained to step %d", self.run_dir, self.cfg.attn.name,
                 f"{self.n_params:,}", self.step)

    def outcome(self, interrupted: bool) -> dict:
        return self.last_val


def open_steps(cfg: Config, runs: list[Config] | None = None, *, batches: BatchSource = training_batches) -> Steps:
    """What trains ``cfg``: its one run (a ``Trainer``), or with ``train.seeds``/``train.lrs`` (or the ``runs``
    given) a ``SeedGroup`` of them stepped as one; ``batches``: each run's training batches (``Trainer``)."""
    if runs is None and not (cfg.train.seeds or cfg.train.lrs):
        return Trainer(cfg, batches=batches)
    return SeedGroup(cfg, runs, open_run=partial(Trainer, progress=False, batches=batches))


def train_runs(runs: list[Config]) -> dict:
    """Train (or resume) single runs that differ only in their seeds, AdamW learning rates and run directories as
    one group, each in its own directory (``lmzoo.run.seeds.group_config``); the summary of ``train``'s group."""
    cfg = group_config(runs)
    return train(cfg, open_steps(cfg, runs))


def train(cfg: Config, trainer: Steps | None = None) -> dict:
    """Train (or resume) the run described by ``cfg`` (with the ``trainer`` opened for it, by default
    ``open_steps``': one run, or with ``train.seeds``/``train.lrs`` several as one group); returns the last
    validation metrics (a group: each run's)."""
    trainer = trainer or open_steps(cfg)
    try:
        with StopRequest() as stop, logging_redirect_tqdm():
            while trainer.step < cfg.train.steps:
                metrics = trainer.advance()
                trainer.record(metrics)
                if stop.requested:  # checked before the scheduled save so the stop saves once
                    return trainer.save_and_stop()
                if trainer.due(cfg.train.checkpoint_every):
                    trainer.save()
            trainer.settle()  # the last step's flag, if nothing after it read it
        trainer.report_end()
        if stop.requested:  # asked during the last step's save: the run is whole, but what follows it must stop
            log.info("interrupted: the run had finished (checkpoint at step %d %s)", trainer.step,
                     trainer.saved_where())
        return trainer.summary(interrupted=stop.requested)
    finally:
        trainer.close()
