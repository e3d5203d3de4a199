"""Run as a script by one task of a local multi-worker job (TF_CONFIG set by the test):
create the strategy train.py creates and print JSON with this task and whether it is the
chief, as training.strategy.is_chief says."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_transformer.training.strategy import is_chief, make_strategy  # noqa: E402

strategy = make_strategy("multi_worker")
task = json.loads(os.environ["TF_CONFIG"])["task"]
print(json.dumps({"task": f"{task['type']}:{task['index']}", "chief": is_chief(strategy)}))
sys.stdout.flush()
