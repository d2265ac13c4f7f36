"""Shared fixtures: the real embedded target is loaded once per test session."""

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def real_models():
    """The embedded target with a random drafter; DARTREE_TEST_DEVICE=cuda puts them on that device in fp32, the
    exact mode (scripts/device_check.sh runs the lossless tests so). Unset: the loader's defaults, as the app's."""
    from dartree.models.loading import load_models

    device = os.environ.get("DARTREE_TEST_DEVICE")
    if device:
        return load_models("smollm2-135m", drafter="random", device=device, dtype="fp32")
    return load_models("smollm2-135m", drafter="random")


@pytest.fixture(scope="session")
def real_target(real_models):
    return real_models.target
