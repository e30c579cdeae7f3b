"""Stands in for the MCP SDK's first import in a forged process whose PYTHONPATH starts here:
it waits until the file `FORGED_TEST_SDK_GATE` names exists, then loads the real httpx2 in
its place. A test holds the SDK's import for as long as it likes this way."""

import importlib
import os
import sys
import time

_gate = os.environ["FORGED_TEST_SDK_GATE"]
while not os.path.exists(_gate):
    time.sleep(0.01)
sys.path.remove(os.path.dirname(os.path.abspath(__file__)))
del sys.modules["httpx2"]
sys.modules["httpx2"] = importlib.import_module("httpx2")
