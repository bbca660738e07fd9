"""A source being converted: its kind, fields and rows (see :mod:`flextrain.data.convert.sources`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flextrain.data.rows import Field

__all__ = ["Source"]


@dataclass(frozen=True)
class Source:
    """A converted source: ``kind`` (one of KINDS), ``path``, the record ``fields`` and ``num_rows``.

    ``columns`` holds the parsed rows of a tabular source (name -> array of shape ``(n, *shape)`` or a
    list); ``class_names`` are an image folder's classes (its :class:`ImageSource` decodes in ``read``).
    """

    kind: str
    path: str
    fields: tuple[Field, ...]
    num_rows: int
    columns: Mapping[str, object] | None = None
    class_names: tuple[str, ...] | None = None

    def read(self, start: int, end: int) -> dict[str, object]:
        """Columns of rows ``[start, end)``."""
        return {name: col[start:end] for name, col in self.columns.items()}
