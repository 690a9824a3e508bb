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

from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import HEAD_NORM_EPS, linear
from lmzoo.interop.llama import Fused, Tensor, same
from lmzoo.mixers.gla import GLAConfig

MODEL_TYPE = "gla"
ARCHITECTURE = "GLAForCausalLM"
MIXER = GLAConfig
FIXED_BY_FLA = {"gate_rank": 16, "gate_temperature": 16.0}  # GLAForCausalLM builds its layers with these


# ----------------------------------------------------------------------------- settings


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla GLAConfig can express, as ``key=value`` (empty: it maps exactly)."""
    return fla_common.refusals(cfg, GLAConfig, FIXED_BY_FLA)


def check_exportable(cfg: Config) -> None:
    """ConfigError naming every setting with no equivalent in fla's GLA."""
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE, f"attn=gla with attn.gate_rank=16, attn.gate_temperature=16, a "
                          f"SwiGLU MLP and model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's GLA head norm uses")


# fla GLAConfig keys whose other values compute something lmzoo's GLA does not, at fla's default (which maps).
FLA_DEFAULTS = {"expand_v": 1.0, "num_kv_heads": None, "feature_map": None, "use_short_conv": False,
                "use_output_gate": True, "clamp_min": None, "elementwise_affine": True, "use_gk": True, "use_gv": False}


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla GLAForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    return {**fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id),
            "num_heads": cfg.model.n_heads, "expand_k": cfg.attn.key_ratio, **FLA_DEFAULTS, "attn_mode": "chunk"}


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla GLA of ``hf`` (a
    ``config.json``) computes; ConfigError naming what lmzoo's GLA has no equivalent for."""
    fla_common.refuse_checkpoint(fla_common.checkpoint_refusals(hf, FLA_DEFAULTS),
                                 f"lmzoo's GLA head norm has eps {HEAD_NORM_EPS:g}, fla uses norm_eps for it")
    return {"model": fla_common.model_settings(hf),
            "attn": {"name": MODEL_TYPE, "mixer": "gla", "key_ratio": hf.get("expand_k", 0.5)},
            "pos": {"kind": "none"}}


# ----------------------------------------------------------------------------- weights


def mixer_tensors(hf: str, mixer: tuple) -> list[Tensor | Fused]:
    """fla's GatedLinearAttention under ``hf`` and lmzoo's GLA at ``mixer``."""
    return [*(linear(f"{hf}.{name}", (*mixer, name)) for name in ("q_proj", "k_proj", "v_proj", "o_proj")),
            linear(f"{hf}.g_proj", (*mixer, "out_gate", "gate")),
            linear(f"{hf}.gk_proj.0", (*mixer, "gate_down")), linear(f"{hf}.gk_proj.1", (*mixer, "gate_up")),
            Tensor(f"{hf}.gk_proj.1.bias", (*mixer, "gate_up", "bias"), same, same),
            Tensor(f"{hf}.g_norm_swish_gate.weight", (*mixer, "out_gate", "norm", "scale"), same, same)]


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    """Every tensor of an fla GLA with ``n_layers`` blocks (no ``lm_head`` when ``tied``)."""
    return fla_common.block_tensors(n_layers, tied, mixer_tensors)
