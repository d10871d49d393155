"""``--tensorboard DIR``: the event file holds exactly the --metrics records' scalars (read
back through TFRecord framing and tensorboardX's own Event protobuf, not through our
writer), and a missing tensorboardX is one clear error before anything runs."""

import io
import json
import struct
import sys
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from pshybrid.config import TrainConfig
from pshybrid.errors import ConfigError
from pshybrid.synthetic import SyntheticCTR

CFG = TrainConfig(mode="allreduce", servers=0, embedding_dim=4, mlp=(8,), batch_size=8,
                  steps=6, log_every=2, progress="none", seed=1)


def events(logdir) -> dict:
    """{tag: [(step, value)]} of every scalar in ``logdir``'s event files."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):  # record: u64 length, u32 crc, payload, u32 crc
            (n,) = struct.unpack_from("<Q", data, at)
            ev = Event.FromString(data[at + 12:at + 12 + n])
            at += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def test_event_file_holds_the_metrics_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    from pshybrid.train import train

    cfg = replace(CFG, metrics=str(tmp_path / "m.jsonl"), tensorboard=str(tmp_path / "tb"))
    train(cfg, MPI.COMM_SELF, dataset=SyntheticCTR(seed=2), out=io.StringIO())
    recs = [json.loads(ln) for ln in (tmp_path / "m.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r and not r.get("summary")]
    assert [r["step"] for r in steps] == [2, 4, 6]
    got = events(tmp_path / "tb")
    f32 = np.float32
    for key in ("loss", "samples_per_s", "lr"):
        assert got[f"train/{key}"] == [(r["step"], f32(r[key])) for r in steps], key
    start = {"step": 0, "seconds": dict.fromkeys(steps[0]["seconds"], 0.0)}  # the run's start
    for phase in ("fwd_bwd", "data"):  # per step between records, from the cumulative seconds
        want = [(b["step"], f32(1e3 * (b["seconds"][phase] - a["seconds"][phase])
                                / (b["step"] - a["step"])))
                for a, b in zip([start] + steps, steps)]
        assert got[f"time/{phase}_ms_per_step"] == want


def test_evaluations_go_under_eval(tmp_path):
    pytest.importorskip("tensorboardX")
    from pshybrid.tboard import TensorBoard

    tb = TensorBoard(str(tmp_path))
    tb.add({"eval": True, "step": 5, "auc": 0.75, "logloss": 0.5, "rows": 9})
    tb.add({"summary": True, "steps": 5})
    tb.close()
    assert events(tmp_path) == {"eval/auc": [(5, 0.75)], "eval/logloss": [(5, 0.5)]}


def test_without_tensorboardx_the_run_is_refused_before_it_starts(tmp_path, monkeypatch,
                                                                   capsys):
    from pshybrid.cli import main
    from pshybrid.launch import run
    from pshybrid.tboard import NEEDS, check

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    with pytest.raises(ConfigError) as e:
        check()
    assert str(e.value) == NEEDS
    argv = ["train", "--mode", "allreduce", "--servers", "0", "--steps", "2", "--mlp", "8",
            "--tensorboard", str(tmp_path / "tb"), "--metrics", str(tmp_path / "m.jsonl")]
    assert run(main, argv) == 2
    assert capsys.readouterr().err == f"pshybrid: error: {NEEDS}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_under_the_events_is_one_warning_and_training_goes_on(tmp_path,
                                                                          monkeypatch, capsys):
    """The events are written on the training thread: a failed write (ENOSPC from the 5th
    record on) is one warning, training ends normally and says so in its status, as for
    --metrics. (tensorboardX's writer thread died of it, and training then blocked for
    good on its full queue, deaf to SIGTERM.)"""
    pytest.importorskip("tensorboardX")
    import errno

    from tensorboardX import record_writer

    from pshybrid.train import train

    calls, write = [0], record_writer.RecordWriter.write

    def full(self, data):
        calls[0] += 1
        if calls[0] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    cfg = replace(CFG, steps=40, log_every=1, tensorboard=str(tmp_path / "tb"))
    res = train(cfg, MPI.COMM_SELF, dataset=SyntheticCTR(seed=2), out=io.StringIO())
    assert res.summary["steps"] == 40 and res.metrics_failed
    err = capsys.readouterr().err
    assert err == (f"pshybrid: warning: --tensorboard {tmp_path / 'tb'}: No space left on "
                   "device: no more events are written; training goes on (exit status 1 at "
                   "the end)\n"), err
