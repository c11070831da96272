"""Host-side privacy model: the one-way private-data ratchet of a session.

``Sensitivity`` levels, ``Dataset`` records, the immutable ``PrivacyState``,
the on-disk ``PrivacyStore`` (one JSON file per session, raise-only, fails
closed) and the seeds' ``PrivateData`` / ``get_network_mode`` API.
Standard library only (plus ``jupyter_core`` for the default data dir).
"""

from .identity import default_user_id, session_id_for_notebook, validate_id
from .modes import NetworkMode
from .private_data import PrivateData, get_network_mode, session_has_private_data
from .records import SOURCES, Dataset, SessionMark
from .schema import SchemaError
from .sensitivity import Sensitivity
from .state import MAX_DATASETS, PrivacyState, merge
from .store import (
    MAX_FILE_BYTES,
    PrivacyStore,
    PrivacyStoreError,
    default_data_dir,
    default_store,
)

__all__ = [
    "MAX_DATASETS",
    "MAX_FILE_BYTES",
    "SOURCES",
    "Dataset",
    "NetworkMode",
    "PrivacyState",
    "PrivacyStore",
    "PrivacyStoreError",
    "PrivateData",
    "SchemaError",
    "Sensitivity",
    "SessionMark",
    "default_data_dir",
    "default_store",
    "default_user_id",
    "get_network_mode",
    "merge",
    "session_has_private_data",
    "session_id_for_notebook",
    "validate_id",
]
