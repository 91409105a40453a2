"""Ground truth measured on one GPU: what a training step of a real model really costs.

Runs on a machine with an NVIDIA GPU and torch + transformers installed, never in tests or CI:
  1. training steps of real Hugging Face models (random init from a config; nothing downloaded):
     step time (median of timed steps after warm-up) and peak allocated memory, in pure bf16
     (params, grads, AdamW states in bf16) and in torch AMP (fp32 params, bf16 autocast);
  2. a Kineto trace (record_shapes) of one step of two of them, for `calibrate`;
  3. bf16 GEMMs at the forward, data-gradient and weight-gradient layouts of nn.Linear;
  4. flash attention (SDPA) forward+backward, layer norm, AdamW step.
Writes $OUT/gpu_measured_set1.json (+ traces). --dry runs tiny sizes on the CPU to check the script.
Run: `PYTHONUNBUFFERED=1 BUDGET_S=400 python3 measure_gpu.py` (env PARTS=runs,gemm,attn,misc; OUT=folder).
"""
import gzip, json, math, os, shutil, subprocess, sys, tempfile, time, traceback

import torch
import torch.nn.functional as F

DRY = "--dry" in sys.argv
DEV = "cpu" if DRY else "cuda"
OUT = os.environ.get("OUT") or os.path.join(tempfile.gettempdir(), "gpu_measured")
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
BUDGET = float(os.environ.get("BUDGET_S", "400"))
PARTS = os.environ.get("PARTS", "runs,gemm,attn,misc").split(",")
SET = os.environ.get("SET", "1")
# LINGER=1 (added after the bundled runs, which ran without it): every run timed once before any
# profiling in the process ("phase": "clean"), then the usual pass (timed, then traced: "traced"),
# so that a step timed after an earlier profiled step can be told from the same step timed
# before any (benchmarks/profiler_linger.py).  TEARDOWN_CUPTI=1 in the environment makes Kineto
# detach CUPTI after each profiling session; its value is recorded in "env".
LINGER = os.environ.get("LINGER") == "1"
R = {"env": {}, "runs": [], "gemm": [], "attn": [], "misc": [], "errors": [], "traces": []}
BF = torch.bfloat16


def left():
    return BUDGET - (time.time() - T0)


def save():
    with open(os.path.join(OUT, f"gpu_measured_set{SET}.json"), "w") as f:
        json.dump(R, f, indent=1)


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps, warm=3):
    """Median seconds of fn() over reps runs, CUDA events on the GPU."""
    for _ in range(warm):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        if DEV == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2], ts[0], ts[-1]


def timed_graph(fn, inner, reps=7):
    """Median seconds of one fn() call: `inner` calls captured in a CUDA graph, replayed `reps`
    times between events, so the CPU's dispatch time never starves the GPU."""
    if DEV != "cuda":
        return timed(fn, reps)[0]
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay(); sync()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / inner)
    del g
    ts.sort()
    return ts[len(ts) // 2]


def timed_queue(fn, inner, reps=5):
    """Median seconds of one fn() call, `inner` calls queued back to back between two events."""
    if DEV != "cuda":
        return timed(fn, reps)[0]
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / inner)
    ts.sort()
    return ts[len(ts) // 2]


def env():
    import transformers
    e = {"torch": torch.__version__, "transformers": transformers.__version__, "dry": DRY,
         "linger": LINGER, "teardown_cupti": os.environ.get("TEARDOWN_CUPTI")}
    if DEV == "cuda":
        p = torch.cuda.get_device_properties(0)
        e.update(gpu=p.name, sms=p.multi_processor_count, mem_bytes=p.total_memory,
                 cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        try:
            e["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
        except Exception as ex:
            e["nvidia_smi"] = repr(ex)
    R["env"] = e


# ---------------------------------------------------------------- 1. training steps
def hf_config(kind, **kw):
    import transformers as tf
    if kind == "gpt2":
        return tf.GPT2Config(n_layer=kw["L"], n_embd=kw["h"], n_head=kw["a"], vocab_size=kw.get("V", 50257),
                             n_positions=kw.get("npos", 1024), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if kind == "llama":
        return tf.LlamaConfig(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                              num_key_value_heads=kw["kv"], intermediate_size=kw["ffn"], vocab_size=kw["V"],
                              tie_word_embeddings=kw.get("tie", False), max_position_embeddings=kw.get("npos", 4096),
                              head_dim=kw["h"] // kw["a"])
    if kind == "bert":
        return tf.BertConfig(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                             intermediate_size=4 * kw["h"], max_position_embeddings=512,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if kind == "vit":
        return tf.ViTConfig(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                            intermediate_size=4 * kw["h"], image_size=224, patch_size=16, num_labels=1000,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if kind == "resnet":
        extra = {k: kw[k] for k in ("layer_type", "hidden_sizes") if k in kw}
        return tf.ResNetConfig(depths=kw.get("depths", [3, 4, 6, 3]), num_labels=1000, **extra)
    if kind == "mixtral":
        return tf.MixtralConfig(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                                num_key_value_heads=kw["kv"], intermediate_size=kw["ffn"], vocab_size=kw["V"],
                                num_local_experts=kw["E"], num_experts_per_tok=kw["k"], max_position_embeddings=4096,
                                head_dim=kw["h"] // kw["a"])
    if kind == "qwen2":
        return tf.Qwen2Config(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                              num_key_value_heads=kw["kv"], intermediate_size=kw["ffn"], vocab_size=kw["V"],
                              tie_word_embeddings=kw.get("tie", True), max_position_embeddings=kw.get("npos", 4096))
    if kind == "qwen3":
        return tf.Qwen3Config(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                              num_key_value_heads=kw["kv"], head_dim=kw.get("hd", kw["h"] // kw["a"]),
                              intermediate_size=kw["ffn"], vocab_size=kw["V"],
                              tie_word_embeddings=kw.get("tie", True), max_position_embeddings=kw.get("npos", 4096))
    if kind == "gemma":
        return tf.GemmaConfig(num_hidden_layers=kw["L"], hidden_size=kw["h"], num_attention_heads=kw["a"],
                              num_key_value_heads=kw["kv"], head_dim=kw.get("hd", kw["h"] // kw["a"]),
                              intermediate_size=kw["ffn"], vocab_size=kw["V"],
                              hidden_activation="gelu_pytorch_tanh", max_position_embeddings=kw.get("npos", 4096))
    raise ValueError(kind)


# name, kind, dims, micro-batch, seq, mode (bf16 | amp), profile?  -- edit freely
RUNS = [
    ("gpt2-small", "gpt2", dict(L=12, h=768, a=12), 8, 1024, "bf16", True),
    ("gpt2-6l-512", "gpt2", dict(L=6, h=512, a=8), 16, 1024, "bf16", False),
    ("gpt2-small", "gpt2", dict(L=12, h=768, a=12), 4, 1024, "amp", False),
    ("llama-1b", "llama", dict(L=16, h=2048, a=32, kv=8, ffn=8192, V=128256, tie=True), 4, 2048, "bf16", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "bf16", False),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "amp", False),
    ("qwen2-1.5b", "qwen2", dict(L=12, h=1536, a=12, kv=2, ffn=8960, V=151936, tie=True), 2, 2048, "bf16", False),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "bf16", False),
    ("vit-8l-512", "vit", dict(L=8, h=512, a=8), 128, 224, "bf16", False),
    ("resnet18", "resnet", dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512]), 256, 224, "bf16", False),
]
G2 = dict(L=12, h=768, a=12)
L1 = dict(L=16, h=2048, a=32, kv=8, ffn=8192, V=128256, tie=True)
RUNS3 = [  # set 3: one model at several shapes (pairs for --profile), each step traced
    ("gpt2-small", "gpt2", G2, 8, 1024, "bf16", True),
    ("llama-1b", "llama", L1, 4, 2048, "bf16", True),
    ("gpt2-small", "gpt2", G2, 4, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 16, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 16, 512, "bf16", True),
    ("gpt2-small", "gpt2", G2, 2, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 32, 256, "bf16", True),
    ("llama-1b", "llama", L1, 2, 2048, "bf16", True),
    ("llama-1b", "llama", L1, 8, 2048, "bf16", True),
    ("llama-1b", "llama", L1, 8, 1024, "bf16", True),
    ("llama-1b", "llama", L1, 1, 4096, "bf16", True),
    ("gpt2-medium", "gpt2", dict(L=24, h=1024, a=16), 8, 1024, "bf16", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "bf16", True),
    ("qwen2-1.5b", "qwen2", dict(L=12, h=1536, a=12, kv=2, ffn=8960, V=151936, tie=True), 2, 2048, "bf16", True),
    ("gpt2-small", "gpt2", G2, 8, 1024, "amp", True),
    ("llama-1b", "llama", L1, 4, 2048, "amp", True),
]
RUNS4 = [  # set 4: the other architectures of the model list, each traced
    ("gpt2-6l-512", "gpt2", dict(L=6, h=512, a=8), 16, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 4, 1024, "amp", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "amp", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "bf16", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 128, 128, "bf16", True),
    ("vit-8l-512", "vit", dict(L=8, h=512, a=8), 128, 224, "bf16", True),
    ("vit-8l-512", "vit", dict(L=8, h=512, a=8), 256, 224, "bf16", True),
    ("resnet18", "resnet", dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512]), 256, 224, "bf16", True),
    ("resnet18", "resnet", dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512]), 128, 224, "bf16", True),
    ("resnet18", "resnet", dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512]), 256, 224, "amp", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "amp", True),
]
RUNS5 = [  # set 5: the CPU side of different architectures on one machine (same process pairs)
    ("gpt2-small", "gpt2", G2, 8, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 2, 1024, "bf16", True),
    ("gpt2-small", "gpt2", G2, 8, 1024, "amp", True),
    ("gpt2-small", "gpt2", G2, 2, 1024, "amp", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 8, 2048, "bf16", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 1, 2048, "bf16", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "bf16", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 16, 128, "bf16", True),
    ("vit-8l-512", "vit", dict(L=8, h=512, a=8), 32, 224, "bf16", True),
    ("resnet18", "resnet", dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512]), 16, 224, "bf16", True),
    ("gpt2-6l-512", "gpt2", dict(L=6, h=512, a=8), 2, 1024, "bf16", True),
]
MX = dict(L=8, h=1024, a=16, kv=8, ffn=2048, V=32000, E=8, k=2)
Q3 = dict(L=28, h=1024, a=16, kv=8, hd=128, ffn=3072, V=151936, tie=True)
GM = dict(L=6, h=2048, a=8, kv=1, hd=256, ffn=16384, V=256000)
L3 = dict(L=8, h=3072, a=24, kv=8, ffn=8192, V=128256)
Q05 = dict(L=24, h=896, a=14, kv=2, ffn=4864, V=151936, tie=True)
R50 = dict(depths=[3, 4, 6, 3])
R18 = dict(depths=[2, 2, 2, 2], layer_type="basic", hidden_sizes=[64, 128, 256, 512])
RUNS6 = [  # set 6: models no constant was fitted on (held out), other shapes of the measured ones, on an H200
    ("mixtral-8x0.1b", "mixtral", MX, 4, 2048, "bf16", True),
    ("mixtral-8x0.1b", "mixtral", MX, 8, 1024, "bf16", True),
    ("mixtral-8x0.1b", "mixtral", MX, 2, 2048, "bf16", True),
    ("mixtral-8x0.1b", "mixtral", MX, 4, 2048, "amp", True),
    ("qwen3-0.6b", "qwen3", Q3, 4, 2048, "bf16", True),
    ("qwen3-0.6b", "qwen3", Q3, 8, 1024, "bf16", True),
    ("gemma-1b", "gemma", GM, 2, 2048, "bf16", True),
    ("gemma-1b", "gemma", GM, 4, 2048, "bf16", True),
    ("llama-3b-8l", "llama", L3, 2, 4096, "bf16", True),
    ("llama-3b-8l", "llama", L3, 4, 2048, "bf16", True),
    ("qwen2-0.5b", "qwen2", Q05, 4, 2048, "bf16", True),
    ("qwen2-0.5b", "qwen2", Q05, 4, 2048, "amp", True),
    ("gpt2-large", "gpt2", dict(L=36, h=1280, a=20), 4, 1024, "bf16", True),
    ("gpt2-large", "gpt2", dict(L=36, h=1280, a=20), 8, 1024, "bf16", True),
    ("bert-base", "bert", dict(L=12, h=768, a=12), 32, 512, "bf16", True),
    ("bert-base", "bert", dict(L=12, h=768, a=12), 128, 128, "bf16", True),
    ("bert-base", "bert", dict(L=12, h=768, a=12), 32, 512, "amp", True),
    ("vit-base", "vit", dict(L=12, h=768, a=12), 64, 224, "bf16", True),
    ("vit-base", "vit", dict(L=12, h=768, a=12), 128, 224, "bf16", True),
    ("resnet50", "resnet", R50, 128, 224, "bf16", True),
    ("resnet50", "resnet", R50, 128, 224, "amp", True),
    ("resnet50", "resnet", R50, 64, 224, "bf16", True),
    ("bert-6l-512", "bert", dict(L=6, h=512, a=8), 64, 128, "bf16", True),
    ("vit-8l-512", "vit", dict(L=8, h=512, a=8), 128, 224, "bf16", True),
    ("resnet18", "resnet", R18, 256, 224, "bf16", True),
    ("gpt2-small", "gpt2", G2, 1, 1024, "bf16", True),
    ("llama-0.3b", "llama", dict(L=12, h=1024, a=16, kv=4, ffn=2816, V=32000), 4, 1024, "bf16", True),
    ("llama-1b", "llama", L1, 2, 4096, "bf16", True),
]
MX4 = dict(L=6, h=2048, a=16, kv=8, ffn=2816, V=32000, E=4, k=1)
MX16 = dict(L=4, h=1024, a=16, kv=4, ffn=1024, V=32000, E=16, k=4)
RUNS7 = [  # set 7: two more mixture-of-experts shapes (top-1 of 4, top-4 of 16), held out from the grouped-GEMM import
    ("mixtral-4x0.3b-top1", "mixtral", MX4, 4, 2048, "bf16", True),
    ("mixtral-4x0.3b-top1", "mixtral", MX4, 8, 2048, "bf16", True),
    ("mixtral-4x0.3b-top1", "mixtral", MX4, 4, 2048, "amp", True),
    ("mixtral-16x0.03b-top4", "mixtral", MX16, 8, 1024, "bf16", True),
    ("mixtral-16x0.03b-top4", "mixtral", MX16, 16, 1024, "bf16", True),
    ("mixtral-16x0.03b-top4", "mixtral", MX16, 8, 1024, "amp", True),
]
if os.environ.get("SET") == "7":
    RUNS = RUNS7
if os.environ.get("SET") == "6":
    RUNS = RUNS6[::-1] if os.environ.get("REV") else RUNS6
if os.environ.get("SET") == "5":
    RUNS = RUNS5
if os.environ.get("SET") == "3":
    RUNS = RUNS3
if os.environ.get("SET") == "4":
    RUNS = RUNS4
if DRY:
    RUNS = [("gpt2-tiny", "gpt2", dict(L=2, h=64, a=4, V=1000), 2, 32, "bf16", True),
            ("llama-tiny", "llama", dict(L=2, h=64, a=4, kv=2, ffn=128, V=1000, tie=True), 2, 32, "amp", False),
            ("bert-tiny", "bert", dict(L=2, h=64, a=4), 2, 32, "bf16", False),
            ("vit-tiny", "vit", dict(L=2, h=64, a=4), 2, 224, "bf16", False),
            ("resnet-tiny", "resnet", dict(depths=[1, 1, 1, 1]), 2, 64, "amp", True),
            ("mixtral-tiny", "mixtral", dict(L=2, h=64, a=4, kv=2, ffn=96, V=1000, E=4, k=2), 2, 32, "bf16", False)]


def train_run(name, kind, dims, b, s, mode, profile):
    import transformers as tf
    cfg = hf_config(kind, **dims)
    torch.manual_seed(0)
    task = {"bert": "mlm", "vit": "image", "resnet": "image"}.get(kind, "clm")
    cls = {"clm": tf.AutoModelForCausalLM, "mlm": tf.AutoModelForMaskedLM, "image": tf.AutoModelForImageClassification}[task]
    kw = {} if kind == "resnet" else {"attn_implementation": "sdpa"}
    with torch.device(DEV):
        model = cls.from_config(cfg, **kw)
    model.to(dtype=BF if mode == "bf16" else torch.float32)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=(DEV == "cuda"))
    if task == "image":
        inputs = dict(pixel_values=torch.randn(b, 3, s, s, device=DEV, dtype=BF if mode == "bf16" else torch.float32),
                      labels=torch.randint(0, 1000, (b,), device=DEV))
    else:
        ids = torch.randint(0, cfg.vocab_size, (b, s), device=DEV)
        inputs = dict(input_ids=ids, labels=ids)

    def step():
        if mode == "amp":
            with torch.autocast(DEV, dtype=BF):
                loss = model(**inputs).loss
        else:
            loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync()
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
    reps = 3 if DRY else 10
    ts = []
    hs = []
    for _ in range(reps):
        sync(); t = time.perf_counter(); step(); hs.append(time.perf_counter() - t); sync(); ts.append(time.perf_counter() - t)
    ts.sort(); hs.sort()
    rec = dict(task=task, name=name, kind=kind, dims=dims, micro_batch=b, seq=s, mode=mode, params=params,
               step_s_median=ts[len(ts) // 2], step_s_min=ts[0], step_s_max=ts[-1], steps=reps,
               attn=getattr(model.config, "_attn_implementation", None), host_issue_s_median=hs[len(hs) // 2])
    if DEV == "cuda":
        rec.update(peak_alloc_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved())
        tok = b * s
        rec["tflops_6N"] = 6 * params * tok / rec["step_s_median"] / 1e12
    if profile and left() > 60:
        from torch.profiler import ProfilerActivity, profile as prof
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
        with prof(activities=acts, record_shapes=True) as p:
            sync(); t = time.perf_counter(); step(); prof_h = time.perf_counter() - t; sync(); prof_s = time.perf_counter() - t
        rec["profiled_step_s"] = prof_s
        rec["profiled_host_issue_s"] = prof_h
        raw = os.path.join("/tmp", f"trace_{name}_{mode}.json")
        p.export_chrome_trace(raw)
        gz = os.path.join("/tmp", f"trace_{name}_{mode}_b{b}_s{s}.json.gz")
        with open(raw, "rb") as fi, gzip.open(gz, "wb", compresslevel=6) as fo:
            shutil.copyfileobj(fi, fo)
        sz = os.path.getsize(gz)
        if sz > 15 * 2**20:
            os.remove(gz)
            R["errors"].append(f"trace {name} too large: {sz}")
        else:
            import tarfile
            with tarfile.open(os.path.join(OUT, f"traces_set{SET}.tar"), "a") as tf_:
                tf_.add(gz, arcname=os.path.basename(gz))
            R["traces"].append(dict(file=os.path.basename(gz), run=name, mode=mode, micro_batch=b, seq=s, bytes=sz))
    del model, opt, inputs
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return rec


# ---------------------------------------------------------------- 2. GEMMs
def gemm_shapes():
    Ms = [256, 1024] if DRY else [2048, 8192, 16384]
    NK = [  # (N, K): nn.Linear weight [N, K]; dense and tensor-parallel shards of common widths
        (2304, 768), (768, 768), (3072, 768), (768, 3072), (50257, 768),
        (3072, 1024), (1024, 1024), (4096, 1024), (1024, 4096), (50257, 1024),
        (3840, 1280), (1280, 1280), (5120, 1280), (1280, 5120),
        (3072, 2048), (2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (16384, 2048), (128256, 2048),
        (1152, 896), (896, 896), (9728, 896), (896, 4864), (151936, 896),
        (12288, 4096), (4096, 4096), (16384, 4096), (4096, 16384), (6144, 4096), (4096, 2048),
        (24576, 8192), (8192, 8192), (28672, 8192), (8192, 28672), (3072, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
        (4608, 12288), (12288, 1536), (6144, 12288), (12288, 6144), (2304, 12288), (12288, 3072),
        (9216, 18432), (18432, 2304), (9216, 25600), (25600, 3200),
    ]
    if DRY:
        NK = [(256, 64), (64, 256)]
    out = []
    for M in Ms:
        for N, K in NK:
            if M == 16384 and N * K > 16384 * 4096:
                continue
            out.append((M, N, K))
    return out


def gemm_part():
    for M, N, K in gemm_shapes():
        if left() < 40:
            R["errors"].append(f"gemm stopped at {M},{N},{K}: budget"); break
        x = torch.randn(M, K, device=DEV, dtype=BF)
        W = torch.randn(N, K, device=DEV, dtype=BF) * 0.02
        g = torch.randn(M, N, device=DEV, dtype=BF)
        flop = 2.0 * M * N * K
        est = flop / 6e14
        inner = 2 if DRY else max(3, min(50, int(0.02 / max(est, 2e-6))))
        y, dx, dw = (torch.empty(M, N, device=DEV, dtype=BF), torch.empty(M, K, device=DEV, dtype=BF),
                     torch.empty(N, K, device=DEV, dtype=BF))
        row = dict(M=M, N=N, K=K, method="cuda graph of %d calls" % inner)
        for kind, fn in (("fwd", lambda: torch.mm(x, W.t(), out=y)), ("dgrad", lambda: torch.mm(g, W, out=dx)),
                         ("wgrad", lambda: torch.mm(g.t(), x, out=dw))):
            med = timed_graph(fn, inner)
            row[kind + "_s"] = med
            row[kind + "_tflops"] = flop / med / 1e12
        R["gemm"].append(row)
        del x, W, g, y, dx, dw


# ---------------------------------------------------------------- 3. attention, norms, optimizer
def attn_part():
    shapes = [(8, 12, 1024, 64), (16, 12, 1024, 64), (8, 16, 1024, 64), (4, 32, 2048, 64), (2, 24, 2048, 128),
              (8, 14, 2048, 64), (2, 12, 4096, 128), (1, 64, 4096, 128), (1, 96, 2048, 128), (4, 16, 8192, 128)]
    if DRY:
        shapes = [(2, 4, 32, 16)]
    for b, a, s, d in shapes:
        if left() < 30:
            break
        q, k, v = (torch.randn(b, a, s, d, device=DEV, dtype=BF, requires_grad=True) for _ in range(3))
        go = torch.randn(b, a, s, d, device=DEV, dtype=BF)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(go)
        f_med = timed_graph(fwd, 2 if DRY else 20)
        fb_med = timed_queue(fb, 2 if DRY else 20)
        R["attn"].append(dict(b=b, heads=a, seq=s, head_dim=d, causal=True, fwd_s=f_med, fwd_bwd_s=fb_med,
                              method="fwd: cuda graph; fwd+bwd: 20 queued calls"))


def misc_part():
    for M, h in ([(2048, 64)] if DRY else [(8192, 768), (16384, 1024), (8192, 2048), (8192, 4096), (4096, 12288)]):
        if left() < 20:
            break
        x = torch.randn(M, h, device=DEV, dtype=BF, requires_grad=True)
        w = torch.ones(h, device=DEV, dtype=BF, requires_grad=True)
        bb = torch.zeros(h, device=DEV, dtype=BF, requires_grad=True)
        go = torch.randn(M, h, device=DEV, dtype=BF)
        xd = x.detach()
        t_ln = timed_graph(lambda: F.layer_norm(xd, (h,), w.detach(), bb.detach()), 20)
        def ln_fb():
            F.layer_norm(x, (h,), w, bb).backward(go)
        t_lnfb = timed_queue(ln_fb, 20)
        xg = torch.randn(M, 4 * h, device=DEV, dtype=BF)
        t_gelu = timed_graph(lambda: F.gelu(xg, approximate="tanh"), 20)
        y = torch.empty_like(xg)
        t_copy = timed_graph(lambda: y.copy_(xg), 20)
        R["misc"].append(dict(op="layernorm_gelu_copy", M=M, h=h, ln_fwd_s=t_ln, ln_fwd_bwd_s=t_lnfb,
                              gelu_4h_s=t_gelu, copy_4h_s=t_copy, copy_4h_bytes=2 * xg.numel() * 2))
    for n, dt in ([(10**5, BF)] if DRY else [(124_000_000, BF), (124_000_000, torch.float32), (1_200_000_000, BF), (500_000_000, torch.float32)]):
        if left() < 20:
            break
        p = torch.nn.Parameter(torch.randn(n, device=DEV, dtype=dt) * 0.01)
        p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW([p], lr=1e-5, fused=(DEV == "cuda"))
        t = timed_queue(opt.step, 5)
        R["misc"].append(dict(op="adamw_fused", params=n, dtype=str(dt), step_s=t))
        del p, opt


def main():
    env()
    save()
    log("env", R["env"])
    for part in PARTS:
        try:
            if part == "runs":
                passes = (("clean", False), ("traced", True)) if LINGER else ((None, True),)
                for phase, traced in passes:
                    for name, kind, dims, b, s, mode, profile in RUNS:
                        if left() < 90:
                            R["errors"].append(f"runs stopped before {name} {mode}: budget"); break
                        try:
                            rec = train_run(name, kind, dims, b, s, mode, profile and traced)
                            if phase:
                                rec["phase"] = phase
                            R["runs"].append(rec)
                            log("run", name, mode, b, s, f"{rec['step_s_median'] * 1e3:.1f} ms",
                                f"{rec.get('peak_alloc_bytes', 0) / 2**30:.2f} GiB", f"{rec.get('tflops_6N', 0):.0f} TF")
                        except Exception as ex:
                            R["errors"].append(f"run {name} {mode}: {ex!r}"[:500])
                            log("FAIL run", name, mode, repr(ex)[:300])
                            if DEV == "cuda":
                                torch.cuda.empty_cache()
                        save()
            elif part == "gemm":
                gemm_part(); log("gemm", len(R["gemm"]))
            elif part == "attn":
                attn_part(); log("attn", len(R["attn"]))
            elif part == "misc":
                misc_part(); log("misc", len(R["misc"]))
        except Exception as ex:
            R["errors"].append(f"{part}: {traceback.format_exc()[-800:]}")
            log("FAIL", part, repr(ex)[:300])
        save()
    log("errors", R["errors"])
    for r in R["runs"]:
        print(f"{r['name']:16s} {r['mode']:4s} b={r['micro_batch']:2d} s={r['seq']:5d} {r['step_s_median'] * 1e3:8.1f} ms "
              f"{r.get('peak_alloc_bytes', 0) / 2**30:6.2f} GiB {r.get('tflops_6N', 0):5.0f} TF")
    log("done", len(R["gemm"]), "gemms")


if __name__ == "__main__":
    main()
