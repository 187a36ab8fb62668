"""The text view of a partition: one line per record, and the byte position <-> offset mapping.

Free of FUSE and trio, like the engine it reads. See :mod:`logfs.view.text`.
"""

from ..storage.format.lines import LineFormat
from .text import SegmentView, live_view

__all__ = ["LineFormat", "SegmentView", "live_view"]
