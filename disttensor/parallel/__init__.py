"""Data-parallel machinery: fused gradient buckets, overlap with backward, gradient merge."""

from .data_parallel import DataParallel
from .sharding import *  # noqa: F403  (dt.shard_optimizer, dt.ShardingStage1/2/3, ...)
from .sharding import __all__ as _sharding_all

__all__ = ["DataParallel", *_sharding_all]
