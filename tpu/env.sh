# Settings shared by the TPU scripts: source it, or export these before running them.
#   source tpu/env.sh
export PROJECT="${PROJECT:?set PROJECT to your GCP project}"
export ZONE="${ZONE:-us-central2-b}"
export TPU_NAME="${TPU_NAME:-sentemb-pod}"
# v4-8 = one host (4 chips); v4-64 = 8 hosts; v3-128 = 16 hosts (8 cores each, 16 GiB HBM per core).
export ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-64}"
export RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
# The code every worker installs (this repository, pushed somewhere the workers can clone).
export REPO_URL="${REPO_URL:?set REPO_URL to a git URL of this repository}"
export REPO_REF="${REPO_REF:-main}"
# Checkpoints, metrics and exports go to a bucket every worker can write.
export BUCKET="${BUCKET:?set BUCKET, e.g. gs://my-bucket/sentemb}"
