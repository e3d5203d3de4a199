"""Call a TensorFlow Serving server that runs the exported translator.

    python serving/client.py --rest http://localhost:8501 "A man rides a bike."
    python serving/client.py --grpc localhost:8500 "A man rides a bike."
    # per-request decoding options (signature translate_with_options), same server
    python serving/client.py --rest http://localhost:8501 --beam-size 8 --alpha 1.0 \
        --num-hypotheses 3 --prefix "Ein Mann" "A man rides a bike."

REST needs `requests`; gRPC needs `tensorflow-serving-api` (pip install -e ".[serving]").
Without an option flag the request goes to `serving_default` (the export's settings); with
any, to `translate_with_options` (0.1.0's inputs; with `--stop-rule`, to
`translate_with_stop_rule`, which also takes `stop_rule`), the others taking the library's
defaults (`keras_transformer.config`: the paper's beam 4, alpha 0.6, +50 tokens; 1
hypothesis, no prefix). Every option is sent as a vector with one value per sentence (the signature is
batch-major, so TF Serving's batching can merge requests); outputs are then
(batch, num_hypotheses).
"""

from __future__ import annotations

import argparse
import json

from keras_transformer import config  # no TensorFlow import

DEFAULT_OPTIONS = {
    "beam_size": config.BEAM_SIZE,
    "alpha": config.ALPHA,
    "max_extra_length": config.MAX_EXTRA_LENGTH,
    "num_hypotheses": 1,
    "target_prefix": "",
}
DTYPES = {"alpha": "float32", "target_prefix": "string", "stop_rule": "string"}  # others int32


def per_sentence(options: dict | None, count: int) -> dict:
    """Each scalar option repeated once per sentence (the signature's [B] inputs)."""
    return {name: [value] * count for name, value in (options or {}).items()}


def _signature(options: dict | None) -> str:
    if not options:
        return "serving_default"
    return "translate_with_stop_rule" if "stop_rule" in options else "translate_with_options"


def translate_rest(
    url: str, sentences: list[str], model: str = "transformer", options: dict | None = None
) -> dict:
    """POST /v1/models/<model>:predict in the columnar ("inputs") format."""
    import requests

    response = requests.post(
        f"{url}/v1/models/{model}:predict",
        json={
            "signature_name": _signature(options),
            "inputs": {"inputs": sentences, **per_sentence(options, len(sentences))},
        },
        timeout=60,
    )
    response.raise_for_status()
    return response.json()["outputs"]


def translate_grpc(
    target: str, sentences: list[str], model: str = "transformer", options: dict | None = None
) -> dict:
    """PredictionService.Predict; each option a [B] TensorProto of its dtype."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = _signature(options)
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    for name, values in per_sentence(options, len(sentences)).items():
        dtype = tf.as_dtype(DTYPES.get(name, "int32"))
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=dtype))
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
    parser.add_argument("--prefix", dest="target_prefix", help="every translation starts so")
    parser.add_argument(
        "--stop-rule", choices=config.STOP_RULES, help="when the search stops (default: export's)"
    )
    parser.add_argument("sentences", nargs="+")
    args = parser.parse_args()
    names = [*DEFAULT_OPTIONS, "stop_rule"]  # stop_rule: translate_with_stop_rule's only
    given = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    options = {**DEFAULT_OPTIONS, **given} if given else None
    if args.rest:
        result = translate_rest(args.rest, args.sentences, args.model, options)
    else:
        result = translate_grpc(args.grpc, args.sentences, args.model, options)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
