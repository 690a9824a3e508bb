"""lmzoo's RetNet decoder as flash-linear-attention's ``RetNetForCausalLM``: settings and weights, both ways.

The mixer matches term by term (``lmzoo.mixers.retnet``, fla's ``MultiScaleRetention``): q, k and v
``d_model`` wide in ``model.n_heads`` heads (``expand_k = expand_v = 1``), no short conv; q and k
rotated by RoPE over the whole head, by halves, at base 10000 (fla's ``RotaryEmbedding`` as the layer
builds it: only ``pos.kind=rope`` with ``pos.base=10000`` maps); the fixed decays
``gamma_h = 1 - 2^(-5-h)``; ``o_t = q_t S_t / sqrt(D)``; ``W_o (swish(x W_g) * headnorm(o))`` with one
scale shared by the heads (fla's ``g_norm_swish_gate``, eps ``norm_eps``: the head-norm condition of
``lmzoo.interop.fla_common``).
"""

from __future__ import annotations

from lmzoo.cli import shown
from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import HEAD_NORM_EPS, linear
from lmzoo.interop.llama import Fused, Tensor, same
from lmzoo.mixers.retnet import RetNetConfig

MODEL_TYPE = "retnet"
ARCHITECTURE = "RetNetForCausalLM"
MIXER = RetNetConfig
ROPE_BASE = 10000.0  # the base of the RotaryEmbedding fla's MultiScaleRetention builds
# fla RetNetConfig keys whose other values compute something lmzoo's RetNet does not (fla's default expand_v is 2).
FLA_DEFAULTS = {"expand_k": 1.0, "expand_v": 1.0, "num_kv_heads": None, "feature_map": None, "use_short_conv": False,
                "use_output_gate": True, "elementwise_affine": True, "fuse_norm": True}


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla RetNetConfig can express, as ``key=value``."""
    found = fla_common.refusals(cfg, RetNetConfig)
    if cfg.pos.kind != "rope":
        found.append(f"pos.kind={cfg.pos.kind}")
    elif cfg.pos.base != ROPE_BASE:
        found.append(f"pos.base={shown(cfg.pos.base)}")
    return found


def check_exportable(cfg: Config) -> None:
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE, f"attn=retnet with pos.kind=rope at pos.base=10000, a SwiGLU "
                          f"MLP and model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's head norm uses")


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla RetNetForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    return {**fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id),
            "num_heads": cfg.model.n_heads, **FLA_DEFAULTS, "attn_mode": "chunk"}


def lmzoo_settings(hf: dict) -> dict:
    """The ``model``, ``attn`` and ``pos`` settings of an lmzoo model computing what the fla RetNet of ``hf``
    computes; ConfigError naming what lmzoo's RetNet has no equivalent for."""
    fla_common.refuse_checkpoint(fla_common.checkpoint_refusals(hf, FLA_DEFAULTS, {"expand_v": 2.0}),
                                 f"lmzoo's RetNet has q, k and v hidden_size wide and a head norm with eps "
                                 f"{HEAD_NORM_EPS:g}, fla uses norm_eps for it")
    return {"model": fla_common.model_settings(hf, hidden_ratio=2),
            "attn": {"name": MODEL_TYPE, "mixer": "retnet"}, "pos": {"kind": "rope", "base": ROPE_BASE}}


def mixer_tensors(hf: str, mixer: tuple) -> list[Tensor | Fused]:
    return [*(linear(f"{hf}.{name}", (*mixer, name)) for name in ("q_proj", "k_proj", "v_proj", "o_proj")),
            linear(f"{hf}.g_proj", (*mixer, "out_gate", "gate")),
            Tensor(f"{hf}.g_norm_swish_gate.weight", (*mixer, "out_gate", "norm", "scale"), same, same)]


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    return fla_common.block_tensors(n_layers, tied, mixer_tensors)
