"""lmzoo's GLA decoder as flash-linear-attention's ``GLAForCausalLM``: settings and weights, one table both ways.

fla's GLA block is lmzoo's: RMSNorm, the mixer, residual; RMSNorm, SwiGLU (``swish`` gate), residual;
a final RMSNorm and an output layer tied to the embedding or not, no biases but the gate's. The
mixer matches term by term: q and k ``expand_k * d_model`` wide (lmzoo's ``attn.key_ratio``), v
``d_model`` wide (``expand_v = 1``), the log gate ``logsigmoid(x W_1 W_2 + b) / 16`` (fla's
``gate_low_rank_dim`` and ``gate_logit_normalizer``, both fixed at 16 in the layer its model
builds), ``o_t = q_t S_t / sqrt(Dk)``, then ``W_o (swish(x W_g) * headnorm(o))`` with one norm
scale shared by the heads (fla's ``FusedRMSNormGated``). fla takes one ``norm_eps`` for the
blocks' norms and the head norm; lmzoo's head norm has its own, so a run maps only where
``model.norm_eps`` equals it. Flax kernels are [in, out], torch weights [out, in]. The table reads both
ways: ``lmzoo.interop.hf.open_hf`` opens an fla GLA folder whose settings map (``lmzoo_settings``).
"""

from __future__ import annotations

import inspect

import numpy as np

from lmzoo.cli import shown
from lmzoo.config import Config, ConfigError
from lmzoo.interop import llama
from lmzoo.interop.llama import Tensor, same, transposed
from lmzoo.mixers.family.linear import GatedHeadNorm
from lmzoo.mixers.gla import GLAConfig
from lmzoo.model import ff_size

MODEL_TYPE = "gla"
ARCHITECTURE = "GLAForCausalLM"
FIXED_BY_FLA = {"gate_rank": 16, "gate_temperature": 16.0}  # GLAForCausalLM builds its layers with these
HEAD_NORM_EPS = inspect.signature(GatedHeadNorm.__init__).parameters["eps"].default  # lmzoo's head-norm epsilon


# ----------------------------------------------------------------------------- settings


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla GLAConfig can express, as ``key=value`` (empty: it maps exactly)."""
    found = []
    n = cfg.model.n_layers
    for spec in (cfg.attn.for_layer(layer, n) for layer in range(n)):
        if type(spec) is not GLAConfig:
            found.append(f"attn.mixer={spec.mixer}")
            continue
        found += [f"attn.{key}={shown(getattr(spec, key))}" for key, value in FIXED_BY_FLA.items()
                  if getattr(spec, key) != value]
    if cfg.model.norm_eps != HEAD_NORM_EPS:
        found.append(f"model.norm_eps={shown(cfg.model.norm_eps)}")
    if not cfg.model.mlp:
        found.append("model.mlp=false")
    return list(dict.fromkeys(found))


def check_exportable(cfg: Config) -> None:
    """ConfigError naming every setting with no equivalent in fla's GLA."""
    found = refusals(cfg)
    if found:
        raise ConfigError(f"this run has no flash-linear-attention GLA equivalent: {', '.join(found)} (fla's "
                          f"GLAForCausalLM maps attn=gla with attn.gate_rank=16, attn.gate_temperature=16, a SwiGLU "
                          f"MLP and model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's GLA head norm uses)")


# fla GLAConfig keys whose other values compute something lmzoo's GLA does not, at fla's default (which maps).
FLA_DEFAULTS = {"expand_v": 1.0, "num_kv_heads": None, "feature_map": None, "use_short_conv": False,
                "use_output_gate": True, "clamp_min": None, "hidden_act": "swish", "elementwise_affine": True,
                "use_gk": True, "use_gv": False, "attn": None, "attnres_block_size": None}


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla GLAForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    m = cfg.model
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": vocab_size, "hidden_size": m.d_model, "intermediate_size": m.d_ff or ff_size(m.d_model),
        "num_hidden_layers": m.n_layers, "num_heads": m.n_heads, "expand_k": cfg.attn.key_ratio, **FLA_DEFAULTS,
        "norm_eps": m.norm_eps,
        "max_position_embeddings": cfg.data.seq_len, "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": m.init_std, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "attn_mode": "chunk", "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True,
        "torch_dtype": "float32", "use_cache": True,
    }


FLA_NORM_EPS = 1e-6  # GLAConfig's default norm_eps: a checkpoint at it does not map (see HEAD_NORM_EPS)


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla GLA of ``hf`` (a
    ``config.json``) computes; ConfigError naming what lmzoo's GLA has no equivalent for."""
    found = [f"{key}={shown(hf.get(key, value))}" for key, value in FLA_DEFAULTS.items() if hf.get(key, value) != value]
    norm_eps = hf.get("norm_eps", FLA_NORM_EPS)
    if norm_eps != HEAD_NORM_EPS:
        found.append(f"norm_eps={norm_eps:g}")
    if found:
        raise ConfigError(f"this checkpoint has no lmzoo equivalent: {', '.join(found)} (lmzoo's GLA head norm has "
                          f"eps {HEAD_NORM_EPS:g}, fla uses norm_eps for it)")
    d = hf["hidden_size"]
    d_ff = hf.get("intermediate_size") or 256 * -(-int(d * (hf.get("hidden_ratio") or 4) * 2 / 3) // 256)  # GatedMLP's
    return {
        "model": {"d_model": d, "n_layers": hf["num_hidden_layers"], "n_heads": hf["num_heads"],
                  "d_ff": d_ff, "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
                  "norm_eps": norm_eps, "init_std": hf.get("initializer_range", 0.02)},
        "attn": {"name": MODEL_TYPE, "mixer": "gla", "key_ratio": hf.get("expand_k", 0.5)},
        "pos": {"kind": "none"},
    }


# ----------------------------------------------------------------------------- weights

MIXER = (("q_proj", ("q_proj", "kernel")), ("k_proj", ("k_proj", "kernel")), ("v_proj", ("v_proj", "kernel")),
         ("o_proj", ("o_proj", "kernel")), ("g_proj", ("out_gate", "gate", "kernel")),
         ("gk_proj.0", ("gate_down", "kernel")), ("gk_proj.1", ("gate_up", "kernel")))


def tensors(n_layers: int, tied: bool) -> list[Tensor]:
    """Every tensor of an fla GLA with ``n_layers`` blocks (no ``lm_head`` when ``tied``), except the fused MLP
    input (``llama.mlp_input``: fla names it as Llama does)."""
    table = [Tensor("model.embeddings.weight", ("embed", "embedding"), same, same),
             Tensor("model.norm.weight", ("norm", "norm", "scale"), same, same)]
    if not tied:
        table.append(Tensor("lm_head.weight", ("head", "kernel"), transposed, transposed))
    for i in range(n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        mixer = (*ours, "mixer")
        table += [Tensor(f"{hf}.attn_norm.weight", (*ours, "mixer_norm", "norm", "scale"), same, same),
                  Tensor(f"{hf}.mlp_norm.weight", (*ours, "mlp_norm", "norm", "scale"), same, same),
                  Tensor(f"{hf}.mlp.down_proj.weight", (*ours, "mlp", "down", "kernel"), transposed, transposed),
                  Tensor(f"{hf}.attn.gk_proj.1.bias", (*mixer, "gate_up", "bias"), same, same),
                  Tensor(f"{hf}.attn.g_norm_swish_gate.weight", (*mixer, "out_gate", "norm", "scale"), same, same)]
        table += [Tensor(f"{hf}.attn.{name}.weight", (*mixer, *path), transposed, transposed) for name, path in MIXER]
    return table


def to_hf(params: dict[tuple, np.ndarray], n_layers: int, tied: bool) -> dict[str, np.ndarray]:
    """fla's tensors (float32, by name) from lmzoo's parameters (numpy, by state path)."""
    return llama.to_hf(params, n_layers, tied, tensors(n_layers, tied))


def from_hf(weights: dict[str, np.ndarray], n_layers: int, tied: bool) -> dict[tuple, np.ndarray]:
    """lmzoo's parameters (by state path) from fla's tensors; ConfigError naming a missing one."""
    return llama.from_hf(weights, n_layers, tied, tensors(n_layers, tied))
