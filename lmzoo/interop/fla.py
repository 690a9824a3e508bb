"""``format=fla``: the flash-linear-attention model class for a run's mixer, and for a checkpoint's ``model_type``.

Each module named here maps one fla model class onto lmzoo (``hf_config`` out, ``lmzoo_settings`` in, and
``tensors``, the weight table ``lmzoo.interop.llama.to_hf``/``from_hf`` read both ways) and refuses, every
setting named in one line, a run or checkpoint it cannot express exactly.
"""

from __future__ import annotations

from types import ModuleType

from lmzoo.config import Config, ConfigError
from lmzoo.interop import fla_deltanet, fla_gated_deltanet, fla_gla, fla_kda, fla_mamba2, fla_retnet

CLASSES = (fla_gla, fla_gated_deltanet, fla_deltanet, fla_retnet, fla_mamba2, fla_kda)  # one module per fla model class


def for_run(cfg: Config) -> ModuleType:
    """The module of the fla model class for ``cfg``'s mixer (that of its first layer an fla class has: the module
    then names any other layer's mixer); ConfigError where no layer's has one."""
    n = cfg.model.n_layers
    specs = [cfg.attn.for_layer(layer, n) for layer in range(n)]
    for spec in specs:
        for module in CLASSES:
            if type(spec) is module.MIXER:
                return module
    mixers = ", ".join(dict.fromkeys(spec.mixer for spec in specs))
    raise ConfigError(f"attn.mixer={mixers} has no flash-linear-attention model class (format=fla maps: "
                      f"{', '.join(module.MIXER.__name__.removesuffix('Config') for module in CLASSES)}; "
                      f"format=hf maps softmax)")


def for_checkpoint(hf: dict) -> ModuleType | None:
    """The module mapping an fla ``config.json`` (by its ``model_type``) onto lmzoo, or None where it is not fla's."""
    return next((module for module in CLASSES if hf.get("model_type") == module.MODEL_TYPE), None)
