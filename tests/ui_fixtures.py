"""Fixtures shared by the UI tests: a random model pair on disk and a real worker that has it loaded.

The worker is a real subprocess (no mocks): starting it and importing torch costs seconds, so one
worker serves a whole test module.
"""
from __future__ import annotations

import pytest

from dflash_desktop.qt_worker import QtWorker

LOAD_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    from engine.backends.torch.tiny import save_random_pair
    return save_random_pair(tmp_path_factory.mktemp("pair"), hidden=64, layers=4, block_size=8)


@pytest.fixture(scope="module")
def loaded_worker(qapp, random_pair, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
        worker = QtWorker()
        result = worker.client.wait(worker.load_pair(*random_pair), LOAD_TIMEOUT_S)
        assert result["event"] == "loaded", result
        yield worker
        worker.shutdown(10)
