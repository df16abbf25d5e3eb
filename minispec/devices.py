"""Whether a device can be used here: one rule for the API's `device` and the commands' --device."""

from __future__ import annotations

import torch


def device_problem(device: str | torch.device) -> str | None:
    """Why `device` cannot be used on this machine (torch would fail later with an assertion or
    a traceback), or None."""
    try:
        device = torch.device(device)
    except RuntimeError:
        return f"unknown device {str(device)!r}"
    if device.type == "cpu":
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not backend.is_available():
        return f"no {device.type} device is available to this torch build"
    if device.index is not None and device.index >= backend.device_count():
        return f"there are only {backend.device_count()} {device.type} devices"
    return None
