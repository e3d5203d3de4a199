"""The command lines, each installed as a console script (see setup.py):

- `kt-train` (`cli/train.py`): train, or resume, a run directory;
- `kt-export` (`cli/export.py`): a run's checkpoints -> a SavedModel for TensorFlow Serving;
- `kt-translate`, `kt-evaluate`, `kt-score` (`cli/translate.py`, ...): use an export.

`train.py` and `export.py` at the root of a checkout are shims over the first two. Each
module parses its flags before it imports TensorFlow, so `--help` and flag errors answer at
once; `common.py` holds what they share (the one-line error, the decoding flags).
"""
