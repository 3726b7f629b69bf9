#!/usr/bin/env bash
# Download a URL list on the CPU nodes of a Ray cluster, then extract region features on
# its GPU nodes, into folders on the shared filesystem (workflows/cluster/ray-cluster.yaml).
# Run it on the head node (the driver); every path must be on the shared mount.
#
#   workflows/cluster/ray-extract.sh URL_LIST.tsv OUT_DIR
#   e.g. workflows/cluster/ray-extract.sh /shared/cc3m/Train_GCC-training.tsv /shared/cc3m
#   -> OUT_DIR/images (image shards) and OUT_DIR/features (the feature store, verified)
#
# Environment: RAY_ADDRESS (default auto: the cluster this node belongs to), WEIGHTS
# (detector weights, default /shared/weights/faster_rcnn_from_caffe_attr.pkl),
# SHARD_SIZE (default 1000 images: one shard is the unit of work, retry and resume; aim
# for shards of a minute or more of work, and at least a few per CPU of the cluster),
# DOWNLOAD_FLAGS / EXTRACT_FLAGS (more flags for either command; later flags win).
#
# Resume (a preempted node, a killed driver, exit 75 "no capacity left"): run the same
# command again. Finished shards are kept and skipped; a lost node's shards are redone
# elsewhere while the run goes on.
#
# The extract step reads the image shards on the head and ships them to the GPU actors.
# To skip the second pass over the images, one streaming job does both (the CPU nodes
# hand their images straight to the actors): vlprep extract --dataset conceptual_captions
# --input LIST --keep-images OUT/images --download-resource download --ray-address auto ...
set -euo pipefail
if [ "$#" -ne 2 ]; then
    sed -n '2,23p' "$0" >&2
    exit 2
fi
list=$1
out=$2
address=${RAY_ADDRESS:-auto}
shard_size=${SHARD_SIZE:-1000}
# shellcheck disable=SC2086  # the *_FLAGS are word lists
vlprep download --dataset conceptual_captions --input "$list" --out "$out/images" \
    --ray-address "$address" --download-resource download --shard-size "$shard_size" ${DOWNLOAD_FLAGS:-}
# shellcheck disable=SC2086
vlprep extract --images "$out/images" --out "$out/features" --ray-address "$address" \
    --weights "${WEIGHTS:-/shared/weights/faster_rcnn_from_caffe_attr.pkl}" --boxes 10-100 \
    --shard-size "$shard_size" ${EXTRACT_FLAGS:-}
vlprep verify "$out/features"
