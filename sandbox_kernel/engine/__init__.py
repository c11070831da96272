"""The engine: sessions, cells, the worker's lifecycle and state carry."""

from .config import EngineConfig
from .session import CommResult, ExecuteResult, SandboxUnavailable, Session

__all__ = ["CommResult", "EngineConfig", "ExecuteResult", "SandboxUnavailable", "Session"]
