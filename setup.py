"""sentemb_jax: a JAX/Flax stack for training sentence encoders."""
from setuptools import find_packages, setup

# Versions that resolve together on Python 3.11 (see ../shared/ENVIRONMENT.md).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "gin-config==0.5.0",
    "numpy==2.4.6",
    "scipy==1.17.1",
    "scikit-learn==1.9.1",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
    "tensorboardX==2.6.5",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "transformers==5.23.0",
    "sentencepiece==0.2.3",
    # Prepared corpora (sentemb_jax.data.prepared_corpus reads them without TensorFlow).
    "array-record==0.8.6",
    "protobuf==7.36.2",
]

# Where TensorFlow is the tool (sentemb_jax.dependencies): seqio tasks and mixtures, TFDS sources,
# in-graph tokenisation, SavedModel export, prepare_corpus. Training, evaluation and the
# sentence-transformers export run without it (DataConfig.reader='numpy', the default).
TF_REQUIRES = ["tensorflow==2.21.0", "tensorflow-text==2.21.1", "seqio==0.0.20"]

# ONNX export, ONNX Runtime and OpenVINO behind encode (sentemb_jax.onnx_export): jax2onnx 0.13.0 is
# the newest release whose orbax-checkpoint pin admits ours; all four resolve with every pin here.
# (sentence-transformers' own ONNX backend needs optimum, which would replace transformers 5.)
ONNX_REQUIRES = ["jax2onnx==0.13.0", "onnx==1.23.2", "onnxruntime==1.32.0", "openvino==2026.4.0"]

TEST_REQUIRES = [
    # torch first and exactly this version: it is the CPU wheel already on the machine.
    "torch==2.13.0",
    "sentence-transformers==6.2.0",
    "pytest==9.2.0",
    # make test runs two workers (pytest-xdist; execnet is its transport)
    "pytest-xdist==3.8.0",
    "execnet==2.1.2",
    "hypothesis==6.170.15",
    # The linter the test command runs first (ruff.toml).
    "ruff==0.17.6",
    # The TPU compiler without a TPU (tests/test_tpu_compile.py, sentemb_jax.benchmarks.tpu_compile):
    # the libtpu jax[tpu]==0.10.2 pins (0.0.42.*). On a CPU host sentemb_jax keeps jax on the CPU.
    "libtpu==0.0.42.1",
    # tests/test_export.py loads the SavedModel with hub.KerasLayer, as Sentence-T5's TF Hub models
    # are used: tensorflow-hub runs on Keras 2 (tf-keras, the one for tensorflow 2.21), not Keras 3,
    # and imports pkg_resources, which setuptools 82 removed.
    "tensorflow-hub==0.16.1",
    "tf-keras==2.21.0",
    "setuptools<82",
    # tests/test_mteb2.py: MTEB 2's evaluator on our encoder (sentemb_jax.evaluation.mteb_adapter);
    # resolves with every pin above (adds datasets, pandas, polars, pytrec-eval-terrier, nothing re-pinned).
    "mteb==2.26.24",
] + ONNX_REQUIRES + TF_REQUIRES

setup(
    name="sentemb_jax",
    version="0.1.0",
    description="JAX/Flax sentence encoders: dual and cross encoders, contrastive and distillation training.",
    packages=find_packages(include=["sentemb_jax", "sentemb_jax.*"]),
    package_data={"sentemb_jax": ["../gin/**/*.gin"]},
    python_requires=">=3.10,<3.13",
    install_requires=INSTALL_REQUIRES,
    # Accelerators (not installed here): the TPU / CUDA builds of this jax (tpu/README.md).
    extras_require={"test": TEST_REQUIRES, "tf": TF_REQUIRES, "onnx": ONNX_REQUIRES, "tpu": ["jax[tpu]==0.10.2"], "cuda": ["jax[cuda12]==0.10.2"]},
)
