"""``--init-from CKPT``: a new run that starts from a checkpoint's model and optimizer state
(a later day's file read from its first row, at step 0, with a fresh ``--lr-schedule``).

Oracles: training day 1 and then day 2 ``--init-from`` its checkpoint (and a third day from
day 2's) == one run over the files' concatenation (bit for bit: one process, float64; SGD,
Adagrad, Adam); the learning rates logged == a fresh run's on day 2; a checkpoint of such a run
resumed == the run uninterrupted; the refusals name the options and change nothing.
"""

import json
import os
import tomllib
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from mpi_util import snapshot
from pshybrid import export
from pshybrid.cli import main
from pshybrid.config import TrainConfig
from pshybrid.errors import ConfigError, InputError
from pshybrid.synthetic import write_synthetic
from pshybrid.train import train

CARDS = (7, 30, 5)
BASE = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                   batch_size=4, log_every=1, seed=3, dtype="float64", shuffle=False,
                   dense_optimizer="sgd", dense_lr=0.05, progress="none")


@pytest.fixture
def days(tmp_path):
    """Day 1 (16 rows: 4 steps of 4) and day 2 (12 rows), other rows of one generator."""
    out = []
    for name, rows, seed in (("day1.h5", 16, 1), ("day2.h5", 12, 2)):
        write_synthetic(str(tmp_path / name), rows, seed=seed, n_dense=2, cardinalities=CARDS)
        out.append(str(tmp_path / name))
    return out


def run(**kw):
    return train(replace(BASE, **kw), MPI.COMM_SELF, collect=True)


@pytest.mark.parametrize("sparse,dense", [("sgd", "sgd"), ("adagrad", "sgd"), ("adam", "adam")])
def test_later_days_from_checkpoints_are_the_days_trained_as_one(tmp_path, days, sparse, dense):
    """Day 2 --init-from day 1's last checkpoint reads day 2 from its first row with day 1's
    parameters and optimizer state (Adagrad's sums; Adam's moments, and its step count for
    the bias correction), and a third day --init-from day 2's goes on alike: the same as one
    run over day1,day2,day1 (whose steps 4 and 7 begin the next file). Reading day 2 from
    step 4 (a resume: batch 1 of its 3), without the state, or Adam counting from 1 differs."""
    day1, day2 = days
    ck1, ck2 = str(tmp_path / "ck1"), str(tmp_path / "ck2")
    opts = dict(sparse_optimizer=sparse, dense_optimizer=dense)
    run(data=day1, steps=4, checkpoint_dir=ck1, **opts)
    run(data=day2, steps=3, init_from=ck1, checkpoint_dir=ck2, **opts)
    later = run(data=day1, steps=4, init_from=ck2, **opts)
    whole = run(data=f"{day1},{day2},{day1}", steps=11, **opts)
    assert np.array_equal(later.dense, whole.dense) and np.array_equal(later.table, whole.table)
    fresh = run(data=day1, steps=4, **opts)  # (the oracle can fail)
    assert not np.array_equal(fresh.table, whole.table)


def test_the_lr_schedule_starts_afresh_and_a_checkpoint_of_the_run_resumes(tmp_path, days):
    """--init-from with a warm-up: the rates logged are a fresh run's on day 2 (not those
    of the checkpoint's step on); stopped at step 2 and resumed, the run is the same as
    uninterrupted (its checkpoints are its own: step 2 reads day 2's third batch)."""
    day1, day2 = days
    ck1, ck2 = str(tmp_path / "ck1"), str(tmp_path / "ck2")
    run(data=day1, steps=4, checkpoint_dir=ck1)
    sched = dict(lr_schedule="warmup-linear", warmup_steps=2, data=day2, steps=3)

    def rates(name, **kw):
        path = str(tmp_path / name)
        res = run(metrics=path, **sched, **kw)
        with open(path) as f:
            return res, [r["lr"] for r in map(json.loads, f) if "loss" in r and "step" in r]

    whole, lr_from = rates("a.jsonl", init_from=ck1)
    assert lr_from == rates("b.jsonl")[1] and len(lr_from) == 3, lr_from
    run(**sched | dict(steps=2), init_from=ck1, checkpoint_dir=ck2)
    resumed = run(**sched, resume=ck2)
    assert np.array_equal(resumed.dense, whole.dense)
    assert np.array_equal(resumed.table, whole.table)


def test_init_from_refusals_name_the_way_out_and_write_nothing(tmp_path, days):
    """With --resume; a checkpoint of another model; into the checkpoint's own directory;
    an export file: one error each, no checkpoint written, the first run's untouched."""
    day1, day2 = days
    ck1 = str(tmp_path / "ck1")
    run(data=day1, steps=4, checkpoint_dir=ck1)
    before = snapshot(ck1)
    ex = str(tmp_path / "ex.h5")
    export.export(ck1, ex)
    with pytest.raises(ConfigError, match="--init-from starts a new run .* --resume goes on"):
        run(data=day2, init_from=ck1, resume=ck1)
    with pytest.raises(InputError, match="embedding_dim = 4 but this run asks for 8"):
        run(data=day2, init_from=ck1, embedding_dim=8, checkpoint_dir=str(tmp_path / "new"))
    for start in (ck1, os.path.join(ck1, "step-4")):  # (its own: no --resume suggested)
        with pytest.raises(InputError, match=f"--checkpoint-dir {ck1} already holds ch") as e:
            run(data=day2, init_from=start, checkpoint_dir=ck1)
        assert f"--init-from {start} starts from" in str(e.value), e.value
        assert "--resume" not in str(e.value) and "a resume saves" not in str(e.value)
    with pytest.raises(InputError, match="an export written by pshybrid export"):
        run(data=day2, init_from=ex)
    ck2 = str(tmp_path / "ck2")  # (a day-2 run's own, rerun by hand as it began)
    run(data=day2, init_from=ck1, checkpoint_dir=ck2, steps=2)
    with pytest.raises(InputError, match=f"continue them with --resume {ck2}, .*--resume in "
                                         "place of --init-from"):
        run(data=day2, init_from=ck1, checkpoint_dir=ck2)
    assert run(data=day2, resume=ck2, steps=3).table is not None
    assert snapshot(ck1) == before and not os.path.exists(tmp_path / "new")


def test_a_requeued_day_resumes_its_own_checkpoints_from_the_command_line(tmp_path, days,
                                                                          capsys):
    """The batch script's two commands: --init-from day 1 for day 2, then (requeued) --resume
    of day 2's directory, whose stored options hold --init-from: taken as the resumed run's
    start (not refused beside --resume, not listed as changed); it ends at day 2's end."""
    day1, day2 = days
    ck1, ck2 = str(tmp_path / "ck1"), str(tmp_path / "ck2")
    small = ["--mode", "allreduce", "--embedding-dim", "4", "--mlp", "8", "--batch-size", "4",
             "--progress", "none", "--no-shuffle"]
    assert main(["train", *small, "--data", day1, "--steps", "4", "--checkpoint-dir", ck1]) == 0
    assert main(["train", *small, "--data", day2, "--steps", "2", "--init-from", ck1,
                 "--checkpoint-dir", ck2]) == 0
    assert f"started from {ck1} (its step 4) at step 0" in capsys.readouterr().out
    assert main(["train", "--resume", ck2, "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "changed: --steps 3 (was 2)" in out and "--init-from" not in out, out
    assert "resumed from" in out and "at step 2" in out and "done:" in out, out


def test_print_config_of_a_resumed_day_is_a_config_file(tmp_path, days, capsys):
    """--print-config with --resume (a day's run, to give its options to the next day):
    stdout is the TOML file alone, which --config reads back; the resume note goes to
    stderr."""
    day1, day2 = days
    ck1 = str(tmp_path / "ck1")
    small = ["--mode", "allreduce", "--embedding-dim", "4", "--mlp", "8", "--batch-size", "4",
             "--progress", "none", "--no-shuffle"]
    assert main(["train", *small, "--data", day1, "--steps", "2", "--checkpoint-dir", ck1]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", ck1, "--steps", "4", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "resume: the options of" in err and "changed: --steps 4" in err, err
    conf = tomllib.loads(out)
    assert conf["steps"] == 4 and conf["resume"] == ck1 and conf["embedding_dim"] == 4


def test_resume_none_keeps_a_config_files_init_from(tmp_path, capsys):
    """A --config file's --init-from with --resume none given on top (no resume, as the jobs
    scripts' users say): the run still starts from the checkpoint; it was dropped, and the
    day trained from scratch. Oracle: --print-config's TOML, read back, names it."""
    conf = tmp_path / "day.toml"
    ck = str(tmp_path / "ck1")
    conf.write_text(f"init_from = {json.dumps(ck)}\nsteps = 3\n")
    assert main(["train", "--config", str(conf), "--resume", "none", "--print-config"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["init_from"] == ck and printed["resume"] == "none", printed


def test_a_config_files_init_from_of_the_resumed_directory_is_refused(tmp_path, days):
    """A later day's --config file names --init-from the day before's directory, which the
    jobs scripts (its default CKPT) resume with --resume: the day before's run went on, or
    found itself done ("nothing to do"), status 0, nothing trained. Oracle: refused (status
    2 on the command line), naming both; --init-from elsewhere (this run's start, requeued)
    resumes as before."""
    day1, day2 = days
    ck = str(tmp_path / "ck")
    small = ["--mode", "allreduce", "--embedding-dim", "4", "--mlp", "8", "--batch-size", "4",
             "--progress", "none", "--no-shuffle"]
    assert main(["train", *small, "--data", day1, "--steps", "4", "--checkpoint-dir", ck]) == 0
    for start in (ck, os.path.join(ck, "step-4")):
        conf = tmp_path / "day2.toml"
        conf.write_text(f"init_from = {json.dumps(start)}\ndata = {json.dumps(day2)}\n")
        with pytest.raises(ConfigError, match=f"--init-from {start} starts a new run from the "
                                              f"checkpoints that --resume {ck} goes on with"):
            main(["train", "--config", str(conf), "--checkpoint-dir", ck, "--resume", ck])
    conf.write_text(f"init_from = {json.dumps(str(tmp_path / 'day0'))}\n")
    assert main(["train", "--config", str(conf), "--resume", ck, "--steps", "5"]) == 0
