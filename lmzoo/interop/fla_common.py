"""What flash-linear-attention's model classes share with lmzoo's decoder: the blocks' settings, refusals and tensors.

fla's language models (GLA, Gated DeltaNet, DeltaNet, RetNet ...) are lmzoo's decoder: an embedding,
pre-norm blocks (RMSNorm, the mixer, residual; RMSNorm, SwiGLU, residual), a final RMSNorm and an
output layer tied to the embedding or not. They take one ``norm_eps`` for the blocks' norms and for
the mixer's head norm, where lmzoo's head norm has its own epsilon (``HEAD_NORM_EPS``): a run maps
only where ``model.norm_eps`` equals it. Each model class's module (``fla_<name>``) adds its mixer's
settings and tensors to what is here; ``lmzoo.interop.fla`` picks the module for a run or checkpoint.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from lmzoo.cli import shown
from lmzoo.config import Config, ConfigError
from lmzoo.interop.llama import Fused, Tensor, mlp_tensors, outer_tensors, same, transposed
from lmzoo.mixers.family.linear import GatedHeadNorm
from lmzoo.model import ff_size

HEAD_NORM_EPS = inspect.signature(GatedHeadNorm.__init__).parameters["eps"].default  # lmzoo's head-norm epsilon
FLA_NORM_EPS = 1e-6  # the default norm_eps of fla's configs: a checkpoint at it does not map (see HEAD_NORM_EPS)
# fla config keys whose other values compute something no lmzoo block does, at fla's default (which maps).
BLOCK_DEFAULTS = {"hidden_act": "swish", "attn": None, "attnres_block_size": None}


# ----------------------------------------------------------------------------- settings


def refusals(cfg: Config, spec_type: type, fixed: dict | None = None, *, mlp: bool = True,
             head_norm: bool = True) -> list[str]:
    """The settings of ``cfg`` an fla model class cannot express, as ``key=value``: a layer whose mixer spec is not
    ``spec_type``, an ``attn.<key>`` other than its ``fixed`` value, ``model.mlp`` other than ``mlp``, and (where
    the mixer has lmzoo's gated head norm) ``model.norm_eps`` other than its epsilon."""
    found = []
    n = cfg.model.n_layers
    for spec in (cfg.attn.for_layer(layer, n) for layer in range(n)):
        if type(spec) is not spec_type:
            found.append(f"attn.mixer={spec.mixer}")
            continue
        found += [f"attn.{key}={shown(getattr(spec, key))}" for key, value in (fixed or {}).items()
                  if getattr(spec, key) != value]
    if head_norm and cfg.model.norm_eps != HEAD_NORM_EPS:
        found.append(f"model.norm_eps={shown(cfg.model.norm_eps)}")
    if cfg.model.mlp != mlp:
        found.append(f"model.mlp={shown(cfg.model.mlp)}")
    return list(dict.fromkeys(found))


def refuse_run(found: list[str], architecture: str, maps: str) -> None:
    """ConfigError naming every setting in ``found`` (none: return), and what ``architecture`` maps."""
    if found:
        raise ConfigError(f"this run has no flash-linear-attention {architecture} equivalent: {', '.join(found)} "
                          f"(fla's {architecture} maps {maps})")


def block_config(cfg: Config, architecture: str, model_type: str, vocab_size: int, *, bos_id: int, eos_id: int,
                 pad_id: int) -> dict:
    """The ``config.json`` keys every fla model class takes alike, for ``cfg``'s decoder."""
    m = cfg.model
    mlp = ({"intermediate_size": m.d_ff or ff_size(m.d_model), "hidden_act": "swish", "fuse_swiglu": True}
           if m.mlp else {})
    return {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": vocab_size, "hidden_size": m.d_model, "num_hidden_layers": m.n_layers, **mlp,
        "norm_eps": m.norm_eps, "max_position_embeddings": cfg.data.seq_len, "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": m.init_std, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "fuse_norm": True, "fuse_cross_entropy": True, "torch_dtype": "float32", "use_cache": True,
    }


def checkpoint_refusals(hf: dict, required: dict, absent: dict | None = None, *, head_norm: bool = True) -> list[str]:
    """The keys of an fla ``config.json`` no lmzoo model computes, as ``key=value``: each of ``required`` (and the
    blocks') set otherwise (a key not in ``hf`` taking its value in ``absent``, fla's default, else the required
    one), and (``head_norm``) a ``norm_eps`` other than lmzoo's head-norm epsilon."""
    absent = {**BLOCK_DEFAULTS, **required, **(absent or {})}
    found = [f"{key}={shown(hf.get(key, absent[key]))}" for key, value in {**BLOCK_DEFAULTS, **required}.items()
             if hf.get(key, absent[key]) != value]
    norm_eps = hf.get("norm_eps", FLA_NORM_EPS)
    if head_norm and norm_eps != HEAD_NORM_EPS:
        found.append(f"norm_eps={norm_eps:g}")
    return found


def refuse_checkpoint(found: list[str], why: str) -> None:
    if found:
        raise ConfigError(f"this checkpoint has no lmzoo equivalent: {', '.join(found)} ({why})")


def model_settings(hf: dict, *, mlp: bool = True, hidden_ratio: int = 4) -> dict:
    """lmzoo's ``model`` settings for an fla ``config.json``'s blocks (``hidden_ratio``: the class's default)."""
    d = hf["hidden_size"]
    settings = {"d_model": d, "n_layers": hf["num_hidden_layers"], "n_heads": hf["num_heads"],
                "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
                "norm_eps": hf.get("norm_eps", FLA_NORM_EPS), "init_std": hf.get("initializer_range", 0.02)}
    if mlp:  # fla's GatedMLP: intermediate_size, else hidden_ratio * 2/3 * d rounded up to 256
        settings["d_ff"] = (hf.get("intermediate_size")
                            or 256 * -(-int(d * (hf.get("hidden_ratio") or hidden_ratio) * 2 / 3) // 256))
    else:
        settings["mlp"] = False
    return settings


# ----------------------------------------------------------------------------- weights


def block_tensors(n_layers: int, tied: bool,
                  mixer: Callable[[str, tuple], list[Tensor | Fused]]) -> list[Tensor | Fused]:
    """Every tensor of an fla model of ``n_layers`` SwiGLU blocks (no ``lm_head`` when ``tied``), ``mixer(hf, ours)``
    giving a block's mixer tensors from fla's prefix (``model.layers.<i>.attn``) and lmzoo's path."""
    table = outer_tensors("model.embeddings.weight", "model.norm.weight", tied)
    for i in range(n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        table += [Tensor(f"{hf}.attn_norm.weight", (*ours, "mixer_norm", "norm", "scale"), same, same),
                  Tensor(f"{hf}.mlp_norm.weight", (*ours, "mlp_norm", "norm", "scale"), same, same),
                  *mlp_tensors(hf, ours), *mixer(f"{hf}.attn", (*ours, "mixer"))]
    return table


def linear(hf: str, path: tuple) -> Tensor:
    """A bias-free torch Linear's weight and lmzoo's kernel."""
    return Tensor(f"{hf}.weight", (*path, "kernel"), transposed, transposed)


def conv_weight(kernel: np.ndarray) -> np.ndarray:
    """torch's depthwise Conv1d weight [C, 1, K] from lmzoo's [K, C] (both: tap K-1 reads the current token)."""
    return np.ascontiguousarray(kernel.T[:, None, :])


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(weight[:, 0, :].T)


FLA_QK_NORM_EPS = 1e-6  # fla's delta-rule kernels scale q and k by 1 / sqrt(|x|^2 + 1e-6): lmzoo's attn.qk_norm_eps


def delta_tensors(hf: str, mixer: tuple, *, gate: bool = True) -> list[Tensor | Fused]:
    """The delta-rule family's projections, short convs, beta and head norm (``lmzoo.mixers.family.delta``) as fla's
    DeltaNet, Gated DeltaNet and KDA name them (lmzoo's fused ``[q | k | v]`` kernel and conv are fla's three), and
    (``gate``) the one-matrix output gate."""
    table = [Fused(tuple(f"{hf}.{x}_proj.weight" for x in "qkv"), (*mixer, "qkv_proj", "kernel")),
             Fused(tuple(f"{hf}.{x}_conv1d.weight" for x in "qkv"), (*mixer, "conv", "weight"), 1, conv_weight,
                  conv_kernel),
             linear(f"{hf}.b_proj", (*mixer, "beta_proj")), linear(f"{hf}.o_proj", (*mixer, "o_proj")),
             Tensor(f"{hf}.o_norm.weight", (*mixer, "out_gate", "norm", "scale"), same, same)]
    return [*table, linear(f"{hf}.g_proj", (*mixer, "out_gate", "gate"))] if gate else table
