"""URLs and DSNs lose their userinfo, query and fragment, libpq passwords their value; other
text is left alone; all of it in linear time."""

from __future__ import annotations

import string
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ragcore.redact import redact_text, redact_url
from tests.linear_time import assert_linear

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:secret@host:8443/a/b?X-Amz-Signature=abc#frag",
            "https://…@host:8443/a/b?…#…",
        ),
        ("https://files.example.com/p/x.pdf", "https://files.example.com/p/x.pdf"),
        ("https://h/x.pdf?sig=1", "https://h/x.pdf?…"),
        ("https://h/x.pdf#page=2", "https://h/x.pdf#…"),
        ("postgresql://app:hunter2@db:5432/rag", "postgresql://…@db:5432/rag"),
        ("https://a:b@c", "https://…@c"),
        ("https://h/p/https://u:p@x/y", "https://h/p/https://…@x/y"),  # nested in a path
        ("http://[x", "http://[x"),  # malformed: split all the same, never an exception
        ("docs/a.pdf", "docs/a.pdf"),
        ("", ""),
    ],
)
def test_a_url_keeps_where_and_loses_what_grants_access(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_urls_dsns_and_libpq_passwords_in_free_text_are_redacted() -> None:
    text = (
        "GET https://u:pw1@files.example.com/x.pdf?X-Amz-Signature=sig1 failed; "
        "sor: postgresql://app:pw2@db/rag?sslmode=require unreachable "
        "(host=db user=app password=pw3 dbname=rag, sslpassword='pw 4', PASSWORD = pw5)"
    )
    redacted = redact_text(text)
    assert redacted == (
        "GET https://…@files.example.com/x.pdf?… failed; "
        "sor: postgresql://…@db/rag?… unreachable "
        "(host=db user=app password=… dbname=rag, sslpassword=…, PASSWORD = …"  # to the blank
    )


# RFC 3986: userinfo is unreserved, percent-encoded or sub-delims (and ':'); the secrets are
# upper case and digits, the hosts and paths lower case, so a kept part never contains one.
_SECRET = st.text(alphabet=string.ascii_uppercase + string.digits, min_size=6, max_size=20)
_USER = st.text(alphabet=string.ascii_lowercase + "-._~!$&'()*+,;=%", max_size=10)
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5}){0,2}", fullmatch=True)
_PATH = st.from_regex(r"(/[a-z0-9._~-]{0,8}){0,4}", fullmatch=True)
_SCHEME = st.sampled_from(["http", "https", "postgresql", "postgres", "s3", "git+ssh", "x.y-z"])


@st.composite
def _urls_with_secrets(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """(url, host, secrets): userinfo with a password, maybe a query value and a fragment."""
    host = draw(_HOST)
    port = draw(st.one_of(st.none(), st.integers(1, 65535)))
    password, query, fragment = draw(_SECRET), draw(_MAYBE_SECRET), draw(_MAYBE_SECRET)
    url = f"{draw(_SCHEME)}://{draw(_USER)}:{password}@{host}"
    url += (f":{port}" if port else "") + draw(_PATH)
    url += f"?token={query}" if query is not None else ""
    url += f"#{fragment}" if fragment is not None else ""
    return url, host, [s for s in (password, query, fragment) if s is not None]


_MAYBE_SECRET = st.one_of(st.none(), _SECRET)


@settings(max_examples=500, deadline=None)
@given(case=_urls_with_secrets(), before=st.text(max_size=30), after=st.text(max_size=30))
def test_no_secret_of_a_url_survives_in_any_surrounding_text(
    case: tuple[str, str, list[str]], before: str, after: str
) -> None:
    url, host, secrets = case
    assume(not any(s in before + after for s in secrets))
    redacted = redact_text(before + url + after)
    assert not [s for s in secrets if s in redacted], redacted
    if not after or after[0].isspace():
        # where the URL visibly ends its host is kept (text running on, e.g. `...@a@`, may
        # make the host part of what is dropped: more is hidden, never less)
        assert host in redacted
    assert not [s for s in secrets if s in redact_url(url)]


@settings(max_examples=500, deadline=None)
@given(text=st.text())
def test_text_without_urls_or_passwords_is_unchanged(text: str) -> None:
    assume("://" not in text and "password" not in text.lower())
    assert redact_text(text) == text


_PIECES = [
    "a", "a.", "a-", "a+", "1", "://", "a://", "a://@", "a://u:p@h/", "@", "?", "#", "/",
    "https://", "h://a@", "password", "password=", "password='", "password=\\", "password ",
    "sslpassword=x ", "ſ", "'",
]  # fmt: skip


def _repeat(piece: str) -> Callable[[int], str]:
    return lambda n: piece * n


@pytest.mark.parametrize("piece", _PIECES, ids=repr)
def test_redaction_is_linear(piece: str) -> None:
    assert_linear(redact_text, _repeat(piece))
    assert_linear(redact_url, _repeat(piece))


def test_redaction_is_linear_on_long_runs_around_a_url() -> None:
    assert_linear(redact_text, lambda n: "a" * n + "://" + "b" * n)
    assert_linear(redact_text, lambda n: "password" + " " * n + "x")
    assert_linear(redact_text, lambda n: "password='" + "a\\'" * n)
