"""The CPU peak probe's per-user cache (`hardware.cached_cpu_probe`): a machine's runs
share one MFU denominator for a day, and a run starts 3-5 s sooner."""

from __future__ import annotations

import json
import logging
import os

import pytest

from components.trainer import hardware
from components.trainer.hardware import Accelerator, PeakProbe

CPU = Accelerator("cpu", "AMD EPYC 7B13", 1, None, frozenset({"avx2"}))


class FakeProbe:
    """Counts its calls; each returns a peak one GFLOP/s higher than the last."""

    def __init__(self):
        self.calls = 0

    def __call__(self, dtype):
        self.calls += 1
        return PeakProbe(1e11 + self.calls * 1e9, dtype, {"8x8x8": [101.0, 99.0, 102.0]},
                         1.0, 9, 3.3)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(hardware.PROBE_CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(hardware.PEAK_PROBE_ENV, raising=False)
    return tmp_path / "cache"


def test_a_probe_is_measured_once_then_read_from_the_cache(cache_dir):
    probe = FakeProbe()
    first = hardware.cached_cpu_probe(CPU, "float32", probe)
    again = hardware.cached_cpu_probe(CPU, "float32", probe)
    assert probe.calls == 1
    assert (first["cached"], again["cached"]) == (False, True)
    assert first["peak_flops"] == again["peak_flops"] == 1.01e11
    assert again["repeats"] == 9 and again["measured_at"] == first["measured_at"]
    stored = json.loads((cache_dir / "peak_probe.json").read_text())
    (key,) = stored
    assert key == hardware.probe_key(CPU, "float32") and key.startswith("AMD EPYC 7B13|cores=")
    assert "|tf=" in key and key.endswith("|float32")


def test_another_dtype_or_cpu_is_probed_apart(cache_dir):
    probe = FakeProbe()
    hardware.cached_cpu_probe(CPU, "float32", probe)
    assert not hardware.cached_cpu_probe(CPU, "bfloat16", probe)["cached"]
    other = Accelerator("cpu", "Intel(R) Xeon(R) Processor", 1)
    assert not hardware.cached_cpu_probe(other, "float32", probe)["cached"]
    assert probe.calls == 3
    assert len(json.loads((cache_dir / "peak_probe.json").read_text())) == 3


def test_fresh_or_a_day_old_probe_is_measured_again(cache_dir, monkeypatch):
    probe = FakeProbe()
    hardware.cached_cpu_probe(CPU, "float32", probe)
    monkeypatch.setenv(hardware.PEAK_PROBE_ENV, "fresh")
    assert hardware.cached_cpu_probe(CPU, "float32", probe)["peak_flops"] == 1.02e11
    monkeypatch.delenv(hardware.PEAK_PROBE_ENV)
    path = cache_dir / "peak_probe.json"
    stored = json.loads(path.read_text())
    (entry,) = stored.values()
    entry["measured_at_unix"] -= hardware.PROBE_CACHE_HOURS * 3600 + 1
    path.write_text(json.dumps(stored))
    assert not hardware.cached_cpu_probe(CPU, "float32", probe)["cached"]
    assert probe.calls == 3


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"KEY": {"dtype": "float32"}}',
                                  '{"KEY": {"dtype": "float32", "peak_flops": -1, '
                                  '"measured_at_unix": 1e12}}'])
def test_a_malformed_cache_is_measured_over(cache_dir, text):
    cache_dir.mkdir()
    path = cache_dir / "peak_probe.json"
    path.write_text(text.replace("KEY", hardware.probe_key(CPU, "float32")))
    probe = FakeProbe()
    assert not hardware.cached_cpu_probe(CPU, "float32", probe)["cached"]
    assert hardware.cached_cpu_probe(CPU, "float32", probe)["cached"]
    assert probe.calls == 1 and not [p for p in os.listdir(cache_dir) if p.endswith(".tmp")]


def test_an_unwritable_cache_is_logged_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(hardware.PROBE_CACHE_DIR_ENV, str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger=hardware.__name__):
        figures = hardware.cached_cpu_probe(CPU, "float32", FakeProbe())
    assert figures["peak_flops"] == 1.01e11 and not figures["cached"]
    assert "peak probe not cached" in caplog.text and str(blocker) in caplog.text


def test_peak_flops_of_a_cpu_comes_through_the_cache(cache_dir, monkeypatch):
    probe = FakeProbe()
    monkeypatch.setattr(hardware, "probe_matmul_peak", probe)
    first = hardware.peak_flops(CPU, "float32")
    peak, source, figures = hardware.peak_flops(CPU, "float32")
    assert (peak, source) == (1.01e11, "probe:float32 matmul") and first[0] == peak
    assert figures["cached"] and probe.calls == 1
