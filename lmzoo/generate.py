"""``python -m lmzoo.generate run_dir=<dir> prompt="def " [max_new_tokens=256 temperature=0.8 top_k=...
top_p=... seed=0 num_samples=1] [attn.<key>=... pos.<key>=...]``: continue a prompt from a trained run.

Continues a prompt with the newest intact checkpoint of a run (its saved config and tokenizer, and
any evaluation-time overrides of the run's config: ``lmzoo.record.opening``), sampled by
``lmzoo.measure.decoding.generate``. A single sample is streamed to the terminal as it is produced; several
(``num_samples``, decoded together as one batch) are printed one after another once done. A
sample ends at ``max_new_tokens`` or at the tokenizer's end-of-sequence token.

Sampling: ``temperature=0`` is greedy (argmax); otherwise logits / temperature, restricted to the
``top_k`` most likely tokens and then to the smallest set whose probability reaches ``top_p``
(nucleus), are sampled with keys drawn from ``seed``: the same seed gives the same text.
``--help`` lists the settings.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import NoReturn, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lmzoo.cli import (
    RUN_OVERRIDES, errors_in_one_line, exit_codes, parse_settings, run_command, schema_options, show_help, shown_as,
    wants_help,
)
from lmzoo.config import ConfigError
from lmzoo.faults import (
    EXIT_ABORTED, EXIT_CONFIG, EXIT_FINISHED, EXIT_INTERRUPTED, EXIT_RUN_FAULT, EXIT_UNPARSABLE,
)
from lmzoo.measure.decoding import Sampling, check_fits, generate, until_eos
from lmzoo.measure.memory import compiled_bytes, device_memory
from lmzoo.record.checkpoints import split_model
from lmzoo.record.directory import RunDir
from lmzoo.record.opening import check_overrides, open_trained, trained_run


@dataclass
class GenerateSettings(Sampling):
    """The settings of ``python -m lmzoo.generate``: the run, the prompt and how to sample its continuation."""

    run_dir: Optional[str] = shown_as("<dir>")  # the trained run whose model generates

    def check(self) -> None:
        if self.run_dir is None:
            raise ConfigError("run_dir=<dir> is required: the run whose model generates")
        check_text(self.prompt)
        super().check()


def show_usage() -> NoReturn:
    options = {o.key: o for o in schema_options(GenerateSettings)}
    show_help('python -m lmzoo.generate run_dir=<dir> prompt="def " [key=value ...]',
              "Continue a prompt with a trained run's newest intact checkpoint.",
              [("required", [options.pop("run_dir"), options.pop("prompt")]),
               ("sampling settings", list(options.values())),
               ("overrides of the run's config (as in training)", RUN_OVERRIDES),
               ("exit codes", exit_codes(EXIT_FINISHED, EXIT_CONFIG, EXIT_RUN_FAULT, EXIT_UNPARSABLE, EXIT_INTERRUPTED,
                                         EXIT_ABORTED))])


def parse_args(argv: list[str]) -> tuple[RunDir, Sampling, list[str]]:
    """(run_dir, sampling settings, overrides of the run's config) from ``key=value`` arguments; the prompt is
    taken verbatim (spaces kept)."""
    settings, overrides, _ = parse_settings(GenerateSettings, argv, "generate", others=True)
    check_overrides(overrides)
    return trained_run(settings.run_dir), settings, overrides


def check_text(prompt: str) -> None:
    """ConfigError for a prompt that is not UTF-8 text (the shell passes undecodable bytes through as surrogates)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = prompt[e.start:e.end].encode("utf-8", "surrogateescape")
        raise ConfigError(f"prompt is not UTF-8 text (byte {raw[:1].hex()} at character {e.start}); "
                          "give it as UTF-8") from None


PREFILL_MEASURED_FROM = 1024  # prompt tokens from which the prefill's memory is measured (shorter ones fit anywhere)


def check_prefill_fits(model, prompt_len: int, s: Sampling, budget: int) -> None:
    """ConfigError when the prompt's prefill (one forward over it, num_samples times: softmax's scores grow with
    its square) needs more memory than there is, as XLA counts it for the compiled prefill."""
    if prompt_len < PREFILL_MEASURED_FROM:
        return
    graphdef, state = split_model(model)
    max_len = prompt_len + s.max_new_tokens
    prefill = jax.jit(lambda w, tokens: nnx.merge(graphdef, w["params"], w["extra"]).prefill(tokens, max_len))
    need = compiled_bytes(prefill.lower(state, jax.ShapeDtypeStruct((s.num_samples, prompt_len), jnp.int32)).compile())
    if need > budget:
        raise ConfigError(f"prompt: its {prompt_len} tokens need about {need / 2**30:.1f} GiB to read in "
                          f"(num_samples={s.num_samples}), over the {budget / 2**30:.1f} GiB of memory available; "
                          "give a shorter prompt or fewer samples")


ECHOED_CHARACTERS = 2000  # a longer prompt is echoed by its end only


def echoed(prompt: str) -> str:
    """The prompt as printed before its continuation: whole, or a long one's end after a note of its length."""
    if len(prompt) <= ECHOED_CHARACTERS:
        return prompt
    return f"[a prompt of {len(prompt):,} characters; its end:]\n...{prompt[-ECHOED_CHARACTERS // 10:]}"


class Stream:
    """Writes one sample's text as its tokens arrive; a trailing partial character (a byte tokenizer's
    incomplete UTF-8 sequence) waits for the bytes that complete it."""

    def __init__(self, tokenizer, eos_id: Optional[int], out=None):
        self.tokenizer, self.eos_id, self.out = tokenizer, eos_id, out or sys.stdout
        self.tokens, self.written = [], 0

    def __call__(self, tokens: np.ndarray) -> None:
        self.tokens.append(int(tokens[0]))
        text = self.tokenizer.decode(until_eos(np.array(self.tokens), self.eos_id)).rstrip("\ufffd")
        self.out.write(text[self.written:])
        self.out.flush()
        self.written = max(self.written, len(text))

    def finish(self) -> None:
        """Write what was held back, then end the line."""
        self.out.write(self.tokenizer.decode(until_eos(np.array(self.tokens), self.eos_id))[self.written:] + "\n")


def main(argv: list[str] | None = None) -> list[str]:
    """The generated texts (without the prompt), also printed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        run, s, overrides = parse_args(argv)
        trained = open_trained(run, overrides)
        tokenizer, model = trained.data.tokenizer, trained.model
        if not callable(getattr(tokenizer, "encode", None)):  # a synthetic task's symbols
            raise ConfigError(f"run_dir={str(run)!r} trained on task symbols (data.source={trained.cfg.data.source}), "
                              "not text: generate continues a text prompt")
        prompt_ids = tokenizer.encode(s.prompt)
        check_fits(model, len(prompt_ids), s, device_memory())
        check_prefill_fits(model, len(prompt_ids), s, device_memory())
    eos = tokenizer.eos_id
    stream = Stream(tokenizer, eos) if s.num_samples == 1 else None
    if stream:
        sys.stdout.write(echoed(s.prompt))
    tokens = generate(model, prompt_ids, s, eos_id=eos, on_token=stream or (lambda tokens: None))
    texts = [tokenizer.decode(until_eos(row, eos)) for row in tokens]
    if stream:
        stream.finish()
    else:
        for i, text in enumerate(texts):
            print(f"--- sample {i} ---\n{echoed(s.prompt)}{text}")
    return texts


if __name__ == "__main__":
    run_command(main, "the sample stops where it was")
