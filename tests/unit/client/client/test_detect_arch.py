"""Where a pod's arch comes from (:func:`tunecache.client.environment.detect_arch`): torch's
CUDA device 0 where there can be one, else the GPU's name; and where no NVIDIA driver can
be loaded, torch is not imported just to hear that there is no device.

Each case runs in a fresh interpreter, the driver's presence and torch stood in as the
case needs, so that it holds on a GPU machine as on a CPU-only one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from tunecache.client import environment
from tunecache.client.environment import EnvironmentUnavailable, detect_arch

#: Makes ``libcuda.so.1`` load (``present``) or fail to load (``absent``), whatever this machine has.
DRIVER = '''
import ctypes
_real = ctypes.CDLL
def _cdll(name, *args, **kwargs):
    if name == "libcuda.so.1":
        if {present}:
            return object()
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")
    return _real(name, *args, **kwargs)
ctypes.CDLL = _cdll
'''

#: A torch whose device 0 is a B300 (10, 3).
STANDIN_TORCH = '''
class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_capability(index=0):
        return (10, 3)
'''


def _detect(tmp_path, *, driver: bool, standin_torch: bool, gpu_name: str = "NVIDIA H200") -> list[str]:
    """``[arch, whether torch was imported]`` as a fresh pod process sees them."""
    path = []
    if standin_torch:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text(STANDIN_TORCH)
        path = [str(tmp_path)]
    code = textwrap.dedent(DRIVER.format(present=driver)) + textwrap.dedent(f'''
        import sys
        sys.path[:0] = {path!r}
        from tunecache.client.environment import detect_arch
        print(detect_arch({gpu_name!r}), "torch" in sys.modules)
    ''')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the driver check is Linux's")
def test_without_a_driver_the_arch_comes_from_the_gpu_name_and_torch_is_not_imported(tmp_path):
    assert _detect(tmp_path, driver=False, standin_torch=True) == ["sm90", "False"]


def test_with_a_driver_the_arch_comes_from_torchs_device(tmp_path):
    assert _detect(tmp_path, driver=True, standin_torch=True) == ["sm103", "True"]


def test_a_process_that_imported_torch_asks_it_whatever_the_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: True, get_device_capability=lambda index=0: (8, 9))))
    monkeypatch.setattr(environment.ctypes, "CDLL", lambda *a, **k: pytest.fail("the driver was probed"))
    assert detect_arch("NVIDIA H200") == "sm89"


def test_an_unknown_gpu_without_a_device_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False)))
    with pytest.raises(EnvironmentUnavailable, match="--arch sm90"):
        detect_arch("Some Other GPU")
