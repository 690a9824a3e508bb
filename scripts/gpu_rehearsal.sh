#!/usr/bin/env bash
# The GPU calls rehearsed on a CPU, as the GPU machine will meet them: a fresh Python 3.12 venv holding only jax and
# flax (the lock's base pins), the network switched off, lmzoo installed from wheels/ alone by the call's own install
# step, then every call of scripts/gpu_all.py's plan at tiny shapes with the full lists of ops and variants, each
# ending in its archive. Run it before every GPU call (docs/devices.md, "A GPU call"); it passes from a fresh clone.
#
#   bash scripts/gpu_rehearsal.sh                 # every call (about 15 minutes on 2 cores)
#   CALLS="1 2" bash scripts/gpu_rehearsal.sh     # some calls
#   KEEP=/tmp/rehearsal bash scripts/gpu_rehearsal.sh   # keep the venvs, the outputs and the archives there
#
# Only the wheels' download and the venv's jax and flax use the network. Everything after runs in a network namespace
# of its own (`unshare -n`, loopback only) where the machine allows it, else with pip's index switched off.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${CALLS:-"1 2 3 4 5"}
WORK=${KEEP:-$(mktemp -d)}
mkdir -p "$WORK"
say() { echo "== rehearsal: $*"; }
PY312=$(bash scripts/python312.sh)  # the GPU image's Python is 3.12

offline() {  # run "$@" with no network
  if unshare -n true 2>/dev/null; then
    unshare -n -- bash -c 'ip link set lo up 2>/dev/null || true; exec "$@"' offline "$@"
  else
    env PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null "$@"
  fi
}

bare_venv() {  # a fresh venv with only the lock's base (jax, flax and what they bring), from the network
  rm -rf "$1"
  "$PY312" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  # shellcheck disable=SC2046
  "$1/bin/python" -m pip install -q $(sed -n 's/^# base: //p' scripts/gpu_wheels.txt) 2>&1 | grep -v "is ignored" || true
  "$1/bin/python" -c 'import jax, flax' || { echo "gpu_rehearsal.sh: the base venv has no jax/flax" >&2; exit 1; }
}

say "wheels from scripts/gpu_wheels.txt"
bash scripts/gpu_wheels.sh
if unshare -n true 2>/dev/null; then say "offline: unshare -n"; else say "offline: pip with no index"; fi

say "a bare venv (jax + flax) for the install's fallback into a folder of its own"
bare_venv "$WORK/venv-target"
offline "$WORK/venv-target/bin/python" scripts/gpu_install.py --mode target --target "$WORK/site"

say "a bare venv (jax + flax) for the calls"
bare_venv "$WORK/venv"
say "pip resolves lmzoo[kernels] from wheels/ alone"
offline "$WORK/venv/bin/python" -m pip install -q --dry-run --no-index --find-links wheels -e ".[kernels]" \
  pytest pytest-timeout pytest-xdist

failed=""
for call in $CALLS; do
  say "call $call"
  start=$SECONDS
  if offline "$WORK/venv/bin/python" scripts/gpu_all.py --call "$call" --dry-run --out "$WORK/out/call$call" \
       --archive "$WORK/gpu_call$call.tar.gz"; then
    say "call $call passed in $((SECONDS - start)) s"
  else
    say "call $call FAILED in $((SECONDS - start)) s: $WORK/out/call$call/summary.md"
    failed="$failed $call"
  fi
  tar -tzf "$WORK/gpu_call$call.tar.gz" > "$WORK/gpu_call$call.list"  # the one file a call brings back
  grep -q "call$call/summary.md" "$WORK/gpu_call$call.list" || { say "call $call: no summary in its archive"; exit 1; }
done
if [ -n "$failed" ]; then
  say "failed calls:$failed (outputs under $WORK/out)"
  exit 1
fi
say "every call passed (outputs and archives under $WORK)"
