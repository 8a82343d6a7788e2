"""``torch.sagemaker.distributed.checkpoint.filesystem``."""

from __future__ import annotations

import os

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter


class DistributedFileSystemReader(FileSystemReader):
    """SMP's reader: torch's ``FileSystemReader`` (every rank reads the shared directory)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(os.fspath(path))


__all__ = ["DistributedFileSystemReader", "FileSystemWriter"]
