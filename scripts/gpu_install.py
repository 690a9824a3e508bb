"""Install lmzoo on a machine with no network, from the wheels carried beside the checkout (scripts/gpu_wheels.sh).

    python scripts/gpu_install.py                       # into this interpreter's environment; --target if that fails
    python scripts/gpu_install.py --mode target         # only the wheels this interpreter lacks, into --target

``env``: ``<this python> -m pip install --no-index --find-links wheels -e ".[kernels]" pytest pytest-timeout
pytest-xdist``: pip installs only what the environment lacks, from ``wheels/`` alone, never from a network (and
never through a bare ``pip`` that may belong to another Python). ``target``: for an environment that cannot be
written, the wheels of the distributions this interpreter does not have go into ``--target`` (``--no-deps``: the
lock already names every one), and the checkout and the target are to be put on ``PYTHONPATH``; the file
``<target>/PYTHONPATH`` says what to put there (scripts/gpu_all.py reads it for its steps). ``auto`` (the default)
tries ``env``, then ``target``. Either way it ends by importing what the GPU steps import and printing versions,
and exits non-zero with one line if anything is missing. Standard library only: it runs before lmzoo is installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = ["pytest", "pytest-timeout", "pytest-xdist"]  # the GPU steps run the kernel tests
TARGET = Path("/tmp/lmzoo-site")  # --mode target's folder; TARGET / "PYTHONPATH" says what to import from
# What the GPU steps import: the trainer and its configs, the data pipeline, the kernel provider, the test runner.
CHECK = ("import importlib.metadata, lmzoo.train, lmzoo.cli, lmzoo.ops.kernels, hydra, omegaconf, grain, tensorboardX, "
         "jla.ops, pytest, xdist, pytest_timeout, jax, flax\n"
         "print('installed: lmzoo', lmzoo.__file__, '| jax', jax.__version__, '| flax', flax.__version__, '| jla', "
         "importlib.metadata.version('jax-linear-attention'), '| devices', jax.devices())")


def run(argv: list[str], env: dict | None = None) -> int:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.call(argv, cwd=REPO, env=env)


def install_into_environment(wheels: Path) -> int:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}  # no index a config file might name
    return run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                "--disable-pip-version-check", "-e", ".[kernels]", *TOOLS], env)


def install_into_target(wheels: Path, target: Path) -> int:
    """The wheels whose distributions this interpreter lacks, into ``target``; lmzoo itself from the checkout."""
    lacking = []
    for wheel in sorted(wheels.glob("*.whl")):
        try:
            importlib.metadata.version(wheel.name.split("-")[0])
        except importlib.metadata.PackageNotFoundError:
            lacking.append(str(wheel))
    target.mkdir(parents=True, exist_ok=True)
    code = 0
    if lacking:
        code = run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--upgrade", "--target", str(target), *lacking],
                   {**os.environ, "PIP_CONFIG_FILE": os.devnull})
    (target / "PYTHONPATH").write_text(f"{REPO}{os.pathsep}{target}\n")
    return code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", default=str(REPO / "wheels"), help="the folder scripts/gpu_wheels.sh filled")
    parser.add_argument("--mode", default="auto", choices=["auto", "env", "target"])
    parser.add_argument("--target", default=str(TARGET), help="where --mode target installs")
    args = parser.parse_args()
    wheels, target = Path(args.wheels), Path(args.target)
    if not any(wheels.glob("*.whl")):
        sys.exit(f"gpu_install.py: no wheels in {wheels}: run `bash scripts/gpu_wheels.sh` where there is a network, "
                 "and carry wheels/ with the checkout")
    (target / "PYTHONPATH").unlink(missing_ok=True)  # a target from an earlier install must not shadow this one
    code = 1
    if args.mode in ("auto", "env"):
        code = install_into_environment(wheels)
    if code and args.mode in ("auto", "target"):
        if args.mode == "auto":
            print("gpu_install.py: the environment's install failed; installing into " + str(target), flush=True)
        code = install_into_target(wheels, target)
    if code:
        sys.exit(f"gpu_install.py: pip exited {code} (mode {args.mode}); its output is above")
    env = dict(os.environ)
    if (target / "PYTHONPATH").exists():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [(target / "PYTHONPATH").read_text().strip(),
                                                           env.get("PYTHONPATH")]))
    if run([sys.executable, "-c", CHECK], env):
        sys.exit("gpu_install.py: installed, but the GPU steps' imports fail (above)")


if __name__ == "__main__":
    main()
