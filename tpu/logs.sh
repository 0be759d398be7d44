#!/usr/bin/env bash
# Follow a run's log on worker 0 (metrics and evaluation are written by process 0).
#   source tpu/env.sh && bash tpu/logs.sh run_name [worker]
set -euo pipefail
source "$(dirname "$0")/env.sh"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --worker="${2:-0}" \
  --command="tail -n 50 -f ~/logs/${1:?run name}.log"
