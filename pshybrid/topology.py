"""Server/worker topology of one MPI job.

``Topology.create(comm, n_servers)`` duplicates ``comm`` (the library never uses the
caller's communicator directly), finds the nodes with ``Split_type(COMM_TYPE_SHARED)``,
picks the server ranks spread over nodes first (``place_servers``), and splits the
world into a ``servers`` and a ``workers`` communicator. RMA windows live on
``world`` so workers can target servers.

Placement ``dedicated`` (the default): servers only serve, workers only train.
``colocated``: every rank trains and also owns a shard of the tables in its RMA window
(a passive target needs no process of its own): ``server_ranks == worker_ranks == every
rank``, ``is_server`` and ``is_worker`` both true.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from mpi4py import MPI

from .errors import ConfigError
from .threads import binding, shared_cores


def check_servers(n_servers: int, world_size: int, need_servers: bool = True,
                  given: bool = True) -> None:
    """Validate a server count before any collective (same verdict on every rank).
    ``given``: the user named it (else it is the default, one per node)."""
    if need_servers and n_servers == 0 and not given:
        raise ConfigError(
            f"this mode keeps the embedding tables on server ranks: it needs a server and a "
            f"worker, and this job has {world_size} rank(s); run it under mpiexec -n N with "
            "N >= 2, or use --mode allreduce (one process trains alone) or --placement "
            "colocated", collective=True)
    if n_servers < 0:
        raise ConfigError(f"--servers must be >= 0, got {n_servers}", collective=True)
    if n_servers >= world_size:
        raise ConfigError(
            f"--servers {n_servers} leaves no worker in a job of {world_size} rank(s); "
            + (f"use --servers <= {world_size - 1} or launch more ranks (mpiexec -n N)"
               if world_size > 1 else "launch more ranks (mpiexec -n N), or drop --servers "
               "and use --mode allreduce (one process trains alone)"),
            collective=True)
    if need_servers and n_servers == 0:
        raise ConfigError(
            "--servers 0: this mode keeps embedding tables on server ranks and needs "
            f"--servers >= 1 (and at least 2 ranks; this job has {world_size})",
            collective=True)


def default_servers(n_nodes: int, world_size: int) -> int:
    """One server per node, leaving at least one worker."""
    return max(0, min(n_nodes, world_size - 1))


SHARED_MEMORY = {"auto": None, "on": True, "off": False}  # --shared-memory: the store's


def shared_window(setting: bool | None, n_nodes: int) -> bool:
    """Whether the servers' shards are one window shared by a node's ranks
    (``Allocate_shared``) for ``--shared-memory`` ``setting`` (``SHARED_MEMORY``; None:
    auto, on a single-node job); on over several nodes is a ``ConfigError`` (collective)."""
    if setting is None:
        return n_nodes == 1
    if setting and n_nodes > 1:
        raise ConfigError(f"--shared-memory on: shared-memory pulls need every rank on one "
                          f"node; this job spans {n_nodes} nodes: use --shared-memory auto "
                          "(each node's servers through shared memory, the others' by RMA) "
                          "or off", collective=True)
    return setting


# What a launcher tells each process it starts of the job's size: (variable, launcher).
_LAUNCHED = (("PMI_SIZE", "mpiexec"), ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
             ("SLURM_STEP_NUM_TASKS", "srun"))


def launch_mismatch(size: int, environ=os.environ) -> str | None:
    """Why a process the MPI library runs as a job of ``size`` == 1 rank was started as one
    of several (the library does not speak its launcher's interface: each rank runs alone),
    or None."""
    for var, launcher in _LAUNCHED if size == 1 else ():
        n = environ.get(var, "")
        if not n.isdigit():
            continue
        if int(n) <= 1:
            return None
        fix = ("the mpich wheel: srun --mpi=pmi2 or its own mpiexec; a system MPI: "
               "MPI4PY_LIBMPI")
        if environ.get("MPI4PY_LIBMPI") and launcher == "mpiexec":  # Hydra, another libmpi
            fix = (f"MPI4PY_LIBMPI={environ['MPI4PY_LIBMPI']} is set: start it with that "
                   "MPI's own launcher, e.g. mpiexec.openmpi; jobs/local.sh: MPIEXEC=...")
        return (f"{launcher} started {n} tasks, and the MPI library sees a job of 1 rank: if "
                f"they are meant as one job, {'its --mpi' if launcher == 'srun' else 'it'} "
                f"does not match the MPI library ({fix}), so each runs alone")
    return None


# A system MPI's environment (module load, setvars.sh): (variable, what its library's
# version text starts with, its name, where its libmpi is). Within the MPICH family another
# launcher runs the wheel's library as one job without a word: only the library's name tells.
_LOADED = (("I_MPI_ROOT", "Intel", "Intel MPI", "libmpi.so.12 (under $I_MPI_ROOT/lib)"),)


def library_mismatch(library: str, environ=os.environ) -> str | None:
    """Why the MPI ``library`` mpi4py loaded is not the one the environment set up (and no
    ``MPI4PY_LIBMPI`` chose it), or None."""
    for var, prefix, name, lib in () if environ.get("MPI4PY_LIBMPI") else _LOADED:
        if environ.get(var) and not library.startswith(prefix):
            return (f"{name} is set up here ({var}), but mpi4py loaded another MPI library "
                    f"({' '.join(library.split()[:3])}): to run on {name}, set MPI4PY_LIBMPI "
                    f"to its {lib} (docs/clusters.md)")
    return None


def place_servers(node_of_rank: list[int], n_servers: int) -> list[int]:
    """Pick ``n_servers`` world ranks, spread over nodes first. Pure.

    Round-robin over nodes (in order of their lowest rank, rank 0's node last in each
    round); on each node take the highest rank not yet taken, so world rank 0 stays a
    worker whenever possible. Returns the chosen world ranks sorted ascending (server
    index = position).
    """
    nodes: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of_rank):
        nodes.setdefault(node, []).append(rank)
    free = [sorted(r, reverse=True) for _, r in sorted(nodes.items(), key=lambda kv: kv[1][0])]
    free = free[1:] + free[:1]  # (rank 0 alone on its node is taken only when it must be)
    chosen: list[int] = []
    while len(chosen) < n_servers:
        progressed = False
        for ranks in free:
            if ranks and len(chosen) < n_servers:
                chosen.append(ranks.pop(0))
                progressed = True
        if not progressed:
            raise ConfigError(f"cannot place {n_servers} servers on {len(node_of_rank)} ranks",
                              collective=True)
    return sorted(chosen)


def roles_per_node(node_of_rank: list[int], workers, servers) -> dict[int, tuple[int, int]]:
    """{node: (workers, servers) on it}, from the roles' world ranks (a colocated rank is
    in both). Pure: the check before step 1 counts its own node, ``--mode auto`` every
    node of a layout it assumes."""
    workers, servers = set(workers), set(servers)
    out: dict[int, tuple[int, int]] = {}
    for rank, node in enumerate(node_of_rank):
        w, s = out.get(node, (0, 0))
        out[node] = (w + (rank in workers), s + (rank in servers))
    return out


@dataclass
class Topology:
    world: MPI.Comm          # Dup of the caller's communicator; RMA windows live here
    node: MPI.Comm           # ranks sharing this node's memory
    servers: MPI.Comm        # MPI.COMM_NULL on workers
    workers: MPI.Comm        # MPI.COMM_NULL on servers
    server_ranks: list[int]  # world rank of server s
    worker_ranks: list[int]  # world rank of worker w
    node_of_rank: list[int]  # node index of each world rank
    node_names: list[str]    # host name of each node index
    bindings: list = field(default_factory=list)  # each rank's (cores it may run on, the
    #                                                node's cores), as threads.binding says

    @classmethod
    def create(cls, comm: MPI.Comm, n_servers: int | None = None, need_servers: bool = True,
               colocated: bool = False):
        """Collective over ``comm``. ``n_servers=None``: one per node (default_servers).
        ``colocated``: every rank is a worker that owns a shard (``n_servers`` unused)."""
        world = comm.Dup()
        mismatch = launch_mismatch(MPI.COMM_WORLD.size) or (  # (not comm's: a subgroup's)
            MPI.COMM_WORLD.rank == 0 and library_mismatch(MPI.Get_library_version()))
        if mismatch:
            sys.stderr.write(f"pshybrid: note: {mismatch}\n")
        if colocated:
            n_servers = world.size
        elif n_servers is not None:
            check_servers(n_servers, world.size, need_servers)  # identical on every rank: no hang
        # Wire: node-local split, then an allgather of (node leader, host name, binding);
        # all wait.
        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
        leader = node.bcast(world.rank, root=0)
        info = world.allgather((leader, MPI.Get_processor_name(), binding(), os.cpu_count()))
        leaders = sorted({lead for lead, *_ in info})
        node_of_rank = [leaders.index(lead) for lead, *_ in info]
        node_names = [info[lead][1] for lead in leaders]
        if n_servers is None:
            n_servers = default_servers(len(leaders), world.size)
            check_servers(n_servers, world.size, need_servers, given=False)
        server_ranks = place_servers(node_of_rank, n_servers)
        worker_ranks = ([r for r in range(world.size) if r not in server_ranks]
                        if not colocated else list(range(world.size)))
        # Wire: two splits of world by role; every rank waits for all.
        servers = world.Split(0 if world.rank in server_ranks else MPI.UNDEFINED, key=world.rank)
        workers = world.Split(0 if world.rank in worker_ranks else MPI.UNDEFINED, key=world.rank)
        return cls(world, node, servers, workers, server_ranks, worker_ranks,
                   node_of_rank, node_names, [i[2:] for i in info])

    # -- convenience -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def n_servers(self) -> int:
        return len(self.server_ranks)

    @property
    def n_workers(self) -> int:
        return len(self.worker_ranks)

    @property
    def is_server(self) -> bool:
        """This rank owns a shard of the tables (a server, or any rank when colocated)."""
        return self.servers != MPI.COMM_NULL

    @property
    def is_worker(self) -> bool:
        """This rank trains."""
        return self.workers != MPI.COMM_NULL

    @property
    def colocated(self) -> bool:
        return self.n_servers > 0 and self.server_ranks == self.worker_ranks

    @property
    def role(self) -> str:
        """"worker" for every rank that trains (colocated ones too), else "server"."""
        return "worker" if self.is_worker else "server"

    @property
    def server_index(self) -> int:
        return self.server_ranks.index(self.rank) if self.is_server else -1

    @property
    def worker_index(self) -> int:
        return self.worker_ranks.index(self.rank) if self.is_worker else -1

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    def dedicated_servers_on(self, node: int) -> int:
        """Dedicated server ranks on node index ``node`` (0 when colocated)."""
        if self.colocated:
            return 0
        return sum(self.node_of_rank[r] == node for r in self.server_ranks)

    @property
    def servers_here(self) -> int:
        """A dedicated server: the dedicated servers on its node (itself included); 0 on
        any other rank (a worker, a colocated rank)."""
        return self.dedicated_servers_on(self.node_of_rank[self.rank]) if self.is_server else 0

    def shared_cores(self) -> list[str]:
        """A line for each group of this job's ranks bound to fewer cores of a node than
        they are (``threads.shared_cores``: a launcher's binding that doubles up ranks)."""
        groups = shared_cores(self.node_of_rank, [b for b, _ in self.bindings],
                              [n or 0 for _, n in self.bindings])
        return [f"ranks {', '.join(map(str, ranks))} on "
                f"{self.node_names[self.node_of_rank[ranks[0]]]} are bound to "
                f"{'only ' if len(cores) > 1 else ''}core{'s' if len(cores) > 1 else ''} "
                f"{', '.join(map(str, cores))} between them: they take turns there, each at "
                "a fraction of its speed; bind each rank to cores of its "
                "own (mpiexec -bind-to core, srun --cpu-bind=cores) or start fewer ranks on "
                "the node" for ranks, cores in groups]

    @property
    def local_rank(self) -> int:
        return self.node.rank

    def free(self) -> None:
        """Free the communicators this topology created (collective)."""
        for c in (self.servers, self.workers, self.node, self.world):
            if c != MPI.COMM_NULL:
                c.Free()
