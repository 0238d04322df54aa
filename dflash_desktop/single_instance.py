"""One app instance per data folder: only one process writes the chats, and a second launch brings the
first window to the front instead of opening another.

A QLockFile in the data folder says who holds the folder; Qt removes a lock left by a crashed process
(its PID is gone), so a crash never blocks the next start. The holder listens on a QLocalServer (a
Unix socket or a named pipe, only for this user) named after the folder; a second instance sends
"activate" there and waits for "ok". No network port is opened. Qt Core and Network only, no widgets.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

LOCK_NAME = "dflash-desktop.lock"
ACTIVATE, ACK = b"activate\n", b"ok\n"


def server_name(folder: Path) -> str:
    """Per user (the home folder) and per data folder, so test homes and portable installs never meet."""
    key = f"{os.path.expanduser('~')}\n{Path(folder).resolve()}"
    return "dflash-desktop-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class SingleInstance(QObject):
    activated = Signal()  # a second instance asked this one to come to the front

    def __init__(self, folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.name = server_name(folder)
        self._lock = QLockFile(str(Path(folder) / LOCK_NAME))
        self._lock.setStaleLockTime(0)  # held for the whole run; staleness is decided by the holder's PID only
        self._server: QLocalServer | None = None

    def claim(self) -> bool:
        """True when this process may write the data folder; False when another instance holds it.

        A folder that cannot hold a lock file (read-only) cannot be written by anyone, so that counts as
        claimed: the app then opens its chats read-only and says so.
        """
        if self._lock.tryLock(0):
            self._listen()
            return True
        if self._lock.error() == QLockFile.LockError.LockFailedError:
            return False
        log.warning("No single-instance lock in the data folder (%s); going on without it", self._lock.error().name)
        return True

    def _listen(self) -> None:
        QLocalServer.removeServer(self.name)  # a socket left by a crash; we hold the lock, so nobody uses it
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._accept)
        if not self._server.listen(self.name):
            log.warning("A second instance cannot bring this one to the front: %s", self._server.errorString())

    def _accept(self) -> None:
        while self._server.hasPendingConnections():
            sock = self._server.nextPendingConnection()
            sock.readyRead.connect(lambda sock=sock: self._read(sock))
            sock.disconnected.connect(sock.deleteLater)

    def _read(self, sock: QLocalSocket) -> None:
        while sock.canReadLine():
            if bytes(sock.readLine()) == ACTIVATE:
                self.activated.emit()
                sock.write(ACK)
                sock.flush()

    def activate_first(self, timeout_ms: int = 2000) -> bool:
        """Ask the running instance to come to the front; True once it confirmed."""
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if not sock.waitForConnected(timeout_ms):
            return False
        sock.write(ACTIVATE)
        answered = sock.waitForBytesWritten(timeout_ms) and sock.waitForReadyRead(timeout_ms)
        confirmed = answered and bytes(sock.readLine()) == ACK
        sock.disconnectFromServer()
        return confirmed

    def release(self) -> None:
        """Stop listening and remove the lock file (also done by Qt when the process ends)."""
        if self._server is not None:
            self._server.close()
        if self._lock.isLocked():
            self._lock.unlock()
