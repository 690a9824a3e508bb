"""The README's shell blocks run as written, at test size, each block in a fresh folder.

What a block may not do here is said, not guessed: its installs (``pip install``, ``python3 -m venv``: the suite runs
in an installed environment) are left out line by line, and the blocks under ``NOT_RUN`` with the reason. The
rest runs verbatim in bash, with three things prepared:

- ``python -m lmzoo.<command>`` gets the command's test-size settings appended (``TEST_SIZE``: a model 32 wide
  trained 2 steps, evaluated on 512 tokens at 1x and 2x its length), settings the README leaves to their defaults,
  so the commands still read as written;
- ``<date>-<time>`` (the stamp Hydra names a run or sweep folder by) is the newest folder the earlier lines made
  with that prefix, ``<run>`` the newest run folder, and an optional ``[key=value ...]`` is left out;
- ``python`` is this interpreter, and ``lmzoo`` this checkout (``PYTHONPATH``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

README = REPO / "README.md"
NOT_RUN = {
    "On a GPU": "needs a GPU and jax-linear-attention",
    "Tests": "the test suite itself",
}
INSTALLS = ("pip install", "python3 -m venv")
TEST_SIZE = {
    "lmzoo.train": ["model.d_model=32", "model.n_layers=2", "model.n_heads=4", "data.seq_len=32",
                    "train.batch_size=4", "train.steps=2", "train.eval_every=2", "train.checkpoint_every=2",
                    "train.log_every=2", "train.eval_tokens=256", "train.progress=false"],
    "lmzoo.eval": ["eval.lengths=[32,64]", "eval.tokens=512", "eval.batch_tokens=512", "eval.blocks=4",
                   "eval.resamples=20", "eval.probe_batch=1", "eval.probe_max_len=64", "eval.progress=false"],
    "lmzoo.generate": ["max_new_tokens=8"],
}


def shell_blocks(text: str) -> list[tuple[str, str]]:
    """(the heading above it, its text) of every ```bash block, in order."""
    blocks, heading = [], ""
    for part in re.split(r"(^#+ [^\n]*$|^```bash\n.*?^```$)", text, flags=re.M | re.S):
        if part.startswith("#"):
            heading = part.lstrip("#").strip()
        elif part.startswith("```bash"):
            blocks.append((heading, part.removeprefix("```bash\n").removesuffix("```")))
    return blocks


def runnable(block: str) -> str:
    """The block's lines without its installs, placeholders read at run time (``newest``)."""
    lines = [line for line in block.splitlines() if line.strip() and not line.startswith(INSTALLS)]
    script = "\n".join(lines)
    script = re.sub(r"\s*\[key=value \.\.\.\]", "", script)
    script = re.sub(r"([^\s=]*)<date>-<time>", r"$(newest '\1')", script)
    return script.replace("<run>", "$(newest runs/)")


PRELUDE = """set -euo pipefail
newest() { ls -dt "$1"*/ | head -1 | sed 's:/$::'; }
python() {
  if [ "$1" = -m ] && [ -n "${TEST_SIZE[$2]:-}" ]; then "$PYTHON" "$@" ${TEST_SIZE[$2]}; else "$PYTHON" "$@"; fi
}
declare -A TEST_SIZE=(%s)
"""


def prelude() -> str:
    return PRELUDE % " ".join(f"[{command}]='{' '.join(settings)}'" for command, settings in TEST_SIZE.items())


BLOCKS = shell_blocks(README.read_text())


def test_the_readme_has_the_blocks_this_test_knows():
    headings = [heading for heading, _ in BLOCKS]
    assert set(NOT_RUN) <= set(headings), headings
    run = " ".join(block for heading, block in BLOCKS if heading not in NOT_RUN)
    for command in ("lmzoo.train", "lmzoo.train -m", "lmzoo.eval", "lmzoo.compare", "lmzoo.generate"):
        assert f"python -m {command} " in run, command


def test_placeholders_become_the_folders_made_before_them():
    script = runnable("python3 -m venv .venv && pip install -e .\n"
                      "python -m lmzoo.eval run_dir=runs/softmax-<date>-<time>\n"
                      "python -m lmzoo.eval run_dir=<run> [key=value ...]  # note\n")
    assert script == ("python -m lmzoo.eval run_dir=$(newest 'runs/softmax-')\n"
                      "python -m lmzoo.eval run_dir=$(newest runs/)  # note")


RUN = [b for b in BLOCKS if b[0] not in NOT_RUN]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a block trains up to six tiny models, each process compiling its own programs
@pytest.mark.parametrize("heading, block", RUN, ids=[heading for heading, _ in RUN])
def test_a_readme_block_runs_as_written(heading, block, tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", "-c", prelude() + runnable(block)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, f"{heading}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# ----------------------------------------------------------------------------- the kernel table of "Why lmzoo"

KERNEL_TABLE = "| variants | CPU (any device) |"


def kernel_rows() -> list[tuple[dict[str, list[str]], set[str]]]:
    """({each variant of the row: the settings its first cell gives it}, the jla kinds its GPU cell names) per row;
    a setting (``attn.normalize=false``) belongs to the variant named before it."""
    text = README.read_text()
    lines = text[text.index(KERNEL_TABLE):].split("\n\n")[0].splitlines()[2:]
    rows = []
    for line in lines:
        first, _, gpu = [cell.strip() for cell in line.strip("|").split("|")]
        variants: dict[str, list[str]] = {}
        for name in re.findall(r"`([\w.=]+)`", first):
            if "=" in name:
                variants[list(variants)[-1]].append(name)
            else:
                variants[name] = []
        rows.append((variants, set(re.findall(r"jla `(\w+)`", gpu))))
    return rows


def traced_kinds(variant: str, settings: list[str]) -> set[str]:
    """The jla kinds ``variant``'s layers call under ``attn.method=jla`` (traced, not run)."""
    from flax import nnx

    from conftest import tiny_config
    from lmzoo.model import LM

    cfg = tiny_config(variant, "attn.method=jla", "model.n_layers=1", *settings)
    kernels = LM(cfg, 259, rngs=nnx.Rngs(0)).mixer_kernels(1, 32)
    return {op["implementation"].split(":")[1] for layer in kernels for op in layer}


@pytest.mark.slow  # traces a model of each of 15 variants
def test_the_kernel_table_names_what_each_mapped_variant_calls():
    pytest.importorskip("jla")
    mapped = [(variants, kinds) for variants, kinds in kernel_rows() if kinds]
    assert len(mapped) >= 8
    for variants, kinds in mapped:
        for variant, settings in variants.items():
            assert traced_kinds(variant, settings) == kinds, variant


def test_the_variants_the_kernel_table_leaves_to_lmzoo_offer_no_provider(capsys):
    from conftest import tiny_config

    [(rest, kinds)] = [row for row in kernel_rows() if "log_linear_mamba2" in row[0]]
    assert not kinds and len(rest) >= 5
    for variant in rest:
        for method in ("auto", "jla", "cudnn"):
            with pytest.raises(SystemExit):
                tiny_config(variant, f"attn.method={method}")
    capsys.readouterr()


def test_the_kernel_table_names_every_registered_mixer():
    """A new mixer gets its row (or its place among the rest); the softmax family shares one row by its op."""
    from lmzoo.ops import MIXER_OPS
    from lmzoo.registry import MIXERS

    named = {variant for variants, _ in kernel_rows() for variant in variants}
    by_op = {name for name in MIXERS.names() if MIXER_OPS.get(name) == ("attention",)} | {"hybrid"}
    assert set(MIXERS.names()) - by_op - named == set()
