"""Run as a script by one task of a local multi-worker job (TF_CONFIG set by the test):
build the strategy kt-train builds without its start-up check, then run the check with
the device count given for this task's type (argv: chief=N worker=M), as a GPU job whose
chief and workers differ would have, and the run directory given for it (argv:
dir_chief=PATH dir_worker=PATH; none: no directory check); a mismatch ends as kt-train ends
(one line, exit 2)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from keras_transformer.errors import KerasTransformerError  # noqa: E402
from keras_transformer.training.startup import check_same_layout, local_layout  # noqa: E402
from keras_transformer.training.strategy import communication_options  # noqa: E402

devices = dict(arg.split("=") for arg in sys.argv[1:])
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options())
kind = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
try:
    layout = {**local_layout(strategy), "devices": int(devices[kind])}
    check_same_layout(strategy, layout, model_dir=devices.get(f"dir_{kind}"))
except KerasTransformerError as err:
    print(f"kt-train: error: {err}", file=sys.stderr)
    sys.exit(2)
print("same layout", flush=True)
