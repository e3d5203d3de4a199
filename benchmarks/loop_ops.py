"""The ops an export's search loops run per iteration, from the SavedModel's graph alone.

    python benchmarks/loop_ops.py EXPORT [EXPORT ...] [--signature serving_default]

For every `tf.while_loop` a signature runs (its body function, with the functions it calls,
both branches of a `tf.cond` counted), prints the ops the TensorFlow executor runs per
iteration and, among them, those that make a GPU wait for the device (a device-to-host
copy, a "host sync"): `Where` (its output size depends on values: the search's batch
compaction), `If` (the predicate is read on the host) and the loop's own predicate (also
in XLA:GPU, whose while loops copy the predicate to the host at every iteration). A
function compiled by XLA (`jit_compile`) counts as one op (one launch): its ops run inside
XLA, its own loops too (JSON lines, one per loop; "compiled": the loop runs inside XLA).
A figure of the graph, not a timing: a CPU-side regression check for the GPU serving path.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SYNC_OPS = ("Where", "If", "StatelessIf")
CALL_ATTRS = ("f", "then_branch", "else_branch", "body", "cond")


def load_library(path: str):
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    meta = saved.meta_graphs[0]
    return meta, {f.signature.name: f for f in meta.graph_def.library.function}


def called(node):
    """{attr: function name} of the functions a node calls."""
    out = {}
    for attr in CALL_ATTRS:
        if attr in node.attr and node.attr[attr].func.name:
            out[attr] = node.attr[attr].func.name
    return out


def compiled(function) -> bool:
    return function.attr["_XlaMustCompile"].b


def count(name, library, in_xla=False):
    """Ops an iteration of function `name` runs in the executor (nested calls inlined,
    nested loops and XLA functions one op each): Counter by op type."""
    ops = collections.Counter()
    for node in library[name].node_def:
        ops[node.op] += 1
        calls = called(node)
        if node.op in ("While", "StatelessWhile"):
            continue  # its iterations are counted as a loop of their own
        for callee in calls.values():
            if callee in library and not compiled(library[callee]):
                ops.update(count(callee, library))
    return ops


def loops(name, library, seen, in_xla=False, signature=""):
    """Every while loop reachable from function `name`: dicts of its figures."""
    found = []
    if name in seen or name not in library:
        return found
    seen.add(name)
    in_xla = in_xla or compiled(library[name])
    for node in library[name].node_def:
        calls = called(node)
        if node.op in ("While", "StatelessWhile"):
            body = count(calls["body"], library)
            cond = count(calls["cond"], library)
            per_iteration = body + cond
            found.append(
                {
                    "signature": signature,
                    "loop": node.name,
                    "compiled": in_xla,
                    "executor_ops_per_iteration": 0 if in_xla else sum(per_iteration.values()),
                    "host_syncs_per_iteration": {
                        # XLA:GPU too reads a while loop's predicate on the host
                        "loop_predicate": 1,
                        **{op: 0 if in_xla else per_iteration[op] for op in SYNC_OPS},
                    },
                    "xla_launches_per_iteration": sum(
                        n for op, n in per_iteration.items() if op.endswith("PartitionedCall")
                    )
                    if not in_xla
                    else 0,
                }
            )
        for callee in calls.values():
            found += loops(callee, library, seen, in_xla, signature)
    return found


def signature_loops(path: str, signature: str):
    meta, library = load_library(path)
    sig = meta.signature_def[signature]
    outputs = {t.name.split(":")[0] for t in sig.outputs.values()}
    nodes = {n.name: n for n in meta.graph_def.node}
    # the signature's call: the node its outputs come from
    roots = set()
    for name in outputs:
        node = nodes[name]
        roots.update(called(node).values())
        for inp in node.input:
            roots.update(called(nodes[inp.split(":")[0].lstrip("^")]).values())
    found, seen = [], set()
    for root in sorted(roots):
        found += loops(root, library, seen, signature=signature)
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="loop_ops.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("exports", nargs="+", help="SavedModel version directories")
    parser.add_argument("--signature", default="serving_default")
    args = parser.parse_args(argv)
    for path in args.exports:
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            print(f"loop_ops.py: error: {path}: no saved_model.pb; give a version directory",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        for loop in signature_loops(path, args.signature):
            print(json.dumps({"export": path, **loop}))


if __name__ == "__main__":
    main()
