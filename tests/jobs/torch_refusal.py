"""A ``pshybrid.torch`` script whose worker meets an uncaught pshybrid error (a refusal):
the job ends with one line naming the rank and the error, no traceback, status 2. With
an argument, ``pt.init`` itself is refused on every rank: it resumes from that path.

mpiexec -n 2 python tests/jobs/torch_refusal.py [RESUME]
"""

import sys

import pshybrid.torch as pt
from pshybrid.errors import InputError

resume = sys.argv[1] if len(sys.argv) > 1 else None
if pt.init(servers=1, tables=[pt.Table("t", rows=8, dim=2)], resume=resume):
    raise InputError("a refusal of this test")
