"""The one MLflow adapter of the platform (moving into a package: see ``_store``)."""

from tasks.tracking._store import *  # noqa: F403
from tasks.tracking._store import __all__ as __all__
from tasks.tracking._store import _owner_gone as _owner_gone
