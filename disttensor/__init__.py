"""disttensor: numpy programs sharded over a process mesh, run with ``mpiexec -n N``.

See docs/guide.md for the guide and docs/architecture.md for the layers. Importing starts no MPI
work.
"""

from . import nn, optim, spmd
from .autograd import enable_grad, is_grad_enabled, no_grad
from .backend import get_device, set_device
from .capture import compile
from .checkpoint import load, save
from .comm import RankAborted, barrier, get_rank, get_world_size, simulate
from .comm.agree import RanksDiverged
from .comm.mpi import install_abort_hook
from .creation import (
    arange,
    empty,
    empty_like,
    full,
    full_like,
    manual_seed,
    ones,
    ones_like,
    rand,
    randn,
    zeros,
    zeros_like,
)
from .debug import CommCounter, fallback_report
from .explain import explain
from .interactive import simulated
from .mesh import ProcessMesh, init_mesh
from .nn.sharding import shard_layer
from .ops import *  # noqa: F403  (numpy-named ops: dt.add, dt.matmul, dt.sum, ...)
from .ops import __all__ as _ops_all
from .output import get_logger, print0
from .parallel import (
    DataParallel,
    ShardingStage1,
    ShardingStage2,
    ShardingStage3,
    memory_report,
    shard_optimizer,
)
from .placement import Partial, Placement, Replicate, Shard
from .spec import DistSpec
from .tensor import DistTensor, dtensor_from_local, reshard, shard_tensor
from .visualize import describe, visualize_sharding

install_abort_hook()  # an uncaught exception on one rank ends the whole mpiexec job

__version__ = "0.1.0"

__all__ = [
    "CommCounter",
    "DataParallel",
    "DistSpec",
    "DistTensor",
    "Partial",
    "Placement",
    "ProcessMesh",
    "RankAborted",
    "RanksDiverged",
    "Replicate",
    "Shard",
    "arange",
    "barrier",
    "compile",
    "describe",
    "dtensor_from_local",
    "empty",
    "empty_like",
    "enable_grad",
    "explain",
    "fallback_report",
    "full",
    "full_like",
    "get_device",
    "get_logger",
    "get_rank",
    "get_world_size",
    "init_mesh",
    "is_grad_enabled",
    "load",
    "manual_seed",
    "memory_report",
    "nn",
    "optim",
    "print0",
    "no_grad",
    "ones",
    "ones_like",
    "rand",
    "randn",
    "reshard",
    "save",
    "set_device",
    "shard_layer",
    "shard_optimizer",
    "shard_tensor",
    "simulate",
    "simulated",
    "ShardingStage1",
    "ShardingStage2",
    "ShardingStage3",
    "spmd",
    "visualize_sharding",
    "zeros",
    "zeros_like",
    *_ops_all,
]
