"""Which SoR tables Retrieve cannot verify, watched on the health-check schedule.

A mapped table whose column was renamed or dropped (or that vanished) makes every hit of it
unverifiable. Per query that is only an exclusion; this watch makes it an operator signal: the
gauge `ragstream_retrieve_sor_table_unreadable{table}`, one log line when a table becomes
unreadable and one when it is readable again, and a gRPC health status per table
(`sor:<schema.table>`: NOT_SERVING while unreadable). The service itself stays SERVING: the
other tables still answer.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import Gauge

from ragcore.sor.base import SystemOfRecord, TableProbe

log = logging.getLogger(__name__)

#: gRPC health service name of one SoR table.
HEALTH_PREFIX = "sor:"


class SorTableWatch:
    """Probes every mapped table of the SoR reader and reports the unreadable ones."""

    def __init__(self, sor: SystemOfRecord, gauge: Gauge) -> None:
        """`gauge`: `RetrieveMetrics.sor_table_unreadable`."""
        self._probe = sor if isinstance(sor, TableProbe) else None
        self._tables = [m.table for m in sor.catalog]
        self._unreadable: dict[str, str] = {}
        self._lock = threading.Lock()
        self.gauge = gauge
        for table in self._tables:
            self.gauge.labels(table).set(0)

    def check(self) -> dict[str, bool]:
        """Probe now; health service name -> readable. Raises `SorUnavailableError` when the
        SoR is unreachable (the whole service is then NOT_SERVING)."""
        if self._probe is None:
            return {}
        found = self._probe.probe_tables()
        with self._lock:
            for table in self._tables:
                error = found.get(table)
                was = self._unreadable.get(table)
                if error is not None and was is None:
                    log.error(
                        "SoR table %s cannot be read: its hits are excluded as unverifiable "
                        "until the schema or the table mapping is fixed: %s",
                        table,
                        error,
                    )
                elif error is None and was is not None:
                    log.info("SoR table %s is readable again", table)
                if error is None:
                    self._unreadable.pop(table, None)
                else:
                    self._unreadable[table] = error
                self.gauge.labels(table).set(0 if error is None else 1)
            return {HEALTH_PREFIX + t: t not in self._unreadable for t in self._tables}

    def unreadable(self) -> dict[str, str]:
        """The tables found unreadable by the last check, with the error."""
        with self._lock:
            return dict(self._unreadable)
