"""The engine: sessions, cells, the worker's lifecycle and state carry."""

from .config import EngineConfig
from .session import ExecuteResult, SandboxUnavailable, Session

__all__ = ["EngineConfig", "ExecuteResult", "SandboxUnavailable", "Session"]
