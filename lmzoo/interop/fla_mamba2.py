"""lmzoo's Mamba-2 decoder without MLPs as flash-linear-attention's ``Mamba2ForCausalLM``: settings and weights,
both ways.

fla's Mamba-2 blocks are RMSNorm, the mixer, residual, with no MLP: only a run with ``model.mlp=false``
maps. The mixer matches term by term (``lmzoo.mixers.family.ssm.SSDMixer``, fla's ``Mamba2`` layer):
one input projection to ``(z, xBC, dt)`` in that order, a depthwise causal conv with bias over
``xBC`` (``conv_kernel``) then SiLU, ``dt = softplus(dt + dt_bias)`` (fla's ``dt_limit`` at its
default, no clamp), ``A = -exp(A_log)`` per head, ``D`` per head (``D_has_hdim: false``), heads of
``head_dim`` sharing one B and C (``n_groups = 1``: see ``ONE_GROUP``), then ``out_proj(rmsnorm(y * silu(z)))``
normalised per group (``norm_before_gate: false``). fla takes one ``norm_eps`` for the blocks' norms and that
gated norm, whose epsilon in lmzoo is fixed (``GATED_NORM_EPS``): a run maps where ``model.norm_eps``
equals it, as fla's own default does.
"""

from __future__ import annotations

import math

from lmzoo.cli import shown
from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import conv_kernel, conv_weight, linear
from lmzoo.interop.llama import Fused, Tensor, outer_tensors, same
from lmzoo.mixers.mamba2 import Mamba2Config

MODEL_TYPE = "mamba2"
ARCHITECTURE = "Mamba2ForCausalLM"
MIXER = Mamba2Config
GATED_NORM_EPS = 1e-5  # the epsilon of SSDMixer.gated_norm
# fla Mamba2Config keys whose other values compute something lmzoo's Mamba-2 does not.
FLA_DEFAULTS = {"use_bias": False, "use_conv_bias": True, "D_has_hdim": False, "hidden_act": "silu", "rmsnorm": True,
                "norm_before_gate": False, "dt_limit": [0.0, math.inf]}
# Heads share B and C in groups: lmzoo, fla's decode step and mamba-ssm's kernels give head h group h // (H / G),
# but fla 0.6.0's torch prefill (its path without mamba-ssm) tiles them (h % G): only one group means one model.
ONE_GROUP = {"n_groups": 1}
FLOAT_TAG = "__float__"  # transformers writes an infinite float in config.json as {"__float__": "Infinity"}


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla Mamba2Config can express, as ``key=value``."""
    found = fla_common.refusals(cfg, Mamba2Config, ONE_GROUP, mlp=False, head_norm=False)
    if cfg.model.norm_eps != GATED_NORM_EPS:
        found.append(f"model.norm_eps={shown(cfg.model.norm_eps)}")
    return found


def check_exportable(cfg: Config) -> None:
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE, f"attn=mamba2 with model.mlp=false (its blocks have no MLP), "
                          f"attn.n_groups=1 (fla's two forward paths group heads differently) and "
                          f"model.norm_eps={GATED_NORM_EPS:g}, the epsilon of lmzoo's gated norm")


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla Mamba2ForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    a, d = cfg.attn, cfg.model.d_model
    head_dim = a.head_dim or a.expand * d // cfg.model.n_heads
    config = fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                     pad_id=pad_id)
    config.pop("fuse_norm")  # Mamba-2's norms are fla's RMSNorm either way
    return {**config, "head_dim": head_dim, "num_heads": a.expand * d // head_dim, "state_size": a.d_state,
            "expand": a.expand, "n_groups": a.n_groups, "conv_kernel": a.d_conv, **FLA_DEFAULTS,
            "dt_limit": [0.0, {FLOAT_TAG: "Infinity"}], "residual_in_fp32": True}


def number(value) -> float:
    """A float of a ``config.json``, transformers' tagged infinities included."""
    return float(value[FLOAT_TAG]) if isinstance(value, dict) else float(value)


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla Mamba-2 of ``hf`` computes;
    ConfigError naming what lmzoo's Mamba-2 has no equivalent for."""
    checked = {**hf, "dt_limit": [number(x) for x in hf.get("dt_limit", FLA_DEFAULTS["dt_limit"])]}
    found = fla_common.checkpoint_refusals(checked, {**FLA_DEFAULTS, **ONE_GROUP}, {"hidden_act": "silu"},
                                           head_norm=False)
    norm_eps = hf.get("norm_eps", GATED_NORM_EPS)
    if norm_eps != GATED_NORM_EPS:
        found.append(f"norm_eps={norm_eps:g}")
    fla_common.refuse_checkpoint(found, f"lmzoo's Mamba-2 has a gated norm with eps {GATED_NORM_EPS:g}, fla uses "
                                        f"norm_eps for it")
    d, expand, head_dim = hf["hidden_size"], hf.get("expand", 2), hf.get("head_dim", 64)
    heads = expand * d // head_dim
    model = fla_common.model_settings({**hf, "num_heads": math.gcd(heads, d), "norm_eps": norm_eps}, mlp=False)
    return {"model": model,
            "attn": {"name": MODEL_TYPE, "mixer": "mamba2", "d_state": hf.get("state_size", 128), "expand": expand,
                     "head_dim": head_dim, "d_conv": hf.get("conv_kernel", 4)},
            "pos": {"kind": "none"}}


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    """Every tensor of an fla Mamba-2 with ``n_layers`` blocks (no ``lm_head`` when ``tied``)."""
    table = outer_tensors("backbone.embeddings.weight", "backbone.norm_f.weight", tied)
    for i in range(n_layers):
        hf, ours = f"backbone.layers.{i}", ("blocks", i)
        mixer, ours_mixer = f"{hf}.mixer", (*ours, "mixer")
        table += [Tensor(f"{hf}.norm.weight", (*ours, "mixer_norm", "norm", "scale"), same, same),
                  linear(f"{mixer}.in_proj", (*ours_mixer, "in_proj")),
                 linear(f"{mixer}.out_proj", (*ours_mixer, "out_proj")),
                  Tensor(f"{mixer}.conv1d.weight", (*ours_mixer, "conv", "weight"), conv_weight, conv_kernel),
                  Tensor(f"{mixer}.conv1d.bias", (*ours_mixer, "conv", "bias"), same, same),
                  Tensor(f"{mixer}.norm.weight", (*ours_mixer, "norm_weight"), same, same),
                  *(Tensor(f"{mixer}.{name}", (*ours_mixer, name), same, same) for name in ("A_log", "dt_bias", "D"))]
    return table
