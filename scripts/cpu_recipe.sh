#!/usr/bin/env bash
# Train several variants briefly at a short length, evaluate them at 1x-8x that length, compare.
#   bash scripts/cpu_recipe.sh                       # the defaults below
#   VARIANTS=softmax,gla STEPS=200 SEEDS=0 bash scripts/cpu_recipe.sh
# Every variant trains once per seed into $OUT/<variant>-s<seed>; compare groups the seeds into one arm (the mean
# over seeds, with an interval counting seeds and text) and, with BASELINE set, gives each arm's difference to the
# baseline's. Three seeds per arm at least: with one, training noise cannot be estimated.
# Rerunning resumes: a run already evaluated is skipped, an unfinished one resumes from its checkpoint.
# KEEP=<dir> copies each evaluated run's record (config, run info, metrics, evaluation results: no checkpoints
# or figures, about 80 kB) to <dir>/<variant>-s<seed>, skips the runs whose record is there, and compares the
# records: a long measurement can be stopped, carried elsewhere as its records, and continued (git ignores any
# folder named runs/, so records to commit go elsewhere, e.g. KEEP=docs/frontier/records).
# EXTRA adds training settings, EVAL_EXTRA evaluation settings (e.g. eval.min_doc_tokens=1024: score inside long
# documents only).
set -euo pipefail
VARIANTS=${VARIANTS:-softmax,swa,gla,retnet,mamba}
STEPS=${STEPS:-300}
SEEDS=${SEEDS:-0,1,2}
BASELINE=${BASELINE:-softmax}
SEQ_LEN=${SEQ_LEN:-128}
OUT=${OUT:-runs/recipe}
KEEP=${KEEP:-}
EXTRA=${EXTRA:-}
EVAL_EXTRA=${EVAL_EXTRA:-}
LENGTHS="[${SEQ_LEN},$((2 * SEQ_LEN)),$((4 * SEQ_LEN)),$((8 * SEQ_LEN))]"
RESULTS=eval/default/results.json

for variant in ${VARIANTS//,/ }; do
  for seed in ${SEEDS//,/ }; do
    name="${variant}-s${seed}"
    if [[ -n "${KEEP}" && -f "${KEEP}/${name}/${RESULTS}" ]]; then continue; fi
    if [[ ! -f "${OUT}/${name}/${RESULTS}" ]]; then
      # shellcheck disable=SC2086  # EXTRA and EVAL_EXTRA are lists of settings
      python -m lmzoo.train "+attn=${variant}" "seed=${seed}" "data.seq_len=${SEQ_LEN}" "train.steps=${STEPS}" \
        train.eval_every=100 train.progress=false "run_dir=${OUT}/${name}" ${EXTRA}
      python -m lmzoo.eval "run_dir=${OUT}/${name}" "eval.lengths=${LENGTHS}" eval.progress=false ${EVAL_EXTRA}
    fi
    if [[ -n "${KEEP}" ]]; then  # the files lmzoo.compare reads, moved in whole: a kill leaves no torn record
      partial="${KEEP}/.${name}.partial"
      rm -rf "${partial}" && mkdir -p "${partial}"
      (cd "${OUT}/${name}" && ls -d ./*.json ./*.jsonl config.yaml eval/*/results.json | tar -cf - -T -) |
        tar -C "${partial}" -xf -
      rm -rf "${KEEP:?}/${name}" && mv "${partial}" "${KEEP}/${name}"
    fi
  done
done
python -m lmzoo.compare "${KEEP:-${OUT}}" ${BASELINE:+--baseline "${BASELINE}"} out="${KEEP:-${OUT}}"  # its own comparison, replaced as arms are added
