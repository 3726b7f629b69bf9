#!/usr/bin/env bash
# One node's share of a multi-node `vltrain` job: a torchrun agent that joins the job's
# c10d rendezvous and starts this node's worker processes. Start it once per node, with the
# same arguments and environment everywhere (slurm-pretrain.sbatch and k8s-pretrain.yaml do;
# tests/vl_models/test_multinode.py starts two on one host). The arguments are the vltrain
# command line, e.g.:
#
#   NNODES=4 NPROC_PER_NODE=8 RDZV_ENDPOINT=node01:29500 RDZV_ID=lxmert-1 \
#     workflows/cluster/torchrun-node.sh pretrain --resume auto --device cuda --out /shared/runs/lxmert ...
#
# Environment:
#   RDZV_ENDPOINT   host:port of the rendezvous, the same on every node: an address of node 0 (required)
#   NNODES          nodes in the job (default 1); ranks are assigned by the rendezvous, not by node
#   NPROC_PER_NODE  worker processes on this node, one per GPU (default 1)
#   RDZV_ID         the job's id, the same on every node (default vltrain)
#   NODE_RANK       optional: 0 on the node that hosts the rendezvous store, anything else on the
#                   others (without it, the node whose name or address is the endpoint's hosts it;
#                   set it where the endpoint is a service name, as on Kubernetes)
#   MAX_RESTARTS    how often torchrun restarts the job's workers after one fails (default 3); every
#                   node's workers restart together and, with --resume auto, continue from the last
#                   checkpoint of the run
#   RDZV_TIMEOUT    seconds to wait for every node to join (default 600)
#   PYTHON          the interpreter of the environment vltrain is installed in (default: python, else
#                   python3, on PATH: the activated environment's). torchrun is started as its
#                   `-m torch.distributed.run`, so the agent and its workers run that environment
#                   whatever `torchrun` PATH would find first (a base interpreter's, another venv's)
#
# Everything every rank reads lives on a filesystem all nodes share: the feature stores
# (each step reads its batch's regions from them, memory-mapped), the mixture or task data,
# the vocab, and --out (rank 0 writes config.json, metrics.jsonl and checkpoints/ there; every
# rank reads the checkpoint it resumes from). Use absolute paths.
#
# Signals: the script becomes the torchrun agent (exec), so SIGTERM (SLURM preemption, a Kubernetes
# pod deletion) stops the agent and its workers; resubmit the same command to continue.
set -euo pipefail

# The workers' process group gets a store of its own in every restart: torch's default of
# sharing the rendezvous store hands restarted workers the dead workers' addresses (seen with
# torch 2.14, gloo: "Connection refused" after a restart; pytorch/pytorch#135712, #167288).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"

: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port, an address of node 0 (the same on every node)}"
conf="join_timeout=${RDZV_TIMEOUT:-600}"
if [ -n "${NODE_RANK:-}" ]; then
  conf="$conf,is_host=$([ "$NODE_RANK" = 0 ] && echo 1 || echo 0)"
fi
python=${PYTHON:-$(command -v python || command -v python3 || true)}
: "${python:?no python on PATH: activate the environment vltrain is installed in, or set PYTHON}"
exec "$python" -m torch.distributed.run --nnodes "${NNODES:-1}" --nproc-per-node "${NPROC_PER_NODE:-1}" \
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "${RDZV_ID:-vltrain}" --rdzv-conf "$conf" \
  --max-restarts "${MAX_RESTARTS:-3}" -m vl_models.cli "$@"
