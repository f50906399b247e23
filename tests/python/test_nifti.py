"""medfast.nifti against nibabel, the reference."""
import numpy as np
import pytest

try:
    import nibabel as nib
except ImportError:  # the GPU image's pip python has no nibabel (Debian: python3-nibabel)
    nib = None
# Collected and skipped, not skipped at import: a module that collects no test makes pytest
# exit 5, which ctest would count as a failure.
pytestmark = pytest.mark.skipif(nib is None, reason="nibabel, the reference these tests compare with, is not installed")
import torch

import medfast


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_load_equals_nibabel(tmp_path, suffix):
    rng = np.random.default_rng(0)
    data = rng.integers(-1000, 2000, size=(20, 18, 7)).astype(np.int16)
    affine = np.array([[-0.8, 0, 0, 100], [0, -0.8, 0, 50], [0, 0, 5, -30], [0, 0, 0, 1]])
    path = str(tmp_path / ("a" + suffix))
    img = nib.Nifti1Image(data, affine)
    img.header.set_slope_inter(0.5, -3)
    nib.save(img, path)
    tensor, aff, header = medfast.nifti.load(path)
    ref = nib.load(path)
    expected = np.asanyarray(ref.dataobj)
    assert tensor.dtype == torch.float64 and tuple(tensor.shape) == expected.shape
    assert np.array_equal(tensor.numpy(), expected)
    assert np.array_equal(aff.numpy(), ref.affine)
    assert header["shape"] == [20, 18, 7] and header["axcodes"] == "LPS"
    assert header["scl_slope"] == 0.5 and header["scl_inter"] == -3


def test_save_is_read_back_by_nibabel(tmp_path):
    t = torch.arange(4 * 5 * 6, dtype=torch.float32).reshape(4, 5, 6) / 7
    affine = torch.tensor([[1.5, 0, 0, -10], [0, 1.5, 0, 20], [0, 0, 2, 3], [0, 0, 0, 1]], dtype=torch.float64)
    for name in ["b.nii", "b.nii.gz"]:
        path = str(tmp_path / name)
        medfast.nifti.save(path, t, affine)
        ref = nib.load(path)
        assert np.array_equal(np.asanyarray(ref.dataobj), t.numpy())
        assert np.allclose(ref.affine, affine.numpy())
    with pytest.raises(ValueError, match="4x4"):
        medfast.nifti.save(str(tmp_path / "c.nii"), t, torch.eye(3))


def test_a_bad_file_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "bad.nii"
    path.write_bytes(b"\0" * 400)
    with pytest.raises(ValueError, match="bad.nii"):
        medfast.nifti.load(str(path))
