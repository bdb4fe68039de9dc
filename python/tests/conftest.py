"""Test setup: the package is imported from this checkout (no install
needed), and every test gets a short socket directory (a Unix socket path
must stay under ~107 bytes, which pytest's tmp_path can exceed)."""

import os
import shutil
import sys
import tempfile

import pytest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="rg-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
