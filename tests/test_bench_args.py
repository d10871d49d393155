"""The benchmarks' command lines (one process, no MPI launch): a mistake a user makes on the
command line is one usage error (exit status 2, argparse's ``error:`` line naming the
option) before any work, not a traceback after the setup, a hang of the other ranks, an
option silently ignored, or results lost after the run; and what ``bench/scaling.py`` says
about a run's table is that run's table."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))


pytestmark = pytest.mark.usefixtures("modes_restored")  # (modes_bench registers "compute")


def usage_error(capsys, script: str, argv: list) -> str:
    """``script``'s main on ``argv``: the exit status must be 2; its ``error:`` line."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(script).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("script,argv,says", [
    # auto_bench's default --warmup is 30: --steps 20 was an empty median on rank 0 after
    # auto's run, and the other ranks waited for it forever
    ("auto_bench", ["--steps", "20"], "--steps 20 leaves no timed step"),
    ("modes_bench", ["--modes", "hybird"], "--modes: unknown hybird"),
    ("modes_bench", ["--modes", "allreduce", "--mlp", "64,x"], "--mlp 64,x"),
    ("modes_bench", ["--modes", "hybrid,allreduce", "--consistency", "ssp:1", "--cache-rows",
                     "abc"], "--cache-rows abc"),
    # one rank runs no server mode: every one asked for skipped was a traceback (the PNG)
    ("modes_bench", ["--modes", "hybrid,ps"], "needs a server rank"),
    # the runs' --consistency as training checks it: was the job's end after the warm-up
    ("modes_bench", ["--modes", "hybrid,allreduce", "--consistency", "bsp,ssp2"], "ssp2"),
    ("modes_bench", ["--modes", "hybrid", "--placement", "colocated", "--consistency",
                     "ssp:2"], "not with --placement colocated"),
    ("modes_bench", ["--modes", "hybrid", "--placement", "colocated", "--replicate-rows",
                     "100", "--consistency", "asp"], "--replicate-rows 100"),
    ("store_bench", [], "launch 2 ranks"),
    ("store_bench", ["--zipf", "1"], "argument --zipf"),
    ("kernels_bench", ["--pad", "0"], "argument --pad"),
    ("kernels_bench", ["--zipf", "0.5"], "argument --zipf"),
    ("data_bench", ["--rows", "100", "--batch-size", "256"], "--rows 100"),
    ("host_bench", ["--max-cardinality", "1", "--servers", "27"], "--servers 27"),
    ("scaling", ["run.json", "--preset", "eth100"], "--preset: unknown eth100"),
    ("scaling", ["run.json", "--bandwidth", "0"], "argument --bandwidth"),
    ("scaling", ["run.json", "--compute-speedup", "0"], "argument --compute-speedup"),
    ("scaling", ["run.json", "--latency", "-1"], "--latency -1"),
])
def test_a_mistake_is_one_usage_error_before_any_work(script, argv, says, capsys):
    assert says in usage_error(capsys, script, argv)


def test_an_output_in_a_missing_directory_is_refused_before_the_run(tmp_path, capsys):
    """It was a FileNotFoundError when the JSON was written, after every timed run."""
    out = tmp_path / "missing" / "bench.json"
    for script, argv in (("modes_bench", ["--modes", "allreduce", "--json", str(out)]),
                         ("host_bench", ["--json", str(out)]),
                         ("auto_bench", ["--json", str(out)])):
        assert "no directory" in usage_error(capsys, script, argv)
    assert list(tmp_path.iterdir()) == []


def test_the_eval_data_is_named_as_itself(tmp_path, capsys):
    data = tmp_path / "valid.h5"
    data.write_bytes(b"\x89HDF\r\n\x1a\n a dataset")
    err = usage_error(capsys, "modes_bench", ["--modes", "allreduce", "--eval-data", str(data),
                                              "--json", str(data)])
    assert f"same file as --eval-data {data}" in err


def test_the_memory_line_counts_the_runs_own_table(capsys):
    """A run on a --data file: its table, not the synthetic one that --max-cardinality (which
    such a run ignores) would have capped."""
    import scaling  # noqa: F401  (before scaling_cli: it imports the model)
    import scaling_cli
    from pshybrid.optim import SLOTS

    rows, E = 16_727, 17
    run = {"args": {"max_cardinality": 10**6, "sparse_optimizer": "adagrad"},
           "table_rows": rows}
    mem = scaling_cli.memory(run, SimpleNamespace(E=E))
    assert mem["table_rows"] == rows
    assert mem["allreduce_worker_bytes"] == rows * E * 4 * (1 + len(SLOTS["adagrad"]))
    assert f"{rows:,} rows" in capsys.readouterr().out
    older = scaling_cli.memory({"args": run["args"]}, SimpleNamespace(E=E))  # (no table_rows)
    assert older["table_rows"] == scaling_cli.table_rows(10**6)


def test_a_run_without_servers_has_no_server_rss():
    """modes_bench's RSS column printed 0 MB for the servers of allreduce and compute, which
    have none (docs/benchmarks.md: '—')."""
    import modes_report

    assert modes_report.server_rss({"worker": 190.0, "server": 0.0}) == "-"
    assert modes_report.server_rss({"worker": 190.0, "server": 181.4}) == f"{181.4:.0f}"


def test_eval_data_aucs_are_printed(capsys):
    """--eval-data evaluated every run, but without consistency runs no AUC was printed."""
    import modes_report

    b = SimpleNamespace(a=SimpleNamespace(eval_data="valid.h5"))
    results = {"hybrid": {"auc": 0.7281}, "compute": {"auc": 0.70885}, "hybrid wire": {
        "auc": None}}
    modes_report.print_auc(b, results)
    out = capsys.readouterr().out
    assert "valid.h5" in out and "hybrid wire" not in out
    assert all(f"{k} {r['auc']:.4f}" in out for k, r in results.items() if r["auc"])
    modes_report.print_auc(b, {"hybrid": {"auc": None}})  # (no --eval-data: nothing)
    assert capsys.readouterr().out == ""


def test_data_bench_caps_its_file_as_its_stream(monkeypatch):
    """``data_bench --max-cardinality`` capped the synthetic stream's tables only: the HDF5
    file beside it had ``prep synthetic``'s default cap, so the two sources differed. Oracle:
    the file data_bench makes has the stream's cardinalities."""
    import subprocess

    import data_bench
    from pshybrid.data import H5Dataset
    from pshybrid.synthetic import CRITEO_KAGGLE

    real, made = subprocess.run, []

    def prep(cmd, **kw):  # the file made as data_bench asks, then the run stops
        real(cmd, **kw)
        made.append(H5Dataset(cmd[cmd.index("synthetic") + 1]).schema.cardinalities)
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", prep)
    with pytest.raises(KeyboardInterrupt):
        data_bench.main(["--rows", "1024", "--max-cardinality", "50", "--quick"])
    assert tuple(made[0]) == tuple(min(c, 50) for c in CRITEO_KAGGLE)


def test_modes_bench_imported_again_has_its_modes(capsys):
    """The registries ``modes_restored`` put back after an earlier test here lack the
    "compute" mode and "local" strategies ``modes_bench`` registers when it is imported: a
    later test that met the cached module was refused its default ``--modes`` ('unknown
    compute'). Oracle: the default command line passes ``check_args``."""
    import modes_bench
    from pshybrid.registry import MODES

    ap = modes_bench.parser()
    a = ap.parse_args(["--steps", "30", "--warmup", "5"])
    modes_bench.check_args(ap, a, 3)
    assert "compute" in MODES and "compute" in modes_bench.MODES
