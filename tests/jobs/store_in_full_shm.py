"""The store built when /dev/shm has less left than its shard (another job took it after
the check before step 1, which this script skips), with and without that filler; its
window shared among the node's ranks (on: Allocate_shared) or not (off: Allocate).

unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm &&
    timeout 120 mpiexec -n 2 python tests/jobs/store_in_full_shm.py fill|none on|off'
"""

import os
import sys

import numpy as np
from mpi4py import MPI

from pshybrid.launch import run
from pshybrid.schema import TableSpec
from pshybrid.store import EmbeddingStore
from pshybrid.topology import Topology

SHARD = 32 << 20  # one server's bytes: 2**21 rows x 4 float32
LEFT = 8 << 20  # what the filler leaves in /dev/shm


def main(argv):
    topo = Topology.create(MPI.COMM_WORLD.Dup(), 1)
    if topo.rank == 0 and argv[0] == "fill":  # the other job's shards, after MPI's own files
        st = os.statvfs("/dev/shm")
        with open("/dev/shm/other_job", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - LEFT)
    topo.world.Barrier()  # Wire: zero bytes; the store starts once the filler is there
    spec = TableSpec("t", rows=SHARD // 16, dim=4, dtype="float32", init_scale=0.5)
    store = EmbeddingStore(topo, [spec], shared_memory=argv[1] == "on")
    if topo.is_worker:  # the last row is in the last page of the shard
        rows = store.pull("t", np.array([0, spec.rows - 1]))
        assert rows.shape == (2, 4) and np.all(np.abs(rows) <= 0.5), rows
    store.close()
    if topo.rank == 0:
        print("stored", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
