"""The in-process ``memory://`` backend (tests, dry runs, single-process use)."""

from __future__ import annotations

import threading

from airflow_seatunnel_ckpt.core.storage.base import Capabilities, Data, FileInfo, Storage, chunks


class MemoryStorage(Storage):
    """fsspec's in-process ``memory://`` filesystem; one process-wide lock makes create-exclusive
    a true put-if-absent between threads (there is no other process to race with)."""

    capabilities = Capabilities(conditional_create=True, atomic_rename_dir=False, checksum=None)

    _lock = threading.Lock()

    def _write_whole(self, full: str, data: Data) -> int:
        payload = b"".join(chunks(data))
        with self._lock:
            self.fs.pipe_file(full, payload)
        return len(payload)

    def _put_if_absent(self, full: str, data: bytes) -> None:
        with self._lock:
            if self.fs.exists(full):
                raise FileExistsError(full)
            self.fs.pipe_file(full, data)

    def _copy_in_store(self, source_full: str, full: str) -> bool:
        # A memory file is replaced by a whole new one: the copy appears whole.
        with self._lock:
            self.fs.copy(source_full, full)
        return True

    # fsspec's memory filesystem lists and removes by going through one process-wide dict:
    # a listing while another thread writes or deletes would fail ("dictionary changed size
    # during iteration"), so listings and removals take the same lock as writes.
    def list_dir(self, path: str = "") -> list[str]:
        with self._lock:
            return super().list_dir(path)

    def walk(self, path: str = "", include_temp: bool = False) -> list[FileInfo]:
        with self._lock:
            return super().walk(path, include_temp)

    def delete(self, path: str, recursive: bool = False) -> None:
        with self._lock:
            super().delete(path, recursive)
