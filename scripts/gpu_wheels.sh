#!/usr/bin/env bash
# The wheels a GPU machine without a network needs to install lmzoo: fills wheels/ (git-ignored) from the lock
# scripts/gpu_wheels.txt, the cp312 manylinux x86_64 wheels that a Python 3.12 environment holding only jax==0.11.2
# and flax lacks for `pip install -e ".[kernels]"`, the GPU steps' tests and the editable build. Carry wheels/ to
# the machine; scripts/gpu_install.py installs from it there with no index (docs/devices.md, "A GPU call").
#
#   bash scripts/gpu_wheels.sh            # download what the lock names (network), build antlr4's wheel here
#   bash scripts/gpu_wheels.sh --lock     # write the lock anew from a fresh jax+flax venv's resolution (network)
#   WHEELS=/elsewhere bash scripts/gpu_wheels.sh
#
# Every wheel is fetched with --no-deps at the pinned version, so wheels/ holds exactly the lock; a wheel left from an
# older lock is removed (two versions of one package stop an offline install).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=scripts/gpu_wheels.txt
WHEELS=${WHEELS:-wheels}
BASE=("jax==0.11.2" "flax==0.12.10")  # what the GPU image's Python already holds (and the rehearsal's venv)
EXTRA=(pytest pytest-timeout pytest-xdist setuptools)  # the tests' runner and the editable install's build backend
SDIST_ONLY=antlr4-python3-runtime  # hydra's parser runtime: PyPI has only its sdist, so its wheel is built here

if [ "${1:-}" = "--lock" ]; then
  py312=$(bash scripts/python312.sh)  # the GPU image's Python is 3.12
  venv=$(mktemp -d)/venv
  "$py312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${BASE[@]}"
  "$venv/bin/python" -m pip install -q --dry-run --report "$venv/report.json" -e ".[kernels]" "${EXTRA[@]}" 2>/dev/null
  "$venv/bin/python" -m pip freeze --exclude-editable > "$venv/base.txt"
  "$venv/bin/python" - "$venv/report.json" "$venv/base.txt" "${BASE[*]}" > "$LOCK" <<'PY'
import json, sys
report, base, asked = json.load(open(sys.argv[1])), open(sys.argv[2]).read().split(), sys.argv[3]
print(f"""# The wheels scripts/gpu_wheels.sh fetches into wheels/: what a Python 3.12 environment holding only {asked}
# (and what they bring: the base below) lacks for `pip install -e ".[kernels]"`, pytest with its timeout and xdist
# plugins, and setuptools for the editable build. Written by `bash scripts/gpu_wheels.sh --lock`; not edited by hand.
# The GPU image (Python 3.12, jax 0.11.2 with CUDA 13, flax, torch) holds most of them already; it lacks hydra-core,
# omegaconf, antlr4-python3-runtime, grain, array-record, portpicker, tensorboardX and jax-linear-attention.
# pip installs only what an environment lacks, so one set serves the image and the rehearsal's bare venv.""")
for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
    if "dir_info" not in item["download_info"]:  # lmzoo itself, installed from the checkout
        print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]}')
print("\n# base: " + " ".join(base))
PY
  echo "wrote $LOCK: $(grep -c '^[a-zA-Z]' "$LOCK") wheels"
  exit 0
fi

mkdir -p "$WHEELS"
pins=$(grep -E '^[A-Za-z]' "$LOCK" | sed 's/ *#.*//')
binary=$(echo "$pins" | grep -v "^$SDIST_ONLY==" || true)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$WHEELS" $binary
antlr=$(echo "$pins" | grep "^$SDIST_ONLY==" || true)
if [ -n "$antlr" ] && ! ls "$WHEELS"/antlr4_python3_runtime-*.whl >/dev/null 2>&1; then
  python3 -m pip wheel -q --no-deps "$antlr" -w "$WHEELS"  # pure Python: one wheel serves every interpreter
fi
# wheels/ holds exactly the lock: drop any other version of a locked package (left by an older lock)
python3 - "$WHEELS" <<'EOF'
import pathlib, re, sys
pins = {}
for line in pathlib.Path("scripts/gpu_wheels.txt").read_text().splitlines():
    if re.match(r"[A-Za-z]", line):
        name, version = line.split("#")[0].strip().split("==")
        pins[re.sub(r"[-_.]+", "_", name).lower()] = version
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    if pins.get(re.sub(r"[-_.]+", "_", name).lower()) != version:
        print(f"removed {wheel.name}: not in the lock")
        wheel.unlink()
missing = set(pins) - {re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() for w in pathlib.Path(sys.argv[1]).glob("*.whl")}
if missing:
    sys.exit(f"gpu_wheels.sh: no wheel for {sorted(missing)}")
EOF
echo "$WHEELS/: $(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
