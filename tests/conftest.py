import pytest


def _gpu_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    except Exception:
        return False


HAVE_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs a Hopper GPU and torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
