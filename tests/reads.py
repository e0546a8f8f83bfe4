"""What a test may read: the checkout, temp dirs, the caches the tests create, installed software.

A clone anywhere must pass its tests, so no test may depend on data beside the checkout or at a
path of one particular machine. `ReadAudit` is a `sys.addaudithook` hook on the `open` event:
while it is armed (the call of every test not marked `external`, see tests/conftest.py) each
file opened outside `allowed_roots()` is recorded, and the test fails naming it.
tests/test_self_contained.py checks the rule statically as well.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The operating system and installed software (read by libraries, never test data).
SYSTEM_ROOTS = ("/usr", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev", "/run", "/opt")


def allowed_roots() -> tuple[str, ...]:
    """Directories a test may read below: the checkout, the temp dir, the caches the tests
    create ($RAGSTREAM_CACHE_DIR or ~/.cache/ragstream), the interpreter and its packages, the
    operating system."""
    cache = os.environ.get("RAGSTREAM_CACHE_DIR") or str(Path.home() / ".cache" / "ragstream")
    roots: list[str] = [
        str(REPO_ROOT),
        tempfile.gettempdir(),
        cache,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *site.getsitepackages(),
        *(p for p in sysconfig.get_paths().values()),
        *SYSTEM_ROOTS,
    ]
    return tuple(sorted({os.path.abspath(r) for r in roots}))


def is_outside(path: str, roots: Sequence[str]) -> bool:
    """Whether `path` (absolute or relative to the working directory) lies below none of
    `roots`."""
    absolute = os.path.abspath(path)
    return not any(absolute == r or absolute.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class ReadAudit:
    """Records the files opened outside the allowed roots while armed (any thread)."""

    def __init__(self, roots: Iterable[str] | None = None) -> None:
        """`roots`: where reads are allowed (default `allowed_roots()`)."""
        self.roots = tuple(roots) if roots is not None else allowed_roots()
        self.armed = False
        self.outside: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, args: tuple[object, ...]) -> None:
        """The audit hook: on `open` of a path while armed, record it when it is outside."""
        if event != "open" or not self.armed:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, str) and is_outside(path, self.roots):
            with self._lock:
                self.outside.append(path)

    def arm(self) -> None:
        """Start recording (and forget earlier records)."""
        with self._lock:
            self.outside = []
        self.armed = True

    def disarm(self) -> list[str]:
        """Stop recording; the paths opened outside since `arm`."""
        self.armed = False
        with self._lock:
            found, self.outside = sorted(set(self.outside)), []
        return found


#: The one hook of the test session (audit hooks cannot be removed, so it is installed once).
AUDIT = ReadAudit()
