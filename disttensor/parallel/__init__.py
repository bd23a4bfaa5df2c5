"""Data-parallel machinery: fused gradient buckets, overlap with backward, gradient merge."""

from .data_parallel import DataParallel
from .sharding import (
    ShardedOptimizer,
    ShardingStage1,
    ShardingStage2,
    ShardingStage3,
    memory_report,
    shard_optimizer,
)

__all__ = [
    "DataParallel",
    "ShardedOptimizer",
    "ShardingStage1",
    "ShardingStage2",
    "ShardingStage3",
    "memory_report",
    "shard_optimizer",
]
