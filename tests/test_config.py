"""Config: dataclass ⇄ argparse ⇄ TOML. Oracles: round trips and exact error texts."""

import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

from pshybrid.config import (ArgumentParser, TrainConfig, add_arguments, from_dict, option,
                             resolve, to_dict, to_toml)
from pshybrid.errors import ConfigError


@dataclass
class Toy:
    """Every supported field type, generically."""

    flag: bool = option(False, "a switch")
    rate: float = option(0.5, "a rate", check=lambda v: None if v < 1 else "must be < 1")
    count: int | None = option(None, "a count")
    name: str | None = option(None, "a name", choices=("a", "b"))
    sizes: tuple[int, ...] = option((3,), "sizes")


def parse(cls, *argv):
    parser = ArgumentParser(prog="prog")
    add_arguments(parser, cls)
    return resolve(cls, parser.parse_args(argv))


def toml(tmp_path, text):
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return str(path)


def fails(fn, *args):
    """The message of the ConfigError that ``fn(*args)`` raises; it must be collective."""
    with pytest.raises(ConfigError) as info:
        fn(*args)
    assert info.value.collective
    return str(info.value)


def test_defaults_when_nothing_given():
    assert parse(TrainConfig) == TrainConfig()
    assert parse(Toy) == Toy()


def test_cli_overrides_toml_overrides_defaults(tmp_path):
    path = toml(tmp_path, 'model = "dcn"\nbatch-size = 64\nlr = 1\nmlp = [64, 32]\n')
    cfg = parse(TrainConfig, "--config", path, "--batch-size", "32", "--seed", "7")
    assert cfg == TrainConfig(model="dcn", batch_size=32, lr=1.0, mlp=(64, 32), seed=7)
    assert type(cfg.lr) is float


def test_the_largest_seed_is_accepted():
    assert parse(TrainConfig, "--seed", str(2**32 - 1)).seed == 2**32 - 1


def test_cli_values():
    cfg = parse(TrainConfig, "--mlp", "64,32", "--servers", "none", "--dense-lr", "0.1",
                "--shared-memory", "off", "--data", "train.h5", "--epochs", "2")
    assert cfg == TrainConfig(mlp=(64, 32), servers=None, dense_lr=0.1, shared_memory="off",
                              data="train.h5", epochs=2)
    assert parse(TrainConfig, "--servers", "2").servers == 2


def test_the_rows_rate_is_by_the_sparse_optimizer_unless_given(tmp_path):
    """--lr none (the default): 0.05 for Adagrad (0.01 with DeepFM), 0.001 for a sparse
    Adam, 0.5 for SGD; given on the command line or in TOML, it wins. Training steps at it
    (the metrics' ``lr``: the rows' optimizer's rate at each step)."""
    import json

    from mpi4py import MPI

    from pshybrid.train import train

    assert parse(TrainConfig).lr is None and TrainConfig().sparse_lr == 0.05
    assert parse(TrainConfig, "--sparse-optimizer", "adam").sparse_lr == 0.001
    assert parse(TrainConfig, "--sparse-optimizer", "sgd").sparse_lr == 0.5
    assert parse(TrainConfig, "--sparse-optimizer", "adam", "--lr", "0.2").sparse_lr == 0.2
    assert parse(TrainConfig, "--model", "deepfm").sparse_lr == 0.01  # (its own row_rates)
    assert parse(TrainConfig, "--model", "deepfm", "--sparse-optimizer", "adam").sparse_lr == 0.001
    assert parse(TrainConfig, "--model", "deepfm", "--lr", "0.05").sparse_lr == 0.05
    path = toml(tmp_path, 'sparse-optimizer = "adam"\nlr = "none"\n')
    assert parse(TrainConfig, "--config", path).sparse_lr == 0.001
    for model, opt, lr, want in (("wdl", "adam", None, 0.001), ("wdl", "sgd", None, 0.5),
                                 ("wdl", "adam", 0.2, 0.2), ("deepfm", "adagrad", None, 0.01)):
        out = tmp_path / f"{model}-{opt}-{lr}.jsonl"
        cfg = TrainConfig(model=model, mode="allreduce", servers=0, steps=2, batch_size=8,
                          mlp=(4,), sparse_optimizer=opt, lr=lr, log_every=1,
                          metrics=str(out), progress="none")
        train(cfg, MPI.COMM_SELF)
        recs = list(map(json.loads, out.read_text().splitlines()))
        rates = [r["lr"] for r in recs if "lr" in r]
        assert len(rates) >= 2 and set(rates) == {want}, (opt, lr, rates)
        assert recs[0]["rates"] == {"lr": want, "dense_lr": 0.001}, recs[0]  # (dense adam)


@pytest.mark.parametrize("opt, dense_lr, want", [("adam", None, 0.001), ("sgd", None, 0.01),
                                                 ("sgd", 0.2, 0.2)])
def test_the_dense_rate_is_by_the_dense_optimizer_unless_given(opt, dense_lr, want):
    """--dense-lr none (the default): 0.001 for Adam, 0.01 for SGD (not Adam's rate, which
    left a plain-SGD MLP far behind, nor the rows' rate); given, it wins. Step 1's dense
    update is proportional to the rate (SGD: lr g; Adam: lr g / (|g| + eps)), so against
    the same step at rate 1 it is ``want`` times as large."""
    from mpi4py import MPI

    from pshybrid.train import train

    argv = ["--dense-optimizer", opt] + ([] if dense_lr is None else ["--dense-lr", str(dense_lr)])
    cfg = parse(TrainConfig, *argv)
    assert cfg.dense_lr == dense_lr and cfg.dense_rate == want

    def dense(steps, **change):
        run = dataclasses.replace(cfg, mode="allreduce", servers=0, steps=steps, batch_size=8,
                                  mlp=(4,), dtype="float64", progress="none", **change)
        return train(run, MPI.COMM_SELF, collect=True).dense

    w0 = dense(0)
    moved, unit = dense(1) - w0, dense(1, dense_lr=1.0) - w0
    seen = unit != 0
    assert seen.sum() > 10 and np.allclose(moved[seen], want * unit[seen], rtol=1e-6, atol=1e-15)


def test_generic_types(tmp_path):
    assert parse(Toy, "--flag", "--rate", "0.25", "--count", "3", "--name", "b",
                 "--sizes", "1,2") == Toy(True, 0.25, 3, "b", (1, 2))
    path = toml(tmp_path, 'flag = true\nrate = 0\ncount = 5\nname = "a"\nsizes = "4,5"\n')
    assert parse(Toy, "--config", path) == Toy(True, 0.0, 5, "a", (4, 5))
    assert parse(Toy, "--config", path, "--no-flag", "--count", "none", "--name", "none") == \
        Toy(False, 0.0, None, None, (4, 5))


@pytest.mark.parametrize("cls,cfg", [
    (TrainConfig, TrainConfig()),
    (TrainConfig, TrainConfig(model="dlrm", servers=3, data="d.h5", epochs=1, dense_lr=0.5,
                              mlp=(8,), mode="ps", resume="ckpt")),
    (Toy, Toy(True, 0.0, 7, "a", (1, 2, 3))),
])
def test_to_dict_from_dict_round_trip(cls, cfg):
    d = to_dict(cfg)
    assert from_dict(cls, json.loads(json.dumps(d)), "checkpoint") == cfg
    assert d == {k: list(v) if isinstance(v, tuple) else v
                 for k, v in dataclasses.asdict(cfg).items()}


@pytest.mark.parametrize("argv,message", [
    (["--mlp", "abc"], "--mlp: expected comma-separated integers, got 'abc'"),
    (["--mlp", "64,0"], "--mlp: must be a non-empty list of sizes > 0, got 64,0"),
    (["--batch-size", "0"], "--batch-size: must be > 0, got 0"),
    (["--batch-size", "1.5"], "--batch-size: expected an integer, got '1.5'"),
    (["--lr", "-1"], "--lr: must be >= 0 and finite, got -1.0"),
    (["--lr", "inf"], "--lr: must be >= 0 and finite, got inf"),
    (["--servers", "-1"], "--servers: must be >= 0, got -1"),
    (["--beta1", "1"], "--beta1: must be >= 0 and < 1, got 1.0"),  # (1 - b1^t: 0 forever)
    (["--beta2", "nan"], "--beta2: must be >= 0 and < 1, got nan"),
    (["--eps", "0"], "--eps: must be > 0 and finite, got 0.0"),  # (g / 0 on a fresh row)
    (["--eps", "inf"], "--eps: must be > 0 and finite, got inf"),
    # below float32's least value it is 0 in the kernels: g / 0 again (checked for --dtype)
    (["--eps", "1e-50"], "--eps 1e-50 is 0 in float32 (g / 0 on a fresh row): must be >= "
                         f"{np.finfo(np.float32).smallest_subnormal:g}"),
    (["--consistency", "ssp:x"], ("--consistency: must be bsp, ssp:K (K >= 0 steps) or asp, "
                                  "got 'ssp:x'")),
    (["--cache-rows", "-1"], "--cache-rows: must be >= 0, got -1"),
    (["--consistency", "ssp:2", "--mode", "allreduce"],
     ("--consistency ssp:2: only with --mode hybrid or ps, --placement "
      "dedicated, no --replicate-rows, --device cpu; not with --mode allreduce")),
    (["--cache-rows", "9", "--placement", "colocated", "--replicate-rows", "3"],
     ("--cache-rows 9: only with --mode hybrid or ps, --placement "
      "dedicated, no --replicate-rows, --device cpu; not with --placement colocated, "
      "--replicate-rows 3")),
    (["--mode", "bogus"], "prog: argument --mode: invalid choice: 'bogus' "
                          "(choose from 'hybrid', 'ps', 'allreduce', 'auto')"),
    (["--mode", "auto", "--replicate-rows", "8"], "--mode auto chooses --placement and "
                                                  "--replicate-rows: drop --replicate-rows (or "
                                                  "pick a mode)"),
    (["--mode", "auto", "--placement", "dedicated"], "--mode auto chooses --placement and "
                                                     "--replicate-rows: drop --placement (or "
                                                     "pick a mode)"),  # (its default too)
    (["--model", "bogus"], "prog: argument --model: invalid choice: 'bogus' "
                           "(choose from 'wdl', 'deepfm', 'dcn', 'dcnv2', 'dlrm')"),
    (["--epochs", "2"], "--epochs needs --data; the synthetic stream is endless: use --steps"),
    # the tables take the seed's low 32 bits: 2**32 would silently be seed 0
    (["--seed", str(2**32)], "--seed: must be an integer from 0 to 2**32 - 1, got 4294967296"),
    (["--seed", "-1"], "--seed: must be an integer from 0 to 2**32 - 1, got -1"),
    (["--step-timeout", "0.5"], "--step-timeout: must be >= 1, got 0.5"),  # (its thread polls)
    # an unset variable in a job script ("--resume $CKPT") is no path: it was taken as none,
    # a fresh run that saved nothing, on the synthetic stream, exit status 0
    *[([option, value], f"{option}: must be a value (or none), got {value!r}")
      for option in ("--resume", "--checkpoint-dir", "--data", "--eval-data", "--metrics",
                     "--tensorboard") for value in ("", " ")],
])
def test_cli_errors(argv, message):
    assert fails(parse, TrainConfig, *argv) == message


@pytest.mark.parametrize("text,message", [
    ("batch_sise = 12\n", "unknown key 'batch_sise' in {path}; did you mean batch_size?"),
    ("steps = 1\nsteps-per = 2\n", "unknown key 'steps-per' in {path}; did you mean steps?"),
    ("batch_size = 1\nbatch-size = 2\n", "key 'batch-size' given twice in {path}"),
    ('batch_size = "12"\n', "batch_size (in {path}): expected an integer, got '12'"),
    ("lr = true\n", "lr (in {path}): expected a number, got True"),
    ("epochs = 1.0\n", "epochs (in {path}): expected an integer, got 1.0"),
    ("mlp = [64, true]\n", "mlp (in {path}): expected an array of integers, got (64, True)"),
    ('mlp = "64,x"\n', "mlp (in {path}): expected comma-separated integers, got '64,x'"),
    ('model = "bogus"\n', "model (in {path}): must be one of wdl, deepfm, dcn, dcnv2, dlrm, "
                          "got 'bogus'"),
    ('resume = ""\n', "resume (in {path}): must be a value (or none), got ''"),
    ('checkpoint_dir = ""\n', "checkpoint_dir (in {path}): must be a value (or none), got ''"),
])
def test_toml_errors(tmp_path, text, message):
    path = toml(tmp_path, text)
    assert fails(parse, TrainConfig, "--config", path) == message.format(path=path)


def test_auto_and_the_options_it_chooses_are_checked_after_every_layer(tmp_path):
    """A file's ``mode = "auto"`` with its ``placement`` is refused naming the file, and the
    command line's --mode overrides it; a file's placement under the command line's auto
    is refused too, but not one at its default (``--print-config``'s every key)."""
    path = toml(tmp_path, 'mode = "auto"\nplacement = "dedicated"\nreplicate_rows = 0\n')
    assert fails(parse, TrainConfig, "--config", path) == (
        f"--mode auto chooses --placement and --replicate-rows: drop placement (in {path}) "
        f"and replicate_rows (in {path}) (or pick a mode)")
    cfg = parse(TrainConfig, "--config", path, "--mode", "hybrid")
    assert (cfg.mode, cfg.placement, cfg.replicate_rows) == ("hybrid", "dedicated", 0)
    path = toml(tmp_path, 'placement = "colocated"\n')
    assert fails(parse, TrainConfig, "--config", path, "--mode", "auto") == (
        f"--mode auto chooses --placement and --replicate-rows: drop placement (in {path}) "
        "(or pick a mode)")
    # a --print-config of a run in another mode (placement and replicate_rows at their
    # defaults: no choice) under the command line's auto: auto chooses them
    printed = toml(tmp_path, to_toml(parse(TrainConfig, "--mode", "ps")))
    cfg = parse(TrainConfig, "--config", printed, "--mode", "auto")
    assert cfg.mode == "auto" and (cfg.placement, cfg.replicate_rows) == ("dedicated", 0)


def test_unreadable_or_invalid_toml(tmp_path):
    missing = str(tmp_path / "missing.toml")
    assert fails(parse, TrainConfig, "--config", missing) == \
        f"--config {missing}: cannot read: No such file or directory"
    assert fails(parse, TrainConfig, "--config", str(tmp_path)) == \
        f"--config {tmp_path}: cannot read: Is a directory"
    for text in ("seed = \n", "seed = 1\nseed = 2\n"):
        path = toml(tmp_path, text)
        message = fails(parse, TrainConfig, "--config", path)
        assert message.startswith(f"--config {path}: invalid TOML: ") and "line" in message
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'data = "\xff"\n')
    assert fails(parse, TrainConfig, "--config", str(binary)).startswith(
        f"--config {binary}: invalid TOML: ")


def test_generic_errors():
    assert fails(parse, Toy, "--rate", "1") == "--rate: must be < 1, got 1.0"
    assert fails(parse, Toy, "--count", "x") == "--count: expected an integer, got 'x'"
    assert fails(parse, Toy, "--name", "c") == \
        "prog: argument --name: invalid choice: 'c' (choose from 'a', 'b', 'none')"
    assert fails(from_dict, Toy, {"name": "c"}, "src") == \
        "name (in src): must be one of a, b, got 'c'"
    assert fails(from_dict, Toy, {"flag": 1}, "src") == \
        "flag (in src): expected true or false, got 1"
    assert fails(from_dict, Toy, {"zzz": 1}, "ckpt/config.json") == \
        "unknown key 'zzz' in ckpt/config.json; known: flag, rate, count, name, sizes"


@pytest.mark.parametrize("cfg", [
    Toy(), Toy(flag=True, rate=1e-7, count=0, name="b", sizes=(1024, 512, 256)),
    Toy(rate=-0.0, count=2**62, sizes=(1,))])
def test_to_toml_reads_back_to_the_same_config(cfg, tmp_path):
    from pshybrid.config import to_toml

    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert parse(Toy, "--config", str(path)) == cfg


def test_print_config_prints_the_effective_options_and_trains_nothing(tmp_path, capsys):
    """defaults < --config < command line, with strings that need TOML escapes and a
    none-valued option whose default is not none; --config of the output gives it back."""
    import tomllib

    from pshybrid.cli import main
    from pshybrid.config import to_toml

    (tmp_path / "base.toml").write_text('mlp = [8, 4]\nsteps = 7\nmetrics = "x.jsonl"\n')
    argv = ["train", "--config", str(tmp_path / "base.toml"), "--steps", "9", "--step-timeout",
            "none", "--metrics", 'a "b"\\c.jsonl', "--print-config"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    want = dataclasses.replace(TrainConfig(), mlp=(8, 4), steps=9, step_timeout=None,
                               metrics='a "b"\\c.jsonl')
    assert from_dict(TrainConfig, tomllib.loads(printed), "printed") == want
    assert printed == to_toml(want)
    (tmp_path / "printed.toml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert not list(tmp_path.glob("*.jsonl"))  # nothing ran


def test_print_config_of_an_epochs_run_reads_back_and_the_command_line_wins(tmp_path, capsys):
    """--epochs replaces --steps: the printed file comments steps out (both keys in one
    file are refused), reads back to the same options, and under it (and under any file
    giving epochs) --steps on the command line replaces epochs. A path beyond the BMP is
    written as TOML can read it (not as a JSON surrogate pair)."""
    import tomllib

    from pshybrid.cli import main

    argv = ["train", "--data", "d.h5", "--epochs", "2", "--metrics", "run\U0001F600.jsonl",
            "--print-config"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "# steps = 2000  (--epochs decides)\nepochs = 2\n" in printed
    assert tomllib.loads(printed)["metrics"] == "run\U0001F600.jsonl"
    (tmp_path / "p.toml").write_text(printed, encoding="utf-8")
    assert main(["train", "--config", str(tmp_path / "p.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    (tmp_path / "e.toml").write_text('epochs = 2\ndata = "d.h5"\n')
    for conf in ("p.toml", "e.toml"):
        cfg = parse(TrainConfig, "--config", str(tmp_path / conf), "--steps", "10")
        assert (cfg.steps, cfg.epochs) == (10, None), conf
    (tmp_path / "both.toml").write_text('epochs = 2\nsteps = 10\ndata = "d.h5"\n')
    assert f"steps = 10 and epochs = 2 in {tmp_path / 'both.toml'}: give one" in fails(
        parse, TrainConfig, "--config", str(tmp_path / "both.toml"))


@pytest.mark.parametrize("base,argv,want", [
    ({"epochs": 2, "data": "d.h5"}, ["--steps", "5"], {"steps": 5, "epochs": None}),
    ({"steps": 9}, ["--epochs", "2", "--data", "d.h5"], {"steps": 9, "epochs": 2}),
    ({"checkpoint_dir": "ck", "checkpoint_every": 3, "keep_last": 2},
     ["--checkpoint-dir", "none"], {"checkpoint_dir": None, "checkpoint_every": 0,
                                    "keep_last": 0}),
    ({"eval_data": "v.h5", "eval_every": 4}, ["--eval-data", "none"], {"eval_every": 0}),
    ({"data": "d.h5", "epochs": 1}, ["--data", "none"], {"data": None, "epochs": None}),
    ({"lr": 0.5, "mlp": [4, 2]}, ["--lr", "0.25"], {"lr": 0.25, "mlp": (4, 2)}),
    # what --mode auto chose for the run that wrote the checkpoint gives way to auto's
    # choice now (it was refused: "drop placement (from placement in meta.json)")
    ({"mode": "hybrid", "placement": "colocated", "replicate_rows": 8}, ["--mode", "auto"],
     {"mode": "auto", "placement": "dedicated", "replicate_rows": 0}),
])
def test_a_lower_layer_yields_to_what_the_command_line_gives(base, argv, want):
    """``resolve(..., base)`` (a resumed checkpoint's options): the command line wins, and
    an option it sets drops the stored options that only make sense with the old value."""
    parser = ArgumentParser(prog="prog")
    add_arguments(parser, TrainConfig)
    cfg = resolve(TrainConfig, parser.parse_args(argv), base, "ck/meta.json")
    assert {k: getattr(cfg, k) for k in want} == want


def test_a_stored_option_in_the_way_says_how_to_drop_it():
    """A checkpoint's --servers 2 under the command line's --placement colocated: refused
    naming meta.json, and that --servers none drops it (the user never typed --servers)."""
    parser = ArgumentParser(prog="prog")
    add_arguments(parser, TrainConfig)
    ns = parser.parse_args(["--placement", "colocated"])
    with pytest.raises(ConfigError) as e:
        resolve(TrainConfig, ns, {"servers": 2}, "ck/step-4/meta.json")
    assert str(e.value).endswith("drop --servers 2 (from servers in ck/step-4/meta.json: "
                                 "--servers none drops it)"), e.value
    cfg = resolve(TrainConfig, parser.parse_args(["--placement", "colocated", "--servers",
                                                  "none"]), {"servers": 2}, "ck/step-4/meta.json")
    assert cfg.servers is None and cfg.placement == "colocated"
    with pytest.raises(ConfigError, match="--mode auto chooses --placement and "
                                          "--replicate-rows: drop --placement"):
        resolve(TrainConfig, parser.parse_args(["--mode", "auto", "--placement", "colocated"]),
                {"mode": "ps", "placement": "colocated"}, "ck/step-4/meta.json")


def test_steps_and_epochs_given_together_are_refused():
    with pytest.raises(ConfigError, match="--steps 5 and --epochs 2: give one"):
        parse(TrainConfig, "--data", "d.h5", "--steps", "5", "--epochs", "2")


def test_train_refuses_what_is_not_a_train_config():
    """A dict of options used to fail deep inside with a TypeError."""
    from mpi4py import MPI

    from pshybrid.train import train

    msg = fails(train, {"steps": 1}, MPI.COMM_SELF)
    assert msg == ("train: cfg must be a pshybrid.config.TrainConfig, got dict "
                   "(TrainConfig(**d), or config.from_dict(TrainConfig, d, 'where') for a "
                   "checked dict of options)")


def test_given_reads_an_option_before_the_options_are_resolved(tmp_path):
    """What --resume names must be known before resolving (its stored options are a layer
    under the rest): the command line's text, else the --config file's value, else None;
    nothing is checked (an --epochs without --data is no error here)."""
    from pshybrid.config import given

    parser = ArgumentParser(prog="prog")
    add_arguments(parser, TrainConfig)
    (tmp_path / "c.toml").write_text('resume = "from-toml"\nepochs = 2\n')
    toml = ["--config", str(tmp_path / "c.toml")]
    assert given(TrainConfig, parser.parse_args(toml), "resume") == "from-toml"
    assert given(TrainConfig, parser.parse_args([*toml, "--resume", "cli"]), "resume") == "cli"
    assert given(TrainConfig, parser.parse_args(["--epochs", "2"]), "resume") is None


def test_a_cross_option_error_names_the_file_that_set_the_option(tmp_path):
    """jobs/local.toml sets checkpoint-every: without --checkpoint-dir the refusal names the
    file (and not options the message does not name); given on the command line, no file."""
    conf = tmp_path / "c.toml"
    conf.write_text("checkpoint-every = 500\nsteps = 7\n")
    assert fails(parse, TrainConfig, "--config", str(conf)) == (
        f"--checkpoint-every needs --checkpoint-dir (from checkpoint-every in {conf})")
    assert fails(parse, TrainConfig, "--checkpoint-every", "5") == (
        "--checkpoint-every needs --checkpoint-dir")
    assert fails(parse, TrainConfig, "--keep-last", "2") == (  # (it was accepted, unread)
        "--keep-last needs --checkpoint-dir")
    assert fails(parse, TrainConfig, "--eval-every", "2") == "--eval-every needs --eval-data"
    conf.write_text('consistency = "asp"\ndevice = "cpu"\nplacement = "dedicated"\n')
    msg = fails(parse, TrainConfig, "--config", str(conf), "--mode", "allreduce")
    assert msg.endswith(f"(from consistency in {conf})"), msg  # not the defaults it restates
    local = os.path.join(os.path.dirname(__file__), "..", "jobs", "local.toml")
    assert parse(TrainConfig, "--config", local, "--checkpoint-dir", "ck").checkpoint_every == 500


@pytest.mark.parametrize("argv, whole", [
    (["train", "--batch", "32"], "--batch 32 (options are given by their whole names: "
                                 "--batch-size?)"),
    (["prep", "csv", "--lab", "y", "in.csv", "out.h5"],
     "--lab (options are given by their whole names: --label or --label-threshold?)"),
    (["train", "--batch=32"], "--batch=32 (options are given by their whole names: "
                              "--batch-size?)"),
    (["info", "--ste", "3"], "--ste 3"),  # (train's --steps: not info's)
    (["prep", "csv", "--bucket", "3", "in.csv", "out.h5"],
     "--bucket (options are given by their whole names: --buckets?)"),  # (not --bucket-mb)
])
def test_an_abbreviated_option_is_refused_naming_the_whole_one(argv, whole):
    """argparse took a prefix of an option (``--batch`` for ``--batch-size``), which TOML
    keys never were, and a job script's prefix broke the day a second option began with
    it. Refused now, the line naming the whole option; a wrong one gets no guess."""
    from pshybrid.cli import main

    with pytest.raises(ConfigError) as e:
        main(argv)
    assert str(e.value) == f"unrecognized arguments: {whole}"
    with pytest.raises(ConfigError) as e:
        main(["train", "--bogus"])
    assert str(e.value) == "unrecognized arguments: --bogus"


def test_numpy_scalars_are_numbers_in_a_train_config():
    """A sweep's ``lr=np.float64(...)`` or ``batch_size=np.int64(...)`` was refused
    ('expected a number, got np.float64(0.01)'). Oracle: the same config of Python numbers;
    a float for an integer field is still refused, as from TOML."""
    import numpy as np

    from pshybrid.config import from_dict, to_dict

    got = TrainConfig(lr=np.float64(0.01), batch_size=np.int64(16), mlp=(np.int64(8), 4),
                      shuffle=np.bool_(False))
    want = TrainConfig(lr=0.01, batch_size=16, mlp=(8, 4), shuffle=False)
    assert from_dict(TrainConfig, to_dict(got), "TrainConfig") == want
    assert json.dumps(to_dict(got)) == json.dumps(to_dict(want))
    assert "batch_size (in TrainConfig): expected an integer, got 16.0" in fails(
        from_dict, TrainConfig, to_dict(TrainConfig(batch_size=np.float64(16))), "TrainConfig")


def test_train_help_has_a_section_for_every_option():
    """--help lists train's 44 options in sections (``TrainConfig.GROUPS``): every field in
    exactly one, so a new option cannot end up alone under 'options'; each section's
    options are the fields it names."""
    import dataclasses

    from pshybrid.cli import build_parser

    names = [n for group in TrainConfig.GROUPS.values() for n in group]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(TrainConfig))
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    shown_in = {g.title: {a.dest for a in g._group_actions} for g in train._action_groups}
    for title, group in TrainConfig.GROUPS.items():
        assert shown_in[title] == set(group), title


def test_a_numpy_array_for_a_list_option_is_one_config_error():
    """``mlp=np.array([8, 4])``: ``to_dict`` called ``.item()`` on it (a ValueError
    traceback); it is refused as before NumPy scalars were taken."""
    import numpy as np

    from pshybrid.config import from_dict, to_dict

    assert "mlp (in TrainConfig): expected an array of integers" in fails(
        from_dict, TrainConfig, to_dict(TrainConfig(mlp=np.array([8, 4]))), "TrainConfig")


def test_a_python_config_with_a_misspelt_keyword_names_the_field():
    """Oracle: each field with a letter added is refused with Python's TypeError
    naming that field among the close ones (it said only "unexpected keyword argument");
    the field spelt right builds, and dataclasses.replace still works."""
    import dataclasses

    from pshybrid.config import TrainConfig
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    for name in names:
        with pytest.raises(TypeError, match=rf"argument '{name}x'; did you mean .*\b{name}\b"):
            TrainConfig(**{name + "x": getattr(TrainConfig(), name)})
        assert dataclasses.replace(TrainConfig(), **{name: getattr(TrainConfig(), name)}) == (
            TrainConfig())
    with pytest.raises(TypeError, match="argument 'zzz'; known: " + ", ".join(names)):
        TrainConfig(zzz=1)
