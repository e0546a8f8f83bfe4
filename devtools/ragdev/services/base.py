"""What every local service launcher shares: `with Service() as s:` starts it and stops it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class LocalService(ABC):
    """A process this code starts on loopback and stops by pid (tansu, PostgreSQL, Debezium)."""

    @abstractmethod
    def start(self) -> Self:
        """Start the service and wait until it serves; returns the running service."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the service and clean up after it (idempotent)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
