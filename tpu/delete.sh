#!/usr/bin/env bash
# Delete the slice (checkpoints stay in the bucket).
#   source tpu/env.sh && bash tpu/delete.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --quiet
