import subprocess
import sys

import torch

from aio_examples.compat import torchvision_shim as shim


def reference_nms(boxes, scores, iou_threshold):
    """Plain greedy NMS, written out, to check the kernel that torchvision actually runs."""
    order = scores.argsort(descending=True)
    keep = []
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        lt = torch.maximum(boxes[i, :2], boxes[:, :2])
        rb = torch.minimum(boxes[i, 2:], boxes[:, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        iou = inter / (area[i] + area - inter)
        suppressed |= iou > iou_threshold
    return torch.tensor(keep)


def test_torchvision_imports_and_nms_matches_reference():
    tv = shim.ensure_torchvision()
    gen = torch.Generator().manual_seed(0)
    boxes = torch.rand(300, 4, generator=gen) * 100
    boxes[:, 2:] += boxes[:, :2] + 1
    scores = torch.rand(300, generator=gen)
    assert torch.equal(tv.ops.nms(boxes, scores, 0.5), reference_nms(boxes, scores, 0.5))


def test_roi_align_of_a_constant_map_is_constant():
    tv = shim.ensure_torchvision()
    feature = torch.full((1, 3, 16, 16), 2.5)
    rois = torch.tensor([[0, 1.0, 1.0, 9.0, 9.0]])
    out = tv.ops.roi_align(feature, rois, output_size=(4, 4))
    assert out.shape == (1, 3, 4, 4) and torch.allclose(out, torch.full_like(out, 2.5))


def test_status_says_whose_ops_are_in_use():
    shim.ensure_torchvision()
    status = shim.torchvision_status()
    assert status["torchvision"]
    if status["cuda_stub_symbols"]:
        assert status["torchvision_ops"] == "wheel CPU kernels with CUDA stand-ins"
        from pathlib import Path

        assert all((Path(status["cuda_stub_dir"]) / lib).is_file() for lib in shim.STUB_LIBS)
    else:
        assert status["torchvision_ops"] == "torchvision (as installed)"


def test_stub_source_defines_functions_that_abort_and_data_objects():
    src = shim.stub_source([("_ZN3c104cuda12device_countEv", True), ("_ZN3c104cuda1xE", False)])
    assert 'void _ZN3c104cuda12device_countEv(void) { stub_called("_ZN3c104cuda12device_countEv"); }' in src
    assert "void *_ZN3c104cuda1xE[8];" in src
    assert "abort();" in src


def test_a_stand_in_that_is_called_aborts_loudly():
    """If torchvision ever reached a CUDA code path, the process must stop, not compute garbage."""
    code = (
        "import ctypes, torch\n"
        "from aio_examples.compat import torchvision_shim as s\n"
        "s.ensure_torchvision()\n"
        "st = s.torchvision_status()\n"
        "if not st['cuda_stub_symbols']: raise SystemExit(77)\n"
        "lib = ctypes.CDLL(st['cuda_stub_dir'] + '/libc10_cuda.so')\n"
        "lib._ZN3c104cuda12device_countEv()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode == 77:
        return  # torchvision's CPU build: nothing is stood in
    assert proc.returncode != 0
    assert "CUDA stand-in _ZN3c104cuda12device_countEv was called" in proc.stderr
