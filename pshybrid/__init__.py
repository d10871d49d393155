"""pshybrid: hybrid parameter-server / AllReduce training of CTR models over MPI.

Layers, bottom-up (a lower module never imports a higher one):
errors -> backend, kernels, initializers, datakernels -> partition -> topology -> transport
-> store -> optim -> layers -> models -> synthetic, data, prep, metrics -> modes -> checkpoint
-> train -> launch, cli (docs/architecture.md).
"""

__version__ = "0.1.0"

from .errors import PshybridError, ConfigError, InputError  # noqa: F401
