"""Worker stderr into a rotated file in the app's logs folder, so a crash report can point users at
one file and the folder never grows without bound (5 files of 2 MB by default)."""
from __future__ import annotations

import logging
import logging.handlers
import threading
from pathlib import Path

from . import paths

WORKER_LOG = "worker.log"
MAX_BYTES = 2 * 1024 * 1024
BACKUPS = 4  # worker.log plus worker.log.1 .. .4: five files

_handlers: dict[Path, logging.Handler] = {}
_lock = threading.Lock()


class WorkerLog:
    """Append worker stderr lines (and the client's own notes about the worker) to the rotated log."""

    def __init__(self, path: Path | None = None, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        self.path = Path(path) if path else paths.logs_dir() / WORKER_LOG
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _lock:  # one handler per file, shared by every client in this process
            handler = _handlers.get(self.path)
            if handler is None:
                handler = logging.handlers.RotatingFileHandler(
                    self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
                handler.setFormatter(logging.Formatter("%(asctime)s worker[%(pid)s] %(message)s"))
                _handlers[self.path] = handler
        self._handler = handler

    def write(self, line: str, pid: int | None = None) -> None:
        record = logging.LogRecord("worker", logging.INFO, "", 0, line, None, None)
        record.pid = pid if pid is not None else "-"
        self._handler.handle(record)

    def flush(self) -> None:
        self._handler.flush()
