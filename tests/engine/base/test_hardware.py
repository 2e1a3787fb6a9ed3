"""kopt.hardware: profiles as data, name mapping, copy-ceiling cache, flush size (CPU only)."""

from __future__ import annotations

import json

import pytest

from kopt import hardware
from kopt.hardware import DeviceInfo, MiB


def test_yaml_loads_and_validates():
    profiles = {p.name: p for p in hardware.load_profiles()}
    assert {"H200", "H100", "A100", "A100-80GB", "C500", "cpu"} <= set(profiles)
    h200 = profiles["H200"]
    assert (h200.units, h200.warp_size, h200.spec_bw_gbps) == (132, 32, 4800)
    assert h200.l2_bytes == 60 * MiB
    c500 = profiles["C500"]
    assert (c500.units, c500.warp_size, c500.unit_name, c500.l2_bytes) == (104, 64, "AP", 8 * MiB)
    assert c500.smem_per_unit_bytes == 64 * 1024 and c500.spec_verified is False
    assert profiles["A100"].units == 108 and profiles["H100"].l2_bytes == 50 * MiB


def test_yaml_rejects_unknown_fields(tmp_path):
    bad = tmp_path / "hw.yaml"
    bad.write_text("schema_version: 1\ndevices:\n  - {name: X, vendor: nvidia, colour: red}\n")
    with pytest.raises(ValueError):
        hardware.load_profiles(bad)


@pytest.mark.parametrize(
    "raw, name",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("MetaX C500", "C500"),
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
    ],
)
def test_device_name_mapping(raw, name):
    assert hardware.device_name(raw) == name


def test_detect_cpu():
    info = hardware.detect("cpu")
    assert info.name == "cpu" and info.device == "cpu" and info.units and info.units >= 1
    assert hardware.copy_ceiling_gbps("cpu") is None


def _info(l2):
    return DeviceInfo(name="X", device="cuda:0", raw_name="X", unit_name="SM", units=1,
                      warp_size=32, l2_bytes=l2, spec_bw_gbps=None, profile=None)


def test_flush_bytes_rule():
    assert hardware.flush_bytes(_info(60 * MiB)) == 256 * MiB       # 2 x 60 MiB < 256 MiB
    assert hardware.flush_bytes(_info(200 * MiB)) == 400 * MiB
    assert hardware.flush_bytes(_info(None)) == 256 * MiB
    assert hardware.flush_bytes(hardware.detect("cpu")) == 256 * MiB


def test_cache_roundtrip(tmp_path):
    entry = hardware.CopyCeiling(device="H200", raw_name="NVIDIA H200", copy_gbps=4262.5, copy_bytes=1 << 30)
    f = hardware.write_cached(entry, tmp_path)
    assert f.name == "hardware-H200.json" and json.loads(f.read_text())["copy_gbps"] == 4262.5
    assert hardware.read_cached("H200", tmp_path).copy_gbps == 4262.5
    assert hardware.read_cached("A100", tmp_path) is None
    assert not list(tmp_path.glob("*.tmp"))                              # atomic write left nothing
    (tmp_path / "hardware-A100.json").write_text("{not json")
    assert hardware.read_cached("A100", tmp_path) is None


def test_copy_ceiling_measures_once_then_reads_cache(tmp_path, monkeypatch, workspace):
    fake = DeviceInfo(name="H200", device="cuda:0", raw_name="NVIDIA H200", unit_name="SM", units=132,
                      warp_size=32, l2_bytes=60 * MiB, spec_bw_gbps=4800, profile=None)
    monkeypatch.setattr(hardware, "detect", lambda device: fake)
    calls = []

    def measure(device):
        calls.append(device)
        return 4300.0

    assert hardware.copy_ceiling_gbps("cuda:0", measure=measure) == 4300.0
    assert hardware.copy_ceiling_gbps("cuda:0", measure=measure) == 4300.0
    assert calls == ["cuda:0"]                                            # measured once
    assert (workspace / "results" / "hardware-H200.json").is_file()     # default: workspace results/
    assert hardware.copy_ceiling_gbps("cuda:0", tmp_path, measure=lambda d: 4100.0) == 4100.0
    assert hardware.copy_ceiling_gbps("cuda:0", refresh=True, measure=lambda d: 4200.0) == 4200.0


def test_limit_arithmetic():
    from kopt import roofline

    roof = roofline.Roofline(read_gbps=4000.0, copy_gbps=4100.0, floor_ms=0.002)
    assert roofline.limit_ms(8_000_000, roof) == pytest.approx(0.002)           # 2 µs of bytes: the floor
    assert roofline.limit_ms(400_000_000, roof) == pytest.approx(0.1)           # 100 µs of bytes
    assert roofline.limit_ms(1_000, roof) == 0.002                              # tiny call: the floor
    assert roofline.pct_limit(0.1, 0.125) == pytest.approx(80.0)


def test_roofline_measured_once_beside_the_copy_ceiling(tmp_path, monkeypatch, workspace):
    from kopt import roofline

    fake = DeviceInfo(name="H200", device="cuda:0", raw_name="NVIDIA H200", unit_name="SM", units=132,
                      warp_size=32, l2_bytes=60 * MiB, spec_bw_gbps=4800, profile=None)
    monkeypatch.setattr(hardware, "detect", lambda device: fake)
    monkeypatch.setattr(hardware, "measure_copy_gbps", lambda device: 4160.0)
    calls = []

    def read(device):
        calls.append("read")
        return 4700.0, "fake-read"

    def floor(device):
        calls.append("floor")
        return 0.0021, "fake-floor"

    roof = roofline.for_device("cuda:0", measure_read=read, measure_floor=floor)
    assert roof == roofline.Roofline(read_gbps=4700.0, copy_gbps=4160.0, floor_ms=0.0021)
    assert roofline.for_device("cuda:0", measure_read=read, measure_floor=floor) == roof
    assert calls == ["read", "floor"]                                       # cached after the first
    saved = json.loads((workspace / "results" / "hardware-H200.json").read_text())
    assert saved["read_gbps"] == 4700.0 and saved["copy_gbps"] == 4160.0 and saved["floor_ms"] == 0.0021
    assert saved["read_bytes"] >= 4 << 30 and saved["roofline_at"]
    assert roofline.for_device("cpu") is None
