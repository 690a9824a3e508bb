"""``python -m lmzoo.train +attn=<variant> [key=value ...]``: train one model, resumably.

The run directory holds the resolved ``config.yaml``, Orbax checkpoints, TensorBoard events and
``metrics.jsonl``. Running the same command on an existing run directory resumes from its newest
intact checkpoint; SIGTERM or Ctrl-C saves a checkpoint before exiting. A step whose loss or
gradient norm is not finite leaves the state as it was; ``train.max_nonfinite`` of them in a row
stop the run. One trainer at a time holds a run directory (``lmzoo.faults.RunLock``). Exit codes:
``lmzoo.faults``.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict
from functools import partial
from pathlib import Path

import hydra
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from omegaconf import OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from lmzoo.checkpoint import Checkpointer, split_model
from lmzoo.cli import check_argv, fail
from lmzoo.config import CONFIG_DIR, Config, ConfigError, register_schemas, validate
from lmzoo.data import build_data
from lmzoo.evaluator import logit_scores, score_length, token_scores
from lmzoo.faults import (
    EXIT_FINISHED, EXIT_INTERRUPTED, Diverged, RunFault, RunLock, debugging, probe_writable,
)
from lmzoo.logger import MetricsLogger, read_metrics
from lmzoo.metrics.intervals import BLOCKS
from lmzoo.metrics.probes import attention_stats, summary as probe_summary
from lmzoo.mixers.base import AuxLoss
from lmzoo.model import LM, count_params
from lmzoo.optim import learning_rate_schedule, make_optimizer
from lmzoo.rundir import IDENTITY_SECTIONS, describe_changes, prepare_run_dir, record_settings  # noqa: F401
from lmzoo.sharding import batch_sharding, make_mesh, state_shardings

log = logging.getLogger("lmzoo.train")
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax reports every file it writes at INFO
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" on every start


# ----------------------------------------------------------------------------- steps


def scored_mean(values: jax.Array, batch) -> jax.Array:
    """Mean over the scored positions: all of them, or those a synthetic task weights."""
    weights = batch.get("weights")
    if weights is None:
        return values.mean()
    return (values * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def next_token_loss(model: LM, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Next-token cross-entropy, its accuracy, and the auxiliary losses mixers sowed in the forward."""
    logits, sown = nnx.capture(model, AuxLoss)(batch["inputs"], segment_ids=batch.get("segment_ids"))  # (B, T, V)
    scores = logit_scores(logits, batch["targets"])
    loss, accuracy = scored_mean(scores["loss"], batch), scored_mean(scores["correct"], batch)
    return loss, {"accuracy": accuracy, **sum_by_name(sown)}


def sum_by_name(sown) -> dict[str, jax.Array]:
    """Sown AuxLoss values summed over layers by name: {"aux/<name>": scalar}."""
    totals: dict[str, jax.Array] = {}
    for path, value in nnx.to_flat_state(sown):
        for v in jax.tree.leaves(value):  # sow keeps a tuple of the values sown
            totals[f"aux/{path[-1]}"] = totals.get(f"aux/{path[-1]}", 0.0) + jnp.mean(v)
    return totals


def loss_and_extra(params, extra, graphdef, batch):
    model = nnx.merge(graphdef, params, extra, copy=True)  # fresh Variables: in-place writes stay traceable
    model = nnx.view(model, training=True)  # mixers' training-time behaviour on (see Mixer.training)
    loss, metrics = next_token_loss(model, batch)
    objective = loss + sum(v for k, v in metrics.items() if k.startswith("aux/"))
    metrics = {"loss": loss, **metrics}
    return objective, (metrics, nnx.state(model, nnx.Not(nnx.Param)))  # non-parameter state the forward updated


def scored_count(batch) -> jax.Array:
    """How many target positions a batch scores (the weights' sum for synthetic tasks)."""
    weights = batch.get("weights")
    return jnp.asarray(batch["targets"].size if weights is None else weights.sum(), jnp.float32)


def gradients(params, extra, graphdef, batch, micro_batches: int = 1):
    """(grads, metrics, extra) of the objective on ``batch``, over ``micro_batches`` slices of its rows in turn.

    Each slice's loss is a mean over its scored tokens, so weighting the slices by their share of
    the batch's scored tokens gives the whole batch's gradient with one slice's activations in
    memory. Slice i takes rows i, i + m, i + 2m, ... so that every device's rows feed every slice.
    Non-parameter state the forward updates (``extra``) passes from slice to slice.
    """
    grad_fn = jax.value_and_grad(loss_and_extra, has_aux=True)
    if micro_batches == 1:
        (_, (metrics, extra)), grads = grad_fn(params, extra, graphdef, batch)
        return grads, metrics, extra
    slices = jax.tree.map(lambda x: x.reshape(x.shape[0] // micro_batches, micro_batches, *x.shape[1:]).swapaxes(0, 1), batch)
    counts = jax.vmap(scored_count)(slices)
    shares = counts / counts.sum()

    def one_slice(carry, inputs):
        grads_sum, metrics_sum, extra = carry
        piece, share = inputs
        (_, (metrics, extra)), grads = grad_fn(params, extra, graphdef, piece)
        weighted_add = lambda total, x: total + share * x  # noqa: E731
        return (jax.tree.map(weighted_add, grads_sum, grads), jax.tree.map(weighted_add, metrics_sum, metrics), extra), None

    first = jax.tree.map(lambda x: x[0], slices)
    (_, (metrics_shape, _)), grads_shape = jax.eval_shape(grad_fn, params, extra, graphdef, first)
    zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)  # noqa: E731
    (grads, metrics, extra), _ = lax.scan(one_slice, (zeros(grads_shape), zeros(metrics_shape), extra), (slices, shares))
    return grads, metrics, extra


def train_step(graphdef, tx, state, batch, *, micro_batches: int = 1):
    """One optimizer step; a step whose loss, gradient norm or new state is not finite keeps the old state.

    The guard only selects between the updated and the old state (``jnp.where``): it adds no arithmetic
    to a finite step, whose numbers stay those of the unguarded step. (``optax.apply_if_finite`` would
    guard the parameters only, not the non-parameter state the forward updates, and would change the
    checkpoint layout.)
    """
    grads, metrics, extra = gradients(state["params"], state["extra"], graphdef, batch, micro_batches)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    grad_norm = optax.tree.norm(grads)
    updated = {"params": params, "extra": extra, "opt": opt}
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & all_finite(updated)
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, {k: state[k] for k in updated})
    new_state = {**kept, "step": state["step"] + 1}
    return new_state, {**metrics, "grad_norm": grad_norm, "finite": finite}


def all_finite(tree) -> jax.Array:
    """Whether every floating-point value of ``tree`` is finite: a scalar bool."""
    checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def eval_step(graphdef, state, inputs, targets, segment_ids=None):
    return token_scores(nnx.merge(graphdef, state["params"], state["extra"]), inputs, targets, segment_ids)


def probe_metrics(model: LM, tokens, segment_ids=None) -> dict:
    """Attention sparsity and entropy: overall means, and per layer (mean over heads) for TensorBoard."""
    stats = attention_stats(model, tokens, segment_ids)
    metrics = {f"val_{k}": v for k, v in probe_summary(stats).items()}
    for name in ("sparsity", "entropy"):
        for layer, heads in enumerate(stats[name]):
            metrics[f"probe/{name}/layer{layer}"] = float(np.nanmean(heads))
    return metrics


def init_train_state(cfg: Config, model: LM):
    """(graphdef, state, optimizer): the state pytree is what checkpoints hold."""
    graphdef, model_state = split_model(model)
    tx = make_optimizer(cfg.optim, cfg.train.steps)
    state = {**model_state, "opt": tx.init(model_state["params"]), "step": jnp.zeros((), jnp.int32)}
    return graphdef, state, tx


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


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


# ----------------------------------------------------------------------------- setup


def open_data(cfg: Config):
    """(data, training iterator, validation windows at the training length); bad data settings become ConfigErrors."""
    try:
        data = build_data(cfg.data, seed=cfg.seed, shard_index=jax.process_index(), shard_count=jax.process_count())
        train_iter = data.train_iterator(cfg.train.batch_size)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e).splitlines()[0]) from e
    try:
        val_windows = data.validation_windows([cfg.data.seq_len], cfg.train.eval_tokens)[cfg.data.seq_len]
    except ValueError as e:
        raise ConfigError(f"train.eval_tokens={cfg.train.eval_tokens}: {e}") from e
    return data, train_iter, val_windows


def join_processes(cfg: Config) -> None:
    """Connect this process to the others of one run (before JAX touches a device). On a cluster
    JAX reads where and who from its environment (SLURM's); ``train.coordinator_address``,
    ``num_processes`` and ``process_id`` say it explicitly (e.g. several processes on one machine)."""
    t = cfg.train
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of different processes talk through gloo
    jax.distributed.initialize(t.coordinator_address, t.num_processes, t.process_id)


def training_mesh(cfg: Config) -> Mesh:
    """``train.mesh`` over every device; the batch must split evenly over its row axes."""
    mesh = make_mesh(cfg.train.mesh)
    row_groups = mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.train.batch_size % row_groups:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} is not divisible by the {row_groups} devices that "
                          f"split the batch (train.mesh.data x train.mesh.fsdp)")
    return mesh


def write_run_files(run_dir: Path, cfg: Config, data, model: LM, n_params: int) -> None:
    """What the data was and what the model is: ``data_fingerprint.json`` and ``run_info.json``."""
    write_json(run_dir / "data_fingerprint.json", data.fingerprint)
    write_json(run_dir / "run_info.json", {
        "variant": cfg.attn.name, "params": n_params, "state_size": model.state_size(cfg.data.seq_len),
        "state_size_per_layer": [b.mixer.state_size(cfg.data.seq_len) for b in model.blocks],
        "devices": jax.device_count(), "platform": jax.default_backend(),
        "document_boundaries": getattr(data, "document_boundaries", "none"),  # synthetic tasks: one sequence each
    })


def open_logger(run_dir: Path, cfg: Config, n_params: int, start_step: int) -> MetricsLogger:
    logger = MetricsLogger(run_dir, start_step=start_step, enabled=jax.process_index() == 0)
    hparams = {**flatten(asdict(cfg)), "params": n_params}
    logger.log_config(OmegaConf.to_yaml(OmegaConf.structured(cfg)), hparams, ["loss", "bpb"])
    return logger


# ----------------------------------------------------------------------------- loop


class Trainer:
    """One run: its training state on the devices, and the named steps of the loop in ``train``."""

    def __init__(self, cfg: Config):
        if cfg.train.distributed:
            join_processes(cfg)
        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg)
        self.held = ExitStack()  # what ``close`` gives back: the run lock first of all
        if jax.process_index() == 0:  # the hosts of one multi-host run share its directory
            self.held.enter_context(RunLock(self.run_dir))
        try:
            self._start(cfg)
        except BaseException:
            self.held.close()
            raise

    def _start(self, cfg: Config) -> None:
        self.mesh = training_mesh(cfg)
        replicated = NamedSharding(self.mesh, P())
        self.to_device = partial(jax.make_array_from_process_local_data, batch_sharding(self.mesh))
        data, self.train_iter, self.val_windows = open_data(cfg)
        model = LM(cfg, data.tokenizer.vocab_size, rngs=nnx.Rngs(cfg.seed))
        n_params = count_params(model)
        write_run_files(self.run_dir, cfg, data, model, n_params)

        self.graphdef, state, tx = init_train_state(cfg, model)
        self.shardings = state_shardings(state, self.mesh, cfg.train.mesh.rules)
        self.state = jax.device_put(state, self.shardings)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", keep=cfg.train.keep_checkpoints)
        self.held.callback(self.checkpointer.close)
        start = self.resume()
        if jax.process_index() == 0 and (changes := record_settings(cfg, start)):
            log.info("resumed with changed settings: %s (recorded in %s)", describe_changes(changes),
                     self.run_dir / "resumes.jsonl")

        self.step_fn = jax.jit(partial(train_step, self.graphdef, tx, micro_batches=cfg.train.grad_accum), donate_argnums=0,
                               out_shardings=(self.shardings, replicated))  # the state keeps its layout
        self.eval_fn = jax.jit(partial(eval_step, self.graphdef), out_shardings=replicated)  # every host reads all
        rows = cfg.train.batch_size // jax.process_count()
        self.process_rows = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        first_windows = self.val_windows(np.arange(max(1, cfg.train.probe_batch)))
        probed = slice(0, cfg.train.probe_batch)
        self.probe_tokens = first_windows["inputs"][probed]
        self.probe_segments = first_windows["segment_ids"][probed] if "segment_ids" in first_windows else None
        self.bits_per_byte = 1.0 / (math.log(2) * data.bytes_per_token)
        self.schedule = learning_rate_schedule(cfg.optim, cfg.train.steps)
        self.logger = open_logger(self.run_dir, cfg, n_params, start)
        self.held.callback(self.logger.close)

        self.step, self.last_val = int(self.state["step"]), {}
        self.window_losses, self.window_start = [], time.perf_counter()  # the steps since the last log row
        self.nonfinite_in_a_row, self.window_nonfinite = 0, 0
        self.bar = tqdm(total=cfg.train.steps, initial=self.step, desc=cfg.attn.name,
                        disable=not cfg.train.progress, dynamic_ncols=True)
        self.held.callback(self.bar.close)

    def resume(self) -> int:
        """Continue from the newest intact checkpoint; the step restored (0 without checkpoints).

        Damaged newer checkpoints are named, passed over and moved to ``damaged_checkpoints/``
        (the run will save those steps anew); with none intact the run stops (RunFault).
        """
        damaged = []

        def pass_over(step: int, message: str) -> None:
            damaged.append(step)
            log.warning("warning: %s; trying an older checkpoint", message)

        found = self.checkpointer.restore_newest_intact(
            lambda step: self.checkpointer.restore(step, self.state), on_damaged=pass_over)
        if found is None:
            if read_metrics(self.run_dir):
                log.warning("warning: %s has logged steps but no checkpoint: starting afresh from step 0 "
                            "(the logs are cut back to it)", self.run_dir)
            return 0
        step, (self.state, data_state) = found
        self.train_iter.set_state(data_state)
        if jax.process_index() == 0:
            for bad in damaged:
                self.checkpointer.set_aside(bad, self.run_dir / "damaged_checkpoints")
        log.info("resumed %s from step %d", self.run_dir, step)
        return step

    def due(self, every: int) -> bool:
        """Whether the step just taken is a multiple of ``every``, or the last one."""
        return self.step % every == 0 or self.step == self.cfg.train.steps

    def advance(self) -> dict:
        """One optimizer step on the next training batch; its metrics stay on the device."""
        batch = jax.tree.map(self.to_device, next(self.train_iter))
        with jax.set_mesh(self.mesh):  # the model keeps activations split by rows (sharding.constrain_rows)
            self.state, metrics = self.step_fn(self.state, batch)
        self.step += 1
        self.check_finite(bool(metrics["finite"]))  # one scalar read per step, so divergence stops at once
        self.window_losses.append(metrics["loss"])
        self.bar.update(1)
        return metrics

    def check_finite(self, finite: bool) -> None:
        """Count a step the jitted step skipped for a non-finite loss or gradient; Diverged after too many in a row."""
        if finite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.window_nonfinite += 1
        log.warning("warning: step %d: loss or gradient norm is not finite; its update was skipped (%d in a row)",
                    self.step, self.nonfinite_in_a_row)
        if self.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            last = self.checkpointer.latest_step()
            where = f"step {last} in {self.run_dir / 'checkpoints'}" if last is not None else "none saved yet"
            raise Diverged(f"diverged at step {self.step}: {self.nonfinite_in_a_row} steps in a row with a non-finite "
                           f"loss or gradient norm (train.max_nonfinite={self.cfg.train.max_nonfinite}); "
                           f"last finite checkpoint: {where}; lower optim.lr to retry")

    def train_metrics(self, metrics: dict) -> dict:
        """Loss and throughput over the steps since the last row; the other metrics of the last step."""
        losses = np.asarray(jax.device_get(self.window_losses))  # waits for the steps to finish
        finite_losses = losses[np.isfinite(losses)]  # the steps that updated the model
        loss = float(np.mean(finite_losses)) if len(finite_losses) else float("nan")
        elapsed = time.perf_counter() - self.window_start
        steps = len(self.window_losses)
        row = {
            "loss": loss, "bpb": loss * self.bits_per_byte, "ppl": math.exp(min(loss, 50.0)),
            "lr": float(self.schedule(self.step - 1)), "grad_norm": float(metrics["grad_norm"]),
            "tokens_per_s": self.cfg.train.batch_size * self.cfg.data.seq_len * steps / elapsed,
            "step_time_s": elapsed / steps,
            "accuracy": float(metrics["accuracy"]),
            **{k: float(v) for k, v in metrics.items() if k.startswith("aux/")},
            "nonfinite_steps": self.window_nonfinite,
        }
        self.window_losses, self.window_start, self.window_nonfinite = [], time.perf_counter(), 0
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        log.info("step %d: loss %.4f  lr %.3g  grad_norm %.3g  tokens/s %.0f", self.step, loss, row["lr"],
                 row["grad_norm"], row["tokens_per_s"])
        return row

    def score(self, *arrays: np.ndarray) -> dict:
        """Per-target loss and correctness of a global batch of validation windows (inputs, targets and any
        segment ids); this process feeds its rows."""
        local = [self.to_device(x[self.process_rows]) for x in arrays]
        with jax.set_mesh(self.mesh):
            return jax.device_get(self.eval_fn(self.state, *local))

    def validate(self) -> dict:
        """Loss, bits per byte (with its 95% interval) and accuracy on the first ``train.eval_tokens``
        validation targets, scored as ``lmzoo.eval`` scores the training length; the attention probes."""
        scores = score_length(self.score, self.val_windows, rows=self.cfg.train.batch_size, blocks=BLOCKS, n_buckets=1)
        val = {f"val_{k}": v for k, v in scores.summary(self.bits_per_byte).items()}
        interval = scores.bpb_interval(self.bits_per_byte)
        val.update(val_bpb_lo=interval.lo, val_bpb_hi=interval.hi)
        if len(self.probe_tokens):
            model = nnx.merge(self.graphdef, self.state["params"], self.state["extra"])
            val.update(probe_metrics(model, self.probe_tokens, self.probe_segments))
        self.last_val = val
        log.info("step %d: val_loss %.4f  val_bpb %.4f [%.4f, %.4f]", self.step, val["val_loss"], val["val_bpb"],
                 val["val_bpb_lo"], val["val_bpb_hi"])
        return val

    def log(self, row: dict, metrics: dict) -> None:
        """Write a row when this step logged or validated; a validation-only row still gets the step's loss."""
        if row:
            row.setdefault("loss", float(metrics["loss"]))
            self.logger.log(self.step, row)

    def save(self) -> None:
        """Checkpoint the current step, the logs first: whatever a kill leaves on disk, the logs reach
        at least the newest checkpoint, and a resume cuts them back to it."""
        self.logger.flush()
        self.checkpointer.save(self.step, self.state, self.train_iter.get_state())

    def save_and_stop(self) -> dict:
        """The run was asked to stop: checkpoint where it stands, so the same command resumes it."""
        self.save()
        log.info("interrupted: saved a checkpoint at step %d in %s; run the same command to resume",
                 self.step, self.run_dir)
        return self.summary(interrupted=True)

    def summary(self, *, interrupted: bool = False) -> dict:
        """What ``train`` returns: step reached, whether interrupted, last validation."""
        return {"step": self.step, "interrupted": interrupted, **self.last_val}

    def close(self) -> None:
        """Flush and close the outputs and give the run directory back."""
        self.held.close()


def train(cfg: Config) -> dict:
    """Train (or resume) the run described by ``cfg``; returns the last validation metrics."""
    trainer = Trainer(cfg)
    try:
        with StopRequest() as stop, logging_redirect_tqdm():
            while trainer.step < cfg.train.steps:
                metrics = trainer.advance()
                row = trainer.train_metrics(metrics) if trainer.due(cfg.train.log_every) else {}
                if trainer.due(cfg.train.eval_every):
                    row.update(trainer.validate())
                trainer.log(row, metrics)
                if stop.requested:  # checked before the scheduled save so the stop saves once
                    return trainer.save_and_stop()
                if trainer.due(cfg.train.checkpoint_every):
                    trainer.save()
        return trainer.summary()
    finally:
        trainer.close()


# ----------------------------------------------------------------------------- entry point


_exit_codes: list[int] = []  # one per run of this process (several in a multirun)


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def _hydra_main(raw) -> None:
    try:
        cfg = validate(raw)
        summary = train(cfg)
        _exit_codes.append(EXIT_INTERRUPTED if summary["interrupted"] else EXIT_FINISHED)
    except ConfigError as e:
        fail(str(e))
    except RunFault as e:  # one run of a sweep failing leaves the others to run
        if debugging():
            raise
        print(f"lmzoo: error: {e}", file=sys.stderr)
        _exit_codes.append(e.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Exits with the largest of the runs' exit codes (``lmzoo.faults``) unless every run finished."""
    argv = list(sys.argv[1:] if argv is None else argv)
    register_schemas()
    check_argv(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    run_dirs = [a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")]
    if run_dirs and not multirun:  # keep Hydra's own files in the run directory too
        try:
            probe_writable(Path(run_dirs[-1]), "run_dir")  # before Hydra writes its files there
        except RunFault as e:
            fail(str(e), e.exit_code)
        argv.append(f"hydra.run.dir={run_dirs[-1]}")
    elif not multirun and any(a.split("=")[0] in ("-c", "--cfg") for a in argv):
        argv.insert(0, "run_dir=${hydra:run.dir}")  # what a run would use; the job's output dir exists only in a run
    sys.argv = [sys.argv[0], *argv]
    _exit_codes.clear()
    _hydra_main()
    if code := max(_exit_codes, default=EXIT_FINISHED):
        sys.exit(code)


if __name__ == "__main__":
    main()
