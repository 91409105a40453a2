"""Executors (dml2comm.executors): ``trace`` and ``sweep`` on Dask give the outputs of the local
process pool byte for byte; per-worker state is built once per worker; a rank whose worker dies
or whose file cannot be read is reported while the others are analysed; Ctrl-C keeps finished
rows; and without Dask, ``--executor dask`` is a one-line error naming the extra.

The Dask tests share one LocalCluster (2 single-threaded worker processes) and reach it through
``--scheduler ADDRESS``, as a user reaches a cluster; ``allowed-failures`` is 0 on it so that a
task whose worker dies fails at once (the default retries it on 3 more workers)."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from dml2comm import zoo
from dml2comm.cli import main
from dml2comm.errors import ConfigError
from dml2comm.executors import ChunkPlan, DaskExecutor, LocalExecutor, require_dask

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
TRACE_OUTPUTS = ("trace_analysis.json", "events.parquet", "steps.parquet")


@pytest.fixture(scope="module")
def cluster():
    dask = pytest.importorskip("dask")
    dd = require_dask()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        local = dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = dd.Client(local)
    yield local, client
    client.close()
    local.close()


# ---- functions the workers run (importable: the workers import this module)
def _die_on(item: str) -> str:
    if item == "die":
        os._exit(3)
    return item.upper()


def _setup() -> dict:
    return {"pid": os.getpid(), "token": uuid.uuid4().hex}


def _run(state: dict, payload: int) -> list[dict]:
    return [{"chunk": payload, "pid": state["pid"], "token": state["token"]}]


def _plan(n: int) -> ChunkPlan:
    return ChunkPlan(work=[1.0] * n, affinity=list(range(n)), setup=_setup, run=_run, payloads=list(range(n)))


# ---- trace
@pytest.mark.parametrize("folder", ["megatron_tp2_pp2_dp2", "gloo_pp2_dp2", "cp_ep", "gloo_cpu"])
def test_trace_on_dask_is_byte_identical_to_local(cluster, tmp_path, folder):
    local, _ = cluster
    src = str(FIXTURES / folder)
    assert main(["trace", src, "--no-site", "--processes", "2", "--out", str(tmp_path / "local")]) == 0
    assert main(["trace", src, "--no-site", "--executor", "dask", "--scheduler", local.scheduler_address,
                 "--out", str(tmp_path / "dask")]) == 0
    for name in TRACE_OUTPUTS:
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


def test_unreadable_rank_is_reported_on_dask_as_locally(cluster, tmp_path):
    local, _ = cluster
    folder = tmp_path / "ranks"
    shutil.copytree(FIXTURES / "gloo_pp2_dp2", folder)
    (folder / "rank-2.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")  # a gzip header and nothing after it
    assert main(["trace", str(folder), "--no-site", "--out", str(tmp_path / "local")]) == 0
    assert main(["trace", str(folder), "--no-site", "--executor", "dask", "--scheduler", local.scheduler_address,
                 "--out", str(tmp_path / "dask")]) == 0
    text = (tmp_path / "dask" / "trace_analysis.json").read_text()
    assert text == (tmp_path / "local" / "trace_analysis.json").read_text()
    import json

    data = json.loads(text)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 3]
    (failed,) = data["failed_files"]
    assert failed["file"].endswith("rank-2.json.gz") and "truncated or corrupt .gz" in failed["reason"]


def test_a_dying_dask_worker_fails_its_item_only(cluster):
    _, client = cluster
    ex = DaskExecutor.on_client(client)
    out = {i: (result, error) for i, result, error in ex.map_unordered(_die_on, ["a", "die", "b"])}
    assert out[0] == ("A", None) and out[2] == ("B", None)
    assert out[1][0] is None and "died" in out[1][1]
    client.wait_for_workers(2, timeout=30)  # the nanny restarts the killed worker for the next tests


def test_a_dying_local_worker_is_reported():
    out = {i: (result, error) for i, result, error in LocalExecutor(2).map_unordered(_die_on, ["die", "a"])}
    assert out[0][0] is None and "died" in out[0][1]


# ---- sweep
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    zoo.save(zoo.build_gpt(layers=4, hidden=64, heads=4, vocab=256, seq_len=64), path)
    return path


def test_sweep_on_dask_is_byte_identical_to_local(cluster, tmp_path, tiny_model):
    local, _ = cluster
    args = ["sweep", str(tiny_model), "--gpus", "8", "--global-batch-size", "16", "--no-site", "--json"]
    assert main(args + ["--workers", "2", "--out", str(tmp_path / "local")]) == 0
    assert main(args + ["--executor", "dask", "--scheduler", local.scheduler_address, "--out", str(tmp_path / "dask")]) == 0
    csv = (tmp_path / "local" / "sweep.csv").read_text()
    assert csv.count("\n") > 20  # a real sweep: header + one row per configuration
    assert (tmp_path / "dask" / "sweep.csv").read_text() == csv
    assert (tmp_path / "dask" / "sweep.parquet").read_bytes() == (tmp_path / "local" / "sweep.parquet").read_bytes()


def test_dask_builds_the_worker_state_once_per_worker(cluster):
    _, client = cluster
    rows: list[dict] = []
    assert DaskExecutor.on_client(client).run_chunks(_plan(8), rows.extend) is False
    assert sorted(r["chunk"] for r in rows) == list(range(8))
    tokens = {(r["pid"], r["token"]) for r in rows}
    assert len(tokens) == len({r["pid"] for r in rows}) <= 2  # one state per worker process, not per chunk


def test_ctrl_c_keeps_the_rows_that_arrived(cluster):
    _, client = cluster
    rows: list[dict] = []

    def on_rows(chunk_rows):
        rows.extend(chunk_rows)
        if len(rows) == 2:
            raise KeyboardInterrupt

    assert DaskExecutor.on_client(client).run_chunks(_plan(40), on_rows) is True
    assert len(rows) == 2
    rows.clear()
    assert LocalExecutor(1).run_chunks(_plan(5), on_rows) is True and len(rows) == 2


# ---- calibrate
HTA = FIXTURES / "hta"
CALIBRATION_TRACES = [HTA / "nccl_parser_config__nccl_data.json.gz", HTA / "trace_filter__sampled_rank-0.json.gz",
                      HTA / "trace_filter__sampled_rank-1.json.gz"]


def _calibrate_runs(scheduler: str) -> dict[str, list[str]]:
    """The flags of one calibrate run per executor: in this process (no flag), 2 local processes, Dask."""
    return {"in_process": [], "local": ["--executor", "local", "--processes", "2"],
            "dask": ["--executor", "dask", "--scheduler", scheduler]}


def test_calibrate_on_dask_and_local_processes_is_byte_identical_to_in_process(cluster, tmp_path):
    local, _ = cluster
    for name, flags in _calibrate_runs(local.scheduler_address).items():
        assert main(["calibrate", *map(str, CALIBRATION_TRACES), "--holdout", "0.3", *flags,
                     "-o", str(tmp_path / name / "cal.yaml")]) == 0
    outputs = ("cal.yaml", "cal_site/cal.yaml", "cal_site/samples.json", "cal_site/index.html")
    for out in outputs:
        ref = (tmp_path / "in_process" / out).read_bytes()
        assert (tmp_path / "local" / out).read_bytes() == ref, out
        assert (tmp_path / "dask" / out).read_bytes() == ref, out
    import yaml

    record = yaml.safe_load((tmp_path / "dask" / "cal.yaml").read_text())["calibration"]
    assert [t["file"] for t in record["traces"]] == [p.name for p in CALIBRATION_TRACES]  # the order of the files
    assert record["fitted"]["collectives"][0]["level"] == "intra_node"  # classified on the client


def test_calibrate_leaves_an_unreadable_trace_out_on_every_executor(cluster, tmp_path, capsys):
    local, _ = cluster
    folder = tmp_path / "traces"
    folder.mkdir()
    for p in CALIBRATION_TRACES[1:]:
        shutil.copy(p, folder / p.name)
    (folder / "broken.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")  # a gzip header and nothing after it
    for name, flags in _calibrate_runs(local.scheduler_address).items():
        assert main(["calibrate", str(folder), "--cluster", "dgx-a100", "--no-site", *flags,
                     "-o", str(tmp_path / name / "cal.yaml")]) == 0
        printed = capsys.readouterr().out
        assert "; 2 trace(s) (1 unreadable, left out)" in printed
        assert ("warning: broken.json.gz could not be read and is left out: TraceError: 'broken.json.gz' is a truncated or "
                "corrupt .gz file") in printed
    text = (tmp_path / "in_process" / "cal.yaml").read_text()
    assert (tmp_path / "local" / "cal.yaml").read_text() == text == (tmp_path / "dask" / "cal.yaml").read_text()
    assert "broken.json.gz could not be read" in text and "sha256" in text


# ---- errors
def test_without_dask_the_executor_is_a_one_line_error(monkeypatch, tmp_path, capsys, tiny_model):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # `import dask.distributed` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'dml2comm\[dask\]'"):
        require_dask()
    for argv in (["trace", str(FIXTURES / "gloo_cpu")], ["sweep", str(tiny_model), "--gpus", "4"]):
        out = tmp_path / argv[0]
        assert main(argv + ["--executor", "dask", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --executor dask needs Dask") and "pip install 'dml2comm[dask]'" in err
        assert err.count("\n") == 1 and not out.exists()
    out = tmp_path / "calibrate" / "cal.yaml"
    assert main(["calibrate", str(CALIBRATION_TRACES[0]), "--executor", "dask", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --executor dask needs Dask") and err.count("\n") == 1 and not out.parent.exists()


def test_scheduler_needs_the_dask_executor(capsys, tmp_path):
    assert main(["trace", str(FIXTURES / "gloo_cpu"), "--scheduler", "tcp://127.0.0.1:8786", "--out", str(tmp_path)]) == 2
    assert "--scheduler is used only by --executor dask" in capsys.readouterr().err


# ---- what travels from a worker
def test_rank_tables_keep_every_event_and_only_the_drawn_steps_activity():
    import numpy as np

    from dml2comm.traces.analyze import activity_events_table, analyze_file, rank_tables

    path = str(FIXTURES / "megatron_tp2_pp2_dp2" / "rank-0.json")
    full, small = analyze_file(path), rank_tables(path)
    assert small.events_table().equals(activity_events_table(full.rank, full.activity))
    assert (small.steps, small.segments, small.segment_step) == (full.steps, full.segments, full.segment_step)
    k = [s[0] for s in full.activity.steps].index(full.segment_step)  # steps 10 and 11: the second is drawn
    assert k == 1 and set(np.unique(small.activity.step)) == {k}
    assert small.activity.start.size == int((full.activity.step == k).sum()) < full.activity.start.size
    names = [full.activity.names[i] for i in full.activity.name[full.activity.step == k]]
    assert [small.activity.names[i] for i in small.activity.name] == names
