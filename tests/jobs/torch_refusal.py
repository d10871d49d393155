"""A ``pshybrid.torch`` script whose worker meets an uncaught pshybrid error (a refusal):
the job ends with one line naming the rank and the error, no traceback, status 2.

mpiexec -n 2 python tests/jobs/torch_refusal.py
"""

import pshybrid.torch as pt
from pshybrid.errors import InputError

if pt.init(servers=1, tables=[pt.Table("t", rows=8, dim=2)]):
    raise InputError("a refusal of this test")
