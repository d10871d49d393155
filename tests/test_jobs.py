"""Whole-job tests: launch mpiexec in a subprocess, assert on exit code and output."""

import os
import re
import shutil
import sys
import time

import pytest
from mpi4py import MPI

from mpi_util import pshybrid, run_job

pytestmark = pytest.mark.job
HERE = os.path.dirname(__file__)


def test_info_prints_both_roles():
    p = run_job(2, pshybrid("info"), timeout=60)
    assert p.returncode == 0, p.stderr
    lib = MPI.Get_library_version().split()[0]  # (the library this environment loads)
    assert f"MPI library     : {lib}" in p.stdout and "CUDA-aware MPI" in p.stdout, p.stdout
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert [ln[1] for ln in lines] == ["worker", "server"], p.stdout


def test_info_names_each_ranks_threads_and_their_rule():
    """info's thread columns: BLAS threads on every rank, apply threads where a shard is
    applied (a server; '-' on a worker), each with the rule that sized it."""
    p = run_job(2, pshybrid("info"), timeout=60)
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[1]: ln for ln in p.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"])}
    cores = os.cpu_count()
    worker, server = rows["worker"].split(), rows["server"].split()
    assert worker[9] == "-" and server[9].isdigit() and int(server[9]) >= 1, p.stdout
    if f"{cores} cores / 2 ranks on the node" in rows["server"]:  # (not bound by the launcher)
        assert server[9] == str(max(1, cores // 2)), p.stdout
    else:
        assert "bound to" in rows["server"], p.stdout
    p = run_job(2, pshybrid("info", "--server-threads", "3"), timeout=60)
    server = next(ln for ln in p.stdout.splitlines() if " server " in ln)
    assert server.split()[9] == "3" and "apply: --server-threads" in server, p.stdout


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two cores")
@pytest.mark.parametrize("command", [["info"], ["train", "--steps", "2", "--batch-size", "8",
                                               "--mlp", "8", "--progress", "none"]])
def test_ranks_bound_to_one_core_are_named(command):
    """Two ranks a launcher bound to one core take turns on it, each at half its speed, and
    nothing said so. Oracle: both bound to core C, info and train's plan name ranks 0, 1 and
    C; each bound to a core of its own (or not bound), no such line."""
    c, d = sorted(os.sched_getaffinity(0))[:2]
    cmd = " ".join(pshybrid(*command))
    shared = run_job(2, ["taskset", "-c", str(c), *pshybrid(*command)], timeout=60)
    assert shared.returncode == 0, shared.stderr
    said = [ln for ln in shared.stdout.splitlines() if "between them" in ln]
    assert len(said) == 1 and f"ranks 0, 1 on {os.uname().nodename}" in said[0] and (
        f"are bound to core {c} between them: they take turns" in said[0]), shared.stdout
    rank = "${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"  # (MPICH's, Open MPI's)
    for own in (f'exec taskset -c "$(( {rank} ? {d} : {c} ))" {cmd}', f"exec {cmd}"):
        p = run_job(2, ["bash", "-c", own], timeout=60)
        assert p.returncode == 0 and "between them" not in p.stdout, (own, p.stdout, p.stderr)


@pytest.mark.parametrize("ranks", [1, 2])
def test_info_allreduce_needs_no_server(ranks):
    """As train: every rank a worker (not one server per node), and --servers 1 refused."""
    p = run_job(ranks, pshybrid("info", "--mode", "allreduce"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"0 server(s) [], {ranks} worker(s)" in p.stdout, p.stdout
    p = run_job(ranks, pshybrid("info", "--mode", "allreduce", "--servers", "1"), timeout=60)
    assert p.returncode == 2 and "uses no server: drop --servers 1" in p.stderr, p.stderr


@pytest.mark.parametrize("extra", [[], ["--server-threads", "3"]])
def test_info_allreduce_workers_show_the_apply_threads_train_uses(extra):
    """allreduce workers apply the sparse optimizer to their whole table: info's apply
    column on each is the thread count train's plan line states (not '-')."""
    p = run_job(2, pshybrid("info", "--mode", "allreduce", *extra), timeout=60)
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    q = run_job(2, pshybrid("train", "--mode", "allreduce", "--steps", "0", *extra),
                timeout=120)
    assert q.returncode == 0, q.stderr
    plan = next(ln for ln in q.stdout.splitlines() if "sparse optimizer:" in ln)
    threads = plan.split("sparse optimizer:")[1].split()[0]
    assert [r[1] for r in rows] == ["worker", "worker"], p.stdout
    assert [r[9] for r in rows] == [threads, threads], (p.stdout, plan)


@pytest.mark.parametrize("args,needle", [
    (["--servers", "2"], "--servers 2 leaves no worker"),
    (["--servers", "-1"], "--servers must be >= 0"),
    (["--servers", "0"], "--servers 0"),
    (["--mode", "bogus"], "invalid choice: 'bogus'"),
])
def test_bad_servers_fail_on_every_rank(args, needle):
    p = run_job(2, pshybrid("info", *args), timeout=60)
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"(rank {rank}/2)" in p.stderr and needle in p.stderr, p.stderr
    assert p.stderr.count("pshybrid: error") == 2, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("kind,needle", [("crash", "RuntimeError: injected failure on rank 2"),
                                         ("user", "injected bad row 42 on rank 2")])
def test_one_rank_raising_ends_the_job_fast(kind, needle):
    t0 = time.time()
    p = run_job(4, [sys.executable, os.path.join(HERE, "jobs", "raise_on_rank.py"), "2", kind],
                timeout=60)
    elapsed = time.time() - t0
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr
    assert "rank 2/4" in p.stderr, p.stderr
    assert elapsed < 10, f"took {elapsed:.1f}s to end the job"


@pytest.mark.parametrize("args,needle", [
    (["--model", "bogus"], "invalid choice: 'bogus'"),
    (["--mode", "bogus"], "invalid choice: 'bogus'"),
    (["--batch-size", "0"], "--batch-size: must be > 0, got 0"),
    (["--mlp", "abc"], "--mlp: expected comma-separated integers, got 'abc'"),
    (["--lr", "-1"], "--lr"),
    (["--consistency", "ssp", "--mode", "hybrid"], "--consistency: must be bsp, ssp:K"),
    (["--consistency", "asp", "--device", "cuda"], "not with --device cuda"),
    (["--mode", "auto", "--placement", "colocated"], "--mode auto chooses --placement"),
    (["--mode", "allreduce", "--servers", "1"], "drop --servers 1"),
])
def test_train_bad_options_fail_on_every_rank(args, needle):
    p = run_job(2, pshybrid("train", "--steps", "2", *args), timeout=60)
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"(rank {rank}/2)" in p.stderr and needle in p.stderr, p.stderr
    assert p.stderr.count("pshybrid: error") == 2 and "Traceback" not in p.stderr, p.stderr


def test_train_unknown_config_key(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "dcn"\nbatch_sise = 64\n')
    p = run_job(2, pshybrid("train", "--config", str(cfg)), timeout=60)
    assert p.returncode != 0
    assert "unknown key 'batch_sise'" in p.stderr and str(cfg) in p.stderr, p.stderr
    assert "did you mean batch_size" in p.stderr


def test_train_config_file_and_metrics(tmp_path):
    """A TOML config with a command-line override; --metrics gets one JSON object per log
    and a final summary with the per-phase split."""
    import json

    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "deepfm"\nsteps = 50\nbatch_size = 16\nlog_every = 10\n'
                   'embedding_dim = 4\nmlp = [16, 8]\n')
    metrics = tmp_path / "m.jsonl"
    p = run_job(3, pshybrid("train", "--config", str(cfg), "--steps", "20",
                            "--metrics", str(metrics)), timeout=120)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in metrics.read_text().splitlines()][1:]  # after config
    assert [r["step"] for r in recs[:-1]] == [10, 20]  # --steps 20 beat the file's 50
    for r in recs[:-1]:
        assert r["loss"] > 0 and r["samples_per_s"] > 0 and set(r["seconds"]) >= {"pull", "push"}
    s = recs[-1]
    assert s["summary"] and s["model"] == "deepfm" and s["workers"] == 2 and s["servers"] == 1
    assert abs(sum(s["phase_fraction"].values()) - 1) < 1e-6
    assert "done: hybrid deepfm  20 steps" in p.stdout


def test_job_scripts_parse_and_local_one_runs():
    import glob
    import subprocess

    scripts = sorted(glob.glob(os.path.join(HERE, "..", "jobs", "*.sh")))
    assert len(scripts) >= 3
    for path in scripts:
        first_comment = open(path).read().splitlines()[1]
        assert first_comment.startswith("# ") and os.path.basename(path) in first_comment, path
        assert subprocess.run(["bash", "-n", path], capture_output=True,
                              timeout=30).returncode == 0, path
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    p = subprocess.run(["bash", os.path.join(HERE, "..", "jobs", "local.sh"), "3", "--steps", "5",
                        "--batch-size", "8", "--log-every", "5"], capture_output=True, text=True,
                       timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert "done: hybrid wdl  5 steps" in p.stdout


@pytest.mark.timeout(450)  # (the job's own 400 s, not the suite's 120 s, on a slow machine)
def test_default_command_learns(tmp_path):
    """The README's run command (WDL, hybrid, synthetic stream, 2000 steps): mean logloss
    over the last 10% of steps < 0.9 x the logloss of always predicting the base rate."""
    import json

    metrics = tmp_path / "m.jsonl"
    p = run_job(4, pshybrid("train", "--metrics", str(metrics)), timeout=400)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary, logs = recs[-1], recs[1:-1]  # recs[0]: the config record
    assert summary["steps"] == 2000 and summary["mode"] == "hybrid" and summary["model"] == "wdl"
    tail = [r["loss"] for r in logs if r["step"] > 1800]  # each: mean over its 100 steps
    assert len(tail) == 2
    ratio = (sum(tail) / len(tail)) / summary["base_rate_logloss"]
    print(f"last-10% logloss {sum(tail) / len(tail):.4f} / base rate "
          f"{summary['base_rate_logloss']:.4f} = {ratio:.3f}")
    assert ratio < 0.9


def _small_file(path, rows=600, **kw):
    from pshybrid.synthetic import write_synthetic

    write_synthetic(str(path), rows, seed=2, n_dense=3, cardinalities=(7, 30, 200, 5), **kw)
    return str(path)


@pytest.mark.parametrize("case,needle", [
    ("missing", "no such dataset file"),
    ("small", "fewer than one global batch"),
    ("bad_id", "/sparse row 123 has an id outside [0, cardinality): field C3 id 200"),
    ("eval_schema", "the cardinality of field 2 ('C3'): 200 in the training data, 201 in"),
])
def test_train_bad_data_fails_on_every_rank(tmp_path, case, needle):
    import h5py

    args = ["--steps", "3", "--batch-size", "16", "--embedding-dim", "4", "--mlp", "8"]
    data = _small_file(tmp_path / "d.h5")
    if case == "missing":
        data = str(tmp_path / "nope.h5")
    elif case == "small":
        args += ["--batch-size", "400"]
    elif case == "bad_id":
        with h5py.File(data, "a") as f:
            f["sparse"][123, 2] = 200
    elif case == "eval_schema":
        from pshybrid.synthetic import write_synthetic

        write_synthetic(str(tmp_path / "e.h5"), 100, seed=2, n_dense=3, cardinalities=(7, 30, 201, 5))
        args += ["--eval-data", str(tmp_path / "e.h5")]
    p = run_job(3, pshybrid("train", "--data", data, *args), timeout=60)
    assert p.returncode != 0
    assert p.stderr.count("pshybrid: error") == 3, p.stderr
    for rank in range(3):
        assert f"(rank {rank}/3)" in p.stderr, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
def test_training_on_prep_synthetic_reaches_planted_auc(tmp_path):
    """`prep synthetic` file (fields capped at 1000 ids), one epoch of WDL with evaluation:
    AUC on the validation split >= 0.97 x the planted model's own AUC stored in the file."""
    import json
    import subprocess

    import h5py

    out = tmp_path / "syn.h5"
    p = subprocess.run(pshybrid("prep", "synthetic", str(out), "--rows", "240000",
                                "--valid-fraction", "0.1666667", "--max-cardinality", "1000",
                                "--seed", "1"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    valid = tmp_path / "syn.valid.h5"
    with h5py.File(valid, "r") as f:
        planted = float(f.attrs["planted_auc"])
    metrics = tmp_path / "m.jsonl"
    p = run_job(4, pshybrid("train", "--data", str(out), "--eval-data", str(valid),
                            "--epochs", "1", "--log-every", "100", "--metrics", str(metrics)),
                timeout=300)
    assert p.returncode == 0, p.stderr
    assert "step 520/520" in p.stdout  # 200k rows // (3 workers x 128): one epoch, tail dropped
    evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("eval")]
    auc = evals[-1]["auc"]
    print(f"AUC {auc:.4f} vs planted {planted:.4f}: {auc / planted:.3f}")
    assert evals[-1]["rows"] == 40000 and auc >= 0.97 * planted


_KERNELS_AT_START = """
import io, sys
from mpi4py import MPI
from pshybrid import kernels
from pshybrid.config import TrainConfig
from pshybrid.train import train
res = train(TrainConfig(steps=0, batch_size=8, mlp=(8,), progress="none"), MPI.COMM_WORLD,
            out=io.StringIO())
print(f"rank {MPI.COMM_WORLD.rank} {res.role} kernels loaded: {kernels._NUMBA is not None}")
"""


def test_every_rank_loads_the_cpu_kernels_before_the_clock_starts():
    """Worker 0 alone loaded numba (its plan asks whether the kernels' cache is cold); every
    other worker loaded it inside its first timed step (~1 s), so a short run's summary
    blamed worker 1 ('slowest worker 1 ... they wait for it') and its first log's rate fell
    ~50x. Oracle: after start-up (a run of 0 steps), numba was tried on every rank."""
    p = run_job(3, [sys.executable, "-c", _KERNELS_AT_START], timeout=120)
    assert p.returncode == 0, p.stderr
    loaded = dict(re.findall(r"rank (\d) \w+ kernels loaded: (True|False)", p.stdout))
    assert loaded == {"0": "True", "1": "True", "2": "True"}, p.stdout  # (lines may interleave)
