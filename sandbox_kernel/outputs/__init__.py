"""Host-side cleaning and size limits for outputs coming from the sandbox.

Outputs are untrusted too (ARCHITECTURE.md, guarantees 7 and 8): every MIME
bundle from the worker goes through :func:`sanitize_bundle` before it reaches
the frontend, and every cell's output through an :class:`OutputLimiter`.
"""

from .limits import MESSAGE_COST, OutputLimiter, bundle_size, format_bytes
from .sanitize import ALLOWED_MIME_TYPES, SanitizedBundle, is_json_mime, sanitize_bundle
from .sizing import json_size

__all__ = [
    "ALLOWED_MIME_TYPES",
    "MESSAGE_COST",
    "OutputLimiter",
    "SanitizedBundle",
    "bundle_size",
    "format_bytes",
    "is_json_mime",
    "json_size",
    "sanitize_bundle",
]
