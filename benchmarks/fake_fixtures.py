"""Peak memory of one training step of each decoder-only causal LM among the dynamo ONNX fixtures
(``tests/fixtures/*_dynamo.onnx``), counted without a GPU by ``benchmarks/fake_memory.py``'s
FakeTensor step: reference points for ``dml2comm.cost.memory`` on architectures beyond GPT-2 and
Llama (``benchmarks/bench_fake_fixtures.py`` compares the tool's peak on each fixture with them).
A dev script that needs torch and transformers (the tool and its tests never import them):

    /work/fake-venv/bin/python benchmarks/fake_fixtures.py              # every row, writes the JSON
    /work/fake-venv/bin/python benchmarks/fake_fixtures.py gemma_tiny   # one fixture, prints only

Each fixture is counted in both modes and with ``use_cache`` as exported (False) and as
transformers defaults it (True): :data:`USE_CACHE`.

The model.  Each fixture's transformers config is the one ``tests/fixtures/export_models.py``
built it from: the ``cfg = XConfig(...)`` statement of its ``build_*`` function, read from that
file's source (``ast``) and evaluated here, so the two scripts share one config (importing the
export script needs onnx and onnxscript, which this venv lacks).  Two changes, both recorded in
each row: ``attn_implementation`` is ``sdpa`` (fake_memory.py routes SDPA to cuDNN's fused kernel,
as the H100 ran it; the export used ``eager``, which only changes the exported attention ops;
BLOOM, which transformers gives no SDPA path, keeps ``eager``: :data:`EAGER`), and
every dropout probability is 0: the fixtures were exported in eval mode, so their graphs have no
Dropout node, and the tool counts a mask only per Dropout node; training with the configs'
dropouts (GPT-2's 0.1) would keep masks the graph cannot show.

The step: ``fake_memory.count_step`` (AdamW fused, 3 warm-up steps, one counted; modes ``bf16``, the
model in bf16, and ``amp``, the fp32 model under autocast(bf16) with CUDA's fp32 list), at
micro-batch 4 and sequence 512 (every fixture's batch and sequence are symbolic; 512 is at most
each one's position table: ``max_position_embeddings`` 512, GPT-2's ``n_positions`` 1024; BLOOM has
none, ALiBi).  The row's parameter count is checked against ``tests/fixtures/fixtures_expected.json``.

Output: ``benchmarks/data/fake_memory_fixtures.json``, the rows of ``fake_memory_hf.json`` (where
they apply) plus the fixture file, its export function, the config and the changes made to it.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import fake_memory as fm  # noqa: E402  the step, its tally, its SDPA routing and autocast stand-in

FIXTURES = ROOT.parent / "tests" / "fixtures"
EXPORT = FIXTURES / "export_models.py"
OUT = ROOT / "data" / "fake_memory_fixtures.json"
B, S = 4, 512
MODES = ("bf16", "amp")
#: ``use_cache`` of the step: False, the export's config as it is; True, transformers' default
#: (``PretrainedConfig.use_cache``), with which a training script that does not set it runs: the
#: model then builds a ``DynamicCache`` whose ``update`` keeps ``torch.cat``'d copies of K and V
#: (transformers ``cache_utils.py``, ``DynamicLayer.update``), the step the memory model assumes
#: (``ActivationModel._eager_flash_inputs``) and the measured H100 steps ran
USE_CACHE = (False, True)
#: fixture key (``<key>_dynamo.onnx``) -> its export function in export_models.py
BUILDERS = {
    "gpt2": "build_gpt2", "llama_gqa": "build_llama", "gemma_tiny": "build_gemma", "gpt_neox": "build_gpt_neox",
    "falcon_mqa": "build_falcon", "bloom": "build_bloom", "cohere_tiny": "build_cohere",
    "qwen3_init": "build_qwen3_init", "mixtral_tiny": "build_mixtral", "deepseek_v3_tiny": "build_deepseek_v3",
}

#: models transformers gives no SDPA attention ("BloomForCausalLM does not support an attention
#: implementation through torch.nn.functional.scaled_dot_product_attention yet", transformers 5.24):
#: their step runs HF's eager attention (scores and probabilities in memory), as on a GPU
EAGER = {"bloom": "eager"}


def no_packed_sequences() -> None:
    """Every fixture config has ``use_cache=False``, so transformers looks for packed sequences in
    the position ids (``masking_utils._preprocess_mask_arguments``: no attention mask, no cache);
    on fake tensors ``find_packed_sequence_indices`` cannot read the values and returns a mask, which
    makes SDPA take an explicit mask.  On real tensors it returns None for one sequence per row
    (positions 0..s-1), so SDPA runs ``is_causal``: the same patch as export_models.py's."""
    import transformers.masking_utils

    transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None


def export_config(builder: str):
    """The transformers config built by ``builder`` in export_models.py: its ``cfg = XConfig(...)``
    statement, evaluated with ``XConfig`` from transformers (module docstring)."""
    import transformers

    tree = ast.parse(EXPORT.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == builder)
    call = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                and [getattr(t, "id", None) for t in n.targets] == ["cfg"] and isinstance(n.value, ast.Call))
    name = call.func.id
    code = compile(ast.Expression(call), f"{EXPORT}:{call.lineno}", "eval")
    return eval(code, {name: getattr(transformers, name)}), f"{EXPORT.name}:{builder} (line {call.lineno})"  # noqa: S307


def train_config(cfg) -> dict:
    """Sets ``cfg``'s dropout probabilities to 0 (module docstring); returns the ones changed."""
    changed = {}
    for key, value in cfg.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value:
            setattr(cfg, key, 0.0)
            changed[key] = value
    return changed


def fixture_row(key: str, mode: str, expected: dict, use_cache: bool = False) -> dict:
    cfg, source = export_config(BUILDERS[key])
    config = json.loads(cfg.to_json_string(use_diff=True))
    dropouts = train_config(cfg)
    cfg.use_cache = use_cache
    attn = EAGER.get(key, "sdpa")
    row = dict(name=key, fixture=f"{key}_dynamo.onnx", export_function=source, config_class=type(cfg).__name__,
               hf_config=config, dropout_zeroed=dropouts, attn_implementation=attn, use_cache=use_cache,
               micro_batch=B, seq=S, b=B, s=S, mode=mode)
    row.update(fm.count_step(cfg, "clm", B, S, mode, attn))
    want = expected["models"][key]["torch"]["parameter_count"]
    if row["params"] != want:
        raise SystemExit(f"{key}: {row['params']} parameters, the fixture's model has {want}")
    return row


def main(argv: list[str]) -> None:
    import transformers

    no_packed_sequences()
    expected = json.loads((FIXTURES / "fixtures_expected.json").read_text())
    rows = []
    for key in BUILDERS:
        if argv and key not in argv:
            continue
        for mode, use_cache in ((m, c) for c in USE_CACHE for m in MODES):
            try:
                row = fixture_row(key, mode, expected, use_cache)
            except Exception as exc:  # a model the fake step cannot run: say so, keep the others
                print(f"{key:18s} {mode:4s} FAILED: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            rows.append(row)
            print(f"{key:18s} {mode:4s} cache={use_cache:d} params {row['params']:>11,d} peak {row['peak_alloc_bytes'] / 1e9:7.3f} GB in "
                  f"{row['peak_phase']:9s} " + " ".join(f"{k}={v / 1e9:.3f}" for k, v in row["phase_peak_bytes"].items()),
                  flush=True)
    if argv:
        return
    doc = {
        "how": "/work/fake-venv/bin/python benchmarks/fake_fixtures.py: for each decoder-only causal-LM dynamo fixture, "
               "the transformers config of its export function in tests/fixtures/export_models.py (ast-read), "
               "attn_implementation='sdpa' (bloom: 'eager'), dropouts 0 (the eval-mode exports have no Dropout node), "
               "use_cache as exported (False) and transformers' default (True), one training step "
               f"at micro-batch {B}, sequence {S} counted by benchmarks/fake_memory.py's count_step (FakeTensorMode, "
               "storages rounded to 512 B, AdamW fused, 3 warm-up steps, peak reset, one step counted; "
               "bf16: the model in bf16; amp: fp32 model under autocast(bf16) with CUDA's fp32 op list)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "fixtures_exported_with": expected["versions"],
        "not_counted": "cuBLAS/cuBLASLt and attention workspaces (tens of MB on an H100); the CUDA context",
        "runs": rows,
    }
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
