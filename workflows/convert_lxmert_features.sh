#!/usr/bin/env bash
# Convert LXMERT's released bottom-up features (obj36 TSVs) into one feature store,
# verify it, and show what the trainer will see.
#
#   workflows/convert_lxmert_features.sh OUT_STORE TSV [TSV ...]
#   e.g. workflows/convert_lxmert_features.sh data/lxmert_feats \
#          data/mscoco_imgfeat/train2014_obj36.tsv data/mscoco_imgfeat/val2014_obj36.tsv \
#          data/vg_gqa_imgfeat/vg_gqa_obj36.tsv
#
# Environment: BACKEND (arrow|lmdb, default arrow), DTYPE (float16|float32, default float16).
# Rerunning resumes: images already in the store are skipped.
set -euo pipefail
if [ "$#" -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
out=$1
shift
vlprep import --from lxmert-tsv --backend "${BACKEND:-arrow}" --dtype "${DTYPE:-float16}" \
    --cls-prob none --attr-prob none "$@" "$out"
vlprep verify "$out"
vlprep inspect "$out"
vltrain preview-batch "$out" --position 4d
