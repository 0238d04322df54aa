"""One app instance per data folder: only one process writes the chats, and a second launch brings the
first window to the front instead of opening another.

A QLockFile in the data folder says who holds the folder; Qt removes a lock left by a crashed process
(its PID is gone), so a crash never blocks the next start. The holder listens on a QLocalServer (a
Unix socket or a named pipe, only for this user) named after the folder; a second instance sends
"activate" there and waits for "ok". No network port is opened. Qt Core and Network only, no widgets.

Two launches at the same moment (a double click) are the usual case, not a rare one: the second finds the
lock taken a few milliseconds before the first listens, and the first answers only once its event loop
runs, after its window is built (seconds on a busy computer). So the second keeps trying to connect for a
while, and once connected waits for the answer much longer; it gives up early only when the folder is no
longer locked (the first has quit).
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from PySide6.QtCore import QDeadlineTimer, QLockFile, QObject, QThread, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

LOCK_NAME = "dflash-desktop.lock"
ACTIVATE, ACK = b"activate\n", b"ok\n"
CONNECT_MS = 3_000   # a first instance listens a few milliseconds after it took the lock; longer means it never will
ANSWER_MS = 20_000   # a first instance answers once its window is up; longer means it hangs
RETRY_MS = 50


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
            self._read(sock)  # what arrived while this process was still starting

    def _read(self, sock: QLocalSocket) -> None:
        while sock.canReadLine():
            if bytes(sock.readLine()) == ACTIVATE:
                self.activated.emit()
                sock.write(ACK)
                sock.flush()

    def activate_first(self, timeout_ms: int = ANSWER_MS, connect_ms: int = CONNECT_MS) -> bool:
        """Ask the running instance to come to the front; True once it confirmed.

        The first instance may hold the lock but not listen yet (tried again for connect_ms), or listen but
        answer only once its window is up (waited for up to timeout_ms in all). Gives up early once the
        folder is free: the first instance has quit, and nobody is left to answer.
        """
        deadline, connect_deadline = QDeadlineTimer(timeout_ms), QDeadlineTimer(connect_ms)
        reached = False
        while True:
            connected, answer = self._ask(deadline)
            if answer is not None:
                return answer
            reached = reached or connected
            if deadline.hasExpired() or (connect_deadline.hasExpired() and not reached) or not self._held_elsewhere():
                return False
            QThread.msleep(RETRY_MS)

    def _ask(self, deadline: QDeadlineTimer) -> tuple[bool, bool | None]:
        """One try: (whether it connected, the answer: None when there was none before the connection ended)."""
        sock = QLocalSocket()
        try:
            sock.connectToServer(self.name)
            if not sock.waitForConnected(_ms_left(deadline)):
                return False, None
            sock.write(ACTIVATE)
            if not sock.waitForBytesWritten(_ms_left(deadline)):
                return True, None
            while not sock.canReadLine() and not deadline.hasExpired():
                if not sock.waitForReadyRead(_ms_left(deadline)) \
                        and sock.state() != QLocalSocket.LocalSocketState.ConnectedState:
                    break  # the first instance closed the connection unanswered (it is quitting)
            return True, (bytes(sock.readLine()) == ACK if sock.canReadLine() else None)
        finally:
            sock.abort()

    def _held_elsewhere(self) -> bool:
        """Whether another process still holds the data folder; Qt takes over a lock whose process is gone."""
        if self._lock.tryLock(0):
            self._lock.unlock()
            return False
        return True

    def release(self) -> None:
        """Stop listening and remove the lock file (also done by Qt when the process ends)."""
        if self._server is not None:
            self._server.close()
        if self._lock.isLocked():
            self._lock.unlock()


def _ms_left(deadline: QDeadlineTimer) -> int:
    return max(1, deadline.remainingTime())
