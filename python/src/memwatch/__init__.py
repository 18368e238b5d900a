"""memwatch from Python.

`memwatch.Client` speaks the daemon's protocol (stdlib only). The integrations import their framework
when they are imported: `memwatch.pytorch` (a DataLoader memwatch can change, torch imported when one
is built), `memwatch.hf` (transformers.Trainer), `memwatch.lightning` and `memwatch.accelerate`.
"""

from ._version import __version__
from .client import Client, Directives, MemwatchError

__all__ = ["Client", "Directives", "MemwatchError", "__version__"]
