"""lmzoo's softmax decoder as Hugging Face's Llama and back: settings and weights, one table both ways.

lmzoo's decoder is Llama's: pre-norm blocks (RMSNorm, attention over grouped key/value heads with
RoPE, residual; RMSNorm, SwiGLU, residual), a final RMSNorm, an output layer tied to the embedding
or not, no biases anywhere. Both rotate queries and keys by halves (dims i and i + D/2 form a pair,
Hugging Face's ``rotate_half``), so q and k weights map without a permutation. Flax kernels are
[in, out] and torch weights [out, in]; lmzoo's SwiGLU keeps its gate and up projections in one
kernel, gate first. Position methods map where Llama computes the same angles: ``rope``, ``pi``
(``rope_scaling`` linear) and ``ntk`` (its raised base is Llama's ``rope_theta``). A setting that
changes what a layer computes and that Llama lacks is refused, every one named, in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lmzoo.cli import shown
from lmzoo.config import Config, ConfigError
from lmzoo.mixers.softmax import SoftmaxConfig
from lmzoo.model import ff_size

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
# Softmax-attention knobs that change what a layer computes and that Llama has no setting for.
ATTENTION_KNOBS = ("window", "scale", "logn", "key_norm", "qk_norm", "output_gate", "nope")
POSITIONS = ("rope", "pi", "ntk")  # pos.kind values Llama computes exactly


# ----------------------------------------------------------------------------- settings


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no Llama config can express, as ``key=value`` (empty: it maps exactly)."""
    found = []
    n = cfg.model.n_layers
    for spec in (cfg.attn.for_layer(layer, n) for layer in range(n)):
        if type(spec) is not SoftmaxConfig:
            found.append(f"attn.mixer={spec.mixer}")
            continue
        found += [f"attn.{knob}={shown(getattr(spec, knob))}" for knob in ATTENTION_KNOBS if getattr(spec, knob)]
    if cfg.pos.kind not in POSITIONS:
        found.append(f"pos.kind={cfg.pos.kind}")
    if not cfg.model.mlp:
        found.append("model.mlp=false")
    return list(dict.fromkeys(found))


def check_exportable(cfg: Config) -> None:
    """ConfigError naming every setting with no Llama equivalent."""
    found = refusals(cfg)
    if found:
        raise ConfigError(f"this run has no Llama equivalent: {', '.join(found)} (Llama maps softmax attention "
                          f"with MHA/GQA/MQA heads, a SwiGLU MLP and pos.kind {'|'.join(POSITIONS)})")


def head_dim(cfg: Config) -> int:
    return cfg.model.d_model // cfg.model.n_heads


def rope_settings(cfg: Config) -> dict:
    """``rope_theta`` and ``rope_scaling`` giving Llama the angles of ``cfg.pos`` (see ``Positions.frequencies``)."""
    pos, dim = cfg.pos, head_dim(cfg)
    if pos.kind == "ntk" and pos.factor != 1:
        return {"rope_theta": pos.base * pos.factor ** (dim / (dim - 2)), "rope_scaling": None}
    if pos.kind == "pi" and pos.factor != 1:
        return {"rope_theta": pos.base, "rope_scaling": {"rope_type": "linear", "factor": pos.factor}}
    return {"rope_theta": pos.base, "rope_scaling": None}


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A Hugging Face ``config.json`` of a LlamaForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    m = cfg.model
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": vocab_size, "hidden_size": m.d_model, "intermediate_size": m.d_ff or ff_size(m.d_model),
        "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads,
        "num_key_value_heads": cfg.attn.n_kv_heads or m.n_heads, "head_dim": head_dim(cfg),
        "hidden_act": "silu", "rms_norm_eps": m.norm_eps, **rope_settings(cfg),
        "max_position_embeddings": cfg.data.seq_len, "tie_word_embeddings": m.tie_embeddings,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "initializer_range": m.init_std, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "torch_dtype": "float32", "use_cache": True,
    }


def lmzoo_settings(hf: dict) -> dict:
    """The ``model``, ``attn`` and ``pos`` settings of an lmzoo model computing what the Llama of ``hf`` (a
    ``config.json``) computes; ConfigError naming what lmzoo's decoder has no equivalent for."""
    model_type = hf.get("model_type")
    if model_type != MODEL_TYPE:
        raise ConfigError(f"model_type={model_type!r} cannot be opened (lmzoo maps model_type={MODEL_TYPE!r})")
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    found = [f"{key}={hf[key]}" for key in ("attention_bias", "mlp_bias") if hf.get(key)]
    if hf.get("hidden_act", "silu") != "silu":
        found.append(f"hidden_act={hf['hidden_act']}")
    if hf.get("head_dim") not in (None, d // heads) or d % heads:
        found.append(f"head_dim={hf.get('head_dim')} (lmzoo's heads are hidden_size / num_attention_heads wide)")
    if (hf.get("pretraining_tp") or 1) != 1:
        found.append(f"pretraining_tp={hf['pretraining_tp']}")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "linear"):
        found.append(f"rope_type={rope_type}")
    if found:
        raise ConfigError(f"this checkpoint has no lmzoo equivalent: {', '.join(found)}")
    kv = hf.get("num_key_value_heads") or heads
    pos = ({"kind": "pi", "base": theta, "factor": rope["factor"]} if rope_type == "linear"
           else {"kind": "rope", "base": theta})
    return {
        "model": {"d_model": d, "n_layers": hf["num_hidden_layers"], "n_heads": heads,
                  "d_ff": hf["intermediate_size"], "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
                  "norm_eps": hf.get("rms_norm_eps", 1e-6), "init_std": hf.get("initializer_range", 0.02)},
        "attn": {"name": MODEL_TYPE, "mixer": "softmax", "n_kv_heads": None if kv == heads else kv},
        "pos": pos,
    }


# ----------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class Tensor:
    """One Hugging Face tensor and where it lives in lmzoo's parameters, with the maps between the two."""

    hf: str  # its name in the safetensors file
    path: tuple  # its path in ``nnx.state(model, nnx.Param)``
    out: Callable[[np.ndarray], np.ndarray]  # lmzoo's array -> Hugging Face's
    back: Callable[[np.ndarray], np.ndarray]  # Hugging Face's array -> lmzoo's


def same(a: np.ndarray) -> np.ndarray:
    return a


def transposed(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


@dataclass(frozen=True)
class Fused:
    """Hugging Face tensors that lmzoo holds side by side in one array: ``hf`` names the equal parts in the
    order they lie along ``axis`` of lmzoo's array, each mapped as a ``Tensor``'s is."""

    hf: tuple[str, ...]
    path: tuple
    axis: int = 1  # a kernel's output axis
    out: Callable[[np.ndarray], np.ndarray] = transposed
    back: Callable[[np.ndarray], np.ndarray] = transposed

    def parts(self, value: np.ndarray) -> dict[str, np.ndarray]:
        return {name: self.out(part) for name, part in zip(self.hf, np.split(value, len(self.hf), axis=self.axis))}

    def joined(self, weights: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([self.back(weights[name]) for name in self.hf], axis=self.axis)


def outer_tensors(embedding: str, norm: str, tied: bool) -> list[Tensor | Fused]:
    """The tensors around the blocks, by their names in the format: the embedding, the final norm and (unless
    ``tied``) the ``lm_head``."""
    table = [Tensor(embedding, ("embed", "embedding"), same, same), Tensor(norm, ("norm", "norm", "scale"), same, same)]
    return table if tied else [*table, Tensor("lm_head.weight", ("head", "kernel"), transposed, transposed)]


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    """Every tensor of a Llama with ``n_layers`` blocks (no ``lm_head`` when ``tied``)."""
    table = outer_tensors("model.embed_tokens.weight", "model.norm.weight", tied)
    for i in range(n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        table += [Tensor(f"{hf}.input_layernorm.weight", (*ours, "mixer_norm", "norm", "scale"), same, same),
                  Tensor(f"{hf}.post_attention_layernorm.weight", (*ours, "mlp_norm", "norm", "scale"), same, same),
                  *mlp_tensors(hf, ours)]
        table += [Tensor(f"{hf}.self_attn.{name}.weight", (*ours, "mixer", name, "kernel"), transposed, transposed)
                  for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return table


def mlp_tensors(hf: str, ours: tuple) -> list[Tensor | Fused]:
    """A SwiGLU block's MLP, as Llama (and fla) name it under ``hf``: lmzoo keeps its gate and up projections in
    one kernel, gate first."""
    return [Fused((f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"), (*ours, "mlp", "up", "kernel")),
            Tensor(f"{hf}.mlp.down_proj.weight", (*ours, "mlp", "down", "kernel"), transposed, transposed)]


def to_hf(params: dict[tuple, np.ndarray], n_layers: int, tied: bool, table: list[Tensor | Fused] | None = None
          ) -> dict[str, np.ndarray]:
    """Hugging Face's tensors (float32, by name) from lmzoo's parameters (numpy, by state path); ``table`` is
    another format's tensors (Llama's by default)."""
    table = tensors(n_layers, tied) if table is None else table
    out = {}
    for t in table:
        out.update(t.parts(params[t.path]) if isinstance(t, Fused) else {t.hf: t.out(params[t.path])})
    return {name: np.asarray(a, np.float32) for name, a in out.items()}


def from_hf(weights: dict[str, np.ndarray], n_layers: int, tied: bool, table: list[Tensor | Fused] | None = None
            ) -> dict[tuple, np.ndarray]:
    """lmzoo's parameters (by state path) from Hugging Face's tensors (``table`` as for ``to_hf``); ConfigError
    naming a missing one."""
    table = tensors(n_layers, tied) if table is None else table
    missing = [name for t in table for name in (t.hf if isinstance(t, Fused) else (t.hf,)) if name not in weights]
    if missing:
        raise ConfigError(f"the checkpoint lacks {missing[0]}"
                          + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    weights = {name: np.asarray(a, np.float32) for name, a in weights.items()}
    return {t.path: (t.joined(weights) if isinstance(t, Fused) else t.back(weights[t.hf])).astype(np.float32)
            for t in table}
