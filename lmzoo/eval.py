"""``python -m lmzoo.eval run_dir=<dir> [eval.lengths=[...]] [pos.kind=... attn.<key>=...]``.

Loads a run's checkpoint and saved config, applies evaluation-time overrides (position methods,
attention switches) without retraining, and measures validation loss and bits per byte at each
length, with per-position loss, each with a 95% bootstrap interval. Results go to
``<run_dir>/eval/<tag>/``: ``results.json`` (its layout: ``lmzoo.metrics.intervals``),
``results.csv``, PNG plots, and TensorBoard scalars in the run's ``tb/``.

Every length scores the same first ``eval.tokens`` validation targets (``lmzoo.evaluator``); the
training length is always among the lengths, since ratios are taken to it. Long windows are cut
from the validation token stream, in which documents are concatenated with an EOS between them:
a window longer than a document simply continues into the next one, the same packing as in training.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from omegaconf import OmegaConf
from omegaconf import errors as oc_errors
from tqdm.auto import tqdm

from lmzoo.checkpoint import Checkpointer
from lmzoo.cli import fail
from lmzoo.config import CONFIG_DIR, Config, ConfigError, EvalConfig, explain, load_run_config, to_dataclass, validate
from lmzoo.data import build_data
from lmzoo.evaluator import Forward, LengthScores, score_length, token_scores, windows_per_batch
from lmzoo.metrics.intervals import LEVEL, length_intervals
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


def evaluated_lengths(eval_cfg: EvalConfig, train_len: int) -> list[int]:
    """The lengths asked for (default 1x-8x the training length), with the training length: ratios are to it."""
    return sorted(set(eval_cfg.lengths or [train_len * f for f in (1, 2, 4, 8)]) | {train_len})


def validation_windows(data, eval_cfg: EvalConfig, lengths: list[int]) -> dict:
    """The windows of every length over the same ``eval.tokens`` scored targets; a budget or length the data
    cannot give is a ConfigError."""
    try:
        return data.validation_windows(lengths, eval_cfg.tokens)
    except ValueError as e:
        raise ConfigError(f"eval.tokens={eval_cfg.tokens}, eval.lengths={lengths}: {e}") from None


def model_forward(model: LM) -> Forward:
    scores = nnx.jit(token_scores)
    return lambda inputs, targets: jax.device_get(scores(model, inputs, targets))


def length_entry(scores: LengthScores, train: LengthScores, bits: float, bootstrap_args: dict) -> dict:
    """``results["lengths"]["<L>"]``: loss, bpb, ppl, accuracy, and the intervals of the block sums."""
    entry = scores.summary(bits)
    entry.update(length_intervals(scores.block_sums(), train.block_sums(), bits_per_nat=bits, **bootstrap_args))
    return entry


def position_entry(scores: LengthScores, bootstrap_args: dict) -> dict:
    """``results["per_position"]["<L>"]``: loss per span of positions, with its band."""
    curve = scores.position_interval(**bootstrap_args)
    return {"positions": scores.positions, "loss": np.asarray(curve.estimate).tolist(), "loss_ci": curve.bounds()}


def probe_entries(model: LM, windows, eval_cfg: EvalConfig) -> tuple[dict, dict]:
    """Attention sparsity and entropy on the first windows: per layer and head, and per span of positions."""
    tokens = windows(np.arange(min(eval_cfg.probe_batch, len(windows))))["inputs"]
    stats = attention_stats(model, tokens, position_buckets=eval_cfg.position_buckets)
    return ({"sparsity": stats["sparsity"], "entropy": stats["entropy"]},
            {"sparsity": stats["sparsity_by_position"], "entropy": stats["entropy_by_position"]})


def score_lengths(model: LM, windows: dict, eval_cfg: EvalConfig, tag: str) -> dict[int, LengthScores]:
    """Block sums at every length, ``eval.batch_tokens // L`` windows of length L at a time."""
    forward = model_forward(model)
    rows = {n: min(windows_per_batch(eval_cfg.batch_tokens, n), len(w)) for n, w in windows.items()}
    bar = tqdm(total=sum(-(-len(w) // rows[n]) for n, w in windows.items()), desc=f"eval {tag}",
               disable=not eval_cfg.progress)
    scores = {n: score_length(forward, w, rows=rows[n], blocks=eval_cfg.blocks, n_buckets=eval_cfg.position_buckets,
                              on_batch=lambda: bar.update(1)) for n, w in windows.items()}
    bar.close()
    return scores


def evaluate(cfg: Config, eval_cfg: EvalConfig, run_dir: Path, tag: str) -> dict:
    data = build_data(cfg.data, seed=cfg.seed)
    model, step = restore_model(cfg, data.tokenizer.vocab_size, run_dir, eval_cfg.step)
    train_len = cfg.data.seq_len
    lengths = evaluated_lengths(eval_cfg, train_len)
    windows = validation_windows(data, eval_cfg, lengths)
    bits = 1.0 / (math.log(2) * data.bytes_per_token)
    bootstrap_args = {"resamples": eval_cfg.resamples, "seed": eval_cfg.bootstrap_seed}
    scores = score_lengths(model, windows, eval_cfg, tag)
    train = scores[train_len]
    longest = lengths[-1]
    results = {"variant": cfg.attn.name, "train_seq_len": train_len, "tag": tag, "step": step,
               "eval_tokens": len(windows[longest]) * longest,  # text: the N targets scored at every length
               "blocks": len(train.count), "bootstrap": {**bootstrap_args, "level": LEVEL},
               "lengths": {}, "per_position": {}, "block_sums": {}}
    for n in lengths:
        results["lengths"][str(n)] = length_entry(scores[n], train, bits, bootstrap_args)
        results["per_position"][str(n)] = position_entry(scores[n], bootstrap_args)
        results["block_sums"][str(n)] = {k: v.tolist() for k, v in scores[n].block_sums().items()}
        if eval_cfg.probe_batch and n <= eval_cfg.probe_max_len:
            overall, curves = probe_entries(model, windows[n], eval_cfg)
            results["lengths"][str(n)].update(overall)
            results["per_position"][str(n)].update(curves)
    if extra := extra_evaluation(cfg, eval_cfg, model, run_dir / "eval" / tag, longest):
        results["extra"] = extra
    return results


def extra_evaluation(cfg: Config, eval_cfg: EvalConfig, model: LM, out_dir: Path, longest: int) -> dict | None:
    """A data source's own evaluation (e.g. a retrieval grid) where it offers one."""
    hook = getattr(cfg.data, "extra_evaluation", None)
    if hook is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    logits = nnx.jit(lambda m, tokens: m(tokens))
    batch_size = windows_per_batch(eval_cfg.batch_tokens, longest)
    return hook(lambda tokens: np.asarray(logits(model, tokens)), eval_cfg.lengths or None, out_dir,
                seed=cfg.seed, batch_size=batch_size)


def default_tag(overrides: list[str]) -> str:
    return ",".join(sorted(overrides)).replace("/", "_") or "default"


def write_outputs(results: dict, out_dir: Path, run_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    train_len = results["train_seq_len"]
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["length", "length_ratio", "tokens", "loss", "bpb", "bpb_lo", "bpb_hi", "ratio", "ratio_lo",
                         "ratio_hi", "accuracy", "mean_sparsity", "mean_entropy"])
        for length, r in results["lengths"].items():
            means = [float(np.nanmean(r[k])) if k in r else "" for k in ("sparsity", "entropy")]
            writer.writerow([length, int(length) / train_len, r["tokens"], r["loss"], r["bpb"], *r["bpb_ci"],
                             r["ratio"], *r["ratio_ci"], r["accuracy"], *means])
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
    """bpb and its paired ratio to the training length against length, and loss by position, each with its
    95% band; attention sparsity against length where probed."""
    from lmzoo.plots import line_with_band, new_axes, save_axes

    train_len = results["train_seq_len"]
    lengths = [int(n) for n in results["lengths"]]
    title = f"{results['variant']} (trained at {train_len}) — {results['tag']}\n"
    title += f"{results['eval_tokens']:,} tokens, 95% intervals"
    axis = {"train_len": train_len, "xscale": "log", "title": title}
    fig, ax = new_axes()
    bpb = [r["bpb"] for r in results["lengths"].values()]
    lo, hi = zip(*(r["bpb_ci"] for r in results["lengths"].values()))
    line_with_band(ax, lengths, bpb, lo, hi, marker="o", label="bpb, 95% interval")
    save_axes(fig, ax, out_dir / "loss_vs_length.png", xticks=lengths, xlabel="evaluation length (tokens)",
              ylabel="validation bits per byte", **axis)

    fig, ax = new_axes()  # paired on the same blocks: the band shows the change with length, not the text's noise
    ratio = [r["ratio"] for r in results["lengths"].values()]
    lo, hi = zip(*(r["ratio_ci"] for r in results["lengths"].values()))
    line_with_band(ax, lengths, ratio, lo, hi, marker="o", label="paired ratio, 95% interval")
    save_axes(fig, ax, out_dir / "ratio_vs_length.png", xticks=lengths, xlabel="evaluation length (tokens)",
              ylabel=f"bpb@L / bpb@{train_len}", **axis)

    probed = {int(n): r["sparsity"] for n, r in results["lengths"].items() if "sparsity" in r}
    if probed:
        fig, ax = new_axes()
        for layer in range(len(next(iter(probed.values())))):
            layer_means = [float(np.nanmean(s[layer])) for s in probed.values()]
            ax.plot(list(probed), layer_means, marker="o", label=f"layer {layer}")
        save_axes(fig, ax, out_dir / "sparsity_vs_length.png", xticks=list(probed), xlabel="evaluation length (tokens)",
                  ylabel="mean row sparsity S (1 = uniform)", **axis)

    fig, ax = new_axes()
    for length, curve in results["per_position"].items():
        line_with_band(ax, curve["positions"], curve["loss"], *curve["loss_ci"], label=f"L={length}")
    save_axes(fig, ax, out_dir / "per_position.png", xlabel="position", ylabel="loss (nats/token), 95% band", **axis)


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
        lo, hi = r["bpb_ci"]
        print(f"L={length:>6}  loss {r['loss']:.4f}  bpb {r['bpb']:.4f} [{lo:.4f}, {hi:.4f}]  "
              f"ratio {r['ratio']:.3f}  accuracy {r['accuracy']:.3f}")
    print(f"wrote {out_dir}/results.json")
    return results


if __name__ == "__main__":
    main()
