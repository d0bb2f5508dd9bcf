"""PyTorch's backend-autoload entry point (the ``torch.backends`` group in
the package metadata): ``import torch`` calls ``load``, which imports
``polychip.torch`` and so gives PyTorch the ``polychip`` device.

It lives outside ``polychip.torch`` because that module imports torch: when
it is imported first, torch's autoload finds it half-imported, and
importing it again here is then a no-op that lets both finish.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns autoloading off."""


def load() -> None:
    import polychip.torch  # noqa: F401
