"""A fake host for the node plugin's tests and the demo: /sys, /proc and /dev under a folder,
laid out the way Linux shows them (real directories and relative symlinks), so that
:mod:`app.node.finder` reads it as it reads a real host under ``node.host_root``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def config_space(
    caps: Sequence[tuple[int, int, bytes]] = (), *, header: int = 0, size: int = 4096
) -> bytes:
    """A PCI function's configuration space with extended capabilities ``(offset, id, body)``
    chained in the order given (the first must sit at 0x100)."""
    space = bytearray(size)
    space[0x0E] = header
    for index, (offset, capability_id, body) in enumerate(caps):
        following = caps[index + 1][0] if index + 1 < len(caps) else 0
        word = capability_id | (1 << 16) | (following << 20)
        space[offset : offset + 4] = word.to_bytes(4, "little")
        space[offset + 4 : offset + 4 + len(body)] = body
    return bytes(space[:size])


def dsn_body(serial: int) -> bytes:
    return serial.to_bytes(8, "little")


class FakeHost:
    """A host's /sys, /proc and /dev under ``root``, built the way Linux shows them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for folder in ("sys/bus/pci/devices", "sys/class/nvme", "sys/bus/cxl/devices", "dev"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    def write(self, host_path: str, content: str | bytes) -> Path:
        path = self.root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def link(self, host_path: str, target: str) -> None:
        path = self.root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)

    def pci(
        self,
        address: str,
        *,
        vendor: str = "0x10de",
        device: str = "0x20b5",
        dsn: int | None = None,
        iommu_group: int | None = None,
        config: bytes | None = None,
        header: int = 0,
    ) -> FakeHost:
        real = f"/sys/devices/pci0000:00/{address}"
        self.write(f"{real}/vendor", f"{vendor}\n")
        self.write(f"{real}/device", f"{device}\n")
        if config is None:
            caps = [(0x100, 0x0001, b"\0" * 8)]
            if dsn is not None:
                caps.append((0x148, 0x0003, dsn_body(dsn)))
            config = config_space(caps, header=header)
        self.write(f"{real}/config", config)
        self.link(f"/sys/bus/pci/devices/{address}", f"../../../devices/pci0000:00/{address}")
        if iommu_group is not None:
            (self.root / f"sys/kernel/iommu_groups/{iommu_group}").mkdir(parents=True)
            self.link(f"{real}/iommu_group", f"../../../kernel/iommu_groups/{iommu_group}")
        return self

    def vfio_bound(self, group: int, minor: int) -> FakeHost:
        self.write(f"/sys/class/vfio/{group}/dev", f"243:{minor}\n")
        self.write("/sys/class/misc/vfio/dev", "10:196\n")
        return self

    def nvme(
        self,
        number: int,
        *,
        serial: str,
        namespaces: int = 1,
        address: str | None = "0000:3b:00.0",
        uuids: Sequence[str] = (),
    ) -> FakeHost:
        name = f"nvme{number}"
        if address is None:
            real = f"/sys/devices/virtual/nvme-fabrics/ctl/{name}"
        else:
            if not (self.root / f"sys/bus/pci/devices/{address}").exists():
                self.pci(address, vendor="0x144d", device="0xa80a")
            real = f"/sys/devices/pci0000:00/{address}/nvme/{name}"
            self.link(f"{real}/device", f"../../../{address}")
        self.write(f"{real}/serial", f"{serial:<20}\n")
        self.write(f"{real}/dev", f"241:{number}\n")
        for index in range(1, namespaces + 1):
            self.write(f"{real}/{name}n{index}/dev", f"259:{number * 16 + index}\n")
            if index <= len(uuids):
                self.write(f"{real}/{name}n{index}/uuid", f"{uuids[index - 1]}\n")
        self.link(f"/sys/class/nvme/{name}", f"../../{real.removeprefix('/sys/')}")
        return self

    def cxl_mem(self, number: int, *, serial: int, address: str = "0000:35:00.0") -> FakeHost:
        real = f"/sys/devices/pci0000:34/{address}/mem{number}"
        self.write(f"{real}/serial", f"0x{serial:x}\n")
        self.write(f"{real}/dev", f"250:{number}\n")
        self.link(
            f"/sys/bus/cxl/devices/mem{number}",
            f"../../../devices/pci0000:34/{address}/mem{number}",
        )
        return self

    def nvidia_gpu(
        self, address: str, *, uuid: str, minor: int, iommu_group: int | None = None
    ) -> FakeHost:
        self.pci(address, vendor="0x10de", device="0x20b5", iommu_group=iommu_group)
        self.write(
            f"/proc/driver/nvidia/gpus/{address}/information",
            "Model: \t\t NVIDIA A100-SXM4-40GB\n"
            "IRQ:   \t\t 160\n"
            f"GPU UUID: \t GPU-{uuid}\n"
            "Video BIOS: \t 92.00.45.00.06\n"
            "Bus Type: \t PCIe\n"
            f"Bus Location: \t {address}\n"
            f"Device Minor: \t {minor}\n"
            "GPU Excluded:\t No\n",
        )
        return self

    def proc_devices(self, *lines: str) -> FakeHost:
        body = "Character devices:\n" + "".join(f"{line}\n" for line in lines)
        self.write("/proc/devices", body + "\nBlock devices:\n259 blkext\n")
        return self

    def slot(self, name: str, address: str) -> FakeHost:
        self.write(f"/sys/bus/pci/slots/{name}/address", f"{address}\n")
        return self
