"""Command line: ``python -m pshybrid <command>``."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .commands import CKPT_HELP, add_out, add_scoring_commands
from .config import ArgumentParser, TrainConfig, add_arguments, resolve, to_toml
from .errors import ConfigError
from .launch import launched, launched_alone
from .prep import add_prep_commands
from .registry import DEDICATED, MODES, PLACEMENTS, is_colocated, refusal
from .safeio import STEP_RE
from .stopping import ended_by_signals


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="pshybrid", description="MPI-native training of CTR models with "
                       "sharded embedding tables (python -m pshybrid <command> --help: its "
                       "options; docs/: the manual).")
    p.add_argument("--version", action="version", version=f"pshybrid {__version__}")
    sub = p.add_subparsers(dest="command", metavar="<command>", parser_class=ArgumentParser)
    sub.required = True
    train = sub.add_parser("train", help="train a CTR model (default: WDL on the built-in "
                           "synthetic stream)", description="Train a CTR model. Every option "
                           "can also come from a TOML file (--config FILE; same names, - or _); "
                           "the command line wins.")
    add_arguments(train, TrainConfig)
    train.add_argument("--print-config", action="store_true",
                       help="print the effective options (defaults < --config < the command "
                            "line) as a TOML file that --config reads back, and exit")
    train.set_defaults(func=cmd_train)
    add_prep_commands(sub)
    export = sub.add_parser("export", help="write a checkpoint as one plain HDF5 file "
                            "(/dense/<param>, /embeddings/<field>, optimizer state)")
    export.add_argument("ckpt", help=CKPT_HELP)
    add_out(export)
    export.set_defaults(func=ended_by_signals(cmd_export))
    add_scoring_commands(sub)
    info = sub.add_parser("info", help="topology, MPI library, CUDA-awareness, devices, "
                          "per-rank roles")
    info.add_argument("--servers", type=int, default=None,
                      help="number of server ranks (default: one per node)")
    info.add_argument("--mode", choices=tuple(m for m in MODES if not MODES[m].chosen),
                      default="hybrid",
                      help="communication mode, decides whether servers are needed")
    info.add_argument("--placement", choices=tuple(PLACEMENTS), default=DEDICATED,
                      help="as train's --placement: server ranks, or a shard on every rank")
    info.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="as train's --device: check and show each worker's device "
                           "(CuPy and a visible GPU; train also builds the kernels)")
    info.add_argument("--cuda-aware", choices=("auto", "on", "off"), default="auto",
                      help="as train's --cuda-aware: report what it would decide")
    info.add_argument("--server-threads", type=int, default=None,
                      help="as train's --server-threads: report what it would decide")
    info.set_defaults(func=cmd_info)
    return p


def cmd_info(args) -> int:
    from mpi4py import MPI

    from .devices import cuda_aware_mpi
    from .threads import rank_blas_threads, rank_server_threads
    from .topology import Topology

    if args.server_threads is not None and args.server_threads < 1:
        raise ConfigError("--server-threads must be > 0", collective=True)
    why = refusal(args.mode, args.placement, args.servers, 0, "bsp", 0, args.device)
    if why is not None:  # train's own refusal of the combination
        raise ConfigError(why, collective=True)

    # One process and no --servers: describe it (no server) instead of refusing the mode.
    needs = MODES[args.mode].needs_servers
    alone = (MPI.COMM_WORLD.size == 1 and args.servers is None and needs
             and not is_colocated(args.placement))
    topo = Topology.create(MPI.COMM_WORLD, 0 if alone or not needs else args.servers,
                           need_servers=needs and not alone,
                           colocated=is_colocated(args.placement))
    device = _info_device(args.device, topo)
    role = "worker+shard" if topo.colocated else topo.role
    row = (topo.rank, role, topo.worker_index if topo.is_worker else topo.server_index,
           topo.node_of_rank[topo.rank], topo.node_names[topo.node_of_rank[topo.rank]],
           topo.local_rank, device, os.getpid(),
           *_thread_cells(rank_blas_threads(),
                          rank_server_threads(args.server_threads, topo.servers_here),
                          applies=(topo.is_server or topo.colocated
                                   or (topo.is_worker and MODES[args.mode].replicated))))
    # Wire: gather of one small tuple per rank to rank 0; rank 0 waits for all.
    rows = topo.world.gather(row, root=0)
    if topo.rank == 0:
        aware, how = cuda_aware_mpi(args.cuda_aware)
        lib = " ".join(MPI.Get_library_version().split("\n", 1)[0].split())
        print(f"pshybrid {__version__}")
        print(f"MPI library     : {lib} (MPI standard {'.'.join(map(str, MPI.Get_version()))})")
        print(f"CUDA-aware MPI  : {'yes' if aware else 'no'} ({how}); --device cuda's dense "
              + ("Allreduce: blocking, on device buffers" if aware else
                 "Iallreduce: staged through pinned host memory"))
        print(f"mode            : {args.mode}")
        print(f"ranks           : {topo.size} on {topo.n_nodes} node(s): "
              f"{topo.n_servers} {'shard owner' if topo.colocated else 'server'}(s) "
              f"{topo.server_ranks}, "
              f"{topo.n_workers} worker(s)")
        print("".join(f"{line}\n" for line in _info_notes(topo, args.mode, alone)), end="")
        print(f"{'rank':>4}  {'role':<12} {'index':>5}  {'node':>4}  {'host':<20} "
              f"{'local':>5}  {'device':<8} {'pid':>8}  {'blas':>4} {'apply':>5}  "
              "threads: the rule")
        for r in rows:
            print(f"{r[0]:>4}  {r[1]:<12} {r[2]:>5}  {r[3]:>4}  {r[4]:<20} {r[5]:>5}  "
                  f"{r[6]:<8} {r[7]:>8}  {r[8]:>4} {r[9]:>5}  {r[10]}")
        sys.stdout.flush()
    topo.free()
    return 0


def _info_notes(topo, mode: str, alone: bool) -> list[str]:
    """info's lines under the ranks' count: a CPU quota, ranks bound to one core, a mode
    that needs a second rank."""
    from .threads import cpu_quota

    out = [] if (quota := cpu_quota()) is None else [
        f"CPU quota       : {quota} CPU{'s' if quota > 1 else ''} (cgroup): the thread sizing "
        "below takes it as the node's cores"]
    out += [f"warning         : {why}" for why in topo.shared_cores()]
    return out + ([f"note            : --mode {mode} needs a server and a worker: run it under "
                   "mpiexec -n N with N >= 2 (or --placement colocated)"] if alone else [])


def _info_device(kind: str, topo) -> str:
    """This rank's device for ``info``: a worker's ``pick_device``, "cpu" on a server. A
    worker that finds no usable GPU fails every rank (``agree``): a verdict on some workers
    only (a node without a GPU) must not leave rank 0 waiting in the gather for good."""
    from .devices import pick_device
    from .transport import agree

    err, device = None, "cpu"
    if topo.is_worker:
        try:
            device = pick_device(kind, topo.local_rank)
        except ConfigError as e:
            err = e
    agree(topo.world, err)  # Wire: allgather of each rank's verdict; everyone raises the same
    return device


def _thread_cells(blas, apply, applies: bool) -> tuple[str, str, str]:
    """info's (BLAS threads, optimizer-apply threads, the rules that sized them) of a rank
    from ``threads.blas_threads`` / ``server_threads``; ``applies``: the rank applies a
    sparse optimizer to rows it holds (a server, a colocated rank, an allreduce worker's
    whole table), else its apply column is "-"."""
    (nb, rb), (na, ra) = blas, apply
    if not applies:
        return ("-" if nb is None else str(nb)), "-", f"blas: {rb}"
    rule = f"both: {rb}" if rb == ra else f"blas: {rb}; apply: {ra}"
    return ("-" if nb is None else str(nb)), str(na), rule


EXITS_AFTER = False  # set by ``python -m pshybrid``: the process ends after the command
SERIAL = ("prep", "export", "plot")  # the commands of one process (the others: any ranks)


def cmd_train(args) -> int:
    from mpi4py import MPI  # (MPI_Init: MPICH sets a SIGUSR1 handler of its own)

    from .preempt import CAUGHT

    CAUGHT.install()  # a signal from here on is a stop request (it was lost to MPICH's)
    CAUGHT.signum = None  # (a catcher kept by an earlier call in this process: not ours)
    stopped = False
    try:
        status, stopped = _train_command(args, MPI.COMM_WORLD)
        return status
    finally:
        # The catcher stays to the exit of a process that ends after this command
        # (``python -m pshybrid``): a signal after the last step boundary, or forwarded
        # again while MPI finalizes, changes nothing (its default action exited 15 and left
        # the job's shared memory behind). A caller of ``main`` that goes on gets its
        # handlers back, unless the run stopped on a signal (the same request, forwarded
        # again, must not end it).
        if not EXITS_AFTER and not stopped:
            CAUGHT.uninstall()


def _train_command(args, comm) -> tuple[int, bool]:
    """train's work: the options resolved and checked, then ``--print-config`` or the run;
    (the exit status, whether a signal stopped the run)."""
    from .errors import PshybridError
    from .preempt import exit_status
    from .safeio import same_file
    from .train import train
    from .transport import agree

    err, cfg = None, None
    try:
        cfg = _resolve_train(args, comm.rank == 0)
        conf = getattr(args, "config", None)
        if conf and cfg.metrics and same_file(conf, cfg.metrics):
            raise ConfigError(f"--metrics {cfg.metrics} is the same file as --config {conf}: "
                              "an input is never written over")
    except PshybridError as e:
        err = e
    # Wire: allgather of each rank's verdict on its options (an MPMD launch may give some
    # ranks others, refused there alone: the rest waited for them for good)
    agree(comm, err)
    if args.print_config:
        if comm.rank == 0:
            sys.stdout.write(to_toml(cfg))
        return 0, False
    result = train(cfg, comm)
    if result.preempted is not None:
        return exit_status(result.signal, bool(cfg.checkpoint_dir)), True
    return (1 if result.metrics_failed else 0), False


def _resolve_train(args, say: bool):
    """train's options; with ``--resume DIR``, those stored in the checkpoint overlaid by
    ``--config`` and the command line (which win; checked only together, so an option
    that needs a stored one is not refused alone); ``say``: print what this command
    changed."""
    from .checkpoint_files import resumed_options
    from .config import from_dict, given, option_flag, shown

    resume = given(TrainConfig, args, "resume")
    _starts_from_its_own(given(TrainConfig, args, "init_from"), resume)
    base, source, cwd = (resumed_options(resume) if isinstance(resume, str) and resume != "none"
                         else (None, "", None))
    if base is None:  # no resume; or preflight names what is wrong with the checkpoint
        return resolve(TrainConfig, args)
    old = from_dict(TrainConfig, base, source)
    base, moved = _saves_beside(base, os.path.dirname(source),
                                given(TrainConfig, args, "checkpoint_dir") is not None)
    new = resolve(TrainConfig, args, base, source)
    dropped = {k: by for k, by in new.replaced_by().items() if k not in old.replaced_by()}
    changed = [f"{option_flag(k)} {shown(v)} (was {shown(getattr(old, k))}"
               f"{moved if k == 'checkpoint_dir' and v == base.get(k) else ''})"
               for k, v in vars(new).items()
               if k not in ("resume", "init_from") and k not in dropped and v != getattr(old, k)]
    changed += [f"{option_flag(k)} {shown(getattr(old, k))} no longer counts ({by} decides)"
                for k, by in dropped.items()]
    note = sys.stderr if args.print_config else sys.stdout  # (stdout: --print-config's TOML)
    if say:
        print(f"resume: the options of {source}" + (f", changed: {', '.join(changed)}"
                                                     if changed else ", unchanged"), file=note)
    stored = [f"{option_flag(k)} {v}" for k in ("data", "eval_data", "metrics", "tensorboard")
              if (v := getattr(new, k)) and v == base.get(k) and given(TrainConfig, args, k) is None
              and not all(map(os.path.isabs, v.split(",")))]
    if say and stored and cwd and os.path.realpath(cwd) != os.path.realpath(os.getcwd()):
        print(f"resume: {', '.join(stored)}: relative, as given by the run that wrote it in "
              f"{cwd}, so taken from this directory instead ({os.getcwd()}); give them as "
              "absolute paths to use that run's files", file=note)
    return new


def _starts_from_its_own(start, resume) -> None:
    """Refuse ``--init-from`` (a ``--config`` file's: ``--resume`` drops it) of the
    checkpoint directory ``--resume`` goes on with (the jobs scripts' default directory
    given to a later day as the day before's): the day before's run would go on, or end at
    once with nothing trained."""
    from .checkpoint_files import POINTERS, STEP_RE

    def root(p: str) -> str:  # (of a step-N, or ck/best: its directory)
        real, name = os.path.realpath(p), os.path.basename(os.path.normpath(p))
        inside = STEP_RE.fullmatch(os.path.basename(real)) or (
            name in POINTERS and not os.path.isdir(real))
        return os.path.dirname(real) if inside else real

    if all(isinstance(p, str) and p != "none" for p in (start, resume)) and (
            root(start) == root(resume)):
        raise ConfigError(f"--init-from {start} starts a new run from the checkpoints that "
                          f"--resume {resume} goes on with: give the new run a "
                          "--checkpoint-dir of its own (a later day's, not the day "
                          "before's)", collective=True)


def _saves_beside(base: dict, step_dir: str, dir_given: bool) -> tuple[dict, str]:
    """The stored options with ``--checkpoint-dir`` the directory that holds the resumed
    checkpoint ``step_dir`` now (its real parent: a link to a step is followed), where the
    stored one is another directory (the checkpoints were moved, copied, or named relative
    to another working directory: the stored name would start a second history elsewhere),
    and the note for the changed option. A step directory not named ``step-N`` (a step
    copied as ``best``) is no checkpoint directory's: its parent (a home, a working
    directory) is not made one; unless ``dir_given``, a ConfigError asks for one."""
    stored, real = base.get("checkpoint_dir"), os.path.dirname(os.path.realpath(step_dir))
    if not isinstance(stored, str) or os.path.realpath(stored) == real or dir_given:
        return base, ""
    name = os.path.basename(os.path.realpath(step_dir))
    if not STEP_RE.fullmatch(name):
        raise ConfigError(f"--resume {step_dir}: a step directory named {name!r}, not step-N, "
                          f"away from its run's --checkpoint-dir {stored}: this run's "
                          "checkpoints would go beside it, in "
                          f"{os.path.dirname(step_dir) or '.'}; give --checkpoint-dir DIR "
                          "for them (or none)", collective=True)
    given = os.path.dirname(os.path.normpath(step_dir)) or "."  # (as the user named it)
    root = given if os.path.realpath(given) == real else real
    return dict(base, checkpoint_dir=root), ": the resumed checkpoint is in this directory now"


def cmd_export(args) -> int:
    from .export import export

    info = export(args.ckpt, args.out, args.overwrite)
    print(f"exported step {info['step']}: {info['dense_params']} dense parameters, "
          f"{info['tables']} embedding tables -> {args.out}")
    return 0


def main(argv=None) -> int:
    args = _parse(argv)
    return args.func(args)


def _whole_names(e, parser, argv):
    """``e``, or, where an option it does not know begins one its command has
    (abbreviations are not taken: ``config.ArgumentParser``), one line naming the option."""
    said = str(e)
    if not isinstance(e, ConfigError) or not said.startswith("unrecognized arguments: "):
        return e
    words = list(sys.argv[1:] if argv is None else argv)
    while True:  # (down to the command's parser: ``prep csv``'s, ``train``'s)
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                   None)
        if sub is None or not words or words[0] not in sub.choices:
            break
        parser = sub.choices[words.pop(0)]
    names = {n for action in parser._actions for n in action.option_strings}
    for token in said.split(": ", 1)[1].split():
        token = token.split("=", 1)[0]
        whole = sorted(n for n in names if token.startswith("--") and token != "--"
                       and n.startswith(token))
        if whole:
            return ConfigError(f"{said} (options are given by their whole names: "
                               f"{' or '.join(whole[:3])}?)", collective=True)
    return e


def _parse(argv):
    """The command line; in a process an MPI launcher started that ends after the command
    (``python -m pshybrid``), the ranks' outcomes are shared first: an MPMD launch may give
    some ranks a line the parser refuses, or another command (they ended alone, or went
    another way, and the others waited for them for good). Then every rank ends if one
    does: those refused with the parser's line, the others with one line naming the first
    of them, status 2 (0 where each asked for ``--help`` or ``--version``). A command of
    one process (``SERIAL``) launched as several ranks is refused on each."""
    parser = build_parser()
    try:
        args, stop = parser.parse_args(argv), None
    except (SystemExit, ConfigError) as e:
        args, stop = None, _whole_names(e, parser, argv)
    if EXITS_AFTER and launched() and not launched_alone():
        from mpi4py import MPI

        code = None if stop is None else 2 if isinstance(stop, ConfigError) else stop.code or 0
        # Wire: allgather of each rank's parse outcome (None, or its exit status) and
        # command; all wait
        every = MPI.COMM_WORLD.allgather((code, getattr(args, "command", None)))
        bad = next((r for r, (c, _) in enumerate(every) if c not in (None, 0)), None)
        if stop is None and any(c is not None for c, _ in every):
            raise ConfigError(f"rank {bad}'s command line is refused (its line says why): no "
                              "rank runs" if bad is not None else "another rank was given "
                              "--help or --version: no rank runs", collective=True)
        if code == 0 and bad is not None:
            raise SystemExit(2)
        other = next((r for r, (_, cmd) in enumerate(every) if cmd != every[0][1]), None)
        if stop is None and other is not None:
            raise ConfigError(f"rank {other} runs {every[other][1]}, rank 0 {every[0][1]}: "
                              "every rank runs the same command", collective=True)
        if stop is None and args.command in SERIAL and len(every) > 1:  # (each would do
            raise ConfigError(f"pshybrid {args.command} runs as one process, and this job "
                              f"has {len(every)} ranks: run it without mpiexec or srun",
                              collective=True)  # it all and write the one output)
    if stop is not None:
        raise stop
    return args
