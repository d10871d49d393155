"""jobs/: the scripts' shared functions (jobs/lib.sh), their example TOML configs, and a
whole-job preemption: jobs/local.sh signalled mid-run checkpoints and exits 75; the same
command run again resumes from ``latest`` and ends with the parameters of an uninterrupted
run (export of both final checkpoints compared)."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from mpi_util import JOB_TIMEOUT, signal_when
from pshybrid.checkpoint_files import read_latest
from pshybrid.export import export
from pshybrid.cli import build_parser
from pshybrid.config import TrainConfig, resolve

pytestmark = pytest.mark.job
JOBS = os.path.join(os.path.dirname(__file__), os.pardir, "jobs")
ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def bash(script: str, env=None, timeout=30):
    return subprocess.run(["bash", "-c", f"set -euo pipefail; . {JOBS}/lib.sh; {script}"],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(ENV, **(env or {})), stdin=subprocess.DEVNULL)


def test_every_script_parses_and_its_toml_config_is_valid():
    for path in sorted(glob.glob(os.path.join(JOBS, "*.sh"))):
        assert subprocess.run(["bash", "-n", path], timeout=30).returncode == 0, path
    tomls = sorted(glob.glob(os.path.join(JOBS, "*.toml")))
    assert [os.path.basename(t) for t in tomls] == ["local.toml", "slurm_cpu.toml",
                                                   "slurm_gpu.toml"]
    for t in tomls:
        cfg = resolve(TrainConfig, build_parser().parse_args(
            ["train", "--config", t, "--checkpoint-dir", "ck"]))
        assert cfg.checkpoint_every > 0 and cfg.keep_last > 0, t
    for name in ("slurm_cpu", "slurm_gpu"):
        text = open(os.path.join(JOBS, f"{name}.sh")).read()
        for needle in ("#SBATCH --signal=B:USR1@", "#SBATCH --requeue", f"jobs/{name}.toml",
                       "pshybrid_env", "pshybrid_resume", "pshybrid_requeue",
                       'pshybrid_run srun ${SRUN_MPI:+--mpi="$SRUN_MPI"}',  # pmi2: the wheel
                       'SRUN_MPI="${SRUN_MPI-pmi2}"',  # (srun --mpi=pmix: MPI_Init fails)
                       '--cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"',  # (22.05: else 1 core)
                       "${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}"):  # (array: one each)
            assert needle in text, (name, needle)


@pytest.mark.parametrize("name", ["slurm_cpu", "slurm_gpu"])
def test_a_slurm_job_resumes_from_the_directory_its_command_line_names(tmp_path, name):
    """(A fake srun prints the command.) The run's directory is the command line's
    --checkpoint-dir (the script looked for $CKPT/latest), and its latest outranks a
    --resume of another directory the first run was given: the requeued job resumed from
    that one again and was refused (the directory held newer checkpoints)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    (fake / "srun").chmod(0o755)
    mine = tmp_path / "mine"
    repo = os.path.abspath(os.path.join(JOBS, os.pardir))
    env = dict(ENV, PATH=f"{fake}{os.pathsep}{ENV['PATH']}", SLURM_SUBMIT_DIR=repo,
               CKPT=str(tmp_path / "env-ckpt"), SLURM_JOB_ID="7")

    def argv():
        p = subprocess.run(["bash", os.path.join(JOBS, f"{name}.sh"), "--checkpoint-dir",
                            str(mine), "--resume", "old"], capture_output=True, text=True,
                           env=env, timeout=30, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    first = argv()  # (no checkpoint yet: the first run starts from old)
    assert f"--checkpoint-dir={mine}" in first and first[-2:] == ["--resume", "old"], first
    mine.mkdir()
    (mine / "latest").write_text("step-4\n")
    again = argv()
    assert again[-3:] == ["--resume", "old", f"--resume={mine}"], again
    p = subprocess.run(["bash", os.path.join(JOBS, f"{name}.sh")], capture_output=True,
                       text=True, env=dict(env, SLURM_SUBMIT_DIR=str(tmp_path)), timeout=30)
    assert p.returncode == 2 and p.stderr == ("pshybrid: submit from the repository root (no "
                                              f"jobs/lib.sh in {tmp_path})\n"), p.stderr
    p = bash("pshybrid_env", {"PSHYBRID_VENV": str(tmp_path / "no-venv")})  # (a typo)
    assert p.returncode == 0 and p.stderr == (f"pshybrid: warning: PSHYBRID_VENV={tmp_path}/"
                                              "no-venv has no bin/activate: not activated; "
                                              "the python on PATH runs\n"), p.stderr


def _signalled_run(cmd: str, up, sig, env) -> str:
    """``pshybrid_run CMD`` in bash; once CMD has made the file ``up``, ``sig`` to the bash;
    its output (``status=N`` last)."""
    p = subprocess.Popen(["bash", "-c", f". {JOBS}/lib.sh; status=0; pshybrid_run {cmd} || "
                          "status=$?; echo status=$status signal=$PSHYBRID_SIGNAL"],
                         stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 20
    while not up.exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(sig)
    return p.communicate(timeout=30)[0]


def test_lib_forwards_signals_resumes_and_requeues(tmp_path):
    """pshybrid_run passes SIGUSR1 on to its command and returns the command's status (not
    the trap's); pshybrid_resume names DIR only once DIR/latest exists; pshybrid_requeue
    requeues on 75 (a fake scontrol records it) unless the script caught a SIGTERM (a plain
    scancel requeued the job the user cancelled), keeps 75 where the requeue is refused, and
    passes any other status through."""
    child = tmp_path / "child.sh"
    child.write_text("trap 'echo got-usr1; exit 75' USR1\n"
                     f"echo started > {tmp_path}/up\n"
                     "for i in $(seq 200); do sleep 0.05; done\nexit 0\n")
    out = _signalled_run(f"bash {child}", tmp_path / "up", signal.SIGUSR1, ENV)
    assert "got-usr1" in out and "status=75 signal=USR1" in out, out
    assert bash(f"pshybrid_resume {tmp_path}/ck").stdout == ""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("step-4\n")
    assert bash(f"pshybrid_resume {tmp_path}/ck").stdout.split() == [f"--resume={tmp_path}/ck"]
    # the command line's own --resume: of DIR or a step of it, the user's; of another
    # directory (the first run's start), outranked (the requeued job was refused)
    for own, want in ((f"--resume {tmp_path}/ck/step-2", []), (f"--resume={tmp_path}/ck", []),
                      ("--resume old --steps 9", [f"--resume={tmp_path}/ck"]),
                      ("--resume none", []),  # (none, as asked: train then refuses)
                      ("--init-from day1 --steps 9",  # (the first run's start: dropped)
                       [f"--resume={tmp_path}/ck", "--init-from=none"])):
        assert bash(f"pshybrid_resume {tmp_path}/ck {own}").stdout.split() == want, own
    assert bash("pshybrid_option checkpoint-dir --steps 3 --checkpoint-dir a "
                "--checkpoint-dir=b c").stdout == "b"
    assert bash("pshybrid_option checkpoint-dir --steps 3").stdout == ""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/scontrol\n"
                                   "[ -z \"$REFUSE\" ]\n")
    (fake / "scontrol").chmod(0o755)
    env = {"PATH": f"{fake}{os.pathsep}{ENV['PATH']}", "SLURM_JOB_ID": "123"}
    for caught in ("", "PSHYBRID_SIGNAL=USR1; "):  # (USR1 to the ranks alone, or to the script)
        assert bash(f"{caught}pshybrid_requeue 75", env).returncode == 0
        assert (tmp_path / "scontrol").read_text().split() == ["requeue", "123"]
        (tmp_path / "scontrol").unlink()
    p = bash("PSHYBRID_SIGNAL=TERM; pshybrid_requeue 75", env)  # scancel; a preemption
    assert p.returncode == 75 and "not requeued by this script" in p.stdout, p.stdout
    assert bash("pshybrid_requeue 3", env).returncode == 3
    assert not (tmp_path / "scontrol").exists()
    p = bash("pshybrid_requeue 75", dict(env, REFUSE="1"))  # --no-requeue: afterok must wait
    assert p.returncode == 75 and "scontrol requeue refused" in p.stdout, p.stdout


def test_lib_does_not_resume_the_run_a_later_day_starts_from(tmp_path):
    """A later day's job given --init-from the job's own directory (the scripts' default
    CKPT, holding the day before's run): no --resume of it (that would go on with the day
    before's run, or find it done: nothing trained, status 0); train refuses the directory.
    --init-from elsewhere (this job's run, requeued) or none: resumed as before."""
    ck = tmp_path / "ck"
    (ck / "step-4").mkdir(parents=True)
    (ck / "latest").write_text("step-4\n")
    for start in (str(ck), f"{ck}/step-4", f"{ck}/", f"{tmp_path}/./ck/step-9"):
        for args in (f"--init-from {start}", f"--init-from={start} --steps 3"):
            assert bash(f"pshybrid_resume {ck} {args}").stdout == "", args
    for args in (f"--init-from {tmp_path}/day1", "--init-from none"):
        assert bash(f"pshybrid_resume {ck} {args}").stdout.split() == [
            f"--resume={ck}", "--init-from=none"], args


def test_lib_sends_a_ctrl_c_to_the_slurm_steps_by_scancel(tmp_path):
    """Inside a Slurm job (SLURM_JOB_ID set) pshybrid_run passes SIGINT on as ``scancel
    --signal=INT JOBID`` (srun alone would only print its tasks' status); the command's own
    status comes back. Outside one, as kill -INT to the command."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scancel").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/scancel\n")
    (fake / "scancel").chmod(0o755)
    child = tmp_path / "child.py"  # (a background bash would ignore SIGINT for good)
    child.write_text("import os, signal, sys, time\n"
                     "def got(*_):\n    print('got-int', flush=True)\n    sys.exit(130)\n"
                     "signal.signal(signal.SIGINT, got)\n"
                     f"open('{tmp_path}/up', 'w').close()\n"
                     "for _ in range(400):\n"
                     f"    if os.path.exists('{tmp_path}/scancel'):\n        sys.exit(130)\n"
                     "    time.sleep(0.05)\n")
    for job in ("123", None):
        for f in ("up", "scancel"):
            (tmp_path / f).unlink(missing_ok=True)
        env = dict(ENV, PATH=f"{fake}{os.pathsep}{ENV['PATH']}")
        if job:
            env["SLURM_JOB_ID"] = job
        out = _signalled_run(f"{sys.executable} {child}", tmp_path / "up", signal.SIGINT, env)
        assert "status=130" in out, (job, out)
        if job:
            assert (tmp_path / "scancel").read_text().split() == ["--signal=INT", "123"]
            assert "got-int" not in out, out
        else:
            assert "got-int" in out and not (tmp_path / "scancel").exists(), out


def test_local_script_resumes_unless_told_otherwise_and_keeps_odd_names_values(tmp_path):
    """jobs/local.sh (a fake mpiexec prints what it got): DIR/latest adds --resume=DIR, one
    word, so a DIR named "-ck" stays a value (the rerun failed "--resume: expected one
    argument"); a --resume on the command line of DIR or a step of it is the user's and is
    not outranked by it (the script's, appended last, won), one of another directory (the
    first run's start) is (the rerun was refused: DIR holds newer checkpoints); without N,
    4 ranks (N was the first option)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpiexec").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    (fake / "mpiexec").chmod(0o755)
    (tmp_path / "-ck").mkdir()
    (tmp_path / "-ck" / "latest").write_text("step-4\n")
    env = dict(ENV, PATH=f"{fake}{os.pathsep}{ENV['PATH']}")

    def argv(*args):
        p = subprocess.run(["bash", os.path.join(JOBS, "local.sh"), "2", *args], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=30)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()[6:]  # (after: -n 2 python -m pshybrid train)

    assert argv("--checkpoint-dir=-ck") == ["--checkpoint-dir=-ck", "--resume=-ck"]
    assert argv("--checkpoint-dir", "-ck", "--resume", "-ck/step-2") == [
        "--checkpoint-dir", "-ck", "--resume", "-ck/step-2"]
    assert argv("--checkpoint-dir", "new") == ["--checkpoint-dir", "new"]
    assert argv("--checkpoint-dir", "-ck", "--resume", "old") == [  # (the first run's start)
        "--checkpoint-dir", "-ck", "--resume", "old", "--resume=-ck"]
    p = subprocess.run(["bash", os.path.join(JOBS, "local.sh"), "--steps", "3"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=30)  # (no N: 4)
    assert p.stdout.splitlines()[:2] == ["-n", "4"] and p.stdout.splitlines()[-2:] == [
        "--steps", "3"], (p.stdout, p.stderr)
    env["CKPT"] = "-ck"  # (an empty --checkpoint-dir= given: none, not $CKPT)
    assert argv("--checkpoint-dir=") == ["--checkpoint-dir="]
    assert argv() == ["--checkpoint-dir=-ck", "--resume=-ck"]
    del env["CKPT"]
    env["MPIEXEC"] = f"{fake / 'mpiexec'} -x MPI4PY_LIBMPI"  # another launcher, with its options
    p = subprocess.run(["bash", os.path.join(JOBS, "local.sh"), "2", "--steps", "3"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=30)
    assert p.stdout.splitlines() == ["-x", "MPI4PY_LIBMPI", "-n", "2", "python", "-m",
                                     "pshybrid", "train", "--steps", "3"], (p.stdout, p.stderr)


def _local(args):
    """jobs/local.sh with 2 ranks (1 server, 1 worker) in a session of its own."""
    return subprocess.Popen(["bash", os.path.join(JOBS, "local.sh"), "2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(p, timeout=JOB_TIMEOUT):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"jobs/local.sh hung past {timeout}s") from None
    return p.returncode, out, err


def _params(ckpt, out):
    """{dataset name: array} of the export of ``ckpt``'s latest: /dense and /embeddings."""
    export(ckpt, out)
    with h5py.File(out) as f:
        names = []
        f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
        return {n: f[n][()] for n in names if n.split("/")[0] in ("dense", "embeddings")}


def test_local_job_signalled_mid_run_resumes_to_the_uninterrupted_result(tmp_path):
    """Oracle: the uninterrupted run, here one process in ``allreduce`` mode (BSP: every
    mode gives the same parameters, up to float rounding: 1e-9 relative in float64)."""
    from mpi4py import MPI

    from pshybrid.train import train

    steps = 200  # many: the stop must come before the end even on a loaded machine
    common = ["--steps", str(steps), "--batch-size", "16", "--mlp", "16,8", "--embedding-dim",
              "4", "--dtype", "float64", "--log-every", "1", "--progress", "none"]
    ref_ck, ck = str(tmp_path / "ref"), str(tmp_path / "ck")
    metrics = tmp_path / "m.jsonl"
    args = common + ["--checkpoint-dir", ck, "--metrics", str(metrics)]
    p = _local(args)
    deadline = time.time() + JOB_TIMEOUT
    while time.time() < deadline and p.poll() is None and not (
            metrics.exists() and metrics.read_text().count('"step"') >= 2):
        time.sleep(0.02)
    p.send_signal(signal.SIGUSR1)  # the script exec'd mpiexec: it passes it to every rank
    rc, out, err = _finish(p)
    assert rc == 75, (rc, out, err)
    m = re.search(r"stopped by SIGUSR1 at step (\d+): checkpoint", out)
    assert m and 2 <= int(m.group(1)) < steps, out
    assert read_latest(ck) == f"step-{m.group(1)}"
    rc, out, err = _finish(_local(args))  # the same command again
    assert rc == 0 and read_latest(ck) == f"step-{steps}", (out, err)
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]  # both runs: appended
    starts = [r["start_step"] for r in recs if "config" in r]
    assert starts == [0, int(m.group(1))], starts  # the rerun went on, it did not start over
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, steps + 1))  # unbroken
    cfg = resolve(TrainConfig, build_parser().parse_args(
        ["train", *common, "--mode", "allreduce", "--servers", "0", "--checkpoint-dir", ref_ck]))
    train(cfg, MPI.COMM_SELF, out=open(os.devnull, "w"))  # noqa: SIM115
    want, got = _params(ref_ck, str(tmp_path / "ref.h5")), _params(ck, str(tmp_path / "ck.h5"))
    assert sorted(want) == sorted(got) and any(n.startswith("embeddings/") for n in got)
    for n, x in want.items():
        assert got[n].shape == x.shape
        assert np.max(np.abs(got[n] - x)) <= 1e-9 * max(np.max(np.abs(x)), 1e-300), n


def test_slurm_torch_script_checkpoints_on_the_time_limits_usr1_and_requeues(tmp_path):
    """jobs/slurm_torch.sh under a stand-in Slurm (``srun``: mpiexec -n 3 of its command;
    ``scontrol``: records its arguments). SIGUSR1 to the batch script (``--signal=B:USR1``)
    reaches every rank through srun; the pshybrid.torch script (tests/jobs/torch_preempt.py)
    writes its checkpoint in $CKPT at the stop, every rank exits 75, and the batch script
    requeues the job and succeeds."""
    pytest.importorskip("torch")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                               'exec mpiexec -n 3 "$@"\n')
    (fake / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/scontrol\n")
    for f in ("srun", "scontrol"):
        (fake / f).chmod(0o755)
    env = dict(ENV, PATH=f"{fake}{os.pathsep}{ENV['PATH']}", SLURM_JOB_ID="77",
               CKPT=str(tmp_path / "ck"), PSHYBRID_VENV=str(tmp_path / "none"))
    script = os.path.join(os.path.dirname(__file__), "jobs", "torch_preempt.py")
    rc, out, err = signal_when(["bash", os.path.join(JOBS, "slurm_torch.sh"), script, "hybrid",
                                "check", str(tmp_path)], (tmp_path / "stepped").exists,
                               signal.SIGUSR1, cwd=os.path.join(JOBS, os.pardir), env=env)
    m = re.search(r"stopped by SIGUSR1 at step (\d+): checkpoint \S+/ck/step-\1 written", out)
    assert rc == 0 and m and "requeueing it" in out, (rc, out, err)
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "77"]
    assert read_latest(str(tmp_path / "ck")) == f"step-{m.group(1)}"
