#!/bin/sh
# The acceptance campaign: 2,000 GGUF and 2,000 bundle mutations (Qwen2.5-Coder-0.5B and SmolLM2-135M,
# plain / budgeted / sparse generate and inspect, one run per case in turn), in chunks of 100 cases
# that each append their outcome counts to benchmarks/results/fuzz-{gguf,bundle}.jsonl.
# Heavy: run it under the shared lock, from the repository root, with the fuzz bundles exported:
#   flock /work/notes/heavy.lock sh benchmarks/fuzz/campaign.sh
set -u
PY=.venv/bin/python
BUNDLES=bench-out/fuzz-bundles
LABEL="${LABEL:-acceptance campaign}"
CHUNK=${CHUNK:-100}
for first in 0 100 200 300 400 500 600 700 800 900; do
  $PY benchmarks/fuzz/run_fuzz.py --models qwen2.5-coder-0.5b smollm2-135m --cases $CHUNK --first-case $first \
      --rotate --label "$LABEL"
  $PY benchmarks/fuzz/run_fuzz.py --models --bundles $BUNDLES/qwen2.5-coder-0.5b-q4_0:200MB \
      $BUNDLES/smollm2-135m-q4_0:60MB --cases $CHUNK --first-case $first --rotate --label "$LABEL"
done
