"""Public readers, at the reference project's module path (`zephyr.readers`).

The implementations live by layer: format detection in `zephyr.io.formats`, a shard's
reading of a load op in `zephyr.execution.loaders`.
"""

from zephyr.io.formats import FileFormat, format_for

__all__ = ["FileFormat", "format_for"]
