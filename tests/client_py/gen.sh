#!/bin/sh
# gen.sh OUTDIR - generate the Python code of schema/api.fbs (and the job and
# model schemas it includes) into OUTDIR/pipetrain with flatc. Generated code
# lives in a temporary or build directory only; it is never committed.
set -eu
out=${1:?usage: gen.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
exec flatc --python --gen-object-api --gen-all -o "$out" "$root/schema/api.fbs"
