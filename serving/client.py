"""Call a TensorFlow Serving server that runs the exported translator.

    python serving/client.py --rest http://localhost:8501 "A man rides a bike."
    python serving/client.py --grpc localhost:8500 "A man rides a bike."

REST needs `requests`; gRPC needs `tensorflow-serving-api` (pip install -e ".[serving]").
"""

from __future__ import annotations

import argparse
import json


def translate_rest(url: str, sentences: list[str], model: str = "transformer") -> dict:
    import requests

    response = requests.post(
        f"{url}/v1/models/{model}:predict",
        json={"signature_name": "serving_default", "inputs": {"inputs": sentences}},
        timeout=60,
    )
    response.raise_for_status()
    return response.json()["outputs"]


def translate_grpc(target: str, sentences: list[str], model: str = "transformer") -> dict:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        result = stub.Predict(request, timeout=60)
    return {
        "outputs": [s.decode("utf-8") for s in tf.make_ndarray(result.outputs["outputs"])],
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
    parser.add_argument("sentences", nargs="+")
    args = parser.parse_args()
    if args.rest:
        result = translate_rest(args.rest, args.sentences, args.model)
    else:
        result = translate_grpc(args.grpc, args.sentences, args.model)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
