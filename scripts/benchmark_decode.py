"""Decoding speed and state memory against context length: the cost of generating after a long prompt.

    python scripts/benchmark_decode.py                                   # tiny and small models, 256 .. 32k
    python scripts/benchmark_decode.py --models tiny --max-length 4096   # a quick CPU run
    python scripts/benchmark_decode.py --variants softmax "gla attn.method=scan" --lengths 256,1024

Each entry of ``--variants`` is a variant name followed by config overrides for it, built like
``lmzoo.train`` builds it (``+attn=<variant> model=<model>``) with random weights. For every context
length T it times ``LM.prefill`` of T random tokens (compiled first, then one timed run), then
``--new-tokens`` compiled greedy ``LM.step`` calls from that state, and reports their median. "state MiB"
is the decoding state of one sequence of T + new tokens as allocated (``LM.init_state``'s arrays, whose
floats ``LM.state_size`` counts): a KV cache grows with T, a recurrent state does not. A case that fails
(out of memory, a method the device lacks) prints one line and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from lmzoo.cli import compose_and_validate
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.measure.decoding import state_bytes
from lmzoo.model import LM
from lmzoo.record.checkpoints import split_model

VOCAB = ByteTokenizer.vocab_size
DEFAULT_VARIANTS = ["softmax", "mla", "gla", "retnet", "mamba", "mamba2", "gated_deltanet"]


def measure(variant: str, overrides: list[str], model: str, length: int, new_tokens: int) -> dict:
    cfg = compose_and_validate([f"+attn={variant}", f"model={model}", "train.progress=false", *overrides])
    lm = LM(cfg, VOCAB, rngs=nnx.Rngs(0))
    graphdef, weights = split_model(lm)
    build = lambda w: nnx.merge(graphdef, w["params"], w["extra"])
    max_len = length + new_tokens

    def prefill(w, tokens):
        logits, state = build(w).prefill(tokens, max_len)
        return jnp.argmax(logits[:, -1], axis=-1), state

    def step(w, token, state):
        logits, state = build(w).step(token, state)
        return jnp.argmax(logits, axis=-1), state

    tokens = jax.random.randint(jax.random.key(0), (1, length), 0, VOCAB)
    prefill = jax.jit(prefill).lower(weights, tokens).compile()
    start = time.perf_counter()
    token, state = jax.block_until_ready(prefill(weights, tokens))
    prefill_s = time.perf_counter() - start
    step = jax.jit(step, donate_argnums=2).lower(weights, token, state).compile()
    token, state = jax.block_until_ready(step(weights, token, state))  # warm up
    times = []
    for _ in range(new_tokens):
        start = time.perf_counter()
        token, state = jax.block_until_ready(step(weights, token, state))
        times.append(time.perf_counter() - start)
    return {"variant": " ".join([variant, *overrides]), "model": model, "T": length, "prefill_ms": 1e3 * prefill_s,
            "ms_per_token": 1e3 * statistics.median(times), "state_mib": state_bytes(lm, 1, max_len) / 2**20,
            "state_floats": lm.state_size(max_len)}


def describe_model(model: str) -> str:
    m = compose_and_validate(["+attn=softmax", f"model={model}"]).model
    return f"model={model}: d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, {m.dtype}"


def plot(rows: list[dict], out: Path) -> None:
    from lmzoo.plots import label_log_axis, plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 4.4))
    models = sorted({row["model"] for row in rows}, key=[r["model"] for r in rows].index)
    variants = list(dict.fromkeys(row["variant"] for row in rows))
    for variant in variants:  # a colour per variant, a line style per model preset
        for model in models:
            mine = [row for row in rows if row["variant"] == variant and row["model"] == model]
            if not mine:
                continue
            style = {"marker": "o", "linestyle": ["-", "--", ":"][models.index(model) % 3],
                     "label": f"{variant} ({model})",
                     "color": plt.cm.tab10(variants.index(variant) % 10)}
            speed.plot([r["T"] for r in mine], [r["ms_per_token"] for r in mine], **style)
            memory.plot([r["T"] for r in mine], [r["state_mib"] for r in mine], **style)
    lengths = sorted({row["T"] for row in rows})
    for ax, ylabel in ((speed, "ms per generated token (median)"), (memory, "decoding state (MiB)")):
        ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel=ylabel)
        label_log_axis(ax, lengths)
        ax.grid(alpha=0.3)
    handles, labels = memory.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0, 0.06 * -(-len(labels) // 6), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help='e.g. softmax "gla attn.method=scan"')
    parser.add_argument("--models", default="tiny,small", help="model presets (configs/model/)")
    parser.add_argument("--lengths", default="256,1024,4096,16384,32768", help="context lengths")
    parser.add_argument("--max-length", type=int, help="skip the lengths above this (a quick run)")
    parser.add_argument("--new-tokens", type=int, default=128, help="decoding steps timed after each prefill")
    parser.add_argument("--out", type=Path, default=Path("docs/decode.png"), help="the plot to write")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    lengths = [n for n in map(int, args.lengths.split(",")) if args.max_length is None or n <= args.max_length]
    models = args.models.split(",")

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; batch 1, "
          f"{args.new_tokens} new tokens after each prompt")
    for model in models:
        print(describe_model(model))
    print(f"{'variant':<28}{'model':>7}{'T':>8}{'prefill ms':>12}{'ms/token':>10}{'state MiB':>11}")
    rows = []
    for model in models:
        for entry in args.variants:
            variant, *overrides = entry.split()
            for length in lengths:
                try:
                    row = measure(variant, overrides, model, length, args.new_tokens)
                except Exception as error:  # out of memory, a method the device lacks: report it and go on
                    print(f"{entry:<28}{model:>7}{length:>8}  failed: {str(error).strip().splitlines()[0][:120]}",
                          flush=True)
                    continue
                rows.append(row)
                print(f"{row['variant']:<28}{model:>7}{length:>8}{row['prefill_ms']:>12.1f}{row['ms_per_token']:>10.2f}"
                      f"{row['state_mib']:>11.2f}", flush=True)
    if rows:
        plot(rows, args.out)
        print(f"wrote {args.out}")
    if args.json:
        meta = {"device": device.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
                "models": models, "new_tokens": args.new_tokens}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
