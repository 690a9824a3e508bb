"""lmzoo's Kimi Delta Attention decoder as flash-linear-attention's ``KDAForCausalLM``: settings and weights, both ways.

lmzoo's KDA (``lmzoo.mixers.kda``) is its Gated DeltaNet (``lmzoo.interop.fla_gated_deltanet`` gives the
shared terms, ``attn.qk_norm_eps=1e-6`` included) with a decay per key channel,
``-exp(A_log) * softplus(x W_1 W_2 + dt_bias)`` (fla's ``f_proj``, two linears, ``dt_bias`` per
channel, ``A_log`` per head), and the output ``W_o (sigmoid(x W_up W_down + b) * headnorm(o))``
(fla's ``g_proj``, bias on the second linear, and ``o_norm`` with a sigmoid). fla builds both low
ranks at the head dimension (lmzoo's default ``attn.gate_rank`` and ``attn.out_gate_rank``); grouped
value heads (``attn.value_heads``, fla's ``num_v_heads``) are not mapped.
"""

from __future__ import annotations

from lmzoo.cli import shown
from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import FLA_QK_NORM_EPS, HEAD_NORM_EPS, delta_tensors, linear
from lmzoo.interop.llama import Fused, Tensor, same
from lmzoo.mixers.kda import KDAConfig

MODEL_TYPE = "kda"
ARCHITECTURE = "KDAForCausalLM"
MIXER = KDAConfig
RANKS = ("gate_rank", "out_gate_rank")  # fla builds both at the head dimension
# fla KDAConfig keys whose other values compute something lmzoo's KDA does not.
FLA_DEFAULTS = {"expand_v": 1.0, "num_v_heads": None, "use_short_conv": True, "allow_neg_eigval": False,
                "safe_gate": False, "lower_bound": None}


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla KDAConfig can express, as ``key=value``."""
    found = fla_common.refusals(cfg, KDAConfig, {"qk_norm_eps": FLA_QK_NORM_EPS})
    head_dim = cfg.model.d_model // cfg.model.n_heads
    n = cfg.model.n_layers
    for spec in (cfg.attn.for_layer(layer, n) for layer in range(n)):
        if type(spec) is KDAConfig:
            found += [f"attn.{key}={getattr(spec, key)}" for key in RANKS if getattr(spec, key) not in (None, head_dim)]
            if spec.value_heads not in (None, cfg.model.n_heads):
                found.append(f"attn.value_heads={shown(spec.value_heads)}")
    return list(dict.fromkeys(found))


def check_exportable(cfg: Config) -> None:
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE,
                          f"attn=kda with attn.qk_norm_eps=1e-6 (its q/k norm), attn.gate_rank and attn.out_gate_rank "
                          f"at the head dimension, no grouped value heads, a SwiGLU MLP and "
                          f"model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's head norm uses")


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla KDAForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    m = cfg.model
    return {**fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id),
            "num_heads": m.n_heads, "head_dim": m.d_model // m.n_heads, "conv_size": cfg.attn.conv_size,
            **FLA_DEFAULTS, "attn_mode": "chunk"}


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla KDA of ``hf`` computes;
    ConfigError naming what lmzoo's KDA has no equivalent for."""
    ungrouped = {**hf, "num_v_heads": None} if hf.get("num_v_heads") == hf["num_heads"] else hf  # the same model
    found = fla_common.checkpoint_refusals(ungrouped, FLA_DEFAULTS)
    head_dim = hf.get("head_dim", 128)
    if head_dim * hf["num_heads"] != hf["hidden_size"]:
        found.append(f"head_dim={head_dim}")
    fla_common.refuse_checkpoint(found, f"lmzoo's KDA has one value head per key head of hidden_size / num_heads "
                                        f"channels and a head norm with eps {HEAD_NORM_EPS:g}, fla uses norm_eps for "
                                       "it")
    return {"model": fla_common.model_settings(hf),
            "attn": {"name": MODEL_TYPE, "mixer": "kda", "conv_size": hf.get("conv_size", 4),
                    "qk_norm_eps": FLA_QK_NORM_EPS},
            "pos": {"kind": "none"}}


def mixer_tensors(hf: str, mixer: tuple) -> list[Tensor | Fused]:
    """fla's KDA layer under ``hf`` and lmzoo's at ``mixer``: the delta rule's, the two low-rank gates, ``A_log``
    and ``dt_bias``."""
    gate = (*mixer, "out_gate", "gate", "layers")
    return [*delta_tensors(hf, mixer, gate=False),
            linear(f"{hf}.f_proj.0", (*mixer, "gate_proj", "layers", 0)),
            linear(f"{hf}.f_proj.1", (*mixer, "gate_proj", "layers", 1)),
            linear(f"{hf}.g_proj.0", (*gate, 0)), linear(f"{hf}.g_proj.1", (*gate, 1)),
            Tensor(f"{hf}.g_proj.1.bias", (*gate, 1, "bias"), same, same),
            Tensor(f"{hf}.A_log", (*mixer, "A_log"), same, same),
           Tensor(f"{hf}.dt_bias", (*mixer, "dt_bias"), same, same)]


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    return fla_common.block_tensors(n_layers, tied, mixer_tensors)
