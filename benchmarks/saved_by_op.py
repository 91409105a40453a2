"""What the activation model keeps for backward in one layer of a measured step, by the op
that keeps it: the tool's side of the comparison with ``benchmarks/fake_saved.py`` (autograd's
saved tensors of the same step).  Prints only.

    PYTHONPATH=. .venv/bin/python benchmarks/saved_by_op.py [gpt2-small|llama-1b|MODEL.onnx B S] [LAYER] [bf16|amp]

``amp``: the fp32 model under ``torch.autocast(bfloat16)`` (``--precision amp``; its casts' copies
are keyed ``cast:<op>:<tensor>``), as ``fake_saved.py NAME LAYER amp``.

Each storage is listed once, under the first op (graph order) that keeps it, with the other
keepers' op types, its producer's op type and its bytes; then the totals per layer kind.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from importlib import resources
from pathlib import Path

from dml2comm.cost.cache import activation_model_of, layers_of
from dml2comm.ir.onnx_import import ImportOptions
from dml2comm.load import load_model
from dml2comm.validate import steps

STEPS = {"gpt2-small": ("step_gpt2_small_dynamo.onnx", 8, 1024), "llama-1b": ("step_llama_1b_dynamo.onnx", 4, 2048)}


def main(argv: list[str]) -> None:
    name = argv[0] if argv else "gpt2-small"
    if name in STEPS:
        file, b, s = STEPS[name]
        rest = argv[1:]
        with resources.as_file(steps.model_path(file)) as path:
            imported = load_model(path, ImportOptions(batch_size=b, seq_len=s))
    else:
        b, s, rest = int(argv[1]), int(argv[2]), argv[3:]
        imported = load_model(Path(name), ImportOptions(batch_size=b, seq_len=s))
    graph = imported.graph
    mode = rest[1] if len(rest) > 1 else "bf16"
    act = activation_model_of(graph, 1, False, "bf16", False, "pytorch", "flash", autocast=mode == "amp")
    layered = layers_of(graph)
    blocks = [l for l in layered.layers if l.kind == "block"]
    pick = int(rest[0]) if rest else 1
    layer = blocks[pick] if blocks else layered.layers[0]
    keepers: dict[str, list[int]] = defaultdict(list)
    nbytes: dict[str, float] = {}
    for i in layer.op_indices:
        for key, n in act.saved_by_op[i]:
            keepers[key].append(i)
            nbytes[key] = max(nbytes.get(key, 0.0), n)
    print(f"{graph.name} b={b} s={s} {mode}: layer {layer.name} ({layer.kind}), {len(layer.op_indices)} ops")
    by_type: dict[str, float] = defaultdict(float)
    for key in sorted(keepers, key=lambda k: keepers[k][0]):
        ops = [graph.ops[i] for i in keepers[key]]
        prod = graph.producer(key)
        t = graph.tensor(key)
        shape = list(t.shape) if t is not None else ""
        print(f"  {nbytes[key] / 1e6:9.2f} MB  {key[:48]:48s} made by {graph.ops[prod].op_type if prod is not None else '-':10s} "
              f"{str(shape):22s} kept by {', '.join(op.op_type for op in ops)}")
        by_type[ops[0].op_type] += nbytes[key]
    total = act.saved_bytes(layer.op_indices)
    print("  by first keeper: " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])))
    print(f"  layer total {total / 1e6:.2f} MB; all layers {sum(act.saved_bytes(l.op_indices) for l in layered.layers) / 1e9:.3f} GB "
          f"({len(blocks)} blocks)")


if __name__ == "__main__":
    main(sys.argv[1:])
