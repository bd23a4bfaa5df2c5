"""Data-parallel machinery: fused gradient buckets, overlap with backward, gradient merge."""

from .data_parallel import DataParallel

__all__ = ["DataParallel"]
