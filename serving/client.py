"""Call a TensorFlow Serving server that runs the exported translator.

    python serving/client.py --rest http://localhost:8501 "A man rides a bike."
    python serving/client.py --grpc localhost:8500 "A man rides a bike."
    # per-request decoding options (signature translate_with_options; a server started
    # without --enable_batching: `docker compose --profile options up`, ports 8502/8503)
    python serving/client.py --rest http://localhost:8503 --beam-size 8 --alpha 1.0 \
        --num-hypotheses 3 "A man rides a bike."

REST needs `requests`; gRPC needs `tensorflow-serving-api` (pip install -e ".[serving]").
Without an option flag the request goes to `serving_default` (the export's settings); with
any, to `translate_with_options`, the others taking the paper's values (beam 4, alpha 0.6,
+50 tokens, 1 hypothesis). Outputs are then (batch, num_hypotheses).
"""

from __future__ import annotations

import argparse
import json

DEFAULT_OPTIONS = {"beam_size": 4, "alpha": 0.6, "max_extra_length": 50, "num_hypotheses": 1}


def _signature(options: dict | None) -> str:
    return "translate_with_options" if options else "serving_default"


def translate_rest(
    url: str, sentences: list[str], model: str = "transformer", options: dict | None = None
) -> dict:
    """POST /v1/models/<model>:predict in the columnar ("inputs") format: the scalars are
    plain JSON numbers beside the list of sentences."""
    import requests

    response = requests.post(
        f"{url}/v1/models/{model}:predict",
        json={
            "signature_name": _signature(options),
            "inputs": {"inputs": sentences, **(options or {})},
        },
        timeout=60,
    )
    response.raise_for_status()
    return response.json()["outputs"]


def translate_grpc(
    target: str, sentences: list[str], model: str = "transformer", options: dict | None = None
) -> dict:
    """PredictionService.Predict; each option is a scalar TensorProto (int32 or float32)."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = _signature(options)
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    for name, value in (options or {}).items():
        dtype = tf.float32 if name == "alpha" else tf.int32
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        result = stub.Predict(request, timeout=60)
    outputs = tf.make_ndarray(result.outputs["outputs"])
    return {
        "outputs": [[s.decode("utf-8") for s in row] for row in outputs.reshape(len(outputs), -1)]
        if options
        else [s.decode("utf-8") for s in outputs],
        "scores": tf.make_ndarray(result.outputs["scores"]).tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--rest", help="e.g. http://localhost:8501")
    where.add_argument("--grpc", help="e.g. localhost:8500")
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--max-extra-length", type=int)
    parser.add_argument("--num-hypotheses", type=int)
    parser.add_argument("sentences", nargs="+")
    args = parser.parse_args()
    given = {k: getattr(args, k) for k in DEFAULT_OPTIONS if getattr(args, k) is not None}
    options = {**DEFAULT_OPTIONS, **given} if given else None
    if args.rest:
        result = translate_rest(args.rest, args.sentences, args.model, options)
    else:
        result = translate_grpc(args.grpc, args.sentences, args.model, options)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
