"""``python -m lmzoo.train +attn=<variant> [key=value ...]``: train one model, resumably.

The run directory holds the resolved ``config.yaml``, Orbax checkpoints, TensorBoard events and
``metrics.jsonl``. Running the same command on an existing run directory resumes from its latest
checkpoint; SIGTERM or Ctrl-C saves a checkpoint before exiting.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
import threading
import time
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
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from lmzoo.checkpoint import Checkpointer, split_model
from lmzoo.cli import check_argv, fail
from lmzoo.config import CONFIG_DIR, Config, ConfigError, load_run_config, register_schemas, validate
from lmzoo.data import build_data
from lmzoo.evaluator import logit_scores, score_length, token_scores
from lmzoo.logger import MetricsLogger, read_metrics
from lmzoo.metrics.intervals import BLOCKS
from lmzoo.metrics.probes import attention_stats, summary as probe_summary
from lmzoo.mixers.base import AuxLoss
from lmzoo.model import LM, count_params
from lmzoo.optim import learning_rate_schedule, make_optimizer

log = logging.getLogger("lmzoo.train")
logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax reports every file it writes at INFO
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" on every start

# Sections that define what a run is; resuming with any of them changed would be a different run.
IDENTITY_SECTIONS = ("model", "attn", "pos", "data", "seed")


# ----------------------------------------------------------------------------- steps


def scored_mean(values: jax.Array, batch) -> jax.Array:
    """Mean over the scored positions: all of them, or those a synthetic task weights."""
    weights = batch.get("weights")
    if weights is None:
        return values.mean()
    return (values * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def next_token_loss(model: LM, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Next-token cross-entropy, its accuracy, and the auxiliary losses mixers sowed in the forward."""
    logits, sown = nnx.capture(model, AuxLoss)(batch["inputs"])  # (B, T, V) float32
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
    grads, metrics, extra = gradients(state["params"], state["extra"], graphdef, batch, micro_batches)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {"params": params, "extra": extra, "opt": opt, "step": state["step"] + 1}
    return new_state, {**metrics, "grad_norm": optax.tree.norm(grads)}


def eval_step(graphdef, state, inputs, targets):
    return token_scores(nnx.merge(graphdef, state["params"], state["extra"]), inputs, targets)


def probe_metrics(model: LM, tokens) -> dict:
    """Attention sparsity and entropy: overall means, and per layer (mean over heads) for TensorBoard."""
    stats = attention_stats(model, tokens)
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


def prepare_run_dir(cfg: Config) -> Path:
    """Create the run directory, refusing to resume a run whose defining config differs."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    current = OmegaConf.structured(cfg)
    saved_path = run_dir / "config.yaml"
    if saved_path.exists() and (run_dir / "checkpoints").exists():
        saved = load_run_config(saved_path)
        for key in IDENTITY_SECTIONS:
            if OmegaConf.select(saved, key) != OmegaConf.select(current, key):
                raise ConfigError(
                    f"run_dir {str(run_dir)!r} holds a run with a different '{key}' config; "
                    "pick another run_dir to start a new run"
                )
    OmegaConf.save(current, saved_path)
    return run_dir


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def truncate_metrics(run_dir: Path, after_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from: those steps will be redone."""
    rows = [r for r in read_metrics(run_dir) if r["step"] <= after_step]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


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


def data_parallel_shardings(batch_size: int) -> tuple[NamedSharding, NamedSharding]:
    """(replicated, split along the batch) over every device; the batch must split evenly."""
    n_devices = jax.device_count()
    if batch_size % n_devices:
        raise ConfigError(f"train.batch_size={batch_size} is not divisible by the {n_devices} devices")
    mesh = jax.make_mesh((n_devices,), ("data",), axis_types=(AxisType.Auto,))  # GSPMD propagates the rest
    return NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))


def write_run_files(run_dir: Path, cfg: Config, data, model: LM, n_params: int) -> None:
    """What the data was and what the model is: ``data_fingerprint.json`` and ``run_info.json``."""
    write_json(run_dir / "data_fingerprint.json", data.fingerprint)
    write_json(run_dir / "run_info.json", {
        "variant": cfg.attn.name, "params": n_params, "state_size": model.state_size(cfg.data.seq_len),
        "state_size_per_layer": [b.mixer.state_size(cfg.data.seq_len) for b in model.blocks],
        "devices": jax.device_count(), "platform": jax.default_backend(),
    })


def open_logger(run_dir: Path, cfg: Config, n_params: int) -> MetricsLogger:
    logger = MetricsLogger(run_dir, enabled=jax.process_index() == 0)
    hparams = {**flatten(asdict(cfg)), "params": n_params}
    logger.log_config(OmegaConf.to_yaml(OmegaConf.structured(cfg)), hparams, ["loss", "bpb"])
    return logger


# ----------------------------------------------------------------------------- loop


class Trainer:
    """One run: its training state on the devices, and the named steps of the loop in ``train``."""

    def __init__(self, cfg: Config):
        if cfg.train.distributed:
            jax.distributed.initialize()
        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg)
        replicated, batch_sharding = data_parallel_shardings(cfg.train.batch_size)
        self.to_device = partial(jax.make_array_from_process_local_data, batch_sharding)
        data, self.train_iter, self.val_windows = open_data(cfg)
        model = LM(cfg, data.tokenizer.vocab_size, rngs=nnx.Rngs(cfg.seed))
        n_params = count_params(model)
        write_run_files(self.run_dir, cfg, data, model, n_params)

        self.graphdef, state, tx = init_train_state(cfg, model)
        self.state = jax.device_put(state, replicated)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", keep=cfg.train.keep_checkpoints)
        self.resume()

        self.step_fn = jax.jit(partial(train_step, self.graphdef, tx, micro_batches=cfg.train.grad_accum), donate_argnums=0)
        self.eval_fn = jax.jit(partial(eval_step, self.graphdef), out_shardings=replicated)  # every host reads all
        rows = cfg.train.batch_size // jax.process_count()
        self.process_rows = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        first_windows = self.val_windows(np.arange(max(1, cfg.train.probe_batch)))
        self.probe_tokens = first_windows["inputs"][: cfg.train.probe_batch]
        self.bits_per_byte = 1.0 / (math.log(2) * data.bytes_per_token)
        self.schedule = learning_rate_schedule(cfg.optim, cfg.train.steps)
        self.logger = open_logger(self.run_dir, cfg, n_params)

        self.step, self.last_val = int(self.state["step"]), {}
        self.window_losses, self.window_start = [], time.perf_counter()  # the steps since the last log row
        self.bar = tqdm(total=cfg.train.steps, initial=self.step, desc=cfg.attn.name,
                        disable=not cfg.train.progress, dynamic_ncols=True)

    def resume(self) -> None:
        """Continue from the latest checkpoint, if the run directory has one."""
        if (latest := self.checkpointer.latest_step()) is None:
            return
        self.state, data_state = self.checkpointer.restore(latest, self.state)
        self.train_iter.set_state(data_state)
        truncate_metrics(self.run_dir, latest)
        log.info("resumed %s from step %d", self.run_dir, latest)

    def due(self, every: int) -> bool:
        """Whether the step just taken is a multiple of ``every``, or the last one."""
        return self.step % every == 0 or self.step == self.cfg.train.steps

    def advance(self) -> dict:
        """One optimizer step on the next training batch; its metrics stay on the device."""
        batch = jax.tree.map(self.to_device, next(self.train_iter))
        self.state, metrics = self.step_fn(self.state, batch)
        self.step += 1
        self.window_losses.append(metrics["loss"])
        self.bar.update(1)
        return metrics

    def train_metrics(self, metrics: dict) -> dict:
        """Loss and throughput over the steps since the last row; the other metrics of the last step."""
        loss = float(np.mean(jax.device_get(self.window_losses)))  # waits for the steps to finish
        elapsed = time.perf_counter() - self.window_start
        steps = len(self.window_losses)
        row = {
            "loss": loss, "bpb": loss * self.bits_per_byte, "ppl": math.exp(min(loss, 50.0)),
            "lr": float(self.schedule(self.step - 1)), "grad_norm": float(metrics["grad_norm"]),
            "tokens_per_s": self.cfg.train.batch_size * self.cfg.data.seq_len * steps / elapsed,
            "step_time_s": elapsed / steps,
            "accuracy": float(metrics["accuracy"]),
            **{k: float(v) for k, v in metrics.items() if k.startswith("aux/")},
        }
        self.window_losses, self.window_start = [], time.perf_counter()
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        return row

    def score(self, inputs: np.ndarray, targets: np.ndarray) -> dict:
        """Per-target loss and correctness of a global batch of validation windows; this process feeds its rows."""
        local = [self.to_device(x[self.process_rows]) for x in (inputs, targets)]
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
            val.update(probe_metrics(model, self.probe_tokens))
        self.last_val = val
        self.bar.write(f"step {self.step}: val_loss {val['val_loss']:.4f}  "
                       f"val_bpb {val['val_bpb']:.4f} [{val['val_bpb_lo']:.4f}, {val['val_bpb_hi']:.4f}]")
        return val

    def log(self, row: dict, metrics: dict) -> None:
        """Write a row when this step logged or validated; a validation-only row still gets the step's loss."""
        if row:
            row.setdefault("loss", float(metrics["loss"]))
            self.logger.log(self.step, row)

    def save(self) -> None:
        self.checkpointer.save(self.step, self.state, self.train_iter.get_state())

    def save_and_stop(self) -> dict:
        """The run was asked to stop: checkpoint where it stands, so the same command resumes it."""
        self.save()
        self.bar.write(
            f"interrupted: saved a checkpoint at step {self.step} in {self.run_dir}; run the same command to resume"
        )
        return self.finish(interrupted=True)

    def finish(self, *, interrupted: bool = False) -> dict:
        """Close the outputs; the summary ``train`` returns: step reached, whether interrupted, last validation."""
        self.bar.close()
        self.logger.close()
        self.checkpointer.close()
        return {"step": self.step, "interrupted": interrupted, **self.last_val}


def train(cfg: Config) -> dict:
    """Train (or resume) the run described by ``cfg``; returns the last validation metrics."""
    trainer = Trainer(cfg)
    with StopRequest() as stop:
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
    return trainer.finish()


# ----------------------------------------------------------------------------- entry point


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def _hydra_main(raw) -> None:
    try:
        cfg = validate(raw)
        train(cfg)
    except ConfigError as e:
        fail(str(e))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    register_schemas()
    check_argv(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    run_dirs = [a.split("=", 1)[1] for a in argv if a.startswith("run_dir=")]
    if run_dirs and not multirun:  # keep Hydra's own files in the run directory too
        argv.append(f"hydra.run.dir={run_dirs[-1]}")
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
