"""keras-transformer-nmt: the Transformer of "Attention Is All You Need" in TensorFlow/Keras.

The distribution is named keras-transformer-nmt: `keras-transformer` on the package index is an
unrelated project that installs the same import package, `keras_transformer`. The version is
`keras_transformer.__version__` (read here as text, without importing the package).
"""

import re

from setuptools import find_packages, setup

with open("keras_transformer/__init__.py", encoding="utf-8") as handle:
    VERSION = re.search(r'^__version__ = "([^"]+)"', handle.read(), re.MULTILINE).group(1)

setup(
    name="keras-transformer-nmt",
    version=VERSION,
    description=(
        "The Transformer (Vaswani et al., 2017) as Keras layers: training with "
        "MirroredStrategy and mixed precision, beam search, SavedModel export for TF Serving."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",  # LICENSE: TensorFlow's own licence
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["keras_transformer", "keras_transformer.*"]),
    # the console scripts' entry points: outside keras_transformer, so that a shadowing
    # keras_transformer of another distribution gets a one-line error, not a traceback
    py_modules=["keras_transformer_nmt"],
    install_requires=[
        # TensorFlow and TensorFlow Text must share a minor version (ops ABI).
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "keras>=3.10,<4",
        "tensorflow-datasets>=4.9,<5",
        # tensorflow-datasets 4.9.10 imports it to build any dataset (its builders' module
        # loading) but no longer gets it through etils >= 1.15: without it, TFDS fails at run time
        "importlib_resources>=5",
        "sacrebleu>=2.4,<3",
        "sentencepiece>=0.2,<0.3",
        "numpy>=1.26",
        "tqdm>=4.60",
        "tensorboard>=2.21,<2.22",  # Keras TensorBoard callback (not pulled in by TF 2.21)
        # models.config is read and written through its protobuf message
        "tensorflow-serving-api>=2.21,<2.22",
        "pyyaml>=6",  # kt-train --config FILE
    ],
    extras_require={
        # ctranslate2: tests/inference/test_export_formats.py checks --format ctranslate2 and
        # tests/importers/ the OPUS-MT import; safetensors: the Hugging Face layout's import
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            "psutil>=5.9",
            "ruff>=0.6",
            "ctranslate2>=4.5,<5",
            "safetensors>=0.4",
        ],
        # kt-import of a Hugging Face Marian directory (model.safetensors, read into numpy)
        "import": ["safetensors>=0.4"],
        "notebooks": ["jupyter", "nbclient>=0.10", "nbformat>=5", "ipykernel", "matplotlib>=3.8"],
        "serving": ["requests>=2.31"],
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],  # CUDA 12 and cuDNN 9 wheels: docs/gpu.md
        # the reference decoder of benchmarks/bench_decode.py and bench_real.py; the package
        # never imports it
        "bench": ["ctranslate2>=4.5,<5"],
        # kt-export --format ctranslate2; the package imports it for that option only
        "ctranslate2": ["ctranslate2>=4.5,<5"],
        # the docs site: mkdocs.yml, `mkdocs build --strict` (CI) or `mkdocs serve`
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10"],
    },
    entry_points={
        "console_scripts": [
            "kt-train=keras_transformer_nmt:train",
            "kt-export=keras_transformer_nmt:export",
            "kt-translate=keras_transformer_nmt:translate",
            "kt-evaluate=keras_transformer_nmt:evaluate",
            "kt-score=keras_transformer_nmt:score",
            "kt-import=keras_transformer_nmt:import_",
        ]
    },
)
