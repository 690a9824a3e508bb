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
from dataclasses import dataclass
from typing import NoReturn, Optional

from lmzoo.cli import (
    errors_in_one_line, exit_codes, field_notes, parse_settings, run_command, schema_options, show_help, shown_as,
    wants_help,
)
from lmzoo.config import ConfigError, one_of
from lmzoo.interop import fla, llama
from lmzoo.interop.hf import export_hf
from lmzoo.record.opening import open_trained

FORMATS = {"hf": lambda cfg: llama, "fla": fla.for_run}  # format= -> the module mapping a run onto its model class


@dataclass
class ExportSettings:
    """The settings of ``python -m lmzoo.export``."""

    run_dir: Optional[str] = shown_as("<dir>")  # the trained run to export (its newest intact checkpoint)
    out: Optional[str] = shown_as("<folder>")  # where the model folder goes (new or empty)
    format: str = "hf"  # hf: a Hugging Face LlamaForCausalLM folder (safetensors, config.json, tokenizer);
                        # fla: flash-linear-attention's model class of the run's mixer (attn=gla, gated_deltanet,
                        # deltanet, kda, retnet, mamba2)
    step: Optional[int] = None  # the checkpoint step to export; null: the newest intact one

    def check(self) -> None:
        for key in ("run_dir", "out"):
            if not getattr(self, key):
                raise ConfigError(f"{key}=<...> is required ({field_notes(ExportSettings)[key]})")
        one_of("format", self.format, tuple(FORMATS))


def show_usage() -> NoReturn:
    show_help("python -m lmzoo.export run_dir=<dir> out=<folder> [format=hf|fla step=<n>]",
              "Write a trained run as a model folder other libraries load.",
              [("settings", schema_options(ExportSettings)), ("exit codes", exit_codes())])


def parse_args(argv: list[str]) -> ExportSettings:
    return parse_settings(ExportSettings, argv, "export").settings


def main(argv: list[str] | None = None):
    """The folder written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        show_usage()
    with errors_in_one_line():
        s = parse_args(argv)
        trained = open_trained(s.run_dir, (), s.step)
        out = export_hf(trained, s.out, source={"run_dir": str(s.run_dir)}, target=FORMATS[s.format](trained.cfg))
    print(f"wrote {out} (step {trained.step}, {trained.cfg.attn.name})")
    return out


if __name__ == "__main__":
    run_command(main, "the export was not finished (its folder is written whole: an earlier export is intact)")
