#!/usr/bin/env bash
# Train several variants briefly at a short length, evaluate them at 1x-8x that length, compare.
#   bash scripts/cpu_recipe.sh                       # the defaults below
#   VARIANTS=softmax,gla STEPS=200 bash scripts/cpu_recipe.sh
# On a 2-core CPU the defaults take well under an hour; results land in $OUT.
set -euo pipefail
VARIANTS=${VARIANTS:-softmax,swa,gla,retnet,mamba}
STEPS=${STEPS:-300}
SEQ_LEN=${SEQ_LEN:-128}
OUT=${OUT:-runs/recipe}

python -m lmzoo.train -m "+attn=${VARIANTS}" "data.seq_len=${SEQ_LEN}" "train.steps=${STEPS}" \
  train.eval_every=100 train.progress=false "hydra.sweep.dir=${OUT}"
for run in "${OUT}"/*/; do
  python -m lmzoo.eval "run_dir=${run}" \
    "eval.lengths=[${SEQ_LEN},$((2 * SEQ_LEN)),$((4 * SEQ_LEN)),$((8 * SEQ_LEN))]" eval.progress=false
done
python -m lmzoo.compare "${OUT}"
