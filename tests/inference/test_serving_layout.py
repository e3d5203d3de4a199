"""The TF Serving layout: the warmup records, written with tensorflow_serving.apis, hold the
requests that 0.2's hand-encoded PredictionLogs held."""

import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from keras_transformer.inference.serving_layout import (
    WARMUP_FILE,
    warmup_record,
    warmup_records,
    write_warmup,
)

# written by the hand encoder before this module (an export of model "transformer")
RECORDS_0_2 = os.path.join(os.path.dirname(__file__), "warmup_requests_0.2.tfrecord")


def read(path):
    return [
        prediction_log_pb2.PredictionLog.FromString(record.numpy())
        for record in tf.data.TFRecordDataset(path)
    ]


def test_warmup_file_holds_the_requests_of_the_hand_encoded_one(tmp_path):
    path = write_warmup(str(tmp_path), "transformer")
    assert path == os.path.join(str(tmp_path), "assets.extra", WARMUP_FILE)
    new, old = read(path), read(RECORDS_0_2)
    assert len(new) == len(old) == 6
    for ours, theirs in zip(new, old, strict=True):
        assert ours == theirs  # field by field, every tensor of every input
    assert [log.predict_log.request.model_spec.signature_name for log in new][:2] == [
        "serving_default",
        "translate_nbest",
    ]


def test_xla_shapes_come_first_in_chunks_of_32_rows():
    shapes = np.arange(70 * 5, dtype=np.int32).reshape(70, 5).tolist()
    records = [prediction_log_pb2.PredictionLog.FromString(r) for r in warmup_records("m", shapes)]
    requests = [log.predict_log.request for log in records]
    assert [r.model_spec.signature_name for r in requests[:3]] == ["xla_warmup"] * 3
    rows = np.concatenate([tf.make_ndarray(r.inputs["shapes"]) for r in requests[:3]])
    assert rows.tolist() == shapes and set(requests[0].inputs) == {"shapes"}
    assert records[3].SerializeToString() == warmup_record(
        "m", ["A man is riding a bicycle.", "", "Zwei Hunde spielen im Schnee."]
    )
