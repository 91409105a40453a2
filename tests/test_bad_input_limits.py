"""Bad input that used to crash, exhaust memory or mislead (issue 36 items 1-4, 7, 8).

Every case goes through the real command line (``dml2comm.cli.main``, in-process): exit code 2,
exactly one ``error:`` line naming the problem and the fix, no traceback, nothing written.  The
inputs are small and made here; the decompression bomb is made on the fly and refused by the
reader at a cap lowered for the test, never by the machine's memory.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import xml.dom.minidom
import zlib
from pathlib import Path

import onnx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dml2comm.calibrate.calibration import MAX_KERNEL_S
from dml2comm.cli import main
from dml2comm.errors import ConfigError
from dml2comm.hardware.cluster import get_cluster
from dml2comm.hardware.cluster_file import MAX_ASSUMPTIONS, cluster_file_dict, dump_cluster_file
from dml2comm.parallel.config import MAX_GPUS, MAX_SCHEDULE_STEPS, ParallelConfig
from dml2comm.fmt import printable
from dml2comm.traces import load
from tests.helpers import mlp, model, weight
from tests.test_calibrate import _synthetic

ROOT = Path(__file__).resolve().parent.parent
GLOO = ROOT / "tests" / "fixtures" / "traces" / "gloo_pp2_dp2"


def _error(capsys) -> str:
    """The one ``error:`` line on stderr (and nothing on stdout)."""
    cap = capsys.readouterr()
    assert cap.err.startswith("error: ") and cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err + cap.out
    return cap.err


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def _trace_doc(tmp_path: Path) -> dict:
    return json.loads(gzip.decompress(_synthetic(tmp_path).read_bytes()))


# ------------------------------------------------------------------------- item 1: tracebacks


def test_calibrate_with_absurd_kernel_durations_is_one_line(tmp_path: Path, capsys) -> None:
    doc = _trace_doc(tmp_path)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["dur"] = 1e308  # was ZeroDivisionError in calibrate/points.py
    path = tmp_path / "huge" / "rank-0.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    out = tmp_path / "out" / "c.yaml"
    assert main(["calibrate", str(path), "-o", str(out)]) == 2
    assert f"not a positive number below {MAX_KERNEL_S:.0f} s (the trace's dur is in microseconds)" in _error(capsys)
    assert not (tmp_path / "out").exists()


def test_calibrate_output_that_cannot_be_written_is_refused_before_the_page(tmp_path: Path, capsys) -> None:
    trace = _synthetic(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    site = tmp_path / "page"
    assert main(["calibrate", str(trace), "-o", str(afile / "c.yaml"), "--site", str(site)]) == 2
    assert "is a file, not a folder; give a path under a folder" in _error(capsys)
    assert not site.exists()  # the page used to be written first, then the traceback
    folder = tmp_path / "x.yaml"
    folder.mkdir()
    assert main(["calibrate", str(trace), "-o", str(folder)]) == 2
    assert "is an existing folder; give a file name" in _error(capsys)
    assert not (tmp_path / "x_site").exists()  # an X_site/ was left behind
    assert main(["calibrate", str(trace), "-o", str(tmp_path / "c.yaml"), "--site", str(afile)]) == 2
    assert "--site" in _error(capsys)


def test_out_naming_an_existing_file_is_refused(tmp_path: Path, tiny: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main([str(tiny), "--out", str(afile), "--no-site"]) == 2
    assert "is an existing file, not a folder; give a folder" in _error(capsys)
    assert main(["trace", str(GLOO), "--out", str(afile), "--no-site"]) == 2
    assert "is an existing file, not a folder" in _error(capsys)
    assert afile.read_text() == "keep"


# ------------------------------------------------------------------- item 2: unplannable sizes


@pytest.mark.parametrize("flags, limit", [
    (["--global-batch-size", "1000000000000000"], f"{MAX_SCHEDULE_STEPS:,} the simulator holds"),  # numpy asked for PiB
    (["--d", "1000000000"], f"{MAX_GPUS:,} GPUs dml2comm plans"),  # grew to 24 GB and was killed
    (["--t", "3000", "--d", "3000"], f"{MAX_GPUS:,} GPUs"),
    (["--schedule", "interleaved", "--p", "2", "--virtual-stages", "1000000000"], "fewer --virtual-stages"),
    (["--micro-batch-size", "1" + "0" * 21], "up to 2**53"),  # was ValueError from onnx
])
def test_sizes_that_cannot_be_planned_are_refused_with_the_limit(tmp_path: Path, tiny: Path, capsys, flags, limit) -> None:
    out = tmp_path / "out"
    assert main([str(tiny), *flags, "--out", str(out), "--no-site"]) == 2
    assert limit in _error(capsys)
    assert not out.exists()


def test_sweep_gpu_count_beyond_the_limit_is_refused(tmp_path: Path, tiny: Path, capsys) -> None:
    assert main(["sweep", str(tiny), "--gpus", "1000000000", "--global-batch-size", "1024", "--out", str(tmp_path / "s")]) == 2
    assert f"at most {MAX_GPUS:,}" in _error(capsys)


def test_large_but_real_sizes_are_plannable() -> None:
    config = ParallelConfig(dp_size=2**20, global_batch_size=2**20)  # a million GPUs
    assert config.num_gpus == 2**20
    ParallelConfig(pp_size=8, global_batch_size=MAX_SCHEDULE_STEPS // 8)
    with pytest.raises(ConfigError, match="pipeline steps"):
        ParallelConfig(pp_size=8, global_batch_size=MAX_SCHEDULE_STEPS // 8 + 1)


# ---------------------------------------------------------------- item 3: decompression bombs


def _bomb(path: Path, inflated: int) -> Path:
    """A gzip of ``inflated`` bytes of JSON whitespace, written a MiB at a time (a few KB on disk)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    with open(path, "wb") as fh:
        fh.write(z.compress(b'{"traceEvents": ['))
        for _ in range(inflated >> 20):
            fh.write(z.compress(chunk))
        fh.write(z.compress(b"]}") + z.flush())
    return path


def test_a_decompression_bomb_is_refused_at_the_cap(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(load, "MAX_DECOMPRESSED_TRACE_BYTES", 1 << 20)
    bomb = _bomb(tmp_path / "rank-0.json.gz", 32 << 20)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(load.TraceError, match=r"inflates to more than 1\.00 MiB \(the cap on a decompressed trace"):
        load.read_trace_bytes(bomb)
    assert main(["trace", str(bomb), "--out", str(tmp_path / "t"), "--no-site"]) == 2
    err = _error(capsys)
    assert "decompression bomb" in err and "gunzip -k rank-0.json.gz" in err
    assert main(["calibrate", str(bomb), "-o", str(tmp_path / "c" / "c.yaml")]) == 2
    assert "inflates to more than 1.00 MiB" in _error(capsys)
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()
    # under the cap the same reader inflates it whole
    assert len(load.read_trace_bytes(_bomb(tmp_path / "small.json.gz", 0), limit=1 << 20)) == len('{"traceEvents": []}')


# --------------------------------------------------------------- item 4: control characters


def test_printable_replaces_control_characters() -> None:
    assert printable("a\x1b[31mb\x07c\x9bd\te\n") == "a\ufffd[31mb\ufffdc\ufffdd\te\n"


def test_control_characters_reach_neither_terminal_nor_svg(tmp_path: Path, capsys) -> None:
    esc = "se\x1b[31mq\x07"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", esc, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", esc, 16])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc\x07/MatMul"),
             helper.make_node("Relu", ["h"], ["y"], name="/act\x1b/Relu")]
    path = tmp_path / "m\x1b[2Jodel\x07.onnx"
    onnx.save(model(nodes, [x], [y], [weight("w", [16, 16])]), path)
    out = tmp_path / "out"
    assert main([str(path), "--dim", f"{esc}=8", "--out", str(out), "--no-advice"]) == 0
    cap = capsys.readouterr()
    assert "\x1b" not in cap.out + cap.err and "\x07" not in cap.out + cap.err
    svgs = list((out / "svg_file").glob("*.svg"))
    assert svgs
    for svg in svgs:
        xml.dom.minidom.parse(str(svg))  # well-formed: an ESC in a <title> was not
    for page in (out / "site").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "\x1b" not in text and "\x07" not in text, page


# ------------------------------------------------------------ item 7: the cause and the fix


def test_json_nested_100000_levels_is_named(tmp_path: Path, capsys) -> None:
    deep = tmp_path / "rank-0.json"
    deep.write_text('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    assert main(["trace", str(deep), "--out", str(tmp_path / "t")]) == 2
    assert "nests JSON arrays or objects too deeply" in _error(capsys)  # was RecursionError
    assert main(["calibrate", str(deep), "-o", str(tmp_path / "c.yaml")]) == 2
    assert "nests JSON arrays or objects too deeply" in _error(capsys)


def test_ts_given_as_strings_is_named(tmp_path: Path, capsys) -> None:
    doc = _trace_doc(tmp_path)
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = str(e["ts"])
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(doc))
    assert main(["trace", str(path), "--out", str(tmp_path / "t")]) == 2
    err = _error(capsys)
    assert "have no numeric ts/dur (e.g. times written as strings)" in err and "no complete (ph X) events" not in err


def test_a_rank_beyond_the_world_size_is_refused(tmp_path: Path, capsys) -> None:
    doc = _trace_doc(tmp_path)
    doc["distributedInfo"]["rank"] = 99
    path = tmp_path / "rank-99.json"
    path.write_text(json.dumps(doc))
    assert main(["trace", str(path), "--out", str(tmp_path / "t")]) == 2
    assert "is rank 99 of a world of 16 ranks" in _error(capsys)


def test_shape_inference_failures_name_their_cause(tmp_path: Path, capsys) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])
    target = helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", TensorProto.INT64, [2], [-3, 16]))
    nodes = [target, helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc/MatMul"),
             helper.make_node("Reshape", ["h", "t"], ["y"], name="/Reshape")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    onnx.save(model(nodes, [x], [y], [weight("w", [16, 16])]), tmp_path / "reshape.onnx")
    assert main([str(tmp_path / "reshape.onnx"), "--out", str(tmp_path / "o"), "--no-site"]) == 2
    err = _error(capsys)
    assert "target shape of Reshape at node '/Reshape'" in err and "value_info" not in err
    y2 = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n", 16])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc/MatMul"),
             helper.make_node("MyOp", ["h"], ["y"], name="/custom", domain="my.ops")]
    g = helper.make_graph(nodes, "g", [x], [y2], [weight("w", [16, 16])], value_info=[y2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my.ops", 1)]),
              tmp_path / "custom.onnx")
    assert main([str(tmp_path / "custom.onnx"), "--out", str(tmp_path / "o"), "--no-site", "--lenient"]) == 2
    assert "custom op 'MyOp' (domain 'my.ops')" in (err := _error(capsys)) and "every dim a number" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_nan_quantities_are_named_by_their_flag(tmp_path: Path, tiny: Path, capsys, value) -> None:
    assert main([str(tiny), "--collective-overhead-us", value, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "argument --collective-overhead-us: expected a finite number >= 0" in err and "collective_overhead_s" not in err


# ------------------------------------------------------------------------ item 8: leftovers


def test_sigterm_during_the_site_build_leaves_no_staging_folder(tmp_path: Path, tiny: Path, capsys, monkeypatch) -> None:
    import dml2comm.site.build as site_build

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the build")

    monkeypatch.setattr(site_build, "build", killed)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    assert main([str(tiny), "--out", str(out), "--no-advice"]) == 143
    assert "terminated (SIGTERM)" in _error(capsys)
    assert list(out.iterdir()) == []  # no hidden .dml2comm-* folder, no data.json
    assert signal.getsignal(signal.SIGTERM) == before


def test_trace_no_site_writes_json_and_parquet_only(tmp_path: Path) -> None:
    out = tmp_path / "t"
    assert main(["trace", str(GLOO), "--out", str(out), "--no-site", "--json"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["events.parquet", "steps.parquet", "trace_analysis.json"]


def test_a_huge_assumptions_list_in_a_cluster_file_is_refused(tmp_path: Path, tiny: Path, capsys) -> None:
    doc = cluster_file_dict(get_cluster("dgx-a100"), base="dgx-a100")
    doc["assumptions"] = ["x" * 100] * (MAX_ASSUMPTIONS + 1)
    path = tmp_path / "big.yaml"
    path.write_text(dump_cluster_file(doc))
    assert main([str(tiny), "--cluster", str(path), "--out", str(tmp_path / "o"), "--no-site"]) == 2
    assert f"keep at most {MAX_ASSUMPTIONS}" in _error(capsys)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------- the command line fuzzed

_FLAGS = ["--d", "--t", "--p", "--cp", "--ep", "--gpus", "--micro-batch-size", "--global-batch-size", "--seq-len",
          "--virtual-stages", "--collective-overhead-us", "--capacity-factor", "--dropout", "--zero", "--schedule",
          "--gpus-per-node", "--nics-per-node", "--rank-order", "--dim", "--gpu", "--cluster", "--stack", "--pp"]
_VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "3", "7", "nan", "inf", "-inf", "1e308", "10" + "0" * 20, "", "x", "batch=2",
                     "=", "a100", "dgx-h100", "gpipe", "interleaved", "dpt", "\x1b[31m", "\x00"]),
    st.integers(-5, 2**64).map(str),
    st.text(max_size=6),
)
_COMMANDS = [[], ["sweep"], ["compare"], ["trace"], ["calibrate"], ["collective"], ["zoo"], ["presets"], ["sweeep"]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(_COMMANDS), pairs=st.lists(st.tuples(st.sampled_from(_FLAGS), _VALUES), max_size=4),
       garbage=st.lists(st.text(max_size=8), max_size=2))
def test_command_line_fuzz_exits_0_or_2_without_a_traceback(tmp_path_factory, capsys, command, pairs, garbage) -> None:
    """Random flags, values and stray words: exit code 0 or 2, never a traceback.  The model is the
    one-op MLP, with --no-site and --no-advice so an accepted configuration runs in well under a
    second; the outputs go to a fresh folder."""
    work = tmp_path_factory.mktemp("fuzz")
    path = work / "mlp.onnx"
    onnx.save(mlp(), path)
    argv = [*command, *([] if command and command[0] in ("zoo", "presets", "collective", "sweeep") else [str(path)])]
    for flag, value in pairs:
        argv += [flag, value]
    argv += [*garbage, "--out", str(work / "out"), "--no-site", "--no-advice"]
    code = main(argv)
    cap = capsys.readouterr()
    assert code in (0, 2), (argv, code, cap.err[-2000:])
    assert "Traceback" not in cap.err
    if code == 2:
        assert cap.err.startswith("error: ") and cap.err.count("\n") == 1, (argv, cap.err)
