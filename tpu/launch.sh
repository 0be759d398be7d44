#!/usr/bin/env bash
# Run one gin job on every worker of the slice (the same command on each: jax.distributed joins
# them, each reads its own shard of the data; checkpoints go to the bucket).
#   source tpu/env.sh && bash tpu/launch.sh gin/st5_11b.gin run_name [--gin.KEY=VALUE ...]
# Rerunning the same command resumes from the run's last checkpoint.
set -euo pipefail
source "$(dirname "$0")/env.sh"
GIN_FILE="${1:?gin file}"; RUN="${2:?run name}"; shift 2
EXTRA=""
for a in "$@"; do EXTRA+=" $(printf '%q' "$a")"; done
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --worker=all --command="
  cd ~/sentemb_jax && mkdir -p ~/logs
  nohup .venv/bin/python -m sentemb_jax.main --gin_file=$GIN_FILE \
    --gin.MODEL_DIR=\"'$BUCKET/$RUN'\" --gin.sentemb_jax.initialize_distributed.auto=True $EXTRA \
    > ~/logs/$RUN.log 2>&1 &
  echo \"worker \$(hostname): started, log ~/logs/$RUN.log\"
"
