"""How configuration travels from kt-train's flags to `fit`, and from kt-export's flags to
the exporter (issue #39's measure): run `kt-train ARGS` in this process under a profiler
until the trainer calls `fit_to_step` (not run), or `kt-export ARGS` until the exporter's
`export` is called (not run), and print JSON: every call from a keras_transformer module
into another one (a module visit), the distinct call sites among them, and the entries per
module.

    python benchmarks/config_flow.py --data-dir DIR --model-dir /tmp/flow --preset tiny \
        --vocab-size 500 --train-steps 10
    python benchmarks/config_flow.py kt-export --model-dir /tmp/flow --export-dir /tmp/ex

Calls from Keras or TensorFlow into the package (a layer's `call`, a callback) and calls
inside one module are not visits; `layers.*` (the model's structure, not its
configuration) are counted apart. Nothing is trained; the run directory is written as
kt-train writes it up to `fit`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys

import keras_transformer

PACKAGE = os.path.dirname(keras_transformer.__file__)


class ReachedFit(Exception):
    """The traced command reached its end point (`fit`, or the exporter's `export`)."""


def module_of(code) -> str | None:
    if not code.co_filename.startswith(PACKAGE):
        return None
    return os.path.relpath(code.co_filename, PACKAGE)[:-3].replace(os.sep, ".")


def stop_at_fit():
    """kt-train's main, its end point patched to raise `ReachedFit`."""
    from keras_transformer.cli import train as cli_train
    from keras_transformer.training import trainer

    trainer.fit_to_step = reached_fit
    return cli_train.main


def stop_at_export():
    """kt-export's main, every format's `export` patched to raise `ReachedFit`."""
    from keras_transformer.cli import export as cli_export
    from keras_transformer.inference import ctranslate2_export, export

    export.SavedModelExporter.export = reached_fit
    ctranslate2_export.CTranslate2Exporter.export = reached_fit
    return cli_export.main


def reached_fit(*args, **kwargs):
    raise ReachedFit


def trace(argv: list[str]) -> list[tuple[str, str, str]]:
    """[(caller module, callee module, callee function)] up to `fit_to_step` (kt-train), or
    up to the exporter's `export` when argv starts with `kt-export`."""
    command = argv.pop(0) if argv and argv[0] in ("kt-train", "kt-export") else "kt-train"
    main = stop_at_export() if command == "kt-export" else stop_at_fit()
    visits = []

    def profile(frame, event, arg):
        callee = module_of(frame.f_code) if event == "call" else None
        caller = module_of(frame.f_back.f_code) if callee and frame.f_back else None
        if caller and caller != callee and frame.f_code.co_name != "<module>":
            visits.append((caller, callee, frame.f_code.co_name))

    sys.argv = [command, *argv]
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON only
            main()
    except ReachedFit:
        pass
    finally:
        sys.setprofile(None)
    return visits


def summary(visits) -> dict:
    sites = list(dict.fromkeys(visits))  # distinct call sites, in the order first made
    flow = [v for v in sites if not (v[0].startswith("layers") or v[1].startswith("layers"))]
    entries = collections.Counter(callee for _, callee, _ in flow)
    return {
        "visits": len(visits),
        "call_sites": len(sites),
        "call_sites_outside_layers": len(flow),
        "modules": len(entries),
        "entries_per_module": dict(entries.most_common()),
        "flow": [f"{caller} -> {callee}.{name}" for caller, callee, name in flow],
    }


if __name__ == "__main__":
    print(json.dumps(summary(trace(sys.argv[1:])), indent=1))
