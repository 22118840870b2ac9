"""The few Hadoop FileSystem operations the exporter needs, through Spark's JVM (py4j):
one code path for `hdfs://…` in production and `file://…` in tests.

Where `file://` differs from HDFS (ecosystem.md §1.3): a rename onto an existing file
returns false on both, but the local filesystem may also write `.crc` sidecars, and
a failed rename says nothing about whether the target exists. So the exporter never
reads meaning into a rename's result: it checks `exists` before and after.

Durability. On HDFS a closed file is on its datanodes' pipeline and a rename is a
namenode transaction (edit log, synced): nothing more to do. On `file://` neither Spark's
writers nor a rename reach the disk before the kernel writes them back, so sync_file and
sync_dir fsync the local file or directory (they do nothing on any other scheme): a power
loss after the take commits must not lose the files that the take's events went to.
"""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse


class Dfs:
    """A Hadoop FileSystem for one base URI."""

    def __init__(self, spark: Any, base_uri: str) -> None:
        jvm = spark._jvm  # noqa: SLF001 -- py4j is the documented way to reach Hadoop
        self._io = jvm.org.apache.commons.io.IOUtils
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._base = self._path_class(base_uri)
        self._fs = self._base.getFileSystem(spark._jsc.hadoopConfiguration())  # noqa: SLF001
        self.base_uri = str(self._fs.makeQualified(self._base).toString())

    def _path(self, uri: str) -> Any:
        return self._path_class(uri)

    def join(self, *parts: str) -> str:
        """A URI under the base."""
        return "/".join([self.base_uri.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def exists(self, uri: str) -> bool:
        """Does the path exist?"""
        return bool(self._fs.exists(self._path(uri)))

    def mkdirs(self, uri: str) -> None:
        """Create a directory and its parents."""
        if not self._fs.mkdirs(self._path(uri)) and not self.exists(uri):
            raise OSError(f"{uri}: could not create the directory")

    def list_files(self, uri: str, recursive: bool = True) -> list[tuple[str, int]]:
        """(URI, length) of every file under `uri` (none if it does not exist)."""
        if not self.exists(uri):
            return []
        found = []
        files = self._fs.listFiles(self._path(uri), recursive)
        while files.hasNext():
            status = files.next()
            found.append((str(status.getPath().toString()), int(status.getLen())))
        return found

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Create a new file holding `data` (never over an existing one), synced."""
        stream = self._fs.create(self._path(uri), False)
        try:
            stream.write(bytearray(data))
            stream.hsync()
        finally:
            stream.close()

    def read_bytes(self, uri: str) -> bytes:
        """The whole content of a (small) file."""
        stream = self._fs.open(self._path(uri))
        try:
            return bytes(self._io.toByteArray(stream))
        finally:
            stream.close()

    def rename(self, source: str, target: str) -> None:
        """Move a file into place; OSError unless the target exists afterwards and the
        source does not (the result of the rename itself proves nothing on file://)."""
        parent = target.rsplit("/", 1)[0]
        self.mkdirs(parent)
        self._fs.rename(self._path(source), self._path(target))
        if not self.exists(target) or self.exists(source):
            raise OSError(f"rename {source} -> {target} did not happen")

    def delete(self, uri: str, recursive: bool = False) -> None:
        """Delete a file (or a directory tree); nothing if it is not there."""
        self._fs.delete(self._path(uri), recursive)

    def sync_file(self, uri: str) -> None:
        """fsync a file of a `file://` output (nothing elsewhere: see the module doc)."""
        self._fsync(uri, os.O_RDONLY)

    def sync_dir(self, uri: str) -> None:
        """fsync a directory of a `file://` output, so the names in it are durable."""
        self._fsync(uri, os.O_RDONLY | os.O_DIRECTORY)

    def _fsync(self, uri: str, flags: int) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            return
        fd = os.open(parsed.path, flags)  # Hadoop's URIs hold the name as it is on disk
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
