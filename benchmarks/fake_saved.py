"""Every tensor autograd saves for backward in one Hugging Face training step, by the module and
the backward node that saved it: the reference for ``dml2comm.cost.memory.ActivationModel``
under ``--stack pytorch`` (``benchmarks/saved_by_op.py`` prints the tool's side).  A dev script
that needs torch and transformers (run it as ``benchmarks/fake_memory.py``, whose step, configs
and cuDNN attention routing it reuses):

    /work/fake-venv/bin/python benchmarks/fake_saved.py gpt2-small   # or llama-1b, any RUNS name
    /work/fake-venv/bin/python benchmarks/fake_saved.py llama-1b 1   # the layer to list (default 1)
    /work/fake-venv/bin/python benchmarks/fake_saved.py llama-0.3b 1 amp  # fp32 model under CPU autocast(bf16)
    /work/fake-venv/bin/python benchmarks/fake_saved.py gpt_neox 1 bf16   # a fixture of fake_fixtures.py (b=4, s=512)
    /work/fake-venv/bin/python benchmarks/fake_saved.py gpt_neox 1 bf16 cache  # ... with use_cache=True

One forward of ``model(input_ids, labels=input_ids)`` under ``FakeTensorMode`` inside
``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees every tensor an autograd node
saves (``ctx.save_for_backward`` of a custom Function included) and records the module running
at that moment; then the autograd graph is walked from the loss and each node's ``_saved_*``
tensors (``saved_tensors`` for a custom Function) are attributed to the node's name.  A storage
counts once, however many views or nodes keep it; parameters are not activations.  Printed: the
storages of one block with their bytes (rounded up to 512 as the caching allocator does),
dtype, shape and keepers, and per module the total.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fake_fixtures as ff  # noqa: E402  the fixtures' export configs
import fake_memory as fm  # noqa: E402  the step's configs and its SDPA routing


def saved_step(name: str, layer: int, mode: str = "bf16", use_cache: bool = False) -> None:
    """A RUNS row's step, or a fixture's (``fake_fixtures.BUILDERS``: its export config, b, s,
    ``use_cache`` as exported or, given ``cache``, transformers' default True)."""
    if name in ff.BUILDERS:
        ff.no_packed_sequences()
        cfg, _ = ff.export_config(ff.BUILDERS[name])
        ff.train_config(cfg)
        cfg.use_cache = use_cache
        saved_cfg(name, cfg, "clm", ff.B, ff.S, layer, mode, ff.EAGER.get(name, "sdpa"))
        return
    run = next(r for r in fm.RUNS if r[0] == name and r[5] == mode)
    _, kind, dims, b, s, mode = run
    saved_cfg(name, fm.hf_config(kind, **dims), "mlm" if kind == "bert" else "clm", b, s, layer, mode)


def saved_cfg(name: str, cfg, task: str, b: int, s: int, layer: int, mode: str, attn: str = "sdpa") -> None:
    """Lists the saved tensors of block ``layer`` of ``cfg``'s model (module docstring)."""
    import contextlib

    import transformers as tf
    cls = tf.AutoModelForMaskedLM if task == "mlm" else tf.AutoModelForCausalLM
    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fm._cudnn_sdpa
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = cls.from_config(cfg, attn_implementation=attn, dtype=fm.BF if mode == "bf16" else torch.float32)
            model.train()
            params = {id(p.untyped_storage()) for p in model.parameters()}
            stack: list[str] = ["-"]
            for mname, mod in model.named_modules():
                mod.register_forward_pre_hook(lambda _m, _a, n=mname: (stack.append(n), None)[1])
                mod.register_forward_hook(lambda _m, _a, _o: (stack.pop(), None)[1])  # a hook's value would replace the output
            info: dict[int, dict] = {}

            def pack(t: torch.Tensor):
                key = id(t.untyped_storage())
                if key not in params and key not in info:
                    n = t.untyped_storage().nbytes()
                    info[key] = dict(module=stack[-1], bytes=fm.BLOCK * math.ceil(n / fm.BLOCK), dtype=str(t.dtype).split(".")[-1],
                                     shape=list(t.shape), keepers=[], storage=t.untyped_storage())
                return t

            ids = torch.zeros((b, s), dtype=torch.int64, device=fm.DEVICE)
            amp = torch.autocast(fm.DEVICE, dtype=fm.BF) if mode == "amp" else contextlib.nullcontext()
            fp32_ops = fm.CudaFp32Ops() if mode == "amp" else contextlib.nullcontext()  # CUDA's fp32 list
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp, fp32_ops:
                out = model(input_ids=ids, labels=ids)
            seen, todo = set(), [out.loss.grad_fn]
            while todo:
                node = todo.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                todo.extend(f for f, _ in node.next_functions)
                tensors = []
                for attr in dir(node):
                    if attr.startswith("_saved_"):
                        v = getattr(node, attr)
                        tensors.extend(v if isinstance(v, (tuple, list)) else [v])
                if hasattr(node, "saved_tensors"):
                    tensors.extend(node.saved_tensors)
                for t in tensors:
                    if isinstance(t, torch.Tensor):
                        rec = info.get(id(t.untyped_storage()))
                        if rec is not None and node.name() not in rec["keepers"]:
                            rec["keepers"].append(node.name())
    finally:
        F.scaled_dot_product_attention = sdpa
    per_module: dict[str, int] = defaultdict(int)
    for rec in info.values():
        per_module[rec["module"]] += rec["bytes"]
    blocks_at = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList))  # the blocks' list
    prefix = f"{blocks_at}.{layer}"
    print(f"{name} b={b} s={s} {mode}: block {prefix}")
    block = 0
    for rec in info.values():
        if rec["module"] == prefix or rec["module"].startswith(prefix + "."):
            block += rec["bytes"]
            print(f"  {rec['bytes'] / 1e6:9.2f} MB {rec['dtype']:9s} {str(rec['shape']):22s} {rec['module'][len(prefix):] or '.':28s} "
                  f"kept by {', '.join(rec['keepers'])}")
    print(f"  block total {block / 1e6:.2f} MB")
    print("per module (not in a block):")
    blocks = 0
    for m, n in per_module.items():
        if m.startswith(prefix.rsplit(".", 1)[0] + "."):
            blocks += n
        else:
            print(f"  {n / 1e6:9.2f} MB {m}")
    print(f"  all blocks {blocks / 1e9:.3f} GB; everything saved {sum(per_module.values()) / 1e9:.3f} GB")


if __name__ == "__main__":
    saved_step(sys.argv[1] if len(sys.argv) > 1 else "gpt2-small", int(sys.argv[2]) if len(sys.argv) > 2 else 1,
               sys.argv[3] if len(sys.argv) > 3 else "bf16", sys.argv[4:5] == ["cache"])
