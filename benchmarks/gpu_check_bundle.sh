#!/usr/bin/env bash
# `make gpu-check-bundle`: what the lent GPU machine lacks, built here into .gpu-bundle/ (ignored
# by git, carried by the device call): meshtrain's wheel, and the wheels of pydantic and its
# needs and of torchao, for CPython 3.12 on x86-64 Linux (that machine has Python 3.12, a CUDA
# build of torch 2.11 and no network). The versions are the ones installed here, so the machine
# runs what the tests ran with. benchmarks/gpu_check_device.sh installs them there (--no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
BUNDLE=${BUNDLE:-.gpu-bundle}
LIMIT_MIB=60  # the device call carries at most 64 MiB, the working tree included

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"
# built from a copy: setuptools' build/ folder would keep files deleted since in the wheel
source=$(mktemp -d)
trap 'rm -rf "$source"' EXIT
cp -r pyproject.toml README.md sdk runtime "$source"/
find "$source" -name __pycache__ -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$BUNDLE" "$source"
pins=$("$PYTHON" - <<'PY'
import importlib.metadata as metadata
names = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection",
         "typing-extensions", "torchao"]
print(" ".join(f"{name}=={metadata.version(name)}" for name in names))
PY
)
# pip matches each manylinux tag exactly: name the ones these packages publish
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --dest "$BUNDLE" $pins
# the wheel holds the working tree as it is: say so when sdk/ or runtime/ differ from HEAD
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- sdk runtime || echo +uncommitted)" \
  > "$BUNDLE/COMMIT"
size_kib=$(du -sk "$BUNDLE" | cut -f1)
ls -l "$BUNDLE"
echo "gpu-check bundle: $((size_kib / 1024)) MiB in $BUNDLE ($pins; commit $(cat "$BUNDLE/COMMIT"))"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "gpu-check bundle: over ${LIMIT_MIB} MiB, the device call would refuse it" >&2
  exit 1
fi
