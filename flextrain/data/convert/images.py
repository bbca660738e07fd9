"""Image folders (torchvision's ImageFolder layout) as a ``flextrain data convert`` source.

``ROOT/<class>/**/<image>``: one sub-folder per class; label ``i`` is the
``i``-th class in sorted sub-folder order (the schema records the names).
Images are taken in sorted path order within each class; files with other
extensions are passed over, as ImageFolder does.

Fields: ``image`` and ``label`` (int64). When every image has the same size,
``image`` holds the decoded pixels, uint8 ``[H, W, 3]`` (converted to RGB,
as ImageFolder's loader does); otherwise the image file's own bytes
(dtype ``bytes``), to be decoded by the model's ``feed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from flextrain.data.convert.base import Source
from flextrain.data.errors import DataError
from flextrain.data.rows import Field

__all__ = ["IMAGE_EXTENSIONS", "ImageSource", "open_images"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


@dataclass(frozen=True)
class ImageSource(Source):
    """An image folder: ``images`` are the ``(path, label)`` of its files; ``read`` decodes them."""

    images: tuple[tuple[str, int], ...] = ()

    def read(self, start: int, end: int) -> dict[str, object]:
        """Columns ``image`` and ``label`` of images ``[start, end)``; DataError naming one that cannot be decoded."""
        batch = self.images[start:end]
        labels = np.array([label for _, label in batch], dtype=np.int64)
        if self.fields[0].dtype == "bytes":
            return {"image": [_read_bytes(p) for p, _ in batch], "label": labels}
        shape = self.fields[0].shape
        pixels = np.empty((len(batch), *shape), dtype=np.uint8)
        for i, (path, _) in enumerate(batch):
            pixels[i] = _decode(path, shape)
        return {"image": pixels, "label": labels}


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _decode(path: str, shape: tuple[int, ...]) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            arr = np.asarray(img.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:  # PIL raises these for damaged files
        raise DataError(f"image {path} cannot be decoded: {exc}") from None
    if arr.shape != shape:
        raise DataError(f"image {path} decodes to {list(arr.shape)}, the folder's images are {list(shape)}")
    return arr


def open_images(root: str) -> ImageSource:
    """List the folder and read every image's header (size); DataError naming an image that cannot be opened."""
    from PIL import Image, UnidentifiedImageError

    classes = sorted(n for n in os.listdir(root) if not n.startswith(".") and os.path.isdir(os.path.join(root, n)))
    images: list[tuple[str, int]] = []
    sizes = set()
    for label, name in enumerate(classes):
        found = []
        for folder, dirs, files in os.walk(os.path.join(root, name), followlinks=True):
            dirs.sort()
            found += [os.path.join(folder, f) for f in sorted(files)
                      if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")]
        if not found:
            raise DataError(f"class folder {os.path.join(root, name)} holds no images "
                            f"({', '.join(IMAGE_EXTENSIONS)})")
        for path in found:
            try:
                with Image.open(path) as img:
                    sizes.add(img.size)
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
                raise DataError(f"image {path} cannot be decoded: {exc}") from None
            images.append((path, label))
    if len(sizes) == 1:
        (width, height), = sizes
        image = Field("image", "uint8", (height, width, 3))
    else:
        image = Field("image", "bytes")
    return ImageSource("images", root, (image, Field("label", "int64")), len(images),
                       class_names=tuple(classes), images=tuple(images))
