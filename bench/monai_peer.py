"""MONAI, measured beside medfast: find the peer copy and build its transforms from medfast's chains.

The benchmarks never quote a MONAI figure: they import MONAI 1.3 from --monai (the
project keeps a pure-Python copy in ../shared/peers/monai-1.3.2 beside the repository)
and run it on the same files and threads in the same run. Where the copy is missing they
print one line saying so and measure medfast alone.

medfast's chains are lists of {"name": MONAI's array-transform name, MONAI's arguments};
`transforms()` turns one into MONAI's dictionary transforms (name + "d") with the same
arguments, so both sides run the chain written once.
"""
import os
import sys
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.normpath(os.path.join(REPO, "..", "shared", "peers", "monai-1.3.2"))


def add_argument(parser):
    parser.add_argument("--monai", default=DEFAULT_PATH,
                        help="MONAI 1.3 source tree to import (default: %(default)s); absent: medfast only")


def load(path):
    """MONAI imported from `path`, or None after printing why the side-by-side is skipped."""
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "monai", "__init__.py")):
        print(f"MONAI peer not found at {path}: skipping the side-by-side", flush=True)
        return None
    sys.path.insert(0, path)
    warnings.filterwarnings("ignore", category=FutureWarning, module="monai")
    import monai  # noqa: F401
    import monai.data
    import monai.inferers
    import monai.losses
    import monai.metrics
    import monai.networks.nets
    import monai.transforms
    import monai.utils
    return monai


def _tuples(args):
    """Lists become tuples (MONAI's sequence arguments), keys stay as given."""
    return {k: (tuple(v) if isinstance(v, list) and k != "keys" else v) for k, v in args.items()}


def _load_image(mt, args, reader=None):
    """LoadImage: medfast's per-key dtype ("" keeps the file's) as one LoadImaged per distinct dtype;
    `reader` (an ImageReader instance) replaces MONAI's choice (NibabelReader for NIfTI)."""
    import numpy as np
    keys = args.pop("keys")
    keys = [keys] if isinstance(keys, str) else keys
    dtypes = args.pop("dtype", "float32")
    dtypes = [dtypes] * len(keys) if isinstance(dtypes, str) or dtypes is None else dtypes
    args.pop("image_only", None)  # medfast keeps the geometry either way; MONAI's meta does the same
    if reader is not None:
        args["reader"] = reader
    groups = {}
    for k, d in zip(keys, dtypes):
        groups.setdefault(d or "", []).append(k)
    return [mt.LoadImaged(keys=ks, dtype=np.dtype(d) if d else None, **args) for d, ks in groups.items()]


def _crop_foreground(mt, args):
    """CropForeground: medfast's threshold is MONAI's select_fn (x > threshold)."""
    threshold = args.pop("threshold", 0)
    args.setdefault("allow_smaller", True)  # medfast's default, and MONAI 1.3's (explicit: no warning)
    if threshold:
        args["select_fn"] = lambda x: x > threshold
    return [mt.CropForegroundd(**_tuples(args))]


def _label_to_regions(monai, args):
    """LabelToRegions (medfast's; nnU-Net's regions, MONAI's tutorials write the same as a
    ConvertToMultiChannelBasedOnBratsClassesd of their own): channel k is the label in
    regions[k], as the MSD Task01 tutorial's class does for TC, WT and ET."""
    import torch
    keys = args.pop("keys", ["label"])
    regions = [[r] if isinstance(r, int) else list(r) for r in args.pop("regions")]
    if args:
        raise ValueError(f"LabelToRegions: arguments {sorted(args)} are not known to the MONAI peer")

    class LabelToRegionsd(monai.transforms.MapTransform):
        def __call__(self, data):
            d = dict(data)
            for key in self.key_iterator(d):
                img = d[key]
                if img.ndim == 4 and img.shape[0] == 1:
                    img = img.squeeze(0)
                channels = []
                for region in regions:
                    mask = img == region[0]
                    for value in region[1:]:
                        mask = mask | (img == value)
                    channels.append(mask)
                d[key] = torch.stack(channels, dim=0).float()  # as the tutorial's class: float32
            return d

    return [LabelToRegionsd(keys=keys)]


def transforms(monai, chain, reader=None):
    """MONAI dictionary transforms for a medfast chain (a list of {"name": ..., arguments});
    `reader`: the ImageReader its LoadImage uses (default: MONAI's own choice, nibabel for NIfTI)."""
    mt = monai.transforms
    out = []
    for item in chain:
        args = dict(item)
        name = args.pop("name")
        if name == "LoadImage":
            out += _load_image(mt, args, reader)
        elif name == "CropForeground":
            out += _crop_foreground(mt, args)
        elif name == "LabelToRegions":
            out += _label_to_regions(monai, args)
        else:
            out.append(getattr(mt, name + "d")(**_tuples(args)))
    return out


def version(monai):
    import torch
    where = os.path.dirname(os.path.dirname(monai.__file__))
    return f"MONAI {monai.__version__} (torch {torch.__version__}) from {where}"
