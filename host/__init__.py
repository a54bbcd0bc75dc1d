"""Layer 4: devices that run kernels (sim, emu, xrt, pynq) behind one small protocol. No torch.

Example::

    from offload.host import open_device
    dev = open_device("sim")                    # or "emu", "xrt:0", ...; default $OFFLOAD_DEVICE, else "sim"
    h = dev.load(kernel)                        # tables / weights uploaded once, resident
    out = dev.run(h, {"indices": idx, "offsets": off})
"""

from offload.host.device import (
    Device,
    DeviceError,
    DeviceInfo,
    DeviceTimeout,
    KernelHandle,
    default_device,
    launch_modes,
    open_device,
    register_device,
)

# The built-in backends register themselves when their modules load (pyxrt and pynq themselves
# are imported only when such a device is opened).
from offload.host import emu, pynq, sim, xrt  # noqa: E402,F401  isort: skip

__all__ = [
    "Device",
    "DeviceError",
    "DeviceInfo",
    "DeviceTimeout",
    "KernelHandle",
    "default_device",
    "launch_modes",
    "open_device",
    "register_device",
]
