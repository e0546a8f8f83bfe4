"""Secrets out of text people read: URLs without their userinfo, query and fragment, and
libpq `password=` values.

Error messages sent to clients, DLQ headers and log lines name URLs: a document's reference
(`https://user:secret@host/...`, a presigned `?X-Amz-Signature=...`), a DSN
(`postgresql://user:pass@host/db`). `redact_url` keeps what says where (scheme, host, port,
path) and drops what may grant access, marking each dropped part with `…`; `redact_text` does
that to every URL it finds in free text, and to the value of each `password=` pair of a libpq
connection string. Both are linear in the text's length (their patterns start a match only at
the start of a run and never backtrack), so they can run on any text a row or a request holds.
"""

from __future__ import annotations

import re

#: What replaces a dropped part.
DROPPED = "…"

# A run of scheme characters ending in `://`, taken whole (possessive) and tried only where a
# run starts (the characters before the first letter are not part of the scheme); the URL runs
# to the next blank: userinfo may hold quotes (RFC 3986 sub-delims), never a blank.
_URL = re.compile(r"(?<![A-Za-z0-9+.\-])([A-Za-z0-9+.\-]*+)://(\S*+)")
# libpq's key/value form: `password=secret`, `password = 'it''s'`, `sslpassword=...`
_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9_])((?:ssl)?password\s*+=\s*+)('(?:[^'\\\n]|\\.)*+'?|[^\s']*+)",
    re.IGNORECASE | re.ASCII,  # ASCII case folding: no `ſ` standing in for an `s`
)


def redact_url(url: str) -> str:
    """`url` with its userinfo, query and fragment replaced by `…`: `https://…@host:8443/a/b?…#…`.

    Never raises: anything that is not a well-formed URL is split the same way (an authority
    runs from `://` to the next `/`, its userinfo to the last `@` in it; the query from the
    first `?`, the fragment from the first `#`). Every `://` before the query starts an
    authority, so a URL nested in another's path loses its userinfo too.
    """
    cut = len(url)
    for mark in "?#":
        at = url.find(mark)
        if 0 <= at < cut:
            cut = at
    head, tail = url[:cut], url[cut:]
    parts: list[str] = []
    pos = 0
    while (found := head.find("://", pos)) >= 0:
        start = found + 3
        slash = head.find("/", start)
        end = slash if slash >= 0 else len(head)
        at = head.rfind("@", start, end)
        if at >= 0:
            parts += [head[pos:start], DROPPED, "@", head[at + 1 : end]]
        else:
            parts.append(head[pos:end])
        pos = end
    parts.append(head[pos:])
    head = "".join(parts)
    if not tail:
        return head
    query = tail.startswith("?")
    fragment = "#" in tail
    return head + ("?" + DROPPED if query else "") + ("#" + DROPPED if fragment else "")


def redact_text(text: str) -> str:
    """`text` with every `scheme://...` URL in it passed through `redact_url` and the value of
    every libpq `password=` pair replaced by `…`; text without either is returned unchanged."""
    if "://" in text:
        text = _URL.sub(_redacted_url, text)
    return _PASSWORD.sub(_redacted_password, text)


def _redacted_url(match: re.Match[str]) -> str:
    run, rest = match.group(1), match.group(2)
    # the scheme starts at the run's first letter; what precedes it stays as it was
    first = next((i for i, char in enumerate(run) if char.isascii() and char.isalpha()), len(run))
    return run[:first] + redact_url(f"{run[first:]}://{rest}")


def _redacted_password(match: re.Match[str]) -> str:
    return match.group(1) + DROPPED
