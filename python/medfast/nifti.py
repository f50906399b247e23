"""NIfTI-1/2 files (.nii, .nii.gz), read and written as nibabel does."""
from ._medfast.nifti import load, save

__all__ = ["load", "save"]
