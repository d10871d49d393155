"""A signal stops training at a step boundary with a checkpoint (pshybrid.preempt): one
worker signalled mid-run -> every worker stops at the same step, that step's checkpoint is
written, the result says so on every rank; resuming from ``latest`` ends with the same
parameters as the uninterrupted run (the checkpoint oracle of test_checkpoint_mpi)."""

import io
import os
import signal
from dataclasses import replace

import pytest

from mpi_util import assert_all
from pshybrid.checkpoint_files import read_latest
from pshybrid.train import train
from test_checkpoint_mpi import same
from test_train_mpi import BASE, DATA, run


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,sig,every", [("hybrid", signal.SIGUSR1, 0),
                                            ("allreduce", signal.SIGTERM, 3)])
def test_signal_checkpoints_at_a_step_boundary_and_resume_matches(comm, mpi_tmp_path, mode,
                                                                  sig, every):
    S = 0 if mode == "allreduce" else 1
    W = comm.size - S
    cfg = replace(BASE, mode=mode, servers=S, steps=12, sparse_optimizer="adagrad",
                  dense_optimizer="adam")
    ckpt = str(mpi_tmp_path / f"ck-{mode}")
    straight = run(cfg, comm)
    before = signal.getsignal(sig)

    def on_step(done):  # one worker alone is signalled, after its step 4 (the server of a
        if done == 4 and comm.rank == comm.size - 1 - S:  # one-node job: the last rank)
            os.kill(os.getpid(), sig)

    stopped = train(replace(cfg, checkpoint_dir=ckpt, checkpoint_every=every), comm,
                    dataset=DATA, out=io.StringIO(), on_step=on_step)
    ok, msg = True, ""
    # stops at a boundary after 4 (the agreement started at one boundary ends at the next)
    if not (stopped.preempted is not None and 4 <= stopped.preempted <= 6):
        ok, msg = False, f"preempted {stopped.preempted}"
    latest = read_latest(ckpt)
    if ok and latest != f"step-{stopped.preempted}":
        ok, msg = False, f"latest {latest} after a stop at step {stopped.preempted}"
    if signal.getsignal(sig) != before:
        ok, msg = False, "signal handler not restored"
    steps = comm.allgather(stopped.preempted)
    if len(set(steps)) != 1:
        ok, msg = False, f"ranks stopped at different steps: {steps}"
    assert_all(comm, ok, msg)
    resumed = train(replace(cfg, checkpoint_dir=ckpt, resume=ckpt), comm, dataset=DATA,
                    collect=True, out=io.StringIO())
    if resumed.preempted is not None:
        ok, msg = False, "the resumed run says it was stopped"
    if straight.role == "worker" and not (same(straight.table, resumed.table, W)
                                          and same(straight.dense, resumed.dense, W)):
        ok, msg = False, f"{mode}: stopped + resumed != uninterrupted"
    assert_all(comm, ok, msg)
