"""pytest setup: tests marked `gpu` run only where graphdecode sees a CUDA device.

Without one they are reported as skipped (with the reason), never as passed. Set
GRAPHDECODE_REQUIRE_GPU=1 (scripts/gpu-check.sh does) to make a missing device a failure instead.
"""

import os

import pytest

import graphdecode as gd

HAVE_GPU = gd.cuda_device_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    if os.environ.get("GRAPHDECODE_REQUIRE_GPU") == "1":
        raise pytest.UsageError("GRAPHDECODE_REQUIRE_GPU=1 but no CUDA device is available")
    skip = pytest.mark.skip(reason="no CUDA device (graphdecode.cuda_device_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
