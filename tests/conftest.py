"""Shared fixtures: the real embedded target is loaded once per test session."""

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def real_models():
    from dartree.models.loading import load_models

    return load_models("smollm2-135m", drafter="random")


@pytest.fixture(scope="session")
def real_target(real_models):
    return real_models.target
