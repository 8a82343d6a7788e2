#!/usr/bin/env bash
# Runs on the lent GPU machine, from the repository root (see docs/testing.md, "On a lent GPU"):
# installs what `make gpu-check-bundle` built here (carried as .gpu-bundle) into /tmp/site with
# --no-deps, on that machine's own torch, then `make gpu-check` with its report written into
# $OUT (the folder that comes back: at most 8 files; this writes 4).
set -uo pipefail
BUNDLE=${BUNDLE:-.gpu-bundle}
: "${OUT:?OUT must name the folder to write the report into}"
export PYTHONUNBUFFERED=1
if ! ls "$BUNDLE"/meshtrain-*.whl >/dev/null 2>&1; then
  echo "no $BUNDLE/meshtrain-*.whl: run 'make gpu-check-bundle' here and carry $BUNDLE" >&2
  exit 3
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$BUNDLE"/*.whl || exit 3
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi -L; python3 -c "import torch, meshtrain; print(torch.__version__, torch.version.cuda, meshtrain.__file__)"; } \
  > "$OUT/machine.txt" 2>&1
args="--commit $(cat "$BUNDLE/COMMIT") ${GPU_CHECK_ARGS:-}"
if command -v make >/dev/null; then
  make --no-print-directory gpu-check PYTHON=python3 GPU_CHECK_OUT="$OUT" GPU_CHECK_ARGS="$args" \
    2>&1 | tee "$OUT/gpu-check.log"
else
  python3 benchmarks/gpu_check.py --out "$OUT" $args 2>&1 | tee "$OUT/gpu-check.log"
fi
exit "${PIPESTATUS[0]}"
