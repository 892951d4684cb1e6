"""The stock augmentation ops for ``augment=[...]``: each is ``(image, rng) -> image``.

ColorJitter, RandomErasing, TrivialAugmentWide and RandAugment follow torchvision's definitions
(see docs/augment-ops.md); they also run on the fused pipeline's output, after its name:
``augment=["train", stoker.ops.TrivialAugmentWide()]``.
"""

from .autoaugment import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide
from .transforms import CenterCrop, HorizontalFlip, RandomResizedCrop, Resize

__all__ = [
    "CenterCrop",
    "ColorJitter",
    "HorizontalFlip",
    "RandAugment",
    "RandomErasing",
    "RandomResizedCrop",
    "Resize",
    "TrivialAugmentWide",
]
