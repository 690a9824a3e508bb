"""``python -m lmzoo.eval run_dir=<dir> [eval.lengths=[...]] [pos.kind=... attn.<key>=...]``.

Loads a run's checkpoint and saved config, applies evaluation-time overrides (position methods,
attention switches) without retraining, and measures validation loss and bits per byte at each
length, with per-position loss, each with a 95% bootstrap interval. Results go to
``<run_dir>/eval/<tag>/``: ``results.json`` (its layout: ``lmzoo.metrics.intervals``),
``results.csv``, PNG plots, and TensorBoard scalars in the run's ``tb/eval/``.

Every length scores the same first ``eval.tokens`` validation targets (``lmzoo.evaluator``); the
training length is always among the lengths, since ratios are taken to it. Long windows are cut
from the validation token stream, in which documents are concatenated with an EOS between them:
a window longer than a document simply continues into the next one, the same packing as in training.

Before scoring, each length's forward is compiled and its memory (XLA's own account) compared with
the device's memory (``eval.memory_budget_gb`` to set it): a length that cannot fit is refused in one
line naming about the largest that can. A damaged newest checkpoint is named and passed over for the
next older intact one (unless ``eval.step`` names it). A position override that changes nothing for
the variant (``pos.kind=alibi`` on a model without attention positions) gets a warning line.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import OmegaConf
from omegaconf import errors as oc_errors
from tqdm.auto import tqdm

from lmzoo.checkpoint import Checkpointer, split_model
from lmzoo.cli import errors_in_one_line
from lmzoo.config import CONFIG_DIR, Config, ConfigError, EvalConfig, explain, load_run_config, to_dataclass, validate
from lmzoo.data import build_data
from lmzoo.evaluator import Forward, LengthScores, score_length, token_scores, windows_per_batch
from lmzoo.faults import RunFault
from lmzoo.metrics.intervals import LEVEL, length_intervals
from lmzoo.metrics.probes import attention_stats
from lmzoo.model import LM

log = logging.getLogger("lmzoo.eval")

# Overrides that would change parameter shapes cannot apply to a trained checkpoint.
FROZEN_SECTIONS = ("model",)
# The attention probes hold a layer's [B, H, T, T] float32 matrices and a few temporaries of that size.
PROBE_COPIES = 4


def parse_args(argv: list[str]) -> tuple[Path, EvalConfig, list[str]]:
    """(run_dir, eval settings, overrides of the run's config) from ``key=value`` arguments."""
    try:
        args = OmegaConf.from_dotlist(argv)
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(f"could not parse the arguments: {str(e).splitlines()[0]}") from None
    if "run_dir" not in args:
        raise ConfigError("run_dir=<dir> is required: the run to evaluate")
    run_dir = trained_run_dir(str(args.pop("run_dir")))
    defaults = OmegaConf.load(Path(CONFIG_DIR) / "eval" / "default.yaml")
    eval_cfg = to_dataclass(EvalConfig, OmegaConf.merge(defaults, args.pop("eval", {})), prefix="eval.")
    eval_cfg.check()
    overrides = [a for a in argv if not a.startswith(("run_dir=", "eval."))]
    check_overrides(overrides)
    return run_dir, eval_cfg, overrides


def trained_run_dir(path: str) -> Path:
    """``path`` as a run directory, ConfigError unless it holds a trained run."""
    run_dir = Path(path)
    if not (run_dir / "config.yaml").exists() or not (run_dir / "checkpoints").exists():
        raise ConfigError(f"run_dir={path!r} holds no trained run (no config.yaml and checkpoints)")
    return run_dir


def check_overrides(overrides: list[str]) -> None:
    """ConfigError for an override of the run's config that a trained checkpoint cannot take."""
    for override in overrides:
        if override.split(".")[0] in FROZEN_SECTIONS:
            key = override.split("=")[0]
            raise ConfigError(f"{key} cannot change at evaluation: it changes the trained parameters")


def run_config(run_dir: Path, overrides: list[str]) -> Config:
    saved = load_run_config(run_dir / "config.yaml")
    try:
        merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e)) from None
    merged.run_dir = str(run_dir)
    return validate(merged)


def restore_model(cfg: Config, vocab_size: int, run_dir: Path, step: int | None) -> tuple[LM, int]:
    """The model saved at ``step`` (the newest intact one if None), and that step; no optimizer is built."""
    checkpointer = Checkpointer(run_dir / "checkpoints")
    fresh = LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed))
    try:
        if step is not None:
            if step not in checkpointer.all_steps():
                raise ConfigError(f"eval.step={step} has no checkpoint in {run_dir} "
                                  f"(available: {checkpointer.all_steps()})")
            return checkpointer.restore_model(step, fresh), step
        found = checkpointer.restore_newest_intact(
            lambda s: checkpointer.restore_model(s, fresh),
            on_damaged=lambda s, message: log.warning("warning: %s; evaluating an older checkpoint", message))
        if found is None:
            raise RunFault(f"run_dir {str(run_dir)!r} has no checkpoint to evaluate")
        return found[1], found[0]
    finally:
        checkpointer.close()


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


def compile_forward(model: LM, rows: int, length: int, segments: bool = False):
    """``token_scores`` of ``model`` compiled for ``rows`` windows of ``length`` (with their segment ids
    when ``segments``), not yet run."""
    graphdef, state = split_model(model)
    scores = jax.jit(lambda s, *batch: token_scores(nnx.merge(graphdef, s["params"], s["extra"]), *batch))
    tokens = jax.ShapeDtypeStruct((rows, length), jnp.int32)
    return scores.lower(state, *[tokens] * (3 if segments else 2)).compile(), state


def carries_segments(windows) -> bool:
    """Whether batches of these windows carry segment ids (data.document_boundaries=mask)."""
    return "segment_ids" in windows(np.arange(1))


def compiled_bytes(compiled) -> int:
    """Device memory a compiled computation needs: arguments, outputs and temporaries, as XLA counts them."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def memory_budget(eval_cfg: EvalConfig) -> int:
    """Bytes one forward may use: ``eval.memory_budget_gb``, else the device's memory (the host's available
    memory on a CPU)."""
    if eval_cfg.memory_budget_gb is not None:
        return int(eval_cfg.memory_budget_gb * 2**30)
    return device_memory()


def device_memory() -> int:
    """Bytes of the device's memory (the host's available memory on a CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return host_available_bytes()


def host_available_bytes() -> int:
    """Memory the kernel could give us now (free plus reclaimable caches: /proc/meminfo's MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")  # free pages only: on the safe side


def largest_fitting_length(length: int, need: int, small: int, small_need: int, budget: int) -> int:
    """About the longest length within ``budget``, from the memory at two lengths and its growth between them."""
    growth = math.log(need / small_need) / math.log(length / small) if length > small and need > small_need else 2.0
    return int(small * (budget / small_need) ** (1 / min(max(growth, 1.0), 2.0)))


def length_forwards(model: LM, n_heads: int, lengths: list[int], rows: dict[int, int],
                    eval_cfg: EvalConfig, segments: bool = False) -> dict[int, Forward]:
    """A compiled forward per length; ConfigError in one line for a length whose forward or probes exceed
    the memory budget, before anything runs."""
    budget = memory_budget(eval_cfg)
    forwards, needs = {}, {}
    for n in lengths:
        compiled, state = compile_forward(model, rows[n], n, segments)
        needs[n] = compiled_bytes(compiled)
        if eval_cfg.probe_batch and n <= eval_cfg.probe_max_len:
            needs[n] = max(needs[n], PROBE_COPIES * 4 * eval_cfg.probe_batch * n_heads * n * n)
        if needs[n] > budget:
            small = lengths[0]
            fits = largest_fitting_length(n, needs[n], small, needs[small], budget)
            raise ConfigError(f"eval.lengths: length {n} needs about {needs[n] / 2**30:.1f} GiB for "
                              f"{rows[n]} window(s), over the {budget / 2**30:.1f} GiB budget (eval.memory_budget_gb); "
                              f"the largest length that fits is about {fits}")
        forwards[n] = lambda *batch, c=compiled, s=state: jax.device_get(c(s, *(jnp.asarray(x, jnp.int32) for x in batch)))
    return forwards


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
    batch = windows(np.arange(min(eval_cfg.probe_batch, len(windows))))
    stats = attention_stats(model, batch["inputs"], batch.get("segment_ids"), position_buckets=eval_cfg.position_buckets)
    return ({"sparsity": stats["sparsity"], "entropy": stats["entropy"]},
            {"sparsity": stats["sparsity_by_position"], "entropy": stats["entropy_by_position"]})


def score_lengths(forwards: dict[int, Forward], windows: dict, rows: dict[int, int], eval_cfg: EvalConfig,
                  tag: str) -> dict[int, LengthScores]:
    """Block sums at every length, ``rows[L]`` windows of length L at a time."""
    bar = tqdm(total=sum(-(-len(w) // rows[n]) for n, w in windows.items()), desc=f"eval {tag}",
               disable=not eval_cfg.progress)
    scores = {n: score_length(forwards[n], w, rows=rows[n], blocks=eval_cfg.blocks,
                              n_buckets=eval_cfg.position_buckets, on_batch=lambda: bar.update(1))
              for n, w in windows.items()}
    bar.close()
    return scores


def warn_inert_overrides(run_dir: Path, overrides: list[str], model: LM, vocab_size: int, tokens: np.ndarray) -> None:
    """One warning line for each position override whose removal leaves the model's outputs exactly as
    they are with every override: the variant, with the other settings, does not use what it sets (e.g.
    ``pos.kind=alibi`` on a model without attention positions; not ``pos.window`` beside ``pos.kind=rerope``)."""
    position_overrides = [o for o in overrides if o.startswith("pos.")]
    if not position_overrides:
        return
    state = split_model(model)[1]
    logits = nnx.jit(lambda m, t: m(t))

    def outputs(cfg: Config) -> np.ndarray:
        graphdef = split_model(LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed)))[0]
        return np.asarray(logits(nnx.merge(graphdef, state["params"], state["extra"]), tokens))

    with_all = outputs(run_config(run_dir, overrides))
    for override in position_overrides:
        if np.array_equal(outputs(run_config(run_dir, [o for o in overrides if o != override])), with_all):
            log.warning("warning: %s changes none of this %s model's outputs: the variant, with the other settings, "
                        "does not use it", override, model_variant(run_dir))


def model_variant(run_dir: Path) -> str:
    return str(load_run_config(run_dir / "config.yaml").attn.name)


def evaluate(cfg: Config, eval_cfg: EvalConfig, run_dir: Path, tag: str, overrides: list[str] = ()) -> dict:
    data = build_data(cfg.data, seed=cfg.seed)
    model, step = restore_model(cfg, data.tokenizer.vocab_size, run_dir, eval_cfg.step)
    train_len = cfg.data.seq_len
    lengths = evaluated_lengths(eval_cfg, train_len)
    longest = lengths[-1]
    windows = validation_windows(data, eval_cfg, lengths)
    bits = 1.0 / (math.log(2) * data.bytes_per_token)
    bootstrap_args = {"resamples": eval_cfg.resamples, "seed": eval_cfg.bootstrap_seed}
    rows = {n: min(windows_per_batch(eval_cfg.batch_tokens, n), len(w)) for n, w in windows.items()}
    forwards = length_forwards(model, cfg.model.n_heads, lengths, rows, eval_cfg, carries_segments(windows[train_len]))
    warn_inert_overrides(run_dir, list(overrides), model, data.tokenizer.vocab_size,
                         windows[longest](np.arange(1))["inputs"])
    scores = score_lengths(forwards, windows, rows, eval_cfg, tag)
    train = scores[train_len]
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

    with SummaryWriter(str(run_dir / "tb" / "eval")) as tb:  # its own folder: a resumed training run purges steps in tb/
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
    with errors_in_one_line():
        run_dir, eval_cfg, overrides = parse_args(argv)
        cfg = run_config(run_dir, overrides)
        tag = eval_cfg.tag or default_tag(overrides)
        results = evaluate(cfg, eval_cfg, run_dir, tag, overrides)
    out_dir = run_dir / "eval" / tag
    write_outputs(results, out_dir, run_dir)
    for length, r in results["lengths"].items():
        lo, hi = r["bpb_ci"]
        print(f"L={length:>6}  loss {r['loss']:.4f}  bpb {r['bpb']:.4f} [{lo:.4f}, {hi:.4f}]  "
              f"ratio {r['ratio']:.3f}  accuracy {r['accuracy']:.3f}")
    print(f"wrote {out_dir}/results.json")
    return results


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s", level=logging.WARNING, force=True)  # warnings as plain lines
    main()
