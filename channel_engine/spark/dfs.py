"""The few Hadoop FileSystem operations the exporter needs, through Spark's JVM (py4j):
one code path for `hdfs://…` in production and `file://…` in tests.

Where `file://` differs from HDFS (ecosystem.md §1.3): a rename onto an existing file
returns false on both, but the local filesystem may also write `.crc` sidecars, and
a failed rename says nothing about whether the target exists. So the exporter never
reads meaning into a rename's result: it checks `exists` before and after.

Durability. On HDFS, write_bytes hsyncs before it closes: the DataNodes of the block's
pipeline fsync it (hflush makes bytes visible to readers and close completes the block,
but neither fsyncs it; a closed file is in the DataNodes' page cache unless they run
with dfs.datanode.synconclose). A rename is a NameNode transaction (edit log, synced).
sync_file and sync_dir do nothing there. On `file://` neither Spark's writers nor a
rename reach the disk before the kernel writes them back, and Hadoop's local stream only
flushes on hsync, so sync_file and sync_dir fsync the local file or directory: a power
loss after the take commits must not lose the files that the take's events went to.
"""
from __future__ import annotations

import os
from typing import Any


class Dfs:
    """A Hadoop FileSystem for one base URI."""

    def __init__(self, spark: Any, base_uri: str) -> None:
        jvm = spark._jvm  # noqa: SLF001 -- py4j is the documented way to reach Hadoop
        self._spark = spark
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

    def data_files(self, uri: str) -> list[str]:
        """The URI of every file under `uri` that a reader of it reads: none below a name
        starting with "_" or "." (_weir/, Spark's temp dirs, .crc sidecars)."""
        # Spark's file index lists in the JVM, in bulk (in parallel for many folders), and
        # skips such names as every reader does; list_files costs some JVM calls per file
        # (about 7 ms each here: minutes for an output of 100,000 files)
        frame = (self._spark.read.format("binaryFile").option("recursiveFileLookup", "true")
                 .load(uri).select("path"))  # the path column alone: no file is read
        return [str(row.path) for row in frame.collect()]

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Create a new file holding `data` (never over an existing one), hsynced before
        close: on its DataNodes' disks on HDFS; on file:// call sync_file too."""
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

    def length(self, uri: str) -> int:
        """The file's length in bytes."""
        return int(self._fs.getFileStatus(self._path(uri)).getLen())

    def read_range(self, uri: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes of a file from `offset` (fewer at its end)."""
        stream = self._fs.open(self._path(uri))
        try:
            stream.seek(offset)
            return bytes(self._io.toByteArray(stream, min(length, self.length(uri) - offset)))
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

    def sync_dirs_up_to(self, uris: list[str], top: str) -> None:
        """fsync the directories holding `uris` and each parent of theirs up to `top`
        (file:// only): a directory made on the way is durable in its parent."""
        done: set[str] = set()
        for uri in uris:
            directory = uri.rsplit("/", 1)[0]
            while directory.startswith(top.rstrip("/")) and directory not in done:
                self.sync_dir(directory)
                done.add(directory)
                if directory.rstrip("/") == top.rstrip("/"):
                    break
                directory = directory.rsplit("/", 1)[0]

    def _fsync(self, uri: str, flags: int) -> None:
        path = local_path(uri)
        if path is None:
            return
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def local_path(uri: str) -> str | None:
    """The local path of a Hadoop `file:` URI ("file:/a/b" or "file:///a/b"), else None.
    Cut by hand, not parsed: Hadoop's URI strings hold names as they are on disk, where
    '#', '?' and '%2F' are plain characters."""
    if not uri.startswith("file:"):
        return None
    path = uri[len("file:"):]
    if path.startswith("//"):  # file://<authority>/path: local files have no authority
        path = path[2:]
        path = path[path.index("/"):] if "/" in path else "/"
    return path
