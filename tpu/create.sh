#!/usr/bin/env bash
# Create a TPU VM (one host) or pod slice (several hosts, one VM per host).
#   source tpu/env.sh && bash tpu/create.sh [--spot]
set -euo pipefail
source "$(dirname "$0")/env.sh"
gcloud compute tpus tpu-vm create "$TPU_NAME" \
  --project="$PROJECT" --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "$@"
gcloud compute tpus tpu-vm describe "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
  --format='value(state,acceleratorType,networkEndpoints.len())'
