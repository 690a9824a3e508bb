"""Evaluating a trained model at several lengths: ``evaluate`` returns a results dict and writes nothing.

Validation loss, bits per byte and accuracy at each length, per-position loss and attention probes,
each with its 95% bootstrap interval (``lmzoo.measure.outputs`` writes them; ``lmzoo.eval`` is the
command).

Every length scores the same ``eval.tokens`` validation targets, spread over every document
(``lmzoo.scoring.lengths``); the training length is always among the lengths, since ratios are taken to it.
Long windows are cut from the validation token stream, in which documents are concatenated with an EOS between
them: a window longer than a document simply continues into the next one, the same packing as in training.
``eval.min_doc_tokens=n`` scores only windows inside one document of at least ``n`` tokens instead, so a
target at position ``p`` has ``p`` tokens of its own document before it: what "context of length ``L``" means
in long-document evaluations (PG-19 and the like). results.json then records how many validation documents are
long enough at each length; a length no document reaches is refused in one line.

Before scoring, each length's forward is compiled and its memory (XLA's own account) compared with
the device's memory (``eval.memory_budget_gb`` to set it): a length that cannot fit is refused in one
line naming about the largest that can. The results layout: ``lmzoo.stats.bootstrap``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from lmzoo.cli import parse_settings
from lmzoo.config import CONFIG_DIR, Config, ConfigError, EvalConfig
from lmzoo.measure.memory import compiled_bytes, largest_fitting_length, memory_budget
from lmzoo.scoring.catalog import PROBES
from lmzoo.scoring.probes import attention_stats
from lmzoo.scoring.lengths import Forward, LengthScores, score_length, token_scores, windows_per_batch
from lmzoo.model import LM
from lmzoo.record.checkpoints import split_model
from lmzoo.record.directory import RunDir
from lmzoo.record.opening import Trained, trained_config
from lmzoo.stats.bootstrap import LEVEL, length_intervals

log = logging.getLogger("lmzoo.eval")

# The attention probes hold a layer's [B, H, T, T] float32 matrices and a few temporaries of that size.
PROBE_COPIES = 4
# Evaluation settings that change how it runs, not what it measures.
NOT_RESULT_SETTINGS = ("tag", "progress", "memory_budget_gb", "batch_tokens")


@dataclass
class EvalSettings:
    """The measuring settings as a command line gives them (``eval.<key>=value``), over
    ``configs/eval/default.yaml``."""

    eval: EvalConfig = field(default_factory=EvalConfig)

    def check(self) -> None:
        self.eval.check()


def eval_defaults() -> dict:
    """``configs/eval/default.yaml``, nested under ``eval``: what ``eval_settings`` starts from."""
    return {"eval": OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "eval" / "default.yaml")) or {}}


def eval_settings(dotlist: list[str] = ()) -> EvalConfig:
    """``configs/eval/default.yaml`` with ``eval.<key>=value`` items applied, checked."""
    return parse_settings(EvalSettings, list(dotlist), "eval", defaults=eval_defaults()).settings.eval


def result_settings(eval_cfg: EvalConfig, overrides: list[str]) -> dict:
    """What the results depend on besides the run: the measuring settings and the overrides of the run's config."""
    measuring = {k: v for k, v in asdict(eval_cfg).items() if k not in NOT_RESULT_SETTINGS}
    if measuring["min_doc_tokens"] is None:  # unset: settings read as those of results made before it existed
        del measuring["min_doc_tokens"]
    return {"eval": measuring, "overrides": sorted(overrides)}


def evaluated_lengths(eval_cfg: EvalConfig, train_len: int) -> list[int]:
    """The lengths asked for (default 1x-8x the training length), with the training length: ratios are to it."""
    return sorted(set(eval_cfg.lengths or [train_len * f for f in (1, 2, 4, 8)]) | {train_len})


def validation_windows(data, eval_cfg: EvalConfig, lengths: list[int]) -> dict:
    """The windows of every length over the same ``eval.tokens`` scored targets (with ``eval.min_doc_tokens``,
    only inside documents at least that long); a budget, length or minimum the data cannot give is a ConfigError."""
    if eval_cfg.min_doc_tokens is not None and not data.has_documents:
        raise ConfigError(f"eval.min_doc_tokens={eval_cfg.min_doc_tokens}: this run's data are generated "
                          "examples, not documents; it applies to text corpora (set it to null)")
    try:
        return data.validation_windows(lengths, eval_cfg.tokens, eval_cfg.min_doc_tokens)
    except ValueError as e:
        minimum = "" if eval_cfg.min_doc_tokens is None else f", eval.min_doc_tokens={eval_cfg.min_doc_tokens}"
        raise ConfigError(f"eval.tokens={eval_cfg.tokens}, eval.lengths={lengths}{minimum}: {e}") from None


def check_request(trained: Trained, eval_cfg: EvalConfig) -> np.ndarray:
    """ConfigError in one line for lengths or a token budget the data cannot give, before anything runs;
    else the first window of the longest length (tokens [1, L])."""
    lengths = evaluated_lengths(eval_cfg, trained.cfg.data.seq_len)
    return validation_windows(trained.data, eval_cfg, lengths)[lengths[-1]](np.arange(1))["inputs"]


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
        forwards[n] = lambda *batch, c=compiled, s=state: jax.device_get(
            c(s, *(jnp.asarray(x, jnp.int32) for x in batch)))
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
    """The attention probes (sparsity, entropy, first-key share) on the first windows: per layer and head, and per
    span of positions."""
    batch = windows(np.arange(min(eval_cfg.probe_batch, len(windows))))
    stats = attention_stats(model, batch["inputs"], batch.get("segment_ids"),
                            position_buckets=eval_cfg.position_buckets)
    overall = {p.name: stats[p.name] for p in PROBES}
    return overall, {p.name: stats[f"{p.name}_by_position"] for p in PROBES}  # per_position's keys: the names


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



def warn_inert_overrides(run: RunDir, overrides: list[str], model: LM, vocab_size: int, tokens: np.ndarray) -> None:
    """One warning line for each position override whose removal leaves the model's outputs exactly as
    they are with every override: the variant, with the other settings, does not use what it sets (e.g.
    ``pos.kind=alibi`` on a model without attention positions; not ``pos.window`` beside ``pos.kind=rerope``)."""
    position_overrides = [o for o in overrides if o.lstrip("+").startswith(("pos.", "pos="))]
    if not position_overrides:
        return
    state = split_model(model)[1]
    logits = nnx.jit(lambda m, t: m(t))

    def outputs(cfg: Config) -> np.ndarray:
        graphdef = split_model(LM(cfg, vocab_size, rngs=nnx.Rngs(cfg.seed)))[0]
        return np.asarray(logits(nnx.merge(graphdef, state["params"], state["extra"]), tokens))

    with_all = outputs(trained_config(run, overrides))
    for override in position_overrides:
        if np.array_equal(outputs(trained_config(run, [o for o in overrides if o != override])), with_all):
            log.warning("warning: %s changes none of this %s model's outputs: the variant, with the other settings, "
                        "does not use it", override, run.read_config().attn.name)


def evaluate(trained: Trained, eval_cfg: EvalConfig, *, tag: str = "default", extra_dir: Path | None = None) -> dict:
    """The results of ``trained`` at every evaluated length (layout: ``lmzoo.stats.bootstrap``); writes
    nothing but what a data source's own evaluation plots into ``extra_dir`` (skipped when None)."""
    cfg, data, model, step = trained
    train_len = cfg.data.seq_len
    lengths = evaluated_lengths(eval_cfg, train_len)
    longest = lengths[-1]
    windows = validation_windows(data, eval_cfg, lengths)
    bits = 1.0 / (math.log(2) * data.bytes_per_token)
    bootstrap_args = {"resamples": eval_cfg.resamples, "seed": eval_cfg.bootstrap_seed}
    rows = {n: min(windows_per_batch(eval_cfg.batch_tokens, n), len(w)) for n, w in windows.items()}
    forwards = length_forwards(model, cfg.model.n_heads, lengths, rows, eval_cfg, carries_segments(windows[train_len]))
    scores = score_lengths(forwards, windows, rows, eval_cfg, tag)
    train = scores[train_len]
    results = {"variant": cfg.attn.name, "train_seq_len": train_len, "tag": tag, "step": step,
               "eval_tokens": len(windows[longest]) * longest,  # text: the N targets scored at every length
               **windows[longest].sampling_keys(),  # which text: its sampling, documents, what blocks are made of
               "blocks": len(train.count), "bootstrap": {**bootstrap_args, "level": LEVEL},
               "lengths": {}, "per_position": {}, "block_sums": {}}
    for n in lengths:
        results["lengths"][str(n)] = length_entry(scores[n], train, bits, bootstrap_args)
        results["per_position"][str(n)] = position_entry(scores[n], bootstrap_args)
        results["block_sums"][str(n)] = {k: v.tolist() for k, v in scores[n].block_sums().items()}
        results["lengths"][str(n)]["kernels"] = model.mixer_kernels(rows[n], n, carries_segments(windows[n]))
        if eval_cfg.probe_batch and n <= eval_cfg.probe_max_len:
            overall, curves = probe_entries(model, windows[n], eval_cfg)
            results["lengths"][str(n)].update(overall)
            results["per_position"][str(n)].update(curves)
    if extra_dir is not None and (extra := extra_evaluation(cfg, eval_cfg, model, extra_dir, longest)):
        results["extra"] = extra
    return results


def extra_evaluation(cfg: Config, eval_cfg: EvalConfig, model: LM, out_dir: Path, longest: int) -> dict | None:
    """A data source's own evaluation (e.g. a retrieval grid): its spec's ``extra_evaluation`` (None: it has none)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logits = nnx.jit(lambda m, tokens: m(tokens))
    batch_size = windows_per_batch(eval_cfg.batch_tokens, longest)
    return cfg.data.extra_evaluation(lambda tokens: np.asarray(logits(model, tokens)), eval_cfg.lengths or None,
                                     out_dir, seed=cfg.seed, batch_size=batch_size)
