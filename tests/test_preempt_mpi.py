"""A signal stops training at a step boundary (pshybrid.preempt) in every mode and placement,
whoever is signalled: one worker, the server alone, or every rank. Every rank stops at the
same step, that step's checkpoint is written, the result says so on every rank; resuming
from ``latest`` ends with the same parameters as the uninterrupted run (the checkpoint
oracle of test_checkpoint_mpi). Without a checkpoint directory every rank still stops."""

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


# (mode, placement, signal, who is signalled, --checkpoint-every): one worker alone, the
# server alone (it tells the workers), every rank at once (as srun does).
CASES = [("hybrid", "dedicated", signal.SIGUSR1, "worker", 0),
         ("allreduce", "dedicated", signal.SIGTERM, "worker", 3),
         ("hybrid", "dedicated", signal.SIGTERM, "server", 0),
         ("ps", "dedicated", signal.SIGTERM, "every", 0),
         ("hybrid", "colocated", signal.SIGINT, "every", 0)]


def _signal_after_4(comm, who, sig, S):
    """on_step for the workers: after step 4, signal ``who`` (pids gathered beforehand)."""
    pids = comm.allgather(os.getpid())
    server, last_worker = comm.size - 1, comm.size - 1 - S  # one node: the last rank serves

    def on_step(done):
        if done != 4:
            return
        if who == "worker" and comm.rank == last_worker:
            os.kill(os.getpid(), sig)
        elif who == "server" and comm.rank == 0:
            os.kill(pids[server], sig)
        elif who == "every":
            os.kill(os.getpid(), sig)
            if comm.rank == 0 and S:
                os.kill(pids[server], sig)
    return on_step


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,placement,sig,who,every", CASES)
def test_signal_checkpoints_at_a_step_boundary_and_resume_matches(comm, mpi_tmp_path, mode,
                                                                  placement, sig, who, every):
    S = 0 if mode == "allreduce" or placement == "colocated" else 1
    W = comm.size - S
    where = ({"placement": "colocated", "servers": None} if placement == "colocated"
             else {"servers": S})
    cfg = replace(BASE, mode=mode, steps=12, sparse_optimizer="adagrad",
                  dense_optimizer="adam", **where)
    ckpt = str(mpi_tmp_path / f"ck-{mode}-{placement}")
    straight = run(cfg, comm)
    before = signal.getsignal(sig)
    stopped = train(replace(cfg, checkpoint_dir=ckpt, checkpoint_every=every), comm,
                    dataset=DATA, out=io.StringIO(), on_step=_signal_after_4(comm, who, sig, S))
    ok, msg = True, ""
    # stops at a boundary after 4 (the agreement started at one boundary ends at the next;
    # a server's notice is heard at the boundary after it arrives)
    if not (stopped.preempted is not None and 4 <= stopped.preempted <= 7):
        ok, msg = False, f"preempted {stopped.preempted}"
    elif stopped.signal != sig:
        ok, msg = False, f"stopped on signal {stopped.signal}, not {sig}"
    latest = read_latest(ckpt)
    if ok and latest != f"step-{stopped.preempted}":
        ok, msg = False, f"latest {latest} after a stop at step {stopped.preempted}"
    if signal.getsignal(sig) != before:
        ok, msg = False, "signal handler not restored"
    steps = comm.allgather((stopped.preempted, stopped.signal))
    if len(set(steps)) != 1:
        ok, msg = False, f"ranks stopped differently: {steps}"
    assert_all(comm, ok, msg)
    resumed = train(replace(cfg, checkpoint_dir=ckpt, resume=ckpt), comm, dataset=DATA,
                    collect=True, out=io.StringIO())
    if resumed.preempted is not None:
        ok, msg = False, "the resumed run says it was stopped"
    if straight.role == "worker" and not (same(straight.table, resumed.table, W)
                                          and same(straight.dense, resumed.dense, W)):
        ok, msg = False, f"{mode} {placement}: stopped + resumed != uninterrupted"
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_without_a_checkpoint_dir_a_signal_still_stops_every_rank(comm):
    """No --checkpoint-dir: the server alone is signalled; every rank stops at one step
    boundary (nothing saved) and says which signal, and a later run in the same process is
    not stopped by it (the catcher forgets it at the end of the run). Its last log is its
    last step (no log came due before it): the summary's final loss and base rate are
    those of a run of that many steps."""
    cfg = replace(BASE, mode="hybrid", servers=1, steps=12)
    out = io.StringIO()
    stopped = train(cfg, comm, dataset=DATA, out=out,
                    on_step=_signal_after_4(comm, "server", signal.SIGTERM, 1))
    again = train(replace(cfg, steps=stopped.preempted or 6), comm, dataset=DATA,
                  out=io.StringIO())
    ok = (stopped.preempted is not None and 4 <= stopped.preempted <= 7
          and stopped.signal == signal.SIGTERM and again.preempted is None)
    if comm.rank == 0:
        got, want = ([r.summary[k] for k in ("final_loss", "base_rate", "steps_run")]
                     for r in (stopped, again))
        ok = ok and got == want and stopped.log[-1]["step"] == stopped.preempted
    said = out.getvalue()
    if comm.rank == 0 and "no --checkpoint-dir, so nothing was saved (exit status 143)" not in said:
        ok = False
    assert_all(comm, ok, f"{stopped.preempted} {stopped.signal} {again.preempted} {said[-300:]}")
