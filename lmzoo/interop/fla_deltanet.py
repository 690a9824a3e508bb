"""lmzoo's DeltaNet decoder as flash-linear-attention's ``DeltaNetForCausalLM``: settings and weights, both ways.

lmzoo's DeltaNet is its Gated DeltaNet without the decay (``lmzoo.interop.fla_gated_deltanet`` gives the
term-by-term match, ``attn.qk_norm_eps=1e-6`` included), and fla's ``DeltaNet`` layer is
its Gated DeltaNet likewise, at ``expand_k = expand_v = 1``, SiLU before the L2 norm of q and k
(``qk_activation: silu``, ``qk_norm: l2``), ``use_beta`` and the output gate on (``use_gate: true``,
off in fla's own default, which lmzoo has no equivalent for).
"""

from __future__ import annotations

from lmzoo.config import Config
from lmzoo.interop import fla_common
from lmzoo.interop.fla_common import FLA_QK_NORM_EPS, HEAD_NORM_EPS, delta_tensors
from lmzoo.interop.llama import Fused, Tensor
from lmzoo.mixers.deltanet import DeltaNetConfig

MODEL_TYPE = "delta_net"
ARCHITECTURE = "DeltaNetForCausalLM"
MIXER = DeltaNetConfig
# fla DeltaNetConfig keys whose other values compute something lmzoo's DeltaNet does not; use_gate is off when absent.
FLA_DEFAULTS = {"expand_k": 1.0, "expand_v": 1.0, "use_gate": True, "use_short_conv": True, "allow_neg_eigval": False,
                "use_beta": True, "qk_norm": "l2", "qk_activation": "silu"}


def refusals(cfg: Config) -> list[str]:
    """The settings of ``cfg`` that no fla DeltaNetConfig can express, as ``key=value``."""
    return fla_common.refusals(cfg, DeltaNetConfig, {"qk_norm_eps": FLA_QK_NORM_EPS})


def check_exportable(cfg: Config) -> None:
    fla_common.refuse_run(refusals(cfg), ARCHITECTURE,
                          f"attn=deltanet with attn.qk_norm_eps=1e-6 (its q/k norm), a SwiGLU MLP and "
                          f"model.norm_eps={HEAD_NORM_EPS:g}, the epsilon lmzoo's head norm uses")


def hf_config(cfg: Config, vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """A ``config.json`` of an fla DeltaNetForCausalLM computing what ``cfg``'s model computes."""
    check_exportable(cfg)
    return {**fla_common.block_config(cfg, ARCHITECTURE, MODEL_TYPE, vocab_size, bos_id=bos_id, eos_id=eos_id,
                                      pad_id=pad_id),
            "num_heads": cfg.model.n_heads, "conv_size": cfg.attn.conv_size, **FLA_DEFAULTS, "attn_mode": "chunk"}


def lmzoo_settings(hf: dict) -> dict:
    """The ``model`` and ``attn`` settings of an lmzoo model computing what the fla DeltaNet of ``hf`` computes;
    ConfigError naming what lmzoo's DeltaNet has no equivalent for."""
    found = fla_common.checkpoint_refusals(hf, FLA_DEFAULTS, {"use_gate": False})
    fla_common.refuse_checkpoint(found, f"lmzoo's DeltaNet has an output gate, SiLU and L2-normalised q and k, and a "
                                        f"head norm with eps {HEAD_NORM_EPS:g}, fla uses norm_eps for it")
    return {"model": fla_common.model_settings(hf),
            "attn": {"name": "deltanet", "mixer": "deltanet", "conv_size": hf.get("conv_size", 4),
                     "qk_norm_eps": FLA_QK_NORM_EPS},
            "pos": {"kind": "none"}}


def mixer_tensors(hf: str, mixer: tuple) -> list[Tensor | Fused]:
    return delta_tensors(hf, mixer)


def tensors(n_layers: int, tied: bool) -> list[Tensor | Fused]:
    return fla_common.block_tensors(n_layers, tied, mixer_tensors)
