"""The `demo` eval set: the dev stack's sample corpus (`ragdev.sample`) with identifier queries.

Unlike the golden set, this corpus repeats itself as real ones do: 24 tickets per tenant filed
from six (acme) or five (globex) problems, so one problem's tickets differ only in their ticket
and account numbers, and the release notes that explain each fixed error code. It measures what
the golden set cannot: near-duplicates in the top 5 (`near_duplicate_share@5`) and whether the
chunk that explains an identifier ranks above the tickets that only quote it.

Judgments are derived from the generated corpus, not written by hand: for "what does error
E-xxxx mean?" the release notes that list the fix of E-xxxx answer (grade 3) and the tickets
quoting the code are related (grade 1); for a pump model's seal interval its datasheet answers
(3), tickets about that pump's seal are related (1). The questions of `ragstream dev` are in
it too: none of them may abstain.
"""

from __future__ import annotations

import re

from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragdev.sample import FIXES, sample_documents, sample_tickets

NAME = "demo"
VERSION = "1.0.0"


def demo_entities() -> list[EvalEntity]:
    """The sample corpus as eval entities: its documents and its tickets."""
    out = [
        EvalEntity(
            entity_id=d["id"],
            tenant=d["company_id"],
            entity_type=d["entity_type"],
            title=d["name"],
            content=d["content"],
            format=d["metadata"].get("format", "text"),
            metadata={k: v for k, v in d["metadata"].items() if k != "format"},
        )
        for d in sample_documents()
    ]
    out += [
        EvalEntity(
            entity_id=t["id"],
            tenant=t["company_id"],
            entity_type="TICKET",
            title=t["subject"],
            content=f"{t['subject']}\n\n{t['body']}",
            metadata={"status": t["status"], "priority": t["priority"]},
        )
        for t in sample_tickets()
    ]
    return out


def _error_queries(entities: list[EvalEntity]) -> list[EvalQuery]:
    queries = []
    for code, _what in FIXES:
        fix = re.compile(rf"^- {re.escape(code)}:", re.MULTILINE)
        relevant = {
            e.entity_id: 3
            for e in entities
            if e.entity_type == "RELEASE_NOTE" and fix.search(e.content)
        }
        relevant |= {
            e.entity_id: 1 for e in entities if e.entity_type == "TICKET" and code in e.content
        }
        if relevant:
            queries.append(
                EvalQuery(
                    query_id=f"demo-{code.lower()}",
                    text=f"what does error {code} mean?",
                    tenant="acme",
                    kind=QueryKind.EXACT_IDENTIFIER,
                    answerable=True,
                    relevant=relevant,
                )
            )
    return queries


def _seal_queries(entities: list[EvalEntity]) -> list[EvalQuery]:
    queries = []
    for model in ("GX-300", "GX-410", "GX-550"):
        sheet = f"globex-datasheet-{model.lower()}"
        relevant = {sheet: 3}
        relevant |= {
            e.entity_id: 1
            for e in entities
            if e.entity_type == "TICKET" and model in e.content and "seal" in e.content
        }
        queries.append(
            EvalQuery(
                query_id=f"demo-seal-{model.lower()}",
                text=f"how often should the seal of the {model} be checked?",
                tenant="globex",
                kind=QueryKind.EXACT_IDENTIFIER,
                answerable=True,
                relevant=relevant,
            )
        )
    return queries


def _example_queries(entities: list[EvalEntity]) -> list[EvalQuery]:
    """The questions `ragstream dev` asks (`ragdev.dev.EXAMPLES`) that the identifier queries
    above do not already cover: all must succeed."""
    leaking = {
        e.entity_id: 3
        for e in entities
        if e.entity_type == "TICKET" and e.title.startswith("Seal leaking")
    }
    return [
        EvalQuery(
            query_id="demo-example-refund",
            text="If a client cancels a yearly plan after a few weeks, do they get money back?",
            tenant="acme",
            kind=QueryKind.PARAPHRASE,
            answerable=True,
            relevant={"acme-kb-refund-policy": 3, "acme-email-refund-bluefin": 2},
        ),
        EvalQuery(
            query_id="demo-example-leaking-seal",
            text="which customers reported a leaking seal?",
            tenant="globex",
            kind=QueryKind.KEYWORD,
            answerable=True,
            relevant=leaking,
        ),
    ]


def demo_evalset() -> EvalSet:
    """The demo eval set (deterministic: the sample corpus is generated with fixed seeds)."""
    entities = demo_entities()
    return EvalSet(
        name=NAME,
        version=VERSION,
        description=__doc__ or "",
        entities=tuple(entities),
        queries=tuple(
            _error_queries(entities) + _seal_queries(entities) + _example_queries(entities)
        ),
    )
