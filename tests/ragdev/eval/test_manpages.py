"""Man-page known-item benchmark: roff to text, page selection, pinning and loading."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from ragcore.quality.dataset import QueryKind
from ragcore.quality.errors import EvalDataError
from ragdev.eval import MANPAGES_PIN_PATH
from ragdev.eval.manpages import (
    DEFAULT_MAN_DIR,
    TENANT,
    Selection,
    build_pin,
    load_pinned,
    page_family,
    parse_page,
    read_pin,
    split_args,
    unescape,
    write_pin,
)

pytestmark = pytest.mark.unit

FILLER = " ".join(f"word{i}" for i in range(60))  # a body comfortably over 50 words


def man_page(name: str, description: str, body: str = FILLER) -> str:
    return (
        f'.\\" generated for a test\n.TH {name.upper()} 1 "2024" "t 1.0"\n'
        f".SH NAME\n{name} \\- {description}\n"
        f".SH SYNOPSIS\n.B {name}\n[\\fIOPTION\\fR]...\n"
        f".SH DESCRIPTION\n{body}\n"
    )


def write_page(directory: Path, file: str, source: str) -> Path:
    path = directory / file
    data = source.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if file.endswith(".gz") else data)
    return path


# --- roff to text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("roff", "text"),
    [
        (r"\fBbold\fR and \fIitalic\fP \f(CWmono\f[] \f[B]x\fR", "bold and italic mono x"),
        (r"a\-b \(em c \[em] d \(en e", "a-b \u2014 c \u2014 d \u2013 e"),
        (
            r"\(lqquoted\(rq \*(lqq\*(rq \(aqx\(aq \(dqy\(dq",
            "\u201cquoted\u201d \u201cq\u201d 'x' \"y\"",
        ),
        (r"\&.dot \e back \\ slash", ".dot \\ back \\ slash"),
        (r"non\~breaking\ space \0zero", "non breaking space  zero"),
        (r"\s-1SMALL\s0 \s+2big\s0 \s(12x", "SMALL big x"),
        (r"text \" a comment", "text "),
        (r"caf\['e] na\[:i]ve \[u00E9]t\[char233]", "caf\u00e9 na\u00efve \u00e9t\u00e9"),
        (r"\h'2m'x\v'-1'y\w'abc'z \N'65'", "xyz A"),
        (r"\n(.Hnum\n[reg] \*(C`code\*(C'", "num 'code'"),
    ],
)
def test_unescape(roff: str, text: str) -> None:
    assert unescape(roff) == text


def test_split_args() -> None:
    assert split_args('one "two words"  three "" "say ""hi"""') == [
        "one",
        "two words",
        "three",
        "",  # an empty quoted argument
        'say "hi"',  # "" inside quotes is a literal quote
    ]


def test_parse_man_page() -> None:
    source = "\n".join(
        [
            '.\\" comment line',
            ".de Vb",
            ".ft CW",
            ".nf",
            "..",
            ".ie n \\{\\",
            '.ds L" hidden',
            "'br\\}",
            ".el\\{\\",
            '.ds R" hidden',
            "'br\\}",
            ".if n .ad l",
            '.TH "TOOL" 1',
            '.SH "NAME"',
            "tool, tool2 \\- convert \\fBwidgets\\fR into",
            "gadgets",
            ".SH SYNOPSIS",
            ".B tool",
            ".RB [ \\-v ]",
            ".IR file ...",
            ".SH DESCRIPTION",
            "First line",
            "continues here.",
            ".PP",
            "Second paragraph.",
            ".TP",
            '.BI \\-o " out"',
            "write to",
            ".I out",
            ".IP \\(bu 2",
            "a bullet",
            ".nf",
            "line one",
            "line two",
            ".fi",
            '.SS "Sub section"',
            "Text after it with a \\(em dash.",
        ]
    )
    page = parse_page(source)
    assert page.description == "convert widgets into gadgets"
    assert page.redirect is None
    assert page.body.split("\n") == [
        "SYNOPSIS",
        "tool [-v] file...",
        "DESCRIPTION",
        "First line continues here.",
        "Second paragraph.",
        "-o out write to out",
        "\u2022 a bullet",
        "line one",
        "line two",
        "Sub section",
        "Text after it with a \u2014 dash.",
    ]
    assert "hidden" not in page.body and "NAME" not in page.body
    assert page.body_words == len(page.body.split())


def test_parse_mdoc_page() -> None:
    source = "\n".join(
        [
            ".Dd $Mdocdate: May 1 2024 $",
            ".Dt FROB 1",
            ".Os",
            ".Sh NAME",
            ".Nm frob",
            ".Nd frobnicate files on",
            ".Ux",
            ".Sh SYNOPSIS",
            ".Nm",
            ".Op Fl v",
            ".Ar file",
            ".Sh DESCRIPTION",
            "The",
            ".Nm",
            "utility reads",
            ".Pa /etc/frob.conf .",
            "See",
            ".Xr ssh 1 .",
        ]
    )
    page = parse_page(source)
    assert page.description == "frobnicate files on"
    assert "frob -v" in page.body
    assert "The frob utility reads /etc/frob.conf ." in page.body
    assert "See ssh 1 ." in page.body


def test_redirect_and_name_separator_rules() -> None:
    assert parse_page(".so man1/other.1\n").redirect == "man1/other.1"
    # The separator is the first free-standing dash, not one inside the command name.
    page = parse_page(".SH NAME\ncmd add\\-iam\\-binding \\- add an IAM binding\n.SH X\nbody\n")
    assert page.description == "add an IAM binding"
    assert parse_page(".SH NAME\nplain - a plain dash\n").description == "a plain dash"
    assert parse_page(".SH NAME\nnodash here\n.SH D\nbody\n").description is None


# --- building and loading a pin ----------------------------------------------------------------


@pytest.fixture
def man_dir(tmp_path: Path) -> Path:
    d = tmp_path / "man1"
    d.mkdir()
    write_page(d, "alpha.1.gz", man_page("alpha", "compute the first letter of things"))
    write_page(d, "beta.1", man_page("beta", "print the second letter quickly"))  # not gzipped
    write_page(d, "gamma.1.gz", man_page("gamma", "draw a gamma ray burst diagram"))
    write_page(d, "git-one.1.gz", man_page("git-one", "do the first git thing"))
    write_page(d, "git-two.1.gz", man_page("git-two", "do the second git thing"))
    os.symlink("alpha.1.gz", d / "alpha-alias.1.gz")  # alias of a page of the directory
    write_page(d, "copy.1.gz", man_page("alpha", "compute the first letter of things"))
    write_page(d, "redirect.1.gz", ".so man1/alpha.1\n")
    write_page(d, "empty.1.gz", ".TH E 1\n.SH NAME\nempty \\- a page without any body\n")
    write_page(d, "dup-a.1.gz", man_page("dup-a", "Show the Same   description"))
    write_page(d, "dup-b.1.gz", man_page("dup-b", "show the same description"))
    write_page(d, "short-desc.1.gz", man_page("short-desc", "two words"))
    write_page(d, "short-body.1.gz", man_page("short-body", "has a short body text", "tiny"))
    write_page(d, "noname.1.gz", ".TH N 1\n.SH DESCRIPTION\n" + FILLER + "\n")
    return d


def test_build_pin_applies_every_rule(man_dir: Path) -> None:
    pin = build_pin(man_dir, Selection(max_pages=10, max_per_family=1))
    files = [p.file for p in pin.pages]
    # One of the two git-* pages survives the family cap; which one depends on sha256(name).
    assert [f for f in files if not f.startswith("git-")] == ["alpha.1.gz", "beta.1", "gamma.1.gz"]
    assert sum(f.startswith("git-") for f in files) == 1
    assert files == sorted(files)
    stats = pin.stats
    assert stats["files"] == 14
    assert stats["aliases"] == 1
    assert stats["duplicate_content"] == 1  # copy.1.gz has alpha's bytes
    assert stats["redirects"] == 1
    assert stats["empty_body"] == 1
    assert stats["no_description"] == 1
    assert stats["colliding_descriptions"] == 2  # both dup-a and dup-b are dropped
    assert stats["description_length_filtered"] == 1
    assert stats["short_body_filtered"] == 1
    assert stats["family_cap_filtered"] == 1
    assert stats["pinned"] == 4
    # Deterministic: the same directory gives the same pin.
    assert build_pin(man_dir, Selection(max_pages=10, max_per_family=1)) == pin
    # max_pages keeps the first pages in sha256(name) order, independent of the name order.
    assert len(build_pin(man_dir, Selection(max_pages=2)).pages) == 2


def test_load_pinned_counts_absent_and_changed_pages(man_dir: Path, tmp_path: Path) -> None:
    pin_path = tmp_path / "pin.json"
    write_pin(build_pin(man_dir), pin_path)
    assert read_pin(pin_path).pages == build_pin(man_dir).pages
    full = load_pinned(pin_path, man_dir)
    assert full.evalset is not None and full.skipped_reason is None
    assert full.loaded == full.pinned == 5
    s = full.evalset
    assert {e.tenant for e in s.entities} == {TENANT}
    alpha = s.entity("alpha.1")
    assert "compute the first letter" not in alpha.content  # NAME is not in the document
    assert alpha.content.startswith("SYNOPSIS\nalpha [OPTION]...")
    q = next(q for q in s.queries if q.query_id == "alpha.1")
    assert (q.text, q.relevant, q.kind) == (
        "compute the first letter of things",
        {"alpha.1": 1},
        QueryKind.KNOWN_ITEM,
    )
    assert s.version == f"pin-{full.pin_digest[:12]}"

    (man_dir / "gamma.1.gz").unlink()
    write_page(man_dir, "beta.1", man_page("beta", "print the second letter slowly"))
    partial = load_pinned(pin_path, man_dir)
    assert partial.missing == ("gamma.1.gz",)
    assert partial.changed == ("beta.1",)
    assert partial.loaded == 3
    assert "3 of 5 pinned pages loaded (1 absent, 1 changed" in partial.summary()


def test_absent_directory_or_pages_skip_with_a_reason(man_dir: Path, tmp_path: Path) -> None:
    pin_path = tmp_path / "pin.json"
    write_pin(build_pin(man_dir), pin_path)
    absent = load_pinned(pin_path, tmp_path / "nowhere")
    assert absent.evalset is None
    assert absent.skipped_reason is not None and "does not exist" in absent.skipped_reason
    assert absent.summary().startswith("man-page benchmark skipped:")
    empty = tmp_path / "empty"
    empty.mkdir()
    none = load_pinned(pin_path, empty)
    assert none.evalset is None and len(none.missing) == 5
    assert none.skipped_reason is not None and "none of the 5 pinned pages" in none.skipped_reason
    with pytest.raises(EvalDataError, match="does not exist"):
        build_pin(tmp_path / "nowhere")


def test_malformed_pin_files_are_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "pin.json"
    for text, message in (
        ("{", "cannot read pin"),
        ('{"format": 99}', "unsupported format"),
        ('{"format": 1, "source_dir": "/x", "selection": {}, "pages": [{"file": "a"}]}', "sha256"),
        (
            '{"format": 1, "source_dir": "/x", "selection": {}, "pages": '
            '[{"file": "b", "sha256": "'
            + "0" * 64
            + '"}, {"file": "a", "sha256": "'
            + "0" * 64
            + '"}]}',
            "unique and sorted",
        ),
        (
            '{"format": 1, "source_dir": "/x", "selection": {}, "pages": '
            '[{"file": "a", "sha256": "xyz"}]}',
            "malformed sha256",
        ),
    ):
        bad.write_text(text)
        with pytest.raises(EvalDataError, match=message):
            read_pin(bad)


def test_page_family() -> None:
    assert page_family("git-commit.1.gz") == "git"
    assert page_family("gcloud_alpha_run.1.gz") == "gcloud"
    assert page_family("ls.1.gz") == "ls"


# --- the committed pin -------------------------------------------------------------------------


def test_committed_pin_is_well_formed() -> None:
    pin = read_pin(MANPAGES_PIN_PATH)
    assert pin.source_dir == str(DEFAULT_MAN_DIR)
    assert 1000 <= len(pin.pages) <= pin.selection.max_pages
    assert pin.stats["pinned"] == len(pin.pages)
    families: dict[str, int] = {}
    for page in pin.pages:
        families[page_family(page.file)] = families.get(page_family(page.file), 0) + 1
    assert max(families.values()) <= pin.selection.max_per_family
