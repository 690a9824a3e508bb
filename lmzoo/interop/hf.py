"""Hugging Face model folders: a trained run written as one (``export_hf``) and one opened as an lmzoo model
(``open_hf``).

A folder holds ``config.json`` (a LlamaForCausalLM's settings, ``lmzoo.interop.llama``, or
one of flash-linear-attention's model classes', ``lmzoo.interop.fla``),
``model.safetensors`` (float32 weights) and the tokenizer (``tokenizer.json`` with its
``tokenizer_config.json``), so that ``transformers.AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` load it. Writing needs ``safetensors`` and ``tokenizers``,
not torch. A byte-tokenizer run gets a byte-level ``tokenizer.json`` that gives every byte its own
id as lmzoo does (ids 0-255 the bytes, then ``<bos>``, ``<eos>``, ``<pad>``); a run with a BPE (or
any ``tokenizer.json``) ships that file. ``lmzoo.json`` records the run and step it came from.

``open_hf(folder)`` reads such a folder, or any local Llama checkpoint (sharded safetensors
included; bfloat16 weights are widened to float32), into the ``Trained`` that evaluation,
generation and the lm-eval adapter take: the model's settings come from ``config.json``, the data
from lmzoo's default corpus tokenised with the folder's tokenizer, and ``overrides`` change either
as on any trained run (``data=text_files``, ``data.seq_len=512``, ``pos.kind=...``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from omegaconf import OmegaConf
from omegaconf import errors as oc_errors

from lmzoo.config import ConfigError, explain, validate
from lmzoo.data import build_data
from lmzoo.data.tokenizers import ByteTokenizer
from lmzoo.interop import fla, llama
from lmzoo.model import LM
from lmzoo.record.directory import FILE_MODE
from lmzoo.record.opening import Trained, first_line_of, group_option, is_group_choice

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
PROVENANCE = "lmzoo.json"
BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>")  # ByteTokenizer's ids 256, 257, 258, in that order
DEFAULT_DATA = "stdlib"  # the corpus an opened checkpoint is measured on unless data=<option> says otherwise


# ----------------------------------------------------------------------------- export


def parameters(model: nnx.Module) -> dict[tuple, np.ndarray]:
    """The model's parameters as host arrays, by their path in ``nnx.state``."""
    return {path: np.asarray(variable.get_value()) for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def export_hf(trained: Trained, out: Path | str, *, source: dict | None = None, target=llama) -> Path:
    """Write ``trained`` as a Hugging Face folder at ``out`` (which must not hold files yet) of ``target``'s
    model class (a module with ``hf_config`` and ``tensors``, its weight table: ``llama``, or one of
    ``lmzoo.interop.fla.CLASSES``).

    ConfigError naming every setting of the run that the target has no equivalent for. The folder appears
    whole: it is written beside ``out`` under a temporary name and then renamed."""
    cfg, tokenizer = trained.cfg, trained.data.tokenizer
    if trained.model.readout is not None:
        raise ConfigError(f"this run reads every position from the last one's state (data.source={cfg.data.source}, "
                          f"readout {cfg.data.readout()}): a Hugging Face causal LM has no such head to export to")
    vocab = trained.model.embed.num_embeddings
    config = target.hf_config(cfg, vocab, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"out={str(out)!r} already holds files: name a new folder")
    n_layers, tied = cfg.model.n_layers, cfg.model.tie_embeddings
    weights = llama.to_hf(parameters(trained.model), n_layers, tied, target.tensors(n_layers, tied))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        save_weights(weights, staging / WEIGHTS)
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        write_tokenizer(tokenizer, staging, max_length=cfg.data.seq_len)
        (staging / PROVENANCE).write_text(json.dumps({"step": trained.step, "variant": cfg.attn.name, **(source or {})},
                                                     indent=2) + "\n")
        for path in staging.iterdir():
            os.chmod(path, FILE_MODE)
        os.chmod(staging, FILE_MODE | 0o111 & ~umask())  # mkdtemp makes it private; the files it holds are not
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_weights(weights: dict[str, np.ndarray], path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(weights, str(path), metadata={"format": "pt"})  # transformers reads only files marked as torch's


def byte_to_unicode() -> dict[int, str]:
    """The printable character byte-level tokenizers spell each byte with (GPT-2's table): printable
    ASCII and Latin-1 bytes stand for themselves, the rest for characters from U+0100 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def byte_tokenizer_json(path: Path) -> None:
    """A ``tokenizer.json`` that tokenises as ``ByteTokenizer``: one id per UTF-8 byte, the byte's value."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(BYTE_SPECIALS))
    tokenizer.save(str(path))


def write_tokenizer(tokenizer: Any, folder: Path, *, max_length: int) -> None:
    """``tokenizer.json`` (built for a byte tokenizer, copied otherwise) and the ``tokenizer_config.json``
    that names its special tokens for transformers."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, ByteTokenizer):
        byte_tokenizer_json(folder / TOKENIZER)
    else:
        shutil.copyfile(tokenizer.path, folder / TOKENIZER)
    spelled = Tokenizer.from_file(str(folder / TOKENIZER)).id_to_token
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "bos_token": spelled(tokenizer.bos_id), "eos_token": spelled(tokenizer.eos_id),
              "pad_token": spelled(tokenizer.pad_id), "clean_up_tokenization_spaces": False}
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


# ----------------------------------------------------------------------------- import


def read_hf_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise ConfigError(f"hf={str(folder)!r} holds no {CONFIG}: name a local Hugging Face model folder")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path} is not JSON ({first_line_of(e)})") from None


def source_of(hf: dict):
    """The module mapping a ``config.json``'s model class onto lmzoo: fla's by its ``model_type``, else Llama."""
    return fla.for_checkpoint(hf) or llama


def hf_settings(folder: Path, hf: dict, overrides: list[str]):
    """The lmzoo Config of the checkpoint in ``folder``: its model, the default corpus read with its
    tokenizer at its context length, then ``overrides`` (``group=option`` first, then single keys)."""
    tokenizer = folder / TOKENIZER
    if not tokenizer.is_file():
        raise ConfigError(f"hf={str(folder)!r} holds no {TOKENIZER} (lmzoo reads a fast tokenizer's file)")
    settings = source_of(hf).lmzoo_settings(hf)
    data = OmegaConf.to_container(group_option("data", DEFAULT_DATA))
    raw = OmegaConf.create({"run_dir": str(folder), "seed": 0, **settings, "data": data})
    for choice in [o for o in overrides if is_group_choice(o)]:
        group, option = choice.lstrip("+").split("=", 1)
        raw[group] = group_option(group, option)
    singles = [o for o in overrides if not is_group_choice(o)]
    raw.data.tokenizer = str(tokenizer)
    if hf.get("max_position_embeddings"):  # some classes (fla's Mamba-2) have none: the corpus's default
        raw.data.seq_len = hf["max_position_embeddings"]
    try:
        raw = OmegaConf.merge(raw, OmegaConf.from_dotlist(singles))
    except oc_errors.OmegaConfBaseException as e:
        raise ConfigError(explain(e) if getattr(e, "full_key", None) else first_line_of(e)) from None
    return validate(raw)


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors file(s) as float32 host arrays, by name."""
    from safetensors import safe_open

    index = folder / WEIGHTS_INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [WEIGHTS]
    weights = {}
    for name in files:
        if not (folder / name).is_file():
            raise ConfigError(f"hf={str(folder)!r} lacks {name} (lmzoo reads safetensors weights)")
        with safe_open(str(folder / name), framework="flax") as f:  # jax reads bfloat16, numpy cannot
            weights.update({key: np.asarray(f.get_tensor(key), np.float32) for key in f.keys()})  # noqa: SIM118 (not iterable)
    return weights


def load_parameters(model: nnx.Module, params: dict[tuple, np.ndarray]) -> None:
    """Set every parameter of ``model`` from ``params`` (by state path); ConfigError on a shape that differs."""
    flat = []
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = params[path]
        if value.shape != variable.get_value().shape:
            raise ConfigError(f"{'.'.join(map(str, path))} has shape {value.shape} in the checkpoint, "
                              f"{variable.get_value().shape} in the model its config.json describes")
        flat.append((path, variable.replace(value)))
    nnx.update(model, nnx.from_flat_state(flat))


def open_hf(folder: Path | str, overrides=()) -> Trained:
    """A local Hugging Face Llama folder as an lmzoo ``Trained`` (step 0): settings, data and model."""
    folder = Path(folder)
    hf = read_hf_config(folder)
    cfg = hf_settings(folder, hf, list(overrides))
    try:
        data = build_data(cfg.data, seed=cfg.seed)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    model = LM(cfg, hf["vocab_size"], rngs=nnx.Rngs(0))
    n_layers, tied = cfg.model.n_layers, cfg.model.tie_embeddings
    load_parameters(model, llama.from_hf(read_weights(folder), n_layers, tied, source_of(hf).tensors(n_layers, tied)))
    return Trained(cfg, data, model, 0)
