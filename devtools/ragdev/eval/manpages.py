"""A known-item benchmark from the manual pages in `/usr/share/man/man1` (real text, not ours).

For each page, the one-line NAME description ("ls \\- list directory contents") is the query and
the page body *without* its NAME section is the document; the page is the only relevant entity
(entity id = query id = the file name without `.gz`, e.g. `ls.1`; tenant `manpages`).

Building the page list (`build_pin`), in this order:
1. symlinks whose target is another file of the directory are aliases and skipped; files with
   identical bytes keep only their first name;
2. `.so` redirect pages, pages without a NAME description and pages with an empty body are
   skipped;
3. pages whose descriptions collide (case- and whitespace-insensitive) are ALL dropped: their
   query would have several right answers;
4. filters: description of 3..20 words, body of 50..5000 words (the longest pages would
   hold half of all text, so half the embedding time, for a few queries);
5. selection: the first `max_pages` in order of sha256(file name) — a deterministic sample spread
   over the whole alphabet that changes little when packages come and go — taking at most
   `max_per_family` pages of one family (name up to the first '_', '-' or '.': `gcloud_*`,
   `git-*`), then sorted by name.

The pin file records each selected file name with the sha256 of its bytes. `load_pinned` loads
exactly those pages and skips (and counts) pinned pages that are absent or whose bytes changed,
so two runs on different machines compare the same documents or say how they differ. When the
directory is absent it returns a skip reason instead of an eval set.

roff is converted to plain text here (no groff needed): requests and macro definitions are
dropped, conditional blocks skipped, font/size escapes removed, special characters mapped
(`\\-` -> `-`, `\\(em` -> an em dash ...), text of the man(7) and common mdoc(7) macros kept.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragcore.quality.errors import EvalDataError
from ragdev.eval import MANPAGES_PIN_PATH

log = logging.getLogger(__name__)

DEFAULT_MAN_DIR = Path("/usr/share/man/man1")
TENANT = "manpages"
ENTITY_TYPE = "MANUAL_PAGE"
PIN_FORMAT = 1
DEFAULT_MAX_PAGES = 2000
DEFAULT_MIN_DESCRIPTION_WORDS = 3
DEFAULT_MAX_DESCRIPTION_WORDS = 20
DEFAULT_MIN_BODY_WORDS = 50
# The ~75 longest pages (bash, git-config, rsync, curl ... up to 51k words) would hold half of all
# text, i.e. half the embedding time of every run, for 5% of the queries.
DEFAULT_MAX_BODY_WORDS = 5000
# gcloud alone ships ~16,600 of the ~17,700 pages of a Debian man1 with the Cloud SDK: without
# a cap the benchmark would measure one generated page family.
DEFAULT_MAX_PER_FAMILY = 250

# --- roff escapes ----------------------------------------------------------------------------

#: Special characters `\(xx` / `\[xx]` -> text.
GLYPHS: dict[str, str] = {
    "em": "\u2014",
    "en": "\u2013",
    "hy": "-",
    "mi": "-",
    "bu": "\u2022",
    "aq": "'",
    "dq": '"',
    "lq": "\u201c",
    "rq": "\u201d",
    "oq": "\u2018",
    "cq": "\u2019",
    "Bq": "\u201e",
    "bq": "\u201a",
    "Fo": "\u00ab",
    "Fc": "\u00bb",
    "fo": "\u2039",
    "fc": "\u203a",
    "co": "\u00a9",
    "rg": "\u00ae",
    "tm": "\u2122",
    "mu": "\u00d7",
    "di": "\u00f7",
    "de": "\u00b0",
    "+-": "\u00b1",
    ">=": "\u2265",
    "<=": "\u2264",
    "!=": "\u2260",
    "==": "\u2261",
    "->": "\u2192",
    "<-": "\u2190",
    "<>": "\u2194",
    "rA": "\u21d2",
    "lA": "\u21d0",
    "ua": "\u2191",
    "da": "\u2193",
    "sc": "\u00a7",
    "ps": "\u00b6",
    "ti": "~",
    "ha": "^",
    "ba": "|",
    "br": "|",
    "rs": "\\",
    "sl": "/",
    "at": "@",
    "sh": "#",
    "Do": "$",
    "Eu": "\u20ac",
    "eu": "\u20ac",
    "Po": "\u00a3",
    "ct": "\u00a2",
    "Ye": "\u00a5",
    "aa": "\u00b4",
    "ga": "`",
    "ss": "\u00df",
    "ae": "\u00e6",
    "AE": "\u00c6",
    "o/": "\u00f8",
    "O/": "\u00d8",
    "ul": "_",
    "ru": "_",
    "pl": "+",
    "eq": "=",
    "lh": "\u261c",
    "rh": "\u261e",
    "*a": "\u03b1",
    "*b": "\u03b2",
    "*g": "\u03b3",
    "*d": "\u03b4",
    "*m": "\u03bc",
    "*p": "\u03c0",
    "*l": "\u03bb",
    "*s": "\u03c3",
    "*W": "\u03a9",
    "12": "\u00bd",
    "14": "\u00bc",
    "34": "\u00be",
}
# `\('e`-style accented letters: accent mark -> combining character.
_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    ":": "\u0308",
    "~": "\u0303",
    ",": "\u0327",
}
#: Predefined strings `\*(xx` / `\*[xx]` (pod2man's and groff's usual ones) -> text.
STRINGS: dict[str, str] = {
    "lq": "\u201c",
    "rq": "\u201d",
    'L"': "\u201c",
    'R"': "\u201d",
    "C`": "'",
    "C'": "'",
    "--": "\u2014",
    "PI": "\u03c0",
    "Aq": "'",
    "R": "\u00ae",
    "Tm": "\u2122",
    "C+": "C++",
}
# Escapes followed by a one-char, (xx or [name] argument that print nothing.
_NAMED_ARG_ESCAPES = set("fFgkmMnVY$")
# Escapes followed by a delimited argument ('...') that print nothing we want.
_DELIMITED_ESCAPES = set("hvwoblLDxXRSHABZ")
# Escapes that print nothing.
_SILENT = set("&|^)/,:%cdu{}a!ptrz")
_SPACES = {"~": " ", "0": " ", " ": " ", "_": "_"}


def _glyph(name: str) -> str:
    if name in GLYPHS:
        return GLYPHS[name]
    if len(name) == 2 and name[0] in _ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    code = re.fullmatch(r"u([0-9A-Fa-f]{4,6})(?:_([0-9A-Fa-f]{4,6}))*", name)
    if code:
        return unicodedata.normalize("NFC", "".join(chr(int(p, 16)) for p in name[1:].split("_")))
    if name.startswith("char") and name[4:].isdigit():
        return chr(int(name[4:]))
    return ""


def _read_name(text: str, i: int) -> tuple[str, int]:
    """The escape argument at text[i]: `x`, `(xx` or `[name]`; returns (name, next index)."""
    if i >= len(text):
        return "", i
    if text[i] == "(":
        return text[i + 1 : i + 3], i + 3
    if text[i] == "[":
        end = text.find("]", i + 1)
        if end < 0:
            return text[i + 1 :], len(text)
        return text[i + 1 : end], end + 1
    return text[i], i + 1


def _skip_size(text: str, i: int) -> int:
    # \s0, \s+1, \s-2, \s12, \s(12, \s[...], \s'...'
    if i < len(text) and text[i] in "+-":
        i += 1
    if i < len(text) and text[i] in "(['":
        if text[i] == "(":
            return i + 3
        close = "]" if text[i] == "[" else "'"
        end = text.find(close, i + 1)
        return len(text) if end < 0 else end + 1
    j = i
    while j < len(text) and j < i + 2 and text[j].isdigit():
        j += 1
    return j


def unescape(text: str, strings: dict[str, str] | None = None) -> str:
    """Text of one roff line with escapes resolved (comments `\\"` end the line)."""
    table = STRINGS if strings is None else {**STRINGS, **strings}
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= n:  # a trailing backslash continues the line
            break
        esc = text[i + 1]
        i += 2
        if esc in '"#':
            break
        if esc in "\\eE":
            out.append("\\")
        elif esc == "-":
            out.append("-")
        elif esc in "'`.":
            out.append("'" if esc == "'" else esc)
        elif esc in _SPACES:
            out.append(_SPACES[esc])
        elif esc in _SILENT:
            pass
        elif esc in "([":
            name, i = _read_name(text, i - 1)
            out.append(_glyph(name))
        elif esc == "*":
            name, i = _read_name(text, i)
            out.append(table.get(name.split(" ")[0], ""))
        elif esc == "s":
            i = _skip_size(text, i)
        elif esc in _NAMED_ARG_ESCAPES:
            if esc == "n" and i < n and text[i] in "+-":
                i += 1
            _, i = _read_name(text, i)
        elif esc in _DELIMITED_ESCAPES or esc in "NC":
            if i < n:
                delim = text[i]
                end = text.find(delim, i + 1)
                end = n if end < 0 else end
                arg = text[i + 1 : end]
                i = end + 1
                if esc == "N" and arg.isdigit():
                    out.append(chr(int(arg)))
                elif esc == "C":
                    out.append(_glyph(arg))
        else:
            out.append(esc)
    return "".join(out)


# --- roff lines ------------------------------------------------------------------------------

_REQUEST = re.compile(r"^[.'][ \t]*(?P<name>\S*)(?:[ \t]+(?P<args>.*))?$")
# Requests and macros whose arguments are text to keep.
_TEXT_MACROS = {"B", "I", "SM", "SB", "SH", "SS", "IP", "UR", "MT", "SY", "OP", "TQ"}
_ALTERNATING = {"BR", "BI", "IB", "IR", "RB", "RI"}
_NO_FILL_ON = {"nf", "EX", "Vb", "Bd"}
_NO_FILL_OFF = {"fi", "EE", "Ve", "Ed"}
_BREAKS = {"PP", "LP", "P", "TP", "HP", "sp", "br", "Sp", "Pp", "Lp", "It", "SH", "SS", "Sh", "Ss"}
_DEFINITIONS = {"de", "de1", "am", "am1", "ig", "dei", "ami"}
_CONDITIONALS = {"if", "ie", "el", "while"}
# mdoc macros: `Fl` prefixes a dash; these are dropped as words inside mdoc lines.
_MDOC_CALLABLE = {
    "Ac", "Ao", "Ad", "An", "Aq", "Ar", "At", "Bc", "Bo", "Bq", "Brc", "Bro", "Brq", "Bsx",
    "Bx", "Cd", "Cm", "D1", "Dc", "Dl", "Do", "Dq", "Dv", "Ec", "Em", "En", "Eo", "Er", "Es",
    "Ev", "Fa", "Fc", "Fl", "Fn", "Fo", "Fr", "Ft", "Fx", "Ic", "In", "It", "Li", "Lk", "Ms",
    "Mt", "Nd", "Nm", "No", "Ns", "Nx", "Oc", "Oo", "Op", "Ot", "Ox", "Pa", "Pc", "Pf", "Po",
    "Pq", "Qc", "Ql", "Qo", "Qq", "Sc", "So", "Sq", "St", "Sx", "Sy", "Ta", "Tn", "Ux", "Va",
    "Vt", "Xc", "Xo", "Xr", "Sh", "Ss",
}  # fmt: skip


def split_args(args: str) -> list[str]:
    """roff macro arguments: blank-separated, `"double quoted"` with `""` for a quote."""
    out: list[str] = []
    i, n = 0, len(args)
    while i < n:
        if args[i] in " \t":
            i += 1
            continue
        if args[i] == '"':
            i += 1
            buf: list[str] = []
            while i < n:
                if args[i] == '"':
                    if i + 1 < n and args[i + 1] == '"':
                        buf.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                buf.append(args[i])
                i += 1
            out.append("".join(buf))
        else:
            j = i
            while j < n and args[j] not in " \t":
                j += 1
            out.append(args[i:j])
            i = j
    return out


_MDOC_WORDS = {"Ux": "UNIX", "Bx": "BSD", "Ox": "OpenBSD", "Nx": "NetBSD", "Fx": "FreeBSD"}


def _mdoc_text(args: list[str], page_name: str) -> str:
    words: list[str] = []
    dash = False
    for i, arg in enumerate(args):
        if arg in _MDOC_WORDS:
            words.append(_MDOC_WORDS[arg])
            continue
        if arg == "Nm" and (i + 1 == len(args) or args[i + 1] in _MDOC_CALLABLE):
            words.append(page_name)  # a bare `Nm` repeats the page's name
            continue
        if arg in _MDOC_CALLABLE:
            dash = arg == "Fl"
            continue
        words.append(("-" if dash else "") + arg)
        dash = False
    return " ".join(words)


@dataclass(frozen=True)
class ParsedPage:
    """What `parse_page` found in one man page."""

    description: str | None  # the NAME line after "\\-" (or mdoc `.Nd`), plain text
    body: str  # every section but NAME, plain text, one paragraph a line
    redirect: str | None = None  # the target of a `.so` page

    @property
    def body_words(self) -> int:
        """Whitespace-separated words of the body."""
        return len(self.body.split())


class _Converter:
    """Line-by-line roff -> text, keeping the NAME section apart."""

    def __init__(self) -> None:
        self.paragraphs: list[str] = []
        self.current: list[str] = []
        self.section = ""
        self.no_fill = False
        self.name_raw: list[str] = []  # raw text of the NAME section (before unescaping)
        self.mdoc_description: str | None = None
        self.mdoc_name = ""
        self.strings: dict[str, str] = {}

    def flush(self) -> None:
        text = " ".join(" ".join(self.current).split())
        if text and self.section != "NAME":
            self.paragraphs.append(text)
        self.current = []

    def emit(self, text: str) -> None:
        if self.section == "NAME":
            return
        self.current.append(text)
        if self.no_fill:
            self.flush()

    def text_line(self, raw: str) -> None:
        if self.section == "NAME":
            self.name_raw.append(raw)
            return
        if not raw.strip():
            self.flush()  # a blank line is a paragraph break in roff
            return
        self.emit(unescape(raw, self.strings))

    def request(self, name: str, args: str) -> None:
        if name in ("SH", "Sh"):
            self.flush()
            heading = " ".join(unescape(a, self.strings) for a in split_args(args)).strip()
            self.section = heading.upper()
            if self.section != "NAME" and heading:
                self.paragraphs.append(heading)
            return
        if self.section == "NAME":
            if name == "Nd":
                self.mdoc_description = unescape(args, self.strings).strip()
            elif name == "Nm" and not self.mdoc_name:
                self.mdoc_name = " ".join(split_args(args)).rstrip(" ,")
            elif name in _TEXT_MACROS or name in _ALTERNATING:
                self.name_raw.append(" ".join(split_args(args)))
            return
        if name == "ds":
            key, _, value = args.partition(" ")
            self.strings[key] = unescape(value.lstrip('"'), self.strings)
            return
        if name in _NO_FILL_ON:
            self.flush()
            self.no_fill = True
            return
        if name in _NO_FILL_OFF:
            self.flush()
            self.no_fill = False
            return
        if name in _BREAKS or name in ("IP", "TQ"):
            self.flush()
        parts = split_args(args)
        if name in _ALTERNATING:
            self.emit("".join(unescape(p, self.strings) for p in parts))
        elif name == "IP":
            if parts:
                self.emit(unescape(parts[0], self.strings))
        elif name in _TEXT_MACROS and name != "SS":
            self.emit(" ".join(unescape(p, self.strings) for p in parts))
        elif name in _MDOC_CALLABLE and name not in ("Sh", "Ss"):
            self.emit(unescape(_mdoc_text([name, *parts], self.mdoc_name), self.strings))
        elif name in ("SS", "Ss"):  # a subsection heading is a paragraph of its own
            self.emit(" ".join(unescape(p, self.strings) for p in parts))
            self.flush()

    def description(self) -> str | None:
        if self.mdoc_description:
            return self.mdoc_description
        raw = " ".join(self.name_raw)
        # The separator is the first dash that stands alone: names may contain "\-" themselves
        # ("add\-iam\-policy\-binding \- add an IAM policy binding").
        match = _NAME_SEPARATOR.search(raw)
        if match is None:
            return None
        text = " ".join(unescape(raw[match.end() :], self.strings).split())
        return text or None


_NAME_SEPARATOR = re.compile(r"(?<=\S)\s+(?:\\-|\\\(em|\\\(en|-|\u2013|\u2014)+(?:\s+|$)")


def _skip_block(lines: Sequence[str], i: int) -> int:
    """Index after a conditional starting at lines[i] (its `\\{ ... \\}` block, if any)."""
    depth = lines[i].count("\\{") - lines[i].count("\\}")
    i += 1
    while depth > 0 and i < len(lines):
        depth += lines[i].count("\\{") - lines[i].count("\\}")
        i += 1
    return i


def parse_page(source: str) -> ParsedPage:
    """Parse one man page (man(7) or mdoc(7) source) into its description and body text."""
    lines = source.replace("\r\n", "\n").split("\n")
    # Join escaped newlines (a trailing backslash continues the line).
    joined: list[str] = []
    carry = ""
    for line in lines:
        if line.endswith("\\") and not line.endswith("\\\\"):
            carry += line[:-1]
            continue
        joined.append(carry + line)
        carry = ""
    if carry:
        joined.append(carry)
    conv = _Converter()
    i = 0
    while i < len(joined):
        line = joined[i]
        match = _REQUEST.match(line) if line[:1] in (".", "'") else None
        if match is None:
            conv.text_line(line)
            i += 1
            continue
        name = match["name"]
        args = match["args"] or ""
        if name.startswith('\\"') or name in ("", "\\}"):
            i += 1  # comment or empty request
            continue
        if name == "so" and not conv.paragraphs and not conv.section:
            return ParsedPage(description=None, body="", redirect=args.strip())
        bare = name.split("\\", 1)[0]  # ".el\{" has its brace glued to the name
        if bare in _CONDITIONALS:
            i = _skip_block(joined, i)
            continue
        if bare in _DEFINITIONS:
            i += 1
            while i < len(joined) and joined[i].strip() not in ("..", "'.."):
                i += 1
            i += 1
            continue
        conv.request(bare, args)
        i += 1
    conv.flush()
    return ParsedPage(description=conv.description(), body="\n".join(conv.paragraphs))


def read_source(path: Path) -> str:
    """A page's roff source (gunzipped when `.gz`; UTF-8, else Latin-1)."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def page_name(file_name: str) -> str:
    """Entity id of a page file: `ls.1.gz` -> `ls.1`."""
    return file_name.removesuffix(".gz")


def page_family(file_name: str) -> str:
    """The family of a page: its name up to the first '_', '-' or '.' (`git-commit.1` -> git)."""
    return re.split(r"[-_.]", file_name, maxsplit=1)[0]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _description_key(description: str) -> str:
    return " ".join(description.lower().split())


# --- pin -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedPage:
    """A page of the pin: its file name and the sha256 of the file's bytes."""

    file: str
    sha256: str


@dataclass(frozen=True)
class Selection:
    """How the pinned pages were chosen."""

    max_pages: int = DEFAULT_MAX_PAGES
    min_description_words: int = DEFAULT_MIN_DESCRIPTION_WORDS
    max_description_words: int = DEFAULT_MAX_DESCRIPTION_WORDS
    min_body_words: int = DEFAULT_MIN_BODY_WORDS
    max_body_words: int = DEFAULT_MAX_BODY_WORDS
    max_per_family: int = DEFAULT_MAX_PER_FAMILY
    order: str = "sha256(file name)"


@dataclass(frozen=True)
class Pin:
    """The pinned page list (what `manpages.pin.json` holds)."""

    source_dir: str
    selection: Selection
    stats: dict[str, int]
    pages: tuple[PinnedPage, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {
            "format": PIN_FORMAT,
            "source_dir": self.source_dir,
            "selection": asdict(self.selection),
            "stats": dict(self.stats),
            "count": len(self.pages),
            "pages": [asdict(p) for p in self.pages],
        }

    @property
    def digest(self) -> str:
        """sha256 of the page list: names the benchmark version."""
        listing = "\n".join(f"{p.file} {p.sha256}" for p in self.pages)
        return _sha256(listing.encode("utf-8"))


def _candidate_files(man_dir: Path, stats: Counter[str]) -> list[Path]:
    """Files of the directory minus aliases (symlinks to another file of the directory)."""
    root = man_dir.resolve()
    files: list[Path] = []
    for entry in sorted(os.scandir(man_dir), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=True):
            continue
        stats["files"] += 1
        if entry.is_symlink():
            target = path.resolve()
            if not target.is_file():
                stats["broken_links"] += 1
                continue
            if target.parent == root and target.name != entry.name:
                stats["aliases"] += 1
                continue
        files.append(path)
    return files


def build_pin(man_dir: Path | str = DEFAULT_MAN_DIR, selection: Selection | None = None) -> Pin:
    """Scan the directory and select the pages to pin (see the module docstring for the rules).

    EvalDataError when the directory does not exist.
    """
    man_dir = Path(man_dir)
    sel = selection or Selection()
    if not man_dir.is_dir():
        raise EvalDataError(f"man page directory {man_dir} does not exist")
    stats: Counter[str] = Counter()
    seen_bytes: set[str] = set()
    parsed: dict[str, tuple[str, ParsedPage]] = {}  # file -> (sha256, page)
    for path in _candidate_files(man_dir, stats):
        try:
            data = path.read_bytes()
            digest = _sha256(data)
            if digest in seen_bytes:
                stats["duplicate_content"] += 1
                continue
            seen_bytes.add(digest)
            page = parse_page(read_source(path))
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            stats["unreadable"] += 1
            log.warning("skipping unreadable man page %s: %s", path, exc)
            continue
        if page.redirect is not None:
            stats["redirects"] += 1
        elif not page.description:
            stats["no_description"] += 1
        elif page.body_words == 0:
            stats["empty_body"] += 1
        else:
            parsed[path.name] = (digest, page)
    groups: defaultdict[str, list[str]] = defaultdict(list)
    for file, (_, page) in parsed.items():
        groups[_description_key(page.description or "")].append(file)
    eligible: list[str] = []
    for file, (_, page) in parsed.items():
        if len(groups[_description_key(page.description or "")]) > 1:
            stats["colliding_descriptions"] += 1
            continue
        words = len((page.description or "").split())
        if not sel.min_description_words <= words <= sel.max_description_words:
            stats["description_length_filtered"] += 1
        elif page.body_words < sel.min_body_words:
            stats["short_body_filtered"] += 1
        elif page.body_words > sel.max_body_words:
            stats["long_body_filtered"] += 1
        else:
            eligible.append(file)
    stats["eligible"] = len(eligible)
    chosen: list[str] = []
    per_family: Counter[str] = Counter()
    for file in sorted(eligible, key=lambda f: _sha256(f.encode("utf-8"))):
        if len(chosen) >= sel.max_pages:
            break
        family = page_family(file)
        if per_family[family] >= sel.max_per_family:
            stats["family_cap_filtered"] += 1
            continue
        per_family[family] += 1
        chosen.append(file)
    pages = tuple(PinnedPage(file=f, sha256=parsed[f][0]) for f in sorted(chosen))
    stats["pinned"] = len(pages)
    return Pin(
        source_dir=str(man_dir), selection=sel, stats=dict(sorted(stats.items())), pages=pages
    )


def write_pin(pin: Pin, path: Path | str = MANPAGES_PIN_PATH) -> None:
    """Write the pin file (2-space JSON, trailing newline)."""
    Path(path).write_text(json.dumps(pin.to_dict(), indent=2) + "\n", encoding="utf-8")


def read_pin(path: Path | str = MANPAGES_PIN_PATH) -> Pin:
    """Read a pin file; EvalDataError when it is unreadable or malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != PIN_FORMAT:
            raise EvalDataError(f"pin {path}: unsupported format {data.get('format')!r}")
        pages = tuple(
            PinnedPage(file=str(p["file"]), sha256=str(p["sha256"])) for p in data["pages"]
        )
        pin = Pin(
            source_dir=str(data["source_dir"]),
            selection=Selection(**data["selection"]),
            stats={str(k): int(v) for k, v in data.get("stats", {}).items()},
            pages=pages,
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EvalDataError(f"cannot read pin {path}: {exc}") from exc
    names = [p.file for p in pages]
    if names != sorted(set(names)):
        raise EvalDataError(f"pin {path}: page names must be unique and sorted")
    bad = [p.file for p in pages if not re.fullmatch(r"[0-9a-f]{64}", p.sha256)]
    if bad:
        raise EvalDataError(f"pin {path}: malformed sha256 for {bad[:5]}")
    return pin


# --- load ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManpageLoad:
    """The benchmark as loaded on this machine: an eval set, or why there is none."""

    evalset: EvalSet | None
    skipped_reason: str | None
    pinned: int
    loaded: int
    missing: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unparsable: tuple[str, ...] = ()
    pin_digest: str = ""

    def summary(self) -> str:
        """One line for logs and reports."""
        if self.evalset is None:
            return f"man-page benchmark skipped: {self.skipped_reason}"
        return (
            f"man-page benchmark: {self.loaded} of {self.pinned} pinned pages loaded "
            f"({len(self.missing)} absent, {len(self.changed)} changed, "
            f"{len(self.unparsable)} unparsable)"
        )


def load_pinned(
    pin_path: Path | str = MANPAGES_PIN_PATH, man_dir: Path | str | None = None
) -> ManpageLoad:
    """Load exactly the pinned pages from `man_dir` (default: the pin's source directory)."""
    pin = read_pin(pin_path)
    directory = Path(man_dir) if man_dir is not None else Path(pin.source_dir)
    if not directory.is_dir():
        return ManpageLoad(
            evalset=None,
            skipped_reason=f"{directory} does not exist (no man pages installed on this machine)",
            pinned=len(pin.pages),
            loaded=0,
            pin_digest=pin.digest,
        )
    entities: list[EvalEntity] = []
    queries: list[EvalQuery] = []
    missing: list[str] = []
    changed: list[str] = []
    unparsable: list[str] = []
    for pinned in pin.pages:
        path = directory / pinned.file
        try:
            data = path.read_bytes()
        except OSError:  # absent or unreadable: either way not this pinned page
            missing.append(pinned.file)
            continue
        if _sha256(data) != pinned.sha256:
            changed.append(pinned.file)
            continue
        try:
            page = parse_page(read_source(path))
        except (OSError, EOFError, gzip.BadGzipFile):
            unparsable.append(pinned.file)
            continue
        if not page.description or page.body_words == 0:
            unparsable.append(pinned.file)
            continue
        name = page_name(pinned.file)
        entities.append(
            EvalEntity(
                entity_id=name,
                tenant=TENANT,
                entity_type=ENTITY_TYPE,
                title=name,
                content=page.body,
                metadata={"source_file": pinned.file, "sha256": pinned.sha256},
            )
        )
        queries.append(
            EvalQuery(
                query_id=name,
                text=page.description,
                tenant=TENANT,
                kind=QueryKind.KNOWN_ITEM,
                answerable=True,
                relevant={name: 1},
            )
        )
    if not entities:
        return ManpageLoad(
            evalset=None,
            skipped_reason=(
                f"none of the {len(pin.pages)} pinned pages is present unchanged in {directory}"
            ),
            pinned=len(pin.pages),
            loaded=0,
            missing=tuple(missing),
            changed=tuple(changed),
            unparsable=tuple(unparsable),
            pin_digest=pin.digest,
        )
    evalset = EvalSet(
        name="manpages-man1",
        version=f"pin-{pin.digest[:12]}",
        description=(
            f"Known-item benchmark from {directory}: query = NAME description, document = page "
            f"body without NAME. {len(entities)} of {len(pin.pages)} pinned pages loaded."
        ),
        entities=tuple(entities),
        queries=tuple(queries),
    )
    return ManpageLoad(
        evalset=evalset,
        skipped_reason=None,
        pinned=len(pin.pages),
        loaded=len(entities),
        missing=tuple(missing),
        changed=tuple(changed),
        unparsable=tuple(unparsable),
        pin_digest=pin.digest,
    )


# --- command line ----------------------------------------------------------------------------


def main(argv: Iterable[str] | None = None) -> int:
    """`python -m ragdev.eval.manpages pin|check`: (re)build the pin or check it here."""
    parser = argparse.ArgumentParser(prog="python -m ragdev.eval.manpages")
    sub = parser.add_subparsers(dest="command", required=True)
    pin_cmd = sub.add_parser("pin", help="scan the man directory and write the pin file")
    pin_cmd.add_argument("--man-dir", type=Path, default=DEFAULT_MAN_DIR)
    pin_cmd.add_argument("--out", type=Path, default=MANPAGES_PIN_PATH)
    pin_cmd.add_argument("--max-pages", type=int, default=DEFAULT_MAX_PAGES)
    pin_cmd.add_argument("--max-per-family", type=int, default=DEFAULT_MAX_PER_FAMILY)
    check_cmd = sub.add_parser("check", help="load the pinned pages and report what matches")
    check_cmd.add_argument("--pin", type=Path, default=MANPAGES_PIN_PATH)
    check_cmd.add_argument("--man-dir", type=Path, default=None)
    args = parser.parse_args(None if argv is None else list(argv))
    if args.command == "pin":
        pin = build_pin(
            args.man_dir, Selection(max_pages=args.max_pages, max_per_family=args.max_per_family)
        )
        write_pin(pin, args.out)
        print(json.dumps({"out": str(args.out), **pin.stats}, indent=2))
        return 0
    load = load_pinned(args.pin, args.man_dir)
    print(load.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
