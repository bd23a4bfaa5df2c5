"""The op set, by family; every op goes through dispatch.apply (one path)."""

from __future__ import annotations

from . import (
    gradients,  # noqa: F401  (fills autograd.GRADIENTS)
    mutation,  # noqa: F401  (tensor.py's writes: ops.mutation)
)
from .decompositions import *  # noqa: F403
from .decompositions import __all__ as _decomp
from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _ew
from .layout import *  # noqa: F403
from .layout import __all__ as _layout
from .linalg import *  # noqa: F403
from .linalg import __all__ as _la
from .nn import *  # noqa: F403
from .nn import __all__ as _nn
from .order_stats import *  # noqa: F403
from .order_stats import __all__ as _order
from .reduction import *  # noqa: F403
from .reduction import __all__ as _red
from .scan import *  # noqa: F403
from .scan import __all__ as _scan
from .shape import *  # noqa: F403
from .shape import __all__ as _sh
from .sorting import *  # noqa: F403
from .sorting import __all__ as _sorting
from .statistics import *  # noqa: F403
from .statistics import __all__ as _stats
from .unique import *  # noqa: F403
from .unique import __all__ as _unique

__all__ = [
    *_ew,
    *_la,
    *_red,
    *_sh,
    *_nn,
    *_scan,
    *_stats,
    *_order,
    *_layout,
    *_decomp,
    *_sorting,
    *_unique,
]

# numpy interop (tensor.py's __array_ufunc__ and __array_function__): ops/numpy_interop.py
from .numpy_interop import array_function, array_ufunc  # noqa: F401
