"""``python -m lmzoo.export run_dir=<run> out=<folder> [format=hf|fla step=<n>]``: write a trained run as a
Hugging Face model.

The folder (``lmzoo.interop.hf``) loads with ``transformers.AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``: safetensors weights, a ``config.json`` and the tokenizer. ``format=hf``
writes a Llama (the softmax family, ``lmzoo.interop.llama``); ``format=fla`` writes the
flash-linear-attention model class of the run's mixer (``lmzoo.interop.fla``: GLA, Gated DeltaNet, DeltaNet,
KDA, RetNet, Mamba-2; loading it needs ``import fla``). Any setting the target has no equivalent for is
named in one line. ``--help`` lists the settings.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from lmzoo.cli import Option, errors_in_one_line, exit_codes, key_values, show_help, wants_help
from lmzoo.config import ConfigError
from lmzoo.interop import fla, llama
from lmzoo.interop.hf import export_hf
from lmzoo.record.opening import open_trained

FORMATS = {"hf": lambda cfg: llama, "fla": fla.for_run}  # format= -> the module mapping a run onto its model class
SETTINGS = [Option("run_dir", "<dir>", "the trained run to export (its newest intact checkpoint)"),
            Option("out", "<folder>", "where the model folder goes (new or empty)"),
            Option("format", "hf", "hf: a Hugging Face LlamaForCausalLM folder (safetensors, config.json, tokenizer); "
                                   "fla: flash-linear-attention's model class of the run's mixer "
                                   "(attn=gla, gated_deltanet, deltanet, kda, retnet, mamba2)"),
            Option("step", "null", "the checkpoint step to export; null: the newest intact one")]


def show_usage() -> NoReturn:
    show_help("python -m lmzoo.export run_dir=<dir> out=<folder> [format=hf|fla step=<n>]",
              "Write a trained run as a model folder other libraries load.",
              [("settings", SETTINGS), ("exit codes", exit_codes())])


def parse_args(argv: list[str]) -> dict:
    given = dict(key_values(argv, "export"))
    known = [o.key for o in SETTINGS]
    for key in given:
        if key not in known:
            raise ConfigError(f"unknown setting {key!r} (valid: {', '.join(known)})")
    for key in ("run_dir", "out"):
        if not given.get(key):
            raise ConfigError(f"{key}=<...> is required ({next(o.note for o in SETTINGS if o.key == key)})")
    if given.setdefault("format", "hf") not in FORMATS:
        raise ConfigError(f"format={given['format']!r} is not valid (choose from: {', '.join(FORMATS)})")
    step = given.get("step", "null")
    if step != "null" and not step.isdigit():
        raise ConfigError(f"step={step!r} must be a checkpoint step (a whole number) or null")
    given["step"] = None if step == "null" else int(step)
    return given


def main(argv: list[str] | None = None):
    """The folder written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        args = parse_args(argv)
        trained = open_trained(args["run_dir"], (), args["step"])
        out = export_hf(trained, args["out"], source={"run_dir": str(args["run_dir"])},
                        target=FORMATS[args["format"]](trained.cfg))
    print(f"wrote {out} (step {trained.step}, {trained.cfg.attn.name})")
    return out


if __name__ == "__main__":
    main()
