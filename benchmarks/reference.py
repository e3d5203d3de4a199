"""What the decoding benchmarks share: a CTranslate2 model built from OUR weights, and timed
decoders that each live in a process of their own.

- `write_ctranslate2(model, tokens, out_dir)`: the `Transformer`'s weights, as they are, in
  a CTranslate2 model (product code: `keras_transformer.inference.ctranslate2_export`, which
  `kt-export --format ctranslate2` uses; re-exported here).
- `Worker`: a spawned process that builds its decoders once (`factory(**kwargs)` ->
  {name: run}, `run()` returning the outputs) and runs one of them on demand, timing it
  itself. Why a process each: once a second CTranslate2 `Translator` (e.g. int8 beside
  float32) has run in a process, the first one gets markedly slower; and our TensorFlow
  decoder and CTranslate2 then share nothing but the machine.
- `interleaved(workers, rounds)`: rounds that run every decoder once, in turn, so that a
  slow spell of a shared machine falls on all of them alike.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time

import numpy as np

from keras_transformer.inference.ctranslate2_export import write_ctranslate2  # noqa: F401


def isa_flags() -> str:
    """The `Flags:` line of `lscpu` (the SIMD extensions both decoders can use)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        return f"lscpu failed: {err}"
    flags = [line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags")]
    keep = ("sse4", "avx", "fma", "amx", "vnni", "bf16", "f16c")
    return " ".join(f for f in (flags[0] if flags else []) if f.startswith(keep))


def ctranslate2_translator(model_dir: str, compute_type: str):
    import ctranslate2

    return ctranslate2.Translator(
        model_dir,
        device="cpu",
        compute_type=compute_type,
        inter_threads=1,
        intra_threads=os.cpu_count(),
    )


def _serve(connection, factory, kwargs) -> None:
    """The worker process: build the decoders, then answer ("run", name) with
    (seconds, None), ("outputs", name) with (seconds, outputs) and ("call", name, args)
    with (seconds, name(*args)) until ("stop",)."""
    try:
        decoders = factory(**kwargs)
        connection.send(("ready", sorted(decoders)))
    except Exception as err:  # reported to the parent, which raises it
        connection.send(("error", f"{type(err).__name__}: {err}"))
        return
    while True:
        message = connection.recv()
        if message[0] == "stop":
            return
        start = time.perf_counter()
        outputs = decoders[message[1]](*message[2:])
        seconds = time.perf_counter() - start
        connection.send((seconds, None if message[0] == "run" else outputs))


class Worker:
    """Decoders built by `factory(**kwargs)` (a module-level function) in a spawned process."""

    def __init__(self, factory, **kwargs):
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, factory, kwargs))
        self._process.start()
        status, detail = self._connection.recv()
        if status != "ready":
            self._process.join()
            raise RuntimeError(f"worker {factory.__name__}: {detail}")
        self.names = detail

    def run(self, name: str) -> float:
        """Seconds `name` took, measured in the worker."""
        self._connection.send(("run", name))
        return self._connection.recv()[0]

    def outputs(self, name: str):
        self._connection.send(("outputs", name))
        return self._connection.recv()[1]

    def call(self, name: str, *args):
        """What the worker's `name(*args)` returns (untimed)."""
        self._connection.send(("call", name, *args))
        return self._connection.recv()[1]

    def close(self) -> None:
        self._connection.send(("stop",))
        self._process.join()


def interleaved(decoders: dict, rounds: int) -> dict:
    """{name: [seconds per run]} for {name: (worker, decoder name)}, every one already warm:
    `rounds` rounds that run each decoder once, in turn."""
    times = {name: [] for name in decoders}
    for _ in range(rounds):
        for name, (worker, decoder) in decoders.items():
            times[name].append(worker.run(decoder))
    return times


def ratios(times: dict, ours: str, reference: str) -> dict:
    """Our speed relative to `reference` (> 1: we are faster): the median of the
    per-round ratios (both ran back to back, in the same machine state) and their range."""
    r = np.array(times[reference]) / np.array(times[ours])
    return {
        "median": round(float(np.median(r)), 2),
        "range": [round(float(r.min()), 2), round(float(r.max()), 2)],
    }


class Local:
    """Decoders of this process, with the interface of `Worker`."""

    def __init__(self, decoders: dict):
        self._decoders = decoders
        self.names = sorted(decoders)

    def run(self, name: str) -> float:
        start = time.perf_counter()
        self._decoders[name]()
        return time.perf_counter() - start

    def outputs(self, name: str):
        return self._decoders[name]()

    def close(self) -> None:
        pass
