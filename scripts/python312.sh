#!/usr/bin/env bash
# Prints the path of a Python 3.12 that runs (the GPU image's Python, and jax-linear-attention's), or exits 1 saying
# none is here. A pyenv shim answers `command -v` but fails when the version is not selected: the first that runs wins.
# Used by .ci/run's second leg, scripts/gpu_wheels.sh and scripts/gpu_rehearsal.sh.
for candidate in $(command -v python3.12 || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
  if [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    echo "$candidate"
    exit 0
  fi
done
echo "no Python 3.12 interpreter on this machine" >&2
exit 1
