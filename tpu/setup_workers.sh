#!/usr/bin/env bash
# Install sentemb_jax (pinned versions from setup.py, the TPU build of jax) on every worker.
#   source tpu/env.sh && bash tpu/setup_workers.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --worker=all --command="
  set -euo pipefail
  sudo apt-get update -qq && sudo apt-get install -y -qq python3.11-venv git >/dev/null
  rm -rf ~/sentemb_jax && git clone -q '$REPO_URL' ~/sentemb_jax && cd ~/sentemb_jax && git checkout -q '$REPO_REF'
  python3.11 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[tpu]'
  .venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_device_count(), jax.devices()[0].device_kind)'
"
