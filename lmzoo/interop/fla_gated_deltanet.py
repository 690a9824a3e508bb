"""lmzoo's Gated DeltaNet decoder as flash-linear-attention's ``GatedDeltaNetForCausalLM``: settings and weights,
both ways.

The mixer matches term by term (``lmzoo.mixers.family.delta``, fla's ``GatedDeltaNet`` layer): q, k
and v ``d_model`` wide in ``model.n_heads`` heads (fla's ``head_dim = d_model / n_heads``,
``expand_v = 1``), lmzoo's one ``[q | k | v]`` projection and short conv (no bias, SiLU after) being
fla's three ``*_proj`` and ``*_conv1d``; unit q and k; ``beta = sigmoid(x W_b)``; the decay
``log g = -exp(A_log) * softplus(x W_a + dt_bias)`` per head (``attn.gate=head``); ``o_t = S_t^T q_t /
sqrt(Dk)``; ``W_o (swish(x W_g) * headnorm(o))`` (fla's ``o_norm``, ``FusedRMSNormGated`` with eps
``norm_eps``: the head-norm condition of ``lmzoo.interop.fla_common``), and unit q and k as fla's kernels
make them, ``x / sqrt(|x|^2 + 1e-6)``: lmzoo's ``attn.qk_norm_eps=1e-6`` (by default lmzoo floors
``|x|^2`` at 1e-12 instead, which a tiny run's small q and k show by up to 1.8e-4 nats; docs/interop.md).
"""

from __future__ import annotations

from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import FLA_QK_NORM_EPS, HEAD_NORM_EPS, delta_tensors, linear
from lmzoo.interop.llama import Fused, Tensor, same
from lmzoo.mixers.gated_deltanet import GatedDeltaNetConfig

MODEL_TYPE = "gated_deltanet"
ARCHITECTURE = "GatedDeltaNetForCausalLM"
MIXER = GatedDeltaNetConfig
FIXED_BY_FLA = {"gate": "head", "qk_norm_eps": FLA_QK_NORM_EPS}  # one decay per head; fla's q/k norm
# fla GatedDeltaNetConfig keys whose other values compute something lmzoo's Gated DeltaNet does not (fla's
# default expand_v is 2).
FLA_DEFAULTS = {"expand_v": 1.0, "num_v_heads": None, "use_gate": True, "use_short_conv": True,
                "allow_neg_eigval": False, "output_gate_activation": "swish"}


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla GatedDeltaNetConfig can express, as ``key=value``."""
    return fla_common.refusals(cfg, GatedDeltaNetConfig, FIXED_BY_FLA)


def check_exportable(cfg: Config) -> None:
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE,
                          f"attn=gated_deltanet with attn.gate=head, attn.qk_norm_eps=1e-6 (its q/k norm), a SwiGLU "
                          f"MLP and model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's head norm uses")


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla GatedDeltaNetForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    m = cfg.model
    return {**fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id),
            "num_heads": m.n_heads, "head_dim": m.d_model // m.n_heads, "conv_size": cfg.attn.conv_size,
            **FLA_DEFAULTS, "attn_mode": "chunk"}


def checkpoint_refusals(hf: dict) -> list[str]:
    """What a Gated DeltaNet ``config.json`` sets that lmzoo lacks (``swish`` and ``silu`` are one activation), a
    head size other than ``hidden_size / num_heads`` included."""
    hf = {**hf, "output_gate_activation": "swish"} if hf.get("output_gate_activation") == "silu" else hf
    hf = {**hf, "num_v_heads": None} if hf.get("num_v_heads") == hf["num_heads"] else hf  # as many: the same model
    found = fla_common.checkpoint_refusals(hf, FLA_DEFAULTS, {"expand_v": 2.0})
    head_dim = hf.get("head_dim", 256)
    if head_dim * hf["num_heads"] != hf["hidden_size"]:
        found.append(f"head_dim={head_dim}")
    return found


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla Gated DeltaNet of ``hf`` computes;
    ConfigError naming what lmzoo's Gated DeltaNet has no equivalent for."""
    fla_common.refuse_checkpoint(checkpoint_refusals(hf),
                                 f"lmzoo's Gated DeltaNet has one value head per key head of hidden_size / num_heads "
                                 f"channels and a head norm with eps {HEAD_NORM_EPS:g}, fla uses norm_eps for it")
    return {"model": fla_common.model_settings(hf),
            "attn": {"name": MODEL_TYPE, "mixer": "gated_deltanet", "gate": "head", "conv_size": hf.get("conv_size", 4),
                     "qk_norm_eps": FLA_QK_NORM_EPS},
            "pos": {"kind": "none"}}


def mixer_tensors(hf: str, mixer: tuple) -> list[Tensor | Fused]:
    """fla's GatedDeltaNet layer under ``hf`` and lmzoo's at ``mixer``: the delta rule's, the gate's projection,
    ``A_log`` and ``dt_bias``."""
    return [*delta_tensors(hf, mixer), linear(f"{hf}.a_proj", (*mixer, "gate_proj")),
            Tensor(f"{hf}.A_log", (*mixer, "A_log"), same, same),
           Tensor(f"{hf}.dt_bias", (*mixer, "dt_bias"), same, same)]


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    return fla_common.block_tensors(n_layers, tied, mixer_tensors)
