"""The ``collective`` command: output, --json, --table/--csv, units, and every bad input as a
one-line error (exit code 2 through the real command line)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dml2comm.errors import ConfigError
from dml2comm.cli.collective import run_collective
from dml2comm.network.query import network_presets, parse_algorithm, parse_op
from dml2comm.network.kinds import Algorithm
from dml2comm.network.kinds import CollectiveKind as K
from dml2comm.network.units import parse_latency, parse_rate, parse_size

REPO = Path(__file__).resolve().parents[1]
GIB = 2.0**30


def _json(capsys, *args: str) -> dict:
    assert run_collective(list(args) + ["--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return json.loads(out)


def test_json_has_the_documented_fields_and_the_textbook_value(capsys) -> None:
    data = _json(capsys, "--op", "all_reduce", "--topology", "ring", "--n", "8", "--size", "1GiB", "--bandwidth", "100GB/s",
                 "--latency", "5us")
    for key in ("time_s", "bytes_sent_per_gpu", "steps", "algbw_bytes_per_s", "busbw_bytes_per_s", "algorithm", "limiting_link"):
        assert key in data
    # two counter-rotating rings on a ring of 100 GB/s links: 2(n-1) a + 2((n-1)/n) S / (2 x 100 GB/s)
    assert data["algorithm"] == "ring" and data["steps"] == 14
    assert data["time_s"] == pytest.approx(14 * 5e-6 + 1.75 * GIB / 200e9, rel=1e-12)
    assert data["busbw_bytes_per_s"] == pytest.approx(data["algbw_bytes_per_s"] * 1.75)
    assert data["bytes_sent_per_gpu"] == pytest.approx(1.75 * GIB)


def test_switch_is_the_textbook_formula(capsys) -> None:
    data = _json(capsys, "--op", "allgather", "--n", "16", "--size", "64MiB", "--bandwidth", "200Gb/s", "--latency", "2us",
                 "--algorithm", "ring")
    assert data["time_s"] == pytest.approx(15 * 2e-6 + 15 / 16 * 64 * 2**20 / 25e9, rel=1e-12)
    assert data["limiting_link"].startswith("switch:")


def test_cluster_preset_with_overrides(capsys) -> None:
    data = _json(capsys, "--op", "all_reduce", "--cluster", "dgx-a100", "--n", "16", "--size", "256MiB")
    assert data["library"] == "nccl" and data["limiting_link"].startswith("inter-node")
    faster = _json(capsys, "--op", "all_reduce", "--cluster", "dgx-a100", "--n", "16", "--size", "256MiB",
                   "--inter-bandwidth", "400Gb/s", "--overhead", "0us")
    # 8 x 400 Gb/s per node outrun NVLink: the ring is now limited inside the node
    assert faster["time_s"] < data["time_s"] * 0.85 and faster["overhead_s"] == 0.0
    assert faster["limiting_link"].startswith("intra-node")
    one = _json(capsys, "--op", "all_reduce", "--cluster", "dgx-a100", "--n", "8", "--size", "1GiB", "--algorithm", "ring")
    assert one["time_s"] == pytest.approx(8277.3e-6, rel=1e-4)  # the calibrated 8 x A100 1 GiB row


def test_human_output_and_verbose(capsys) -> None:
    assert run_collective(["--op", "all_reduce", "--cluster", "dgx-h100", "--n", "8", "--size", "1GiB", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "in_network" in out and "busbw" in out and "limiting link" in out
    assert "formula" in out and "with n=8" in out and "candidates" in out and "level" in out


def test_table_and_csv(capsys) -> None:
    assert run_collective(["--op", "all_reduce", "--topology", "switch", "--n", "8", "--table", "-b", "1KiB", "-e", "1MiB",
                           "-f", "32", "--bandwidth", "50GB/s"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# ALL_REDUCE over 8") and "rabenseifner" in out[2]
    assert len([line for line in out if not line.startswith("#")]) == 3  # 1 KiB, 32 KiB, 1 MiB
    assert run_collective(["--op", "all_to_all", "--topology", "torus2d", "--dims", "2x4", "--n", "8", "--table", "--csv",
                           "-b", "1MiB", "-e", "4MiB", "-f", "2", "--bandwidth", "50GB/s"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["size_bytes"] for r in rows} == {"1048576", "2097152", "4194304"}
    assert {r["algorithm"] for r in rows} >= {"pairwise", "bruck", "direct", "hierarchical"}
    for size in ("1048576", "4194304"):
        chosen = [r for r in rows if r["size_bytes"] == size and r["selected"] == "1"]
        assert len(chosen) == 1
        assert float(chosen[0]["time_s"]) == min(float(r["time_s"]) for r in rows if r["size_bytes"] == size)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--op", "all_reduce", "--n", "0", "--size", "1GiB"], "--n: expected a positive integer"),
        (["--op", "all_reduce", "--n", "-3", "--size", "1GiB"], "--n: expected a positive integer"),
        (["--op", "all_reduce", "--n", "8", "--size", "0"], "size must be a positive number"),
        (["--op", "all_reduce", "--n", "8", "--size", "-1GiB"], "size must be positive"),
        (["--op", "all_reduce", "--n", "8", "--size", "lots"], "cannot read size 'lots'"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiBs"], "unknown unit"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--topology", "hypercube"],
         "unknown topology 'hypercube'; valid topologies: ring, tree, switch, fat-tree, mesh2d, torus2d, torus3d, fully-connected, hierarchical"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--algorithm", "magic"],
         "unknown --algorithm 'magic' for ALL_REDUCE; valid: ring, recursive_doubling, rabenseifner, double_binary_tree, in_network, hierarchical"),
        (["--op", "all_reduce", "--n", "16", "--size", "1GiB", "--topology", "torus2d", "--dims", "4x3"], "multiply to 12, not n=16"),
        (["--op", "all_reduce", "--n", "16", "--size", "1GiB", "--topology", "mesh2d", "--dims", "2x2"], "multiply to 4, not n=16"),
        (["--op", "all_reduce", "--n", "12", "--size", "1GiB", "--topology", "torus3d", "--dims", "2x2x2"], "multiply to 8, not n=12"),
        (["--op", "scatter", "--n", "8", "--size", "1GiB"], "unknown --op 'scatter'; valid: all_reduce"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--cluster", "dgx-b200"], "unknown cluster 'dgx-b200'; valid names"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--bandwidth", "fast"], "cannot read bandwidth 'fast'"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--latency", "5 parsecs"], "cannot read latency"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--topology", "ring", "--algorithm", "in_network"],
         "in_network is not available"),
        (["--op", "all_to_all", "--n", "8", "--size", "1GiB", "--algorithm", "ring"], "not an algorithm for ALL_TO_ALL; valid: pairwise"),
        (["--op", "all_reduce", "--n", "8"], "give --size"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--frobnicate"], "unrecognized arguments"),
        (["--op", "all_reduce", "--n", "8", "--size", "1GiB", "--cluster", "dgx-a100", "--topology", "ring"], "drop --topology"),
    ],
)
def test_bad_input_is_a_one_line_config_error(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_collective(args)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_units() -> None:
    assert parse_size("1GiB") == 2**30 and parse_size("64MB") == 64e6 and parse_size("1e9") == 1e9 and parse_size("128M") == 2**27
    assert parse_rate("100GB/s") == 100e9 and parse_rate("200Gb/s") == 25e9 and parse_rate("400Gbps") == 50e9
    assert parse_rate("25e9") == 25e9 and parse_rate("1GiB/s") == 2**30
    assert parse_latency("5us") == 5e-6 and parse_latency("1.5ms") == 1.5e-3 and parse_latency("500ns") == 5e-7
    assert parse_latency("2e-6") == 2e-6 and parse_latency("0") == 0.0
    with pytest.raises(ConfigError, match="bits"):
        parse_size("8Gb")
    with pytest.raises(ConfigError, match="needs /s"):
        parse_rate("100GB")


def test_names() -> None:
    assert parse_op("ALL_REDUCE") is K.ALL_REDUCE and parse_op("send-recv") is K.SEND_RECV
    assert parse_algorithm("tree", K.ALL_REDUCE) is Algorithm.DOUBLE_BINARY_TREE
    assert parse_algorithm("halving-doubling", K.ALL_REDUCE) is Algorithm.RABENSEIFNER
    presets = network_presets()
    assert "fat-tree" in presets["topologies"] and "bruck" in presets["algorithms"]["ALL_TO_ALL"]
    nets = presets["cluster_networks"]
    assert set(nets) >= {"dgx-a100", "dgx-h100", "hgx-h200", "dgx-v100", "pcie-a6000"}
    assert nets["dgx-a100"]["allreduce_busbw_8_gpus_bytes_per_s"] == pytest.approx(227e9, rel=0.01)


def test_through_the_real_command_line() -> None:
    ok = subprocess.run([sys.executable, "main.py", "collective", "--op", "all_reduce", "--topology", "ring", "--n", "8",
                         "--size", "1GiB", "--json"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["algorithm"] == "ring"
    for bad in (["--n", "0", "--size", "1GiB"], ["--n", "8", "--size", "0"], ["--n", "8", "--size", "1GiB", "--topology", "cube"],
                ["--n", "8", "--size", "1GiB", "--algorithm", "nope"], ["--n", "6", "--size", "1GiB", "--topology", "torus2d", "--dims", "2x2"]):
        res = subprocess.run([sys.executable, "main.py", "collective", "--op", "all_reduce", *bad], cwd=REPO, capture_output=True, text=True)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
