"""``python -m lmzoo.eval run_dir=<dir> [eval.lengths=[...]] [pos.kind=... attn.<key>=...]``.

Loads a run's checkpoint and saved config, applies evaluation-time overrides (position methods,
attention switches) without retraining, and measures validation loss and bits per byte at each
length, with per-position loss. Results go to ``<run_dir>/eval/<tag>/``: ``results.json``,
``results.csv``, PNG plots, and TensorBoard scalars in the run's ``tb/``.

Long windows are cut from the validation token stream, in which documents are concatenated with
an EOS between them: a window longer than a document simply continues into the next one, the
same packing as in training.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from omegaconf import OmegaConf
from omegaconf import errors as oc_errors
from tqdm.auto import tqdm

from lmzoo.checkpoint import Checkpointer
from lmzoo.cli import fail
from lmzoo.config import CONFIG_DIR, Config, ConfigError, EvalConfig, explain, load_run_config, to_dataclass, validate
from lmzoo.data import build_data
from lmzoo.metrics.probes import attention_stats
from lmzoo.model import LM

# Overrides that would change parameter shapes cannot apply to a trained checkpoint.
FROZEN_SECTIONS = ("model",)


def parse_args(argv: list[str]) -> tuple[Path, EvalConfig, list[str]]:
    """(run_dir, eval settings, overrides of the run's config) from ``key=value`` arguments."""
    try:
        args = OmegaConf.from_dotlist(argv)
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(f"could not parse the arguments: {str(e).splitlines()[0]}") from None
    if "run_dir" not in args:
        raise ConfigError("run_dir=<dir> is required: the run to evaluate")
    run_dir = Path(str(args.pop("run_dir")))
    if not (run_dir / "config.yaml").exists() or not (run_dir / "checkpoints").exists():
        raise ConfigError(f"run_dir={str(run_dir)!r} holds no trained run (no config.yaml and checkpoints)")
    defaults = OmegaConf.load(Path(CONFIG_DIR) / "eval" / "default.yaml")
    eval_cfg = to_dataclass(EvalConfig, OmegaConf.merge(defaults, args.pop("eval", {})), prefix="eval.")
    eval_cfg.check()
    overrides = [a for a in argv if not a.startswith(("run_dir=", "eval."))]
    for override in overrides:
        if override.split(".")[0] in FROZEN_SECTIONS:
            key = override.split("=")[0]
            raise ConfigError(f"{key} cannot change at evaluation: it changes the trained parameters")
    return run_dir, eval_cfg, overrides


def run_config(run_dir: Path, overrides: list[str]) -> Config:
    saved = load_run_config(run_dir / "config.yaml")
    try:
        merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e)) from None
    merged.run_dir = str(run_dir)
    return validate(merged)


def restore_model(cfg: Config, vocab_size: int, run_dir: Path, step: int | None) -> tuple[LM, int]:
    """The model saved at ``step`` (the latest if None), and that step; no optimizer is built."""
    checkpointer = Checkpointer(run_dir / "checkpoints")
    step = checkpointer.latest_step() if step is None else step
    if step not in checkpointer.all_steps():
        raise ConfigError(f"eval.step={step} has no checkpoint in {run_dir} (available: {checkpointer.all_steps()})")
    model = checkpointer.restore_model(step, LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed)))
    checkpointer.close()
    return model, step


@nnx.jit
def position_sums(model: LM, batch) -> dict[str, jax.Array]:
    """Per position, summed over the batch: scored loss, scored correct predictions, and weight."""
    logits = model(batch["inputs"])  # (B, T, V)
    weights = batch.get("weights", jnp.ones(batch["targets"].shape, jnp.float32))
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    correct = (logits.argmax(-1) == batch["targets"]).astype(jnp.float32)
    return {"loss": (losses * weights).sum(0), "correct": (correct * weights).sum(0), "weight": weights.sum(0)}


def bucket(values: np.ndarray, n_buckets: int) -> tuple[list[int], list[float]]:
    """Mean of ``values`` over ``n_buckets`` equal spans of positions, labelled by each span's last position."""
    spans = np.array_split(np.arange(len(values)), min(n_buckets, len(values)))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a span with no scored position is NaN
        return [int(s[-1]) + 1 for s in spans], [float(np.nanmean(values[s])) for s in spans]


def validation_windows(data, eval_cfg: EvalConfig, length: int) -> list[dict]:
    """The fixed validation batches cut at ``length`` tokens; a length the data cannot give is a ConfigError."""
    try:
        return data.val_batches(eval_cfg.batch_size, eval_cfg.batches, seq_len=length)
    except ValueError as e:
        raise ConfigError(f"eval.lengths: {e}") from None


def score_length(model: LM, batches: list[dict], bits: float, n_buckets: int, bar: tqdm) -> tuple[dict, dict]:
    """(loss, bpb and accuracy over ``batches``, loss per position in ``n_buckets`` spans) at one length."""
    sums = {"loss": 0.0, "correct": 0.0, "weight": 0.0}
    for batch in batches:
        sums = {k: sums[k] + np.asarray(v) for k, v in position_sums(model, batch).items()}  # each (T,)
        bar.update(1)
    loss = float(sums["loss"].sum() / sums["weight"].sum())
    accuracy = float(sums["correct"].sum() / sums["weight"].sum())
    overall = {"loss": loss, "bpb": loss * bits, "accuracy": accuracy, "batches": len(batches)}
    with np.errstate(invalid="ignore"):  # unscored positions of synthetic tasks: NaN, skipped by nanmean
        positions, losses = bucket(sums["loss"] / sums["weight"], n_buckets)
    return overall, {"positions": positions, "loss": losses}


def evaluate(cfg: Config, eval_cfg: EvalConfig, run_dir: Path, tag: str) -> dict:
    data = build_data(cfg.data, seed=cfg.seed)
    model, step = restore_model(cfg, data.tokenizer.vocab_size, run_dir, eval_cfg.step)
    train_len = cfg.data.seq_len
    lengths = eval_cfg.lengths or [train_len * f for f in (1, 2, 4, 8)]
    bits = 1.0 / (math.log(2) * data.bytes_per_token)
    results = {"variant": cfg.attn.name, "train_seq_len": train_len, "tag": tag, "step": step,
               "lengths": {}, "per_position": {}}
    bar = tqdm(total=len(lengths) * eval_cfg.batches, desc=f"eval {tag}", disable=not eval_cfg.progress)
    for length in lengths:
        batches = validation_windows(data, eval_cfg, length)
        overall, curves = score_length(model, batches, bits, eval_cfg.position_buckets, bar)
        if eval_cfg.probe_batch and length <= eval_cfg.probe_max_len:
            tokens = batches[0]["inputs"][: eval_cfg.probe_batch]
            stats = attention_stats(model, tokens, position_buckets=eval_cfg.position_buckets)
            overall.update(sparsity=stats["sparsity"], entropy=stats["entropy"])
            curves.update(sparsity=stats["sparsity_by_position"], entropy=stats["entropy_by_position"])
        results["lengths"][str(length)], results["per_position"][str(length)] = overall, curves
    bar.close()
    return results


def default_tag(overrides: list[str]) -> str:
    return ",".join(sorted(overrides)).replace("/", "_") or "default"


def write_outputs(results: dict, out_dir: Path, run_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    train_len = results["train_seq_len"]
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["length", "length_ratio", "loss", "bpb", "accuracy", "mean_sparsity", "mean_entropy"])
        for length, r in results["lengths"].items():
            means = [float(np.nanmean(r[k])) if k in r else "" for k in ("sparsity", "entropy")]
            writer.writerow([length, int(length) / train_len, r["loss"], r["bpb"], r["accuracy"], *means])
    plot_results(results, out_dir)
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(run_dir / "tb")) as tb:
        for length, r in results["lengths"].items():
            tb.add_scalar(f"eval/{results['tag']}/bpb_vs_length", r["bpb"], int(length))
            tb.add_scalar(f"eval/{results['tag']}/loss_vs_length", r["loss"], int(length))
            for name in ("sparsity", "entropy"):
                if name in r:
                    tb.add_scalar(f"eval/{results['tag']}/{name}_vs_length", float(np.nanmean(r[name])), int(length))
        for png in sorted(out_dir.glob("*.png")):
            tb.add_image(f"eval/{results['tag']}/{png.stem}", plt_image(png), 0, dataformats="HWC")


def plt_image(path: Path) -> np.ndarray:
    import matplotlib.image

    return (matplotlib.image.imread(path)[..., :3] * 255).astype(np.uint8)  # (H, W, 3)


def plot_results(results: dict, out_dir: Path) -> None:
    from lmzoo.plots import new_axes, save_axes

    train_len = results["train_seq_len"]
    title = f"{results['variant']} (trained at {train_len}) — {results['tag']}"
    fig, ax = new_axes()
    ax.plot([int(n) for n in results["lengths"]], [r["bpb"] for r in results["lengths"].values()], marker="o")
    save_axes(fig, ax, out_dir / "loss_vs_length.png", train_len=train_len, xscale="log",
              xlabel="evaluation length (tokens)", ylabel="validation bits per byte", title=title)

    probed = {int(n): r["sparsity"] for n, r in results["lengths"].items() if "sparsity" in r}
    if probed:
        fig, ax = new_axes()
        for layer in range(len(next(iter(probed.values())))):
            layer_means = [float(np.nanmean(s[layer])) for s in probed.values()]
            ax.plot(list(probed), layer_means, marker="o", label=f"layer {layer}")
        save_axes(fig, ax, out_dir / "sparsity_vs_length.png", train_len=train_len, xscale="log",
                  xlabel="evaluation length (tokens)", ylabel="mean row sparsity S (1 = uniform)", title=title)

    fig, ax = new_axes()
    for length, curve in results["per_position"].items():
        ax.plot(curve["positions"], curve["loss"], label=f"L={length}")
    save_axes(fig, ax, out_dir / "per_position.png", train_len=train_len, xscale="log",
              xlabel="position", ylabel="loss (nats/token)", title=title)


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        run_dir, eval_cfg, overrides = parse_args(argv)
        cfg = run_config(run_dir, overrides)
        tag = eval_cfg.tag or default_tag(overrides)
        results = evaluate(cfg, eval_cfg, run_dir, tag)
    except ConfigError as e:
        fail(str(e))
    out_dir = run_dir / "eval" / tag
    write_outputs(results, out_dir, run_dir)
    for length, r in results["lengths"].items():
        print(f"L={length:>6}  loss {r['loss']:.4f}  bpb {r['bpb']:.4f}  accuracy {r['accuracy']:.3f}")
    print(f"wrote {out_dir}/results.json")
    return results


if __name__ == "__main__":
    main()
