"""pshybrid: hybrid parameter-server / AllReduce training of CTR models over MPI.

Layers, bottom-up (a lower module never imports a higher one):
errors -> partition -> topology -> kernels -> transport -> store -> launch -> cli.
"""

__version__ = "0.1.0"

from .errors import PshybridError, ConfigError, InputError  # noqa: F401
