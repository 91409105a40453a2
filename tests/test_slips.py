"""Issue 19 slips and outputs: typos get a suggestion, contradictions are refused, surprising valid
configurations are warned about, the collective command's words match its numbers, every command
writes to its own default folder, and the main --help examples run as written."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dml2comm.cli import main
from dml2comm.cli.analyse import EXAMPLES

ROOT = Path(__file__).resolve().parent.parent
GPT2 = ROOT / "examples" / "gpt2-small.onnx"


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _one_error(*argv: str) -> str:
    rc, _, err = _main(*argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_subcommand_typo_suggests_the_command(tmp_path):
    assert _one_error("sweeep", str(GPT2)) == ("error: unknown command 'sweeep'; did you mean 'sweep'? "
                                               "(commands: zoo, presets, collective, sweep, compare, trace, validate, calibrate; or give a model file)")


def test_flag_typo_suggests_the_flag(tmp_path):
    line = _one_error(str(GPT2), "--pp", "2", "--out", str(tmp_path / "o"))
    assert "unrecognized arguments: --pp 2" in line and "did you mean --p?" in line
    assert "did you mean --n?" not in _one_error("collective", "--op", "all_reduce", "--n", "8", "--size", "1MiB", "--sise", "2")
    assert "did you mean --size?" in _one_error("collective", "--op", "all_reduce", "--n", "8", "--size", "1MiB", "--sise", "2")
    assert not (tmp_path / "o").exists()


def test_gpu_contradicting_the_cluster_is_refused(tmp_path):
    line = _one_error(str(GPT2), "--gpu", "v100", "--cluster", "dgx-a100", "--out", str(tmp_path / "o"), "--no-site")
    assert "--gpu v100 conflicts with --cluster dgx-a100, whose GPU is A100-SXM4-80GB" in line
    assert not (tmp_path / "o").exists()


def _warnings(tmp_path: Path, *flags: str) -> list[str]:
    rc, _, err = _main(str(GPT2), *flags, "--no-site", "--no-advice", "--json", "--out", str(tmp_path))
    assert rc == 0, err
    return json.loads((tmp_path / "data.json").read_text())["warnings"]


def test_tensor_parallelism_across_nodes_is_warned(tmp_path):
    # GPT-2 small has 12 heads, so t=12 is valid; nodes hold 8 GPUs, so each TP group spans two nodes
    assert any(w.startswith("tensor parallelism t=12 is wider than a node of 8 GPUs") for w in _warnings(tmp_path, "--t", "12"))
    assert not any(w.startswith("tensor parallelism") for w in _warnings(tmp_path, "--t", "4"))


def test_zero3_with_pipeline_is_warned_with_deepspeeds_reason(tmp_path):
    ws = _warnings(tmp_path, "--d", "2", "--p", "2", "--zero", "3")
    assert any(w.startswith("ZeRO-3 with pipeline parallelism (p=2): DeepSpeed refuses") for w in ws)
    assert not any("ZeRO-1" in w and "DeepSpeed refuses" in w for w in _warnings(tmp_path, "--d", "2", "--p", "2", "--zero", "1"))


# ------------------------------------------------------------------ the collective command


def test_table_star_and_plus_match_the_numbers():
    rc, out, _ = _main("collective", "--op", "all_gather", "--cluster", "dgx-a100", "--n", "8", "--table",
                       "--min-bytes", "1MiB", "--max-bytes", "1MiB")
    assert rc == 0
    assert "the fastest of the algorithms NCCL implements here (ring)" in out
    row = [line for line in out.splitlines() if line.strip().startswith("1048576")][0].split()
    # size, then (time, busbw) per algorithm: ring, recursive_doubling, bruck, direct; then the default
    times = {"ring": row[1], "recursive_doubling": row[3], "bruck": row[5], "direct": row[7]}
    assert times["ring"].endswith("*") and times["direct"].endswith("+")  # direct 67.41 us beats NCCL's ring 72.52 us
    assert float(times["direct"][:-1]) < float(times["ring"][:-1])


def test_verbose_names_the_pool_and_the_faster_outsider():
    rc, out, _ = _main("collective", "--op", "all_gather", "--cluster", "dgx-a100", "--n", "8", "--size", "1MiB", "--verbose")
    assert rc == 0
    assert "ring (NCCL's only algorithm here;" in out and "fastest of 1" not in out
    assert "  faster         direct 67.4\u00a0µs: not among the nccl model's candidates" in out  # µs, never us


def test_ring_formula_says_both_directions_and_one_direction_doubles_the_bandwidth_term():
    base = ("collective", "--op", "all_reduce", "--topology", "ring", "--algorithm", "ring", "--n", "8", "--size", "1GiB", "--json")
    two = json.loads(_main(*base)[1])
    one = json.loads(_main(*base, "--one-direction")[1])
    # 2((n-1)/n) S / B + 2(n-1) a: bandwidth terms 2 x 7/8 x 2^30 / 600e9 and / 300e9
    bw = 2 * 7 / 8 * 2**30
    lat = 2 * 7 * 3.4e-6
    assert two["time_s"] == pytest.approx(bw / 600e9 + lat)
    assert one["time_s"] == pytest.approx(bw / 300e9 + lat)
    rc, out, _ = _main(*base[:-1], "--verbose")
    assert "two counter-rotating rings: both directions of every link" in out
    assert "--one-direction applies to --topology ring" in _one_error(*base[:4], "switch", *base[5:], "--one-direction")


@pytest.mark.parametrize("alias,canonical", [("torus", "torus2d"), ("mesh", "mesh2d")])
def test_torus_and_mesh_read_as_the_2d_forms(alias, canonical):
    args = ("collective", "--op", "all_reduce", "--n", "16", "--size", "1MiB", "--json", "--topology")
    assert json.loads(_main(*args, alias)[1]) == json.loads(_main(*args, canonical)[1])


# ------------------------------------------------------------------ outputs and examples


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[:2] == ["python", "main.py"]
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *argv[2:]], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_each_command_writes_its_own_default_folder(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "tests" / "fixtures" / "traces" / "gloo_pp2_dp2", tmp_path / "trace_in")
    for line in ("python main.py examples/gpt2-small.onnx --no-site --no-advice",
                 "python main.py sweep examples/gpt2-small.onnx --gpus 8 --no-site --workers 1",
                 "python main.py compare examples/gpt2-small.onnx --global-batch-size 8 --configs d=2 d=1,p=2 --no-site",
                 "python main.py trace trace_in --no-site"):
        r = _run(line, tmp_path)
        assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert (out / "data.json").is_file() and (out / "trace.json").is_file()
    assert (out / "sweep" / "sweep.csv").is_file() and (out / "compare" / "compare.csv").is_file()
    assert (out / "trace" / "trace_analysis.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples", "out", "trace_in"]  # nothing in the current folder


HELPS = ("", "zoo", "collective", "sweep", "compare", "trace", "validate", "calibrate")


def _help_examples(command: str = "") -> list[str]:
    """The example lines of ``python main.py [COMMAND] --help``, as printed."""
    args = [command, "--help"] if command else ["--help"]
    text = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60).stdout
    return [line.strip() for line in text.splitlines() if line.strip().startswith("python main.py ")]


def test_every_help_has_examples_and_the_main_ones_are_the_module_text():
    assert _help_examples() == [line.strip() for line in EXAMPLES.splitlines() if line.strip().startswith("python main.py")]
    assert all(_help_examples(c) for c in HELPS)


ALL_EXAMPLES = list(dict.fromkeys(line for c in HELPS for line in _help_examples(c)))


@pytest.mark.parametrize("line", ALL_EXAMPLES)
def test_help_example_runs_as_written(line, tmp_path):
    """Each example of every ``--help``, run from a copy of the repository's inputs (examples/ and the
    bundled traces). Only speed-ups are added: --no-site and --no-advice where an example builds a site
    or advice (the site is tested in test_site.py), 2 layers for the 80/96-layer zoo builds, and 3 cases
    per validation set without the leave-one-source-out refits (test_validate.py runs those)."""
    words = shlex.split(line)
    command = words[2] if words[2] in HELPS + ("presets",) else ""
    if command == "validate":
        words = [w for w in words if w != "--no-loso"]
        if "--sample" in words:
            del words[words.index("--sample"):words.index("--sample") + 2]
        line = shlex.join(words) + " --sample 3 --no-loso"
    if command == "zoo":
        line = line.replace("--layers 96", "--layers 2").replace("--layers 80", "--layers 2")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copytree(ROOT / "tests" / "fixtures" / "traces", tmp_path / "tests" / "fixtures" / "traces")
    if command in ("", "sweep", "compare", "trace") and "--no-site" not in words and "--help" not in words:
        line += " --no-site"
    if command == "":
        line += " --no-advice"
    r = _run(line, tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("command", [
    ["sweep", "--gpus", "8", "--global-batch-size", "8", "--workers", "1"],
    ["compare", "--global-batch-size", "8", "--configs", "d=2,t=2"],
])
def test_sweep_and_compare_refuse_a_gpu_that_contradicts_the_cluster(tmp_path, capsys, command):
    """As the main command: the dgx-a100 preset fixes its GPU, so --gpu v100 with it is refused
    (one line, exit 2, nothing written) instead of silently running on A100s."""
    from dml2comm.cli import main

    out = tmp_path / "out"
    code = main([command[0], "examples/gpt2-small.onnx", *command[1:], "--gpu", "v100", "--cluster", "dgx-a100",
                 "--out", str(out), "--no-site"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--gpu v100 conflicts with --cluster dgx-a100" in err[0]
    assert not out.exists() or not list(out.iterdir())
