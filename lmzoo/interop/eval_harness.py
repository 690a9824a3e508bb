"""lm-evaluation-harness on lmzoo models: the ``lmzoo`` model adapter, and running tasks into a run directory.

``LmzooLM`` (registered with lm-eval as ``lmzoo``) scores and generates with an lmzoo model, a trained
run's (``run_dir=``) or a Hugging Face folder's (``hf=``, ``lmzoo.interop.hf.open_hf``):

- ``loglikelihood``: log p(continuation | context) summed over the continuation's tokens, and whether
  every one of them is the model's most likely token. Context and continuation are tokenised together
  (a trailing space of the context moves to the continuation, as lm-eval's Hugging Face model does),
  an empty context is the end-of-sequence token, and a sequence longer than ``max_length`` (default the
  run's training length) keeps its last tokens. Requests run longest first in batches of
  ``batch_size`` rows, padded to a few lengths so that few programs compile.
- ``loglikelihood_rolling``: a whole text's log-likelihood in disjoint windows of ``max_length``
  predictions, each with as much context as fits (lm-eval's rolling windows).
- ``generate_until``: greedy decoding through lmzoo's own decoder (one parallel prefill, then one step
  per token: a KV cache for softmax layers, O(1) state for recurrent ones), cut at the first stop string.

``run_tasks`` runs lm-eval's ``simple_evaluate`` on such a model and returns what lmzoo keeps of it:
each task's metrics, the settings, and every example's scores (``per_example``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from lmzoo.measure.decoding import Sampling, generate, until_eos
from lmzoo.record.checkpoints import split_model
from lmzoo.record.opening import Trained
from lmzoo.stats.bootstrap import bootstrap, ratio_of_sums

NAME = "lmzoo"
MIN_PADDED = 16  # the shortest padded length: sequences are padded to powers of two from here to max_length


def padded_length(length: int, max_length: int) -> int:
    """The length a batch of sequences of at most ``length`` tokens is padded to (few shapes, few compiles)."""
    padded = MIN_PADDED
    while padded < length:
        padded *= 2
    return min(padded, max(max_length, length))


def target_scorer(model: nnx.Module) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """inputs, targets [B, L] int32 -> (log p(target) [B, L], target is the most likely token [B, L]), jitted."""
    graphdef, weights = split_model(model)

    @jax.jit
    def score(w, inputs, targets):
        logits = nnx.merge(graphdef, w["params"], w["extra"])(inputs)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        chosen = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        return chosen, logits.argmax(-1) == targets

    return lambda inputs, targets: tuple(np.asarray(a) for a in score(weights, inputs, targets))


@register_model(NAME)
class LmzooLM(LM):
    """An lmzoo model behind lm-eval's model interface; ``trained`` (a ``lmzoo.record.opening.Trained``), or one of
    ``run_dir`` (with ``step``) and ``hf`` to open it from."""

    def __init__(self, run_dir: str | None = None, hf: str | None = None, step: int | None = None,
                 batch_size: int = 8, max_length: int | None = None, max_gen_toks: int = 256,
                 trained: Trained | None = None, **unused: Any):
        super().__init__()
        self.trained = trained or open_model(run_dir, hf, None if step is None else int(step))
        self.model, self.tokenizer = self.trained.model, self.trained.data.tokenizer
        self.batch_size = int(batch_size)
        self.max_length = int(max_length or self.trained.cfg.data.seq_len)
        self.max_gen_toks = int(max_gen_toks)
        self.score = target_scorer(self.model)

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is: the end of a document, as the model saw documents end in training."""
        return self.tokenizer.eos_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).tolist()

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation ids, tokenised together so a merge across the boundary is the model's own."""
        if not context:
            return [self.prefix_token_id], self.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self.encode(context + continuation), self.encode(context)
        return head, whole[len(head):]

    # ------------------------------------------------------------------ scoring

    def score_pairs(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p over the continuation, every continuation token greedy) for each (context, continuation)."""
        rows = []
        for context, continuation in pairs:
            sequence = (context + continuation)[-(self.max_length + 1):]
            rows.append((sequence[:-1], sequence[1:], min(len(continuation), len(sequence) - 1)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: fewer padded tokens
        results: list[Any] = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            length = padded_length(max(len(rows[i][0]) for i in chunk), self.max_length)
            inputs = np.full((self.batch_size, length), self.tokenizer.pad_id, np.int32)
            targets = np.zeros_like(inputs)
            for row, i in enumerate(chunk):
                n = len(rows[i][0])
                inputs[row, :n], targets[row, :n] = rows[i][0], rows[i][1]
            log_probs, greedy = self.score(inputs, targets)
            for row, i in enumerate(chunk):
                n, scored = len(rows[i][0]), rows[i][2]
                results[i] = (float(log_probs[row, n - scored:n].sum()), bool(greedy[row, n - scored:n].all()))
        return results

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        results = self.score_pairs([self.encode_pair(*request.args) for request in requests])
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for index, request in enumerate(requests):
            for window in get_rolling_token_windows(self.encode(request.args[0]), self.prefix_token_id,
                                                    self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owner.append(index)
        totals = np.zeros(len(requests))
        for index, (log_prob, _) in zip(owner, self.score_pairs(windows)):
            totals[index] += log_prob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, float(total))
        return [float(total) for total in totals]

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        texts = []
        for request in requests:
            context, settings = request.args
            settings = dict(settings or {})
            until = settings.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            new_tokens = int(settings.get("max_gen_toks", self.max_gen_toks))
            prompt = (self.encode(context) if context else [self.prefix_token_id])[-self.max_length:]
            produced = generate(self.model, np.asarray(prompt, np.int32),
                                Sampling(prompt=context, max_new_tokens=new_tokens, temperature=0.0),
                                eos_id=self.tokenizer.eos_id)[0]
            text = cut_at(self.tokenizer.decode(until_eos(produced, self.tokenizer.eos_id)), until)
            self.cache_hook.add_partial("generate_until", request.args, text)
            texts.append(text)
        return texts


def cut_at(text: str, stops: list[str]) -> str:
    """``text`` up to (without) the first occurrence of any stop string."""
    ends = [text.find(stop) for stop in stops if stop and stop in text]
    return text[:min(ends)] if ends else text


def open_model(run_dir: str | None, hf: str | None, step: int | None) -> Trained:
    """A trained run's model (``run_dir``, at ``step``), or a Hugging Face folder's (``hf``)."""
    from lmzoo.config import ConfigError

    if (run_dir is None) == (hf is None):
        raise ConfigError("name the model with exactly one of run_dir=<run> and hf=<folder>")
    if hf is not None:
        from lmzoo.interop.hf import open_hf

        return open_hf(hf)
    from lmzoo.record.opening import open_trained

    return open_trained(run_dir, (), step)


# ----------------------------------------------------------------------------- running tasks


def run_tasks(lm: LmzooLM, tasks: list[str], *, include_path: str | None = None, limit: float | None = None,
              num_fewshot: int | None = None, seed: int = 0) -> dict:
    """lm-eval's ``simple_evaluate`` of ``tasks`` on ``lm``: its metrics per task, and every example's scores."""
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or not set(tasks) <= set(manager.all_tasks):  # indexing lm-eval's own tasks takes a minute
        manager = TaskManager(include_path=include_path)
    found = manager.all_tasks
    unknown = [task for task in tasks if task not in found]
    if unknown:
        from lmzoo.config import ConfigError

        raise ConfigError(f"tasks: {', '.join(unknown)} unknown to lm-eval"
                          + ("" if include_path else " (a task of your own: include_path=<folder of task YAMLs>)"))
    output = evaluator.simple_evaluate(
        model=lm, tasks=tasks, task_manager=manager, limit=limit, num_fewshot=num_fewshot, log_samples=True,
        random_seed=seed, numpy_random_seed=seed, torch_random_seed=None, fewshot_random_seed=seed,
        bootstrap_iters=1000)
    examples = per_example(output["samples"])
    return {"results": json_safe(output["results"]), "n_shot": json_safe(output.get("n-shot", {})),
            "versions": json_safe(output.get("versions", {})), "intervals": example_intervals(examples),
            "per_example": examples}


# lm-eval's metrics that aggregate [log-likelihood, count] pairs as a ratio of sums, from -sum(ll) / sum(count)
RATIO_METRICS = {"bits_per_byte": lambda nats: nats / np.log(2), "byte_perplexity": np.exp, "word_perplexity": np.exp}


def example_intervals(examples: dict) -> dict:
    """Per task and metric, the estimate and its 95% bootstrap interval over examples (``text``: which examples
    were scored), for the means of numbers and the ratio metrics of ``RATIO_METRICS``."""
    found = {}
    for task, metrics in examples.items():
        for metric, values in metrics.items():
            values = np.asarray(values, np.float64)
            if metric == "doc_id" or len(values) < 2:
                continue
            if values.ndim == 1:
                interval = bootstrap(ratio_of_sums, [values, np.ones_like(values)])
            elif metric in RATIO_METRICS:
                to_metric = RATIO_METRICS[metric]
                interval = bootstrap(lambda ll, n: to_metric(-ll / n), [values[:, 0], values[:, 1]])  # noqa: B023
            else:
                continue
            found.setdefault(task, {})[metric] = {"estimate": interval.estimate, "ci": interval.bounds(),
                                                  "covers": "text", "resampled": "examples", "n": len(values)}
    return found


def per_example(samples: dict) -> dict:
    """Per task, each metric's value on every example in document order (a number, or for a metric that lm-eval
    aggregates over examples as a ratio, e.g. bits per byte, the example's [log-likelihood, bytes or words]),
    and the documents' ids."""
    kept = {}
    for task, rows in samples.items():
        rows = sorted(rows, key=lambda row: row["doc_id"])
        metrics = metric_keys(rows[0]) if rows else []
        kept[task] = {"doc_id": [row["doc_id"] for row in rows],
                      **{metric: [json_safe(row[metric]) for row in rows] for metric in metrics}}
    return kept


LOGGED = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
          "prompt_hash", "target_hash"}  # what lm-eval logs of an example besides its metrics


def metric_keys(row: dict) -> list[str]:
    """The keys of a logged example that hold a metric's value: a number, or a pair of numbers."""
    def numeric(value) -> bool:
        return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)

    return [key for key, value in row.items() if key not in LOGGED and (
        numeric(value) or (isinstance(value, (list, tuple)) and value and all(numeric(v) for v in value)))]


def json_safe(value: Any) -> Any:
    """``value`` with whatever JSON cannot hold (numpy scalars, functions) made plain or named."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def harness_command_line() -> None:
    """lm-eval's own command line, with the ``lmzoo`` model registered in its process:
    ``python -m lmzoo.interop.eval_harness run --model lmzoo --model_args run_dir=<run> --tasks <task> ...``.

    lm-eval finds models by name in its registry, which it fills from a fixed table of its own models; it reads no
    plugin entry points, so its ``lm_eval`` command cannot know ``lmzoo`` unless this module is imported first."""
    from lm_eval.__main__ import cli_evaluate

    from lmzoo.cli import errors_in_one_line

    with errors_in_one_line():  # the adapter's faults (a missing run_dir, no intact checkpoint): one line
        cli_evaluate()


if __name__ == "__main__":
    from lmzoo.cli import run_command

    run_command(harness_command_line, "lm-eval was stopped; it writes its results only at the end")
