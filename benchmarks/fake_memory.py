"""Peak memory of Hugging Face training steps, counted without a GPU: reference points for
``dml2comm.cost.memory``.  A dev script: it needs torch and transformers, which the tool and its
tests never import.  Run it from its own virtual environment:

    python3 -m venv /work/fake-venv && /work/fake-venv/bin/pip install torch==2.13.0 transformers
    /work/fake-venv/bin/python benchmarks/fake_memory.py            # every run, writes the JSON
    /work/fake-venv/bin/python benchmarks/fake_memory.py gpt2-small  # one run, prints only

What it does.  The training step of ``measure_gpu.py`` (the script of the H100 measurements, dml2comm/validate/data/PROVENANCE.md) (``train_run``, the
script that measured ``h100/steps.json``) is run under ``torch._subclasses.fake_tensor.
FakeTensorMode`` on fake tensors (:data:`DEVICE`): every op runs its meta kernel (shapes, dtypes, no
data, no FLOPs), the model code, autograd and the optimizer run as on the GPU.  A
``TorchDispatchMode`` (:class:`Tally`) sees every tensor an op returns and counts its storage
once, rounded up to 512 bytes as the CUDA caching allocator rounds every block
(``c10/cuda/CUDACachingAllocator.cpp``, ``kMinBlockSize = 512``, ``round_size``), and uncounts
it when the storage dies (a weak reference's callback: the storage's Python object is kept
with its ``StorageImpl``).  So the count is the allocator's ``allocated_bytes`` and its maximum
is what ``torch.cuda.max_memory_allocated()`` reports, except for what the fake run never
allocates: cuBLAS/cuBLASLt and attention workspaces (tens of MB) and the allocator's splitting
of blocks (none counted in ``allocated_bytes``).  ``torch.distributed._tools.mem_tracker.
MemTracker`` does the same with categories; this tally adds the phase of the step at each peak.

The step, as ``train_run``: the model built from a config (random init) under
``attn_implementation="sdpa"``, in bf16 (mode ``bf16``; built in the dtype rather than by
``model.to(bfloat16)``, the same parameters) or fp32 under
``torch.autocast(bfloat16)`` (mode ``amp``: CPU autocast, whose fp32 list lacks CUDA's ``pow``,
``exp``, ``softmax``, ``layer_norm``, ...: :class:`CudaFp32Ops` runs those in fp32 as CUDA does; SDPA's
operands are cast to bf16 as autocast's SDPA kernel does, :func:`_cudnn_sdpa`), ``model(input_ids, labels=input_ids).loss
.backward(); opt.step(); opt.zero_grad(set_to_none=True)``, ``torch.optim.AdamW(fused=True)``.
Three warm-up steps, then the peak is reset to the current count (``reset_peak_memory_stats``)
and one step is counted: the optimizer states exist, the gradients do not.

SDPA: on fake CPU tensors it would pick a CPU kernel; on the H100 both traced steps ran cuDNN's
fused attention (``aten::_scaled_dot_product_cudnn_attention``, GQA key/value heads not
repeated; no score matrix in memory).  So SDPA is routed to that aten op, whose meta kernel
returns what the CUDA kernel does (output, log-sum-exp in fp32, RNG state), and the autograd
function saves what aten's derivative saves.  A mask the model passes (Falcon's explicit causal
mask) goes to the kernel as its additive ``attn_bias``, as aten's SDPA does (:func:`_cudnn_sdpa`).

Output (``benchmarks/data/fake_memory_hf.json``): per run, the peak and the phase it falls in
(``forward``: the model body; ``head_loss``: from the LM head's input through the loss;
``backward``; ``optimizer``), each phase's peak and what it holds (weights, gradients, optimizer
states, the rest: activations and transients), the count at the end of the body, after the
loss (the logits the script holds until then included), at the start of the optimizer step,
and the model states; and, for the two runs measured on the H100, the measured
``peak_alloc_bytes`` beside it (GPT-2 small b=8: 10.248 GB counted, 10.346 measured, -0.9%;
Llama-1B b=4: 34.403 for 34.471, -0.2%).  Every peak is the start of backward.  Nothing of the
tool is fitted to these numbers: ``tests/test_step_memory.py`` checks the model states and the
loss's bytes against them.
"""

from __future__ import annotations

import json
import math
import sys
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests" / "fixtures"))
from measured_configs import measured_config  # noqa: E402  (the fixture script's copy of measure_gpu.py's configs)
OUT = ROOT / "data" / "fake_memory_hf.json"
#: The two steps measured on the H100 (dml2comm/validate/data/h100_steps.json,
#: ``peak_alloc_bytes`` = ``torch.cuda.max_memory_allocated()``; the GPT-2 step's first
#: measurement; its repeat on another machine start read 10,337,111,040).
MEASURED = {("gpt2-small", 8, 1024, "bf16"): 10346023936, ("llama-1b", 4, 2048, "bf16"): 34471360512}
#: CUDA caching allocator block rounding (c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize).
BLOCK = 512
BF = torch.bfloat16
#: The fake tensors' device: fake CUDA tensors need a CUDA build for autograd (its input metadata
#: asks the device guard for a stream), so the step runs on fake CPU tensors, every op through
#: its meta kernel all the same (module docstring).
DEVICE = "cpu"

# name, kind, dims, micro-batch, seq, mode: measure_gpu.py's RUNS (its first two rows were
# measured), plus GPT-2 medium.
RUNS = [
    ("gpt2-small", "gpt2", dict(L=12, h=768, a=12), 8, 1024, "bf16"),
    ("llama-1b", "llama", dict(L=16, h=2048, a=32, kv=8, ffn=8192, V=128256, tie=True), 4, 2048, "bf16"),
    ("gpt2-6l-512", "gpt2", dict(L=6, h=512, a=8), 16, 1024, "bf16"),
    ("gpt2-small", "gpt2", dict(L=12, h=768, a=12), 4, 1024, "amp"),
    ("gpt2-medium", "gpt2", dict(L=24, h=1024, a=16), 8, 1024, "bf16"),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "bf16"),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "amp"),
    ("qwen2-1.5b", "qwen2", dict(L=12, h=1536, a=12, kv=2, ffn=8960, V=151936, tie=True), 2, 2048, "bf16"),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "bf16"),
]


def hf_config(kind: str, **kw):
    """The configs of measure_gpu.py's ``hf_config`` (the same arguments): the fixture script's
    copy (``tests/fixtures/measured_configs.py``), so the two dev scripts build one model."""
    return measured_config(kind, **kw)


class Tally(TorchDispatchMode):
    """Bytes of live tensor storages (module docstring), with the peak and its phase."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # id(storage) -> counted bytes
        self._refs: dict[int, weakref.ref] = {}
        self.now = 0
        self.peak = 0
        self.phase = "setup"
        self.peak_phase = "setup"
        self.phase_peak: dict[str, int] = {}
        self.parts: dict[str, dict[str, int]] = {}  # per phase: what its peak holds (``split``)
        self.split = None  # () -> {weights, grads, optimizer_states}: set while a step is counted

    def held(self, tensors) -> int:
        """Counted bytes of the distinct live storages of ``tensors``."""
        keys = {id(t.untyped_storage()) for t in tensors if t is not None}
        return sum(self.live.get(k, 0) for k in keys)

    def count(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        n = st.nbytes()
        n = BLOCK * math.ceil(n / BLOCK) if n else 0
        self.live[key] = n
        self.now += n

        def gone(_ref, key=key) -> None:
            self.now -= self.live.pop(key, 0)
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(st, gone)
        self._seen()

    def enter(self, phase: str) -> None:
        """A new phase of the step, holding what is live now to begin with."""
        self.phase = phase
        self._seen()

    def _seen(self) -> None:
        if self.now > self.peak:
            self.peak, self.peak_phase = self.now, self.phase
        if self.now > self.phase_peak.get(self.phase, 0):
            self.phase_peak[self.phase] = self.now
            if self.split is not None:
                parts = self.split()
                parts["other"] = self.now - sum(parts.values())
                self.parts[self.phase] = parts

    def reset_peak(self) -> None:
        self.peak, self.peak_phase, self.phase_peak, self.parts = self.now, self.phase, {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.count(t)
        return out


def _cudnn_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention as the H100 ran it (module docstring): cuDNN's kernel,
    grouped-query key/value heads passed as they are (the Llama trace's
    ``aten::_scaled_dot_product_cudnn_attention_backward`` reads k, v of [4, 8, 2048, 64])."""
    if torch.is_autocast_enabled(DEVICE):
        # autocast's SDPA kernel (lower_precision_fp on CUDA and CPU, aten/src/ATen/autocast_mode.cpp)
        # casts the operands; the cuDNN op this routes to is autocast's fallthrough, so cast here
        low = torch.get_autocast_dtype(DEVICE)
        query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(low)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # aten's scaled_dot_product_attention for the cuDNN backend (aten/src/ATen/native/transformers/
        # attention.cpp, convert_boolean_attn_mask_cudnn): a boolean mask becomes an additive one in
        # the query's dtype, where(~mask, -65504, 0), passed to the kernel as its attn_bias
        attn_mask = torch.where(attn_mask, torch.zeros((), dtype=query.dtype), torch.full((), -65504.0, dtype=query.dtype))
    return _CudnnAttention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale)


#: CUDA autocast's fp32 list (PyTorch docs, "Automatic Mixed Precision package": "CUDA Ops that can
#: autocast to float32"; ``rms_norm`` from autocast_mode.cpp), as the Python functions the models
#: call.  CPU autocast lacks most of them (its fp32 list is losses, linear algebra, FFTs, pooling),
#: so :class:`CudaFp32Ops` adds them to the CPU step (GPT-2's ``torch.pow(x, 3.0)`` in its GELU).
CUDA_FP32_FUNCS = frozenset({
    torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.Tensor.__rpow__, torch.rsqrt, torch.Tensor.rsqrt,
    torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log, torch.reciprocal, torch.Tensor.reciprocal,
    torch.softmax, torch.Tensor.softmax, F.softmax, torch.log_softmax, torch.Tensor.log_softmax, F.log_softmax,
    F.layer_norm, F.group_norm, F.rms_norm, torch.sum, torch.Tensor.sum, torch.cumsum, torch.Tensor.cumsum,
    torch.prod, torch.Tensor.prod, F.softplus, F.cross_entropy, F.nll_loss, F.normalize, torch.norm, torch.Tensor.norm,
    torch.tan, torch.Tensor.tan, torch.acos, torch.asin, torch.cosh, torch.sinh, torch.expm1, torch.log1p,
    torch.log2, torch.log10, torch.erfinv, torch.Tensor.erfinv,
})


class CudaFp32Ops(TorchFunctionMode):
    """While autocast is on: runs the ops of :data:`CUDA_FP32_FUNCS` on fp32 copies of their
    16-bit tensor arguments, as CUDA autocast's ``fp32`` policy does (``cached_cast(at::kFloat,
    ...)`` above Autograd: autograd saves the fp32 copy).  A Python-level stand-in, so only for
    calls the model makes itself, not for aten ops inside composites."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CUDA_FP32_FUNCS and torch.is_autocast_enabled(DEVICE):
            up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) else t  # noqa: E731
            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in kwargs.items()}
            with torch.autocast(DEVICE, enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


class _CudnnAttention(torch.autograd.Function):
    """aten's cuDNN attention forward/backward pair (torch/_meta_registrations.py gives their
    meta kernels); saves what aten's derivative formula for it saves (tools/autograd/
    derivatives.yaml: query, key, value, output, logsumexp, philox seed and offset)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_p, is_causal, scale):
        o, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, True, dropout_p, is_causal, False, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse, seed, offset, bias)  # attn_bias too, when given
        ctx.args = (cq, ck, mq, mk, dropout_p, is_causal, scale)
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse, seed, offset, bias = ctx.saved_tensors
        cq, ck, mq, mk, dropout_p, is_causal, scale = ctx.args
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, o, lse, seed, offset, bias, cq, ck, mq, mk, dropout_p, is_causal, scale=scale)
        return dq, dk, dv, None, None, None, None


def fake_step(name: str, kind: str, dims: dict, b: int, s: int, mode: str) -> dict:
    """One counted training step (module docstring) of a RUNS row."""
    row = dict(name=name, kind=kind, dims=dims, micro_batch=b, seq=s, mode=mode)
    row.update(count_step(hf_config(kind, **dims), "mlm" if kind == "bert" else "clm", b, s, mode))
    measured = MEASURED.get((name, b, s, mode))
    if measured is not None:
        row["measured_h100_peak_alloc_bytes"] = measured
        row["error_vs_measured"] = row["peak_alloc_bytes"] / measured - 1
    return row


def count_step(cfg, task: str, b: int, s: int, mode: str, attn: str = "sdpa") -> dict:
    """One counted training step (module docstring) of the model of the transformers config
    ``cfg`` (``task`` "clm": a causal LM, "mlm": a masked LM) at micro-batch ``b``, sequence ``s``:
    the peak, its phase and the marks (the rows' fields beside the run's name and dims).  ``attn``:
    transformers' attention implementation (``eager`` for a model without SDPA support)."""
    import transformers as tf

    cls = tf.AutoModelForMaskedLM if task == "mlm" else tf.AutoModelForCausalLM
    tally = Tally()
    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _cudnn_sdpa
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), tally:
            # built in its dtype rather than converted (Module.to on fake tensors swaps them,
            # which their weak references forbid): the same parameters as model.to(bfloat16)
            model = cls.from_config(cfg, attn_implementation=attn, dtype=BF if mode == "bf16" else torch.float32)
            model.train()
            params = sum(p.numel() for p in model.parameters())
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
            ids = torch.zeros((b, s), dtype=torch.int64, device=DEVICE)  # token ids: their values never matter
            marks: dict[str, int] = {}
            head = model.get_output_embeddings() if task == "clm" else model.cls

            def at_head(_module, _args) -> None:
                # the LM head and the loss: what the forward holds before them is "forward"
                if tally.split is not None:
                    marks["end_of_body_bytes"] = tally.now
                tally.enter("head_loss")

            head.register_forward_pre_hook(at_head)
            plist = list(model.parameters())

            def split() -> dict[str, int]:
                return {"weights": tally.held(plist), "grads": tally.held(p.grad for p in plist),
                        "optimizer_states": tally.held(t for st in opt.state.values() for t in st.values()
                                                       if isinstance(t, torch.Tensor))}

            def step(record: bool) -> None:
                tally.enter("forward")
                if mode == "amp":
                    with torch.autocast(DEVICE, dtype=BF), CudaFp32Ops():
                        out = model(input_ids=ids, labels=ids)
                else:
                    out = model(input_ids=ids, labels=ids)
                loss, logits = out.loss, out.logits
                del out
                if record:
                    marks["after_loss_bytes"] = tally.now
                del logits  # the training loop keeps only the loss
                tally.enter("backward")
                loss.backward()
                del loss
                if record:
                    marks["before_optimizer_bytes"] = tally.now
                tally.enter("optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
                tally.enter("idle")
                if record:
                    marks["after_step_bytes"] = tally.now

            for _ in range(3):
                step(False)
            tally.reset_peak()
            tally.split = split
            start = tally.now
            step(True)
            tally.split = None
            states = sum(t.untyped_storage().nbytes() for st in opt.state.values() for t in st.values()
                         if isinstance(t, torch.Tensor))
            weights = sum(p.untyped_storage().nbytes() for p in model.parameters())
    finally:
        F.scaled_dot_product_attention = sdpa
    return dict(params=params, peak_alloc_bytes=tally.peak, peak_phase=tally.peak_phase,
                phase_peak_bytes=dict(sorted(tally.phase_peak.items())), phase_peak_parts=dict(sorted(tally.parts.items())),
                start_bytes=start, weights_bytes=weights, optimizer_state_bytes=states, **marks)


def main(argv: list[str]) -> None:
    import transformers
    pick = set(argv)
    rows = []
    for run in RUNS:
        if pick and run[0] not in pick:
            continue
        row = fake_step(*run)
        rows.append(row)
        extra = f"  measured {row['measured_h100_peak_alloc_bytes'] / 1e9:.3f} GB ({row['error_vs_measured']:+.1%})" \
            if "measured_h100_peak_alloc_bytes" in row else ""
        print(f"{row['name']:12s} b={row['micro_batch']:<3d} s={row['seq']:<5d} {row['mode']:4s} peak "
              f"{row['peak_alloc_bytes'] / 1e9:7.3f} GB in {row['peak_phase']:9s} "
              + " ".join(f"{k}={v / 1e9:.3f}" for k, v in row["phase_peak_bytes"].items()) + extra, flush=True)
    if pick:
        return
    doc = {
        "how": "benchmarks/fake_memory.py: measure_gpu.py's train_run step under FakeTensorMode on fake CUDA tensors, "
               "every tensor storage counted once, rounded to 512 B, uncounted when it dies; 3 warm-up steps, "
               "peak reset, one step counted (see the script's docstring)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "not_counted": "cuBLAS/cuBLASLt and attention workspaces (tens of MB on an H100); the CUDA context",
        "runs": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
