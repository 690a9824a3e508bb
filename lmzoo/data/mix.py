"""Data mixtures (``data=mix``): rows drawn from named components in fixed proportions, one tokenizer for all.

A mix names its components and their weights (``configs/data/mix.yaml``)::

    components:
      text:    {source: stdlib,  weight: 0.95}
      passkey: {source: passkey, weight: 0.05}

A component is a text corpus or a synthetic task (``valid_kinds``), with that source's own settings
beside its ``source`` and ``weight``. A mix has one sequence length, tokenizer, vocabulary size and
document-boundary setting for all (``data.seq_len``, ``data.tokenizer`` ...); a component may not set
them. The text corpora are tokenised with the mix's tokenizer (a BPE learns from the first corpus's
training split, exactly as that corpus alone would train it). A task's symbols are written into the
same vocabulary, each as one character of the text tokenizer (``SYMBOLS``: digits, then letters, then
punctuation; PAD, SEP and NOISE are space, colon and full stop), so passkey's filler is ``abcdef``
repeated and its number ``0-9`` digits, and a task asks for no new embeddings.

Training rows. Component ``c`` with weight ``w_c`` gives ``w_c / sum(w)`` of the rows, by grain's
``MapDataset.mix``: a fixed interleaving of the components in those proportions, so every run of ``n``
rows holds ``n * w_c / sum(w)`` rows of component ``c`` to within a row or two (tighter than drawing
rows at random, whose counts would vary by ``sqrt(n)``). Grain writes the weights as integers, the
smallest one as 100, so the realised shares are the weights to within 1% of the smallest. The ``k``-th
row of a component is the ``k``-th row that component alone would draw with the run's seed: text windows
in the corpus's shuffled order, epoch after epoch; task examples ``0, 1, 2 ...`` of its training split.
The weight is a share of rows, not of scored tokens: a task scores only its answers, so its rows weigh
less in the mean loss than text rows of the same length.

A batch holds ``inputs``, ``targets``, ``weights`` (1 on every text target, the task's scored targets
otherwise), ``component`` (int32 [rows], the index into ``MixData.component_names``) and the same as
``component_onehot`` (float32 [rows, components], whose width tells the jitted step how many there
are); with ``data.document_boundaries=mask`` also ``segment_ids`` (a task row is one document). Batches are global
and each process keeps its block of rows, as ``lmzoo.data.train_iterators.train_iterator`` does; the
iterator's ``get_state()`` / ``set_state()`` resume exactly.

Losses per component. ``component_terms`` (inside the jitted step) gives each component's summed loss
and scored tokens, both divided by the batch's scored tokens, so that micro-batches weighted by their
share of the scored tokens add up to the whole batch's terms; the component's mean loss is their ratio.
``ComponentLosses`` pools the steps of a logging window into ``loss/<name>``.

Validation. ``MixData.validation_windows`` are the first text component's (the first component's
without one), so ``val_loss`` and ``val_bpb`` score the very targets a run on that corpus alone scores;
``component_windows`` gives each component its own validation windows (text: spans spread over its
validation split; tasks: the first validation examples), scored into ``val_loss/<name>`` (and
``val_accuracy/<name>`` for tasks) by ``component_validation``.
"""

from __future__ import annotations

import functools
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import grain
import numpy as np

from lmzoo.data.corpus import DOCUMENT_BOUNDARIES, CorpusConfig, tokenized
from lmzoo.data.base import Batch, DataDefaults, SourceMetrics
from lmzoo.data.text import TextData
from lmzoo.data.token_windows import TokenWindows, document_ids
from lmzoo.data.train_iterators import READ_OPTIONS, rows_per_process
from lmzoo.data.synthetic import TRAIN, TaskConfig, TaskData, TaskExamples, TaskWindows
from lmzoo.data.tokenizers import BPE, Tokenizer, build_tokenizer
from lmzoo.registry import SOURCES
from lmzoo.schema import ConfigError, DataConfig, one_of, positive, to_dataclass

# Task symbol i is written as SYMBOLS[i]; PAD, SEP and NOISE (task_vocab, +1, +2) as SPECIALS.
SPECIALS = " :."
SYMBOLS = string.digits + string.ascii_lowercase + string.ascii_uppercase + "".join(
    c for c in string.punctuation if c not in SPECIALS)
SHARED = ("seq_len", "tokenizer", "vocab_size", "document_boundaries", "allow_changed")  # the mix's, not a component's
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENDLESS = 2**62  # task examples per split: without end


def valid_kinds() -> list[str]:
    """The sources a mix can hold: text corpora and synthetic tasks."""
    return [name for name in SOURCES.names() if issubclass(SOURCES.lookup(name), (CorpusConfig, TaskConfig))]


def is_text(spec: DataConfig) -> bool:
    return isinstance(spec, CorpusConfig)


@dataclass(frozen=True)
class Component:
    """One named component of a mix: its weight and its source's spec (the mix's shared settings filled in)."""

    name: str
    weight: float
    spec: DataConfig


# --- the spec ----------------------------------------------------------------------------------------


@SOURCES.register("mix")
@dataclass
class MixConfig(DataConfig):
    source: str = "mix"
    tokenizer: str = "byte"  # every component's: byte | bpe (learnt from the first text component) | a tokenizer.json
    vocab_size: int = 8192  # tokenizer=bpe: ids in all
    document_boundaries: str = "none"  # none | mask: each document (and each task row) is mixed alone
    components: dict[str, Any] = field(default_factory=dict)  # name: {source: <text corpus or task>, weight: w, ...}

    def check(self) -> None:
        super().check()
        one_of("data.document_boundaries", self.document_boundaries, DOCUMENT_BOUNDARIES)
        components = self.parts()  # each checked: text components check the shared tokenizer settings as their own
        if any(is_text(c.spec) for c in components):
            return
        if self.tokenizer == BPE:
            raise ConfigError("data.tokenizer=bpe learns from a text component and this mix has none "
                              "(use byte or a tokenizer.json path)")
        if self.tokenizer != "byte" and not os.path.isfile(self.tokenizer):
            raise ConfigError(f"data.tokenizer={self.tokenizer!r}: no such file (use 'byte' or a tokenizer.json path)")

    def parts(self) -> list[Component]:
        """The components in order, each checked; ConfigError in one line naming the setting."""
        if not self.components:
            raise ConfigError("data.components is empty: a mix needs at least one component "
                              "(e.g. data.components.text={source: stdlib, weight: 1})")
        return [self.component(name, raw) for name, raw in self.components.items()]

    def component(self, name: str, raw: Any) -> Component:
        key = f"data.components.{name}"
        if not NAME.fullmatch(str(name)):
            raise ConfigError(f"{key}: a component name is letters, digits and underscores, not starting with a digit")
        if not isinstance(raw, dict):
            raise ConfigError(f"{key}={raw!r} must be a mapping with a source and a weight "
                              "(e.g. {source: passkey, weight: 0.05})")
        settings = dict(raw)
        weight = settings.pop("weight", None)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError(f"{key}.weight={weight!r} must be a positive number (the component's share of the rows)")
        positive(f"{key}.weight", weight)
        one_of(f"{key}.source", settings.get("source"), valid_kinds())
        for shared in SHARED:
            if shared in settings:
                raise ConfigError(f"{key}.{shared}: every component of a mix has the mix's; set data.{shared}")
        spec_type = SOURCES.lookup(settings["source"])
        settings["seq_len"] = self.seq_len
        if issubclass(spec_type, CorpusConfig):
            settings.update(tokenizer=self.tokenizer, vocab_size=self.vocab_size,
                            document_boundaries=self.document_boundaries)
        spec = to_dataclass(spec_type, settings, prefix=f"{key}.")
        try:
            spec.check()
        except ConfigError as e:
            raise ConfigError(component_key(str(e), name)) from None
        if isinstance(spec, TaskConfig) and spec.task_vocab > len(SYMBOLS):
            raise ConfigError(f"{key}.task_vocab={spec.task_vocab}: a mix writes each task symbol as one character of "
                              f"the text tokenizer, {len(SYMBOLS)} symbols at most")
        return Component(str(name), float(weight), spec)

    def build(self, *, seed: int, shard_index: int, shard_count: int) -> "MixData":
        components = self.parts()
        texts = {c.name: c.spec.documents() for c in components if is_text(c.spec)}
        tokenizer = self.shared_tokenizer(components, texts)
        parts = []
        for c in components:
            if is_text(c.spec):
                data = tokenized(texts[c.name], tokenizer, seq_len=self.seq_len, seed=seed, shard_index=shard_index,
                                 shard_count=shard_count, document_boundaries=self.document_boundaries)
                parts.append(TextPart(data))
            else:
                parts.append(TaskPart(TaskData(c.spec, seed, shard_index, shard_count), symbol_tokens(tokenizer, c)))
        return MixData(tokenizer, [c.name for c in components], [c.weight for c in components], parts,
                       self.seq_len, shard_index, shard_count, self.document_boundaries)

    def shared_tokenizer(self, components: Sequence[Component], texts: dict) -> Tokenizer:
        """``data.tokenizer``; a BPE learns from the first text component's training split (its documents in
        ``texts``, else read now)."""
        if self.tokenizer != BPE:
            return build_tokenizer(self.tokenizer)
        first_text = next(c for c in components if is_text(c.spec))  # check() refuses a BPE without one
        documents = texts[first_text.name] if first_text.name in texts else first_text.spec.documents()
        return first_text.spec.tokenizer_for(documents)

    def extra_evaluation(self, forward, lengths, out_dir, *, seed: int = 0, batch_size: int = 8) -> Optional[dict]:
        """Each task component's own evaluation (a retrieval grid), its symbols written as the mix writes them
        and the model's greedy choice read back among all tokens; results by component name."""
        components = self.parts()
        tasks = [c for c in components if not is_text(c.spec)]
        offering = [c for c in tasks if type(c.spec).extra_evaluation is not DataConfig.extra_evaluation]
        if not offering:
            return None
        tokenizer = self.shared_tokenizer(components, {})
        results = {}
        for c in offering:
            task_forward = functools.partial(forward_in_symbols, forward, symbol_tokens(tokenizer, c))
            (Path(out_dir) / c.name).mkdir(parents=True, exist_ok=True)  # its plots: two components may share a source
            found = c.spec.extra_evaluation(task_forward, lengths, Path(out_dir) / c.name, seed=seed,
                                            batch_size=batch_size)
            results.update({c.name: value for value in (found or {}).values()})
        return results or None


def component_key(message: str, name: str) -> str:
    """A component's own error message with its settings named where they live in the mix (``data.digits`` ->
    ``data.components.<name>.digits``); the mix's shared settings keep their names."""
    shared = "|".join(SHARED)
    return re.sub(rf"\bdata\.(?!(?:{shared})\b)(?!components\.)", f"data.components.{name}.", message)


def symbol_tokens(tokenizer: Tokenizer, component: Component) -> np.ndarray:
    """int32 [task symbols + 3]: the text token writing each task symbol (then PAD, SEP, NOISE); ValueError in
    one line where the tokenizer has no single token for one of them."""
    characters = SYMBOLS[: component.spec.task_vocab] + SPECIALS
    tokens = []
    for character in characters:
        ids = tokenizer.encode(character)
        if len(ids) != 1:
            raise ValueError(f"data.components.{component.name}: the tokenizer {tokenizer.name} writes the task symbol "
                             f"{character!r} as {len(ids)} tokens; a mix needs one token per symbol")
        tokens.append(int(ids[0]))
    if len(set(tokens)) < len(tokens):
        raise ValueError(f"data.components.{component.name}: the tokenizer {tokenizer.name} gives two task symbols one "
                         "token")
    return np.asarray(tokens, dtype=np.int32)


def forward_in_symbols(forward, tokens: np.ndarray, task_inputs: np.ndarray) -> np.ndarray:
    """Logits over the task's symbols, plus one last column holding the best other token: the inputs written in
    text tokens, so a greedy (argmax) reading is the model's choice among all tokens, and a choice outside the
    task's symbols (the last column) matches no target."""
    logits = np.asarray(forward(tokens[task_inputs]))  # (B, T, V)
    others = np.delete(logits, tokens, axis=-1).max(-1, keepdims=True)
    return np.concatenate([logits[..., tokens], others], axis=-1)  # (B, T, S + 1)


# --- the data ----------------------------------------------------------------------------------------


class TextPart:
    """A corpus in a mix: its windows in the order the corpus alone shuffles them, every target scored."""

    def __init__(self, data: TextData):
        self.data = data
        self.windows = TokenWindows(data.train_tokens, data.seq_len)
        if not len(self.windows):
            raise ValueError(f"a text component's training split holds no window of data.seq_len={data.seq_len}")
        self.fingerprint = data.fingerprint
        self.bytes_per_token = data.bytes_per_token

    def indices(self) -> grain.MapDataset:
        return grain.MapDataset.range(len(self.windows)).shuffle(seed=self.data.seed).repeat()

    def rows(self, indices: np.ndarray) -> Batch:
        batch = self.windows(indices)
        batch["weights"] = np.ones(batch["targets"].shape, np.float32)
        return batch

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int], min_doc_tokens: Optional[int] = None):
        return self.data.validation_windows(lengths, budget, min_doc_tokens)


class TaskPart:
    """A synthetic task in a mix: its training examples in order, written in text tokens."""

    def __init__(self, data: TaskData, tokens: np.ndarray):
        self.data, self.tokens = data, tokens
        self.examples = TaskExamples(data.cfg, data.seed, TRAIN, data.cfg.seq_len + 1, data.tokenizer)
        self.examples(0)  # a task that does not fit the length fails here, in one line, not inside a data thread
        self.fingerprint = {**data.fingerprint, "symbols": [int(t) for t in tokens]}
        self.bytes_per_token = 1.0  # no bytes behind a task's tokens: its "bits per byte" are bits per token

    def indices(self) -> grain.MapDataset:
        return grain.MapDataset.range(ENDLESS)

    def rows(self, indices: np.ndarray) -> Batch:
        order = self.data.training_order  # a fixed training set's epochs, or each index its own example
        examples = self.examples.rows(indices if order is None else order(indices))
        return encoded(examples, self.tokens)  # drawn together, the same as one by one

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int], min_doc_tokens: Optional[int] = None):
        if min_doc_tokens is not None:
            raise ValueError("a minimum document length applies to text; this mix's first component is a task")
        return {n: EncodedWindows(w, self.tokens) for n, w in self.data.validation_windows(lengths, budget).items()}


def encoded(batch: Batch, tokens: np.ndarray) -> Batch:
    """A task batch with its inputs and targets written in text tokens."""
    return {**batch, "inputs": tokens[batch["inputs"]], "targets": tokens[batch["targets"]]}


@dataclass(frozen=True, eq=False)
class EncodedWindows:
    """A task's validation windows (``TaskWindows``) written in text tokens."""

    windows: TaskWindows
    tokens: np.ndarray

    @property
    def length(self) -> int:
        return self.windows.length

    @property
    def units(self) -> int:
        return self.windows.units

    def __len__(self) -> int:
        return len(self.windows)

    def __call__(self, indices: np.ndarray) -> Batch:
        return encoded(self.windows(indices), self.tokens)

    def sampling_keys(self) -> dict:
        return self.windows.sampling_keys()


def tagged(component: int, index) -> tuple[np.int32, np.int64]:
    return np.int32(component), np.int64(index)


@dataclass(frozen=True, eq=False)
class MixData(DataDefaults):
    """The ``Data`` of a mix (``lmzoo.data.base``); ``component_names`` in the order of ``batch["component"]``."""

    tokenizer: Tokenizer
    component_names: tuple[str, ...]
    weights: tuple[float, ...]
    parts: tuple
    seq_len: int
    shard_index: int
    shard_count: int
    document_boundaries: str = "none"
    _windows: dict = field(default_factory=dict, repr=False)  # main validation windows, by request

    has_documents = True  # a minimum document length reaches the main component (a task refuses it)

    def __post_init__(self):
        for name in ("component_names", "weights", "parts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def main(self):
        """The component validation and bits per byte are about: the first text component, else the first."""
        return next((p for p in self.parts if isinstance(p, TextPart)), self.parts[0])

    @property
    def bytes_per_token(self) -> float:
        return self.main.bytes_per_token

    @property
    def eos_id(self) -> Optional[int]:
        return self.tokenizer.eos_id if self.document_boundaries == "mask" else None

    @property
    def fingerprint(self) -> dict:
        components = [{"name": name, "weight": weight, **part.fingerprint}
                      for name, weight, part in zip(self.component_names, self.weights, self.parts)]
        return {"source": "mix", "tokenizer": self.tokenizer.name, "vocab_size": self.tokenizer.vocab_size,
                "components": components}

    def train_iterator(self, batch_size: int) -> grain.DatasetIterator:
        """Endless batches ``{"inputs", "targets", "weights", "component"[, "segment_ids"]}`` of this process's
        ``batch_size // shard_count`` rows."""
        rows = rows_per_process(batch_size, self.shard_count)
        mine = slice(self.shard_index * rows, (self.shard_index + 1) * rows)
        sources = [part.indices().map(functools.partial(tagged, c)) for c, part in enumerate(self.parts)]
        dataset = (
            grain.MapDataset.mix(sources, self.weights)
            .batch(batch_size, drop_remainder=True)  # (component [batch], index in it [batch])
            .map(lambda picked: (picked[0][mine], picked[1][mine]))
            .map(self.gather)
        )
        return iter(dataset.to_iter_dataset(READ_OPTIONS))

    def gather(self, picked: tuple[np.ndarray, np.ndarray]) -> Batch:
        """The rows of (component, index in that component) pairs, each component's gathered at once."""
        components, indices = picked
        batch = None
        for c in np.unique(components):
            chosen = components == c
            rows = self.parts[c].rows(indices[chosen])
            if batch is None:
                batch = {k: np.empty((len(components), *v.shape[1:]), v.dtype) for k, v in rows.items()}
            for k in batch:
                batch[k][chosen] = rows[k]
        batch["component"] = components.astype(np.int32)
        batch["component_onehot"] = np.eye(len(self.parts), dtype=np.float32)[components]  # its static width: the count
        if self.eos_id is not None:
            batch["segment_ids"] = document_ids(batch["inputs"], self.eos_id)  # a task row has no EOS: one document
        return batch

    def validation_windows(self, lengths: Sequence[int], budget: Optional[int], min_doc_tokens: Optional[int] = None):
        """The main component's windows (``main``): for text, those a run on that corpus alone scores."""
        key = (tuple(lengths), budget, min_doc_tokens)
        if key not in self._windows:
            self._windows[key] = self.main.validation_windows(lengths, budget, min_doc_tokens)
        return self._windows[key]

    def source_metrics(self, length: int, budget: int) -> "ComponentMetrics":
        """What the trainer logs of a mix beyond the loss: each component's loss, in training and validation."""
        return ComponentMetrics(self.component_names, component_windows(self, length, budget))

    def component_windows(self, lengths: Sequence[int], budget: Optional[int]) -> dict[str, dict]:
        """Each component's own validation windows of each length, ``budget`` targets (tasks: examples of
        the longest length that ``budget`` tokens hold); the main component's are ``validation_windows``'s."""
        return {name: self.validation_windows(lengths, budget) if part is self.main
                else part.validation_windows(lengths, budget)
                for name, part in zip(self.component_names, self.parts)}


# --- what the trainer asks of a mix ------------------------------------------------------------------


def component_terms(token_loss, batch) -> dict:
    """Inside the jitted step, for a mix's batch: ``component_loss`` and ``component_share`` [components], each
    component's summed loss and its scored targets, both divided by the batch's scored targets.

    Dividing by the batch's scored targets is what lets micro-batches combine them: weighted by their share
    of the scored targets (``lmzoo.run.steps.gradients``), the slices' terms add up to the whole batch's. A
    component's mean loss is ``component_loss / component_share``."""
    import jax.numpy as jnp  # JAX only once a step is traced: importing lmzoo.data stays light

    weights = batch["weights"]  # (B, T)
    owner = batch["component_onehot"]  # (B, components)
    total = jnp.maximum(weights.sum(), 1.0)
    return {"component_loss": (token_loss * weights).sum(-1) @ owner / total,
            "component_share": weights.sum(-1) @ owner / total}


def component_losses(terms: Sequence[dict], names: Sequence[str]) -> dict[str, float]:
    """``loss/<name>`` over the steps' ``component_terms``: the component's mean loss of each step, averaged
    with weights its share of each step's scored targets (a component absent from every step is left out)."""
    if not terms:
        return {}
    loss = np.sum([np.asarray(t["component_loss"], np.float64) for t in terms], axis=0)
    share = np.sum([np.asarray(t["component_share"], np.float64) for t in terms], axis=0)
    return {f"loss/{name}": float(total / s) for name, total, s in zip(names, loss, share) if s > 0}


class ComponentMetrics(SourceMetrics):
    """A mix's ``SourceMetrics``: ``loss/<name>`` over a logging window from the steps' ``component_terms`` (kept
    on the device until ``pop``), ``val_loss/<name>`` on each component's own validation windows."""

    step_terms = staticmethod(component_terms)

    def __init__(self, names: Sequence[str], windows: dict):
        self.names, self.windows = tuple(names), windows
        self.window: list[dict] = []

    def add(self, metrics: dict, steps_per_call: int) -> None:
        terms = {k: metrics[k] for k in ("component_loss", "component_share")}
        # a call of k steps stacks them [k, components]: their sums are what k calls of one step would add
        self.window.append(terms if steps_per_call == 1 else {k: v.sum(0) for k, v in terms.items()})

    def pop(self) -> dict[str, float]:
        import jax

        window, self.window = self.window, []
        return component_losses(jax.device_get(window), self.names)

    def held(self) -> list[dict]:
        import jax

        return [{k: np.asarray(v).tolist() for k, v in terms.items()} for terms in jax.device_get(self.window)]

    def hold(self, held) -> None:
        self.window = [{k: np.asarray(v) for k, v in terms.items()} for terms in held or []]

    def validation(self, score_windows, *, scored: Optional[tuple] = None) -> dict[str, float]:
        return component_validation(score_windows, self.windows, scored=scored)


def component_windows(data: MixData, length: int, budget: int) -> dict:
    """Each component's validation windows at ``length`` (``MixData.component_windows``). ConfigError in one
    line for a budget a component cannot fill."""
    try:
        return {name: windows[length] for name, windows in data.component_windows([length], budget).items()}
    except ValueError as e:
        raise ConfigError(f"train.eval_tokens={budget}: {e}") from None


def component_validation(score_windows, windows: dict, *, scored: Optional[tuple] = None) -> dict[str, float]:
    """``val_loss/<name>`` on each component's own validation windows (and ``val_accuracy/<name>`` where only
    answers are scored). ``score_windows(windows)`` scores windows into their ``LengthScores`` (the trainer's
    scorer: the data need not know the model or the scorer); ``scored`` = (windows, their ``LengthScores``) already
    scored, not scored again."""
    metrics = {}
    for name, own in windows.items():
        if scored is not None and own is scored[0]:
            scores = scored[1]
        else:
            scores = score_windows(own)
        metrics[f"val_loss/{name}"] = scores.mean_loss
        if scores.answers_only:
            metrics[f"val_accuracy/{name}"] = scores.accuracy
    return metrics
