#!/bin/sh
# The acceptance campaign: 2,000 GGUF and 2,000 bundle mutations, each split 500 on Qwen2.5-Coder-0.5B
# and 1,500 on SmolLM2-135M (plain / budgeted / sparse generate and inspect, one run per case in turn),
# in rounds of 50 + 150 cases per model kind, each appending its outcome counts to
# benchmarks/results/fuzz-{gguf,bundle}.jsonl (an interrupted campaign keeps what it did).
# Heavy: run it under the shared lock, from the repository root, with the fuzz bundles exported
# (bench-out/fuzz-bundles/<model>-q4_0, see benchmarks/fuzz/README.md):
#   flock /work/notes/heavy.lock sh benchmarks/fuzz/campaign.sh
set -u
PY=.venv/bin/python
B=bench-out/fuzz-bundles
LABEL="${LABEL:-acceptance campaign}"
FUZZ="$PY benchmarks/fuzz/run_fuzz.py --rotate --label"
for round in 0 1 2 3 4 5 6 7 8 9; do
  big=$((round * 50)); small=$((round * 150))
  $FUZZ "$LABEL" --models qwen2.5-coder-0.5b --cases 50 --first-case $big
  $FUZZ "$LABEL" --models smollm2-135m --cases 150 --first-case $small
  $FUZZ "$LABEL" --models --bundles $B/qwen2.5-coder-0.5b-q4_0:200MB --cases 50 --first-case $big
  $FUZZ "$LABEL" --models --bundles $B/smollm2-135m-q4_0:60MB --cases 150 --first-case $small
done
