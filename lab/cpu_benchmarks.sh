#!/bin/bash
# On another machine's CPU: every encode / training row of docs/RESULTS.md in one call, as
# jobs side by side on distinct 2-core pairs (taskset), each alternating its rows round by round.
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d /tmp/ov openvino==2026.4.0                           # the other machine's python3 is 3.12
#   python -m sentemb_jax.benchmarks.portable_kit pack --out .devcarry/kit --store_bfloat16 \
#       --openvino /tmp/ov/openvino-2026.4.0-*.whl
#   pip download --no-deps -d .devcarry/kit/whl jax2onnx==0.17.1 gin-config==0.5.0 tensorboardX==2.6.5
#   # then, on the other machine (the kit copied beside the checkout):
#   bash lab/cpu_benchmarks.sh .devcarry/kit
#
# The kit's weights are all-MiniLM-L6-v2 rounded to bfloat16 (so that OpenVINO fits the 64 MiB
# transfer): speed rows are those of the exact model; quality is not (STS-B test float32 82.04
# where the exact weights give 82.03, ONNX int8 81.72 where they give 82.04: measure quality on the
# exact weights at home). Dry run on our AMD EPYC: all eight jobs exit 0. Logs go to $OUT/logs.tgz;
# the last lines of each are printed. jax2onnx 0.17.1 is for a machine with jax 0.11.2 (our pin,
# 0.13.0, fails there). QUICK=1: one round each, one job after another (a dry run of every command).
set -u
KIT=${1:?usage: cpu_benchmarks.sh KIT}
OUT=${OUT:-/tmp/out}; L=/tmp/kit_logs; SITE=/tmp/kit_site; M=/tmp/kit_model
mkdir -p "$OUT"; rm -rf $L $SITE $M; mkdir -p $L $SITE
T=${JOB_TIMEOUT:-450}
if [ -n "${QUICK:-}" ]; then r5=1 r3=1; BG=; else r5=5 r3=3; BG="&"; fi
if ls "$KIT"/whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE "$KIT"/whl/*.whl || exit 3
fi
if [ -f "$KIT/openvino.tar.xz" ]; then  # its compiled extension runs on one Python version: check before any job
  tar xJf "$KIT/openvino.tar.xz" -C $SITE || exit 3
  PY=$(python3 -c "import sys; print(sys.implementation.cache_tag)")
  if ! ls $SITE/openvino/_pyopenvino.$PY-*.so > /dev/null 2>&1; then
    echo "error: $KIT/openvino.tar.xz holds openvino for $(cd $SITE/openvino && ls _pyopenvino.*.so | sed 's/^_pyopenvino\.\(cpython-[0-9]*\).*/\1/')," \
      "this machine's python3 is $PY: pack the kit with --openvino WHEEL, a wheel for $PY" >&2; exit 3
  fi
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= TF_CPP_MIN_LOG_LEVEL=2
export SENTEMB_DATA_DIR=$KIT/data
python3 -m sentemb_jax.benchmarks.portable_kit unpack "$KIT/model" $M || exit 3
date -u; nproc; lscpu | grep -E "Model name|Model:|Thread|Core|Socket|L3"
python3 -c "import jax, torch, flax, sentence_transformers as s, onnxruntime as o, openvino as v
print('jax', jax.__version__, 'torch', torch.__version__, 'flax', flax.__version__, 'st', s.__version__,
      'ort', o.__version__, 'openvino', v.__version__, v.__file__)" || exit 3
job() { local cores=$1 name=$2; shift 2; if [ -n "${QUICK:-}" ]; then cores=0,1; fi
  eval "( timeout $T taskset -c $cores \"\$@\" > $L/$name.log 2>&1; echo \"exit \$?\" >> $L/$name.log ) $BG"; }
E="python3 -m sentemb_jax.benchmarks.encode_throughput --model $M"
OV=sentemb_jax_openvino_packed,sentemb_jax_openvino_bf16_packed,sentence_transformers_bf16
job 0,1   enc_a   $E --rounds $r5                              # float32: ours padded and packed, theirs
job 2,3   enc_b   $E --rounds $r5 --only sentemb_jax_packed
job 4,5   enc_c   $E --rounds $r5 --only sentemb_jax_packed
job 6,7   ov_a    $E --rounds $r3 --only $OV                   # OpenVINO float32 and bf16 vs its bf16
job 8,9   ov_b    $E --rounds $r3 --only $OV
job 10,11 bf16    $E --rounds $r3 --only sentemb_jax_bf16_packed,sentence_transformers_bf16
job 12,13 onnx    $E --rounds $r3 --only sentemb_jax_onnx_int8_packed,sentemb_jax_onnx_packed
job 14,15 train   python3 -m sentemb_jax.benchmarks.train_throughput --model $M --rounds $r3
wait
date -u
tar czf "$OUT/logs.tgz" -C $L .
for f in $L/*.log; do echo "=== $(basename "$f")"
  grep -vE "^\s*$|WARNING|Warning|warn\(|oneDNN custom|cpu_feature_guard|absl::InitializeLog" "$f" | tail -30 | cut -c1-240
done
