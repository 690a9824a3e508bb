#!/usr/bin/env bash
# Train several variants briefly at a short length, evaluate them at 1x-8x that length, compare.
#   bash scripts/cpu_recipe.sh                       # the defaults below
#   VARIANTS=softmax,gla STEPS=200 SEEDS=0 bash scripts/cpu_recipe.sh
# Every variant trains once per seed; compare groups the seeds into one arm (the mean over seeds, with an
# interval counting seeds and text) and, with BASELINE set, gives each arm's difference to the baseline's.
# Three seeds per arm at least: with one, training noise cannot be estimated. Results land in $OUT.
set -euo pipefail
VARIANTS=${VARIANTS:-softmax,swa,gla,retnet,mamba}
STEPS=${STEPS:-300}
SEEDS=${SEEDS:-0,1,2}
BASELINE=${BASELINE:-softmax}
SEQ_LEN=${SEQ_LEN:-128}
OUT=${OUT:-runs/recipe}

python -m lmzoo.train -m "+attn=${VARIANTS}" "data.seq_len=${SEQ_LEN}" "train.steps=${STEPS}" "seed=${SEEDS}" \
  train.eval_every=100 train.progress=false "hydra.sweep.dir=${OUT}"
for run in "${OUT}"/*/; do
  python -m lmzoo.eval "run_dir=${run}" \
    "eval.lengths=[${SEQ_LEN},$((2 * SEQ_LEN)),$((4 * SEQ_LEN)),$((8 * SEQ_LEN))]" eval.progress=false
done
python -m lmzoo.compare "${OUT}" ${BASELINE:+--baseline "${BASELINE}"}
