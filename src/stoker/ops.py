"""The stock augmentation ops for ``augment=[...]``: each is ``(image, rng) -> image``."""

from .transforms import CenterCrop, ColorJitter, HorizontalFlip, RandomResizedCrop, Resize

__all__ = ["CenterCrop", "ColorJitter", "HorizontalFlip", "RandomResizedCrop", "Resize"]
