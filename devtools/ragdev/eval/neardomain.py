"""The `neardomain` eval set: abstention on questions that sound like the corpus.

Over the dev stack's sample corpus (the `demo` set's entities: the golden documents, release
notes, incident reviews, datasheets, service bulletins and tickets of `acme` and `globex`):

- unanswerable questions written in the corpus' own vocabulary about a fact it does not hold
  ("how do I rotate the on-call pager?", an on-call stipend at globex, whose corpus has none;
  a Line 5 PLC where only Line 3 is documented; identifiers of the corpus' shape it does not
  contain). Each was checked against the corpus text for the absent fact;
- answerable questions paraphrasing what one document says, in other words than the document
  (judged by hand: the document that answers is grade 3, a document that helps is 1 or 2; for
  generated documents the judgments are derived from the generated text, as in `ragdev.eval.demo`).

It measures what the golden set's 31 unanswerable questions measure too few of: whether the
calibrated threshold abstains on a near miss without abstaining on a reworded real question.
None of its questions is used to fit or choose anything (the calibration is self-supervised per
index): it is a held-out test of the threshold.
"""

from __future__ import annotations

import re

from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragdev.eval.demo import demo_entities

NAME = "neardomain"
VERSION = "1.0.0"

#: (tenant, question, absent): the corpus holds the vocabulary but not the fact; `absent` (lower
#: case) names it and occurs in none of the tenant's documents.
UNANSWERABLE: tuple[tuple[str, str, str], ...] = (
    ("acme", "how do I rotate the on-call pager?", "rotate the pager"),
    ("acme", "How do I fail over the Redis cache cluster?", "redis"),
    ("acme", "Is there a nonprofit discount on the Enterprise plan?", "nonprofit"),
    ("acme", "How do I export workflow runs directly to BigQuery?", "bigquery"),
    ("acme", "Which Acme Flow release added a dark mode to the workflow editor?", "dark mode"),
    ("acme", "Can invoices be issued in Japanese yen?", "yen"),
    ("acme", "How do I configure single sign-on with PingFederate?", "pingfederate"),
    ("acme", "What are the rate limits of the GraphQL API?", "graphql"),
    ("acme", "How do I set up SCIM user provisioning with Okta?", "scim"),
    ("acme", "Are webhooks delivered over mutual TLS with client certificates?", "mutual tls"),
    ("acme", "Can I get reimbursed for a standing desk for my home office?", "standing desk"),
    ("acme", "How many days of sabbatical do engineers earn after five years?", "sabbatical"),
    ("acme", "What does error E-3050 mean?", "e-3050"),
    ("acme", "Which incident was caused by a leaked API token?", "leaked"),
    ("acme", "What is the employer contribution to the pension plan?", "pension"),
    ("acme", "When does the spring code freeze start?", "spring"),
    ("acme", "What is the SLA credit for the Starter plan?", "sla credit"),
    ("globex", "What is the on-call stipend for maintenance technicians?", "stipend"),
    ("globex", "What is the rated flow of the GX-990 pump?", "gx-990"),
    ("globex", "What are the alarm codes of the Line 5 PLC?", "line 5"),
    ("globex", "Which kit does service bulletin SB-799 call for?", "sb-799"),
    ("globex", "How are confined space entry permits issued?", "confined space"),
    ("globex", "What is the crane operator certification procedure?", "crane"),
    ("globex", "What is the overtime rate for the night shift?", "overtime"),
    ("globex", "Which pumps have ATEX certification for explosive atmospheres?", "atex"),
    ("globex", "What are the canteen opening hours on Saturdays?", "saturday"),
    ("globex", "What is the procedure for a chemical spill in the test bay?", "spill"),
    ("globex", "How often is the fire alarm tested at the Dayton plant?", "fire alarm"),
    ("globex", "What does alarm code B-204 mean?", "b-204"),
    ("globex", "What is the parental leave policy at Globex?", "parental"),
    ("globex", "Which firmware version does the Line 3 HMI run?", "firmware"),
    ("globex", "Which distributor sells Globex pumps in Brazil?", "brazil"),
    ("globex", "What is the pension plan for Globex plant workers?", "pension"),
)

#: (tenant, question, judgments): reworded questions the corpus answers.
ANSWERABLE: tuple[tuple[str, str, dict[str, int]], ...] = (
    (
        "acme",
        "how much is an engineer paid for holding the pager for a week?",
        {"acme-kb-oncall-compensation": 3},
    ),
    (
        "acme",
        "what happens to our data after we close the workspace?",
        {"acme-kb-data-retention": 3},
    ),
    (
        "acme",
        "how many vacation days does a full-time employee get each year?",
        {"acme-kb-pto-policy": 3},
    ),
    (
        "acme",
        "how do I report a security hole I found in the product?",
        {"acme-kb-vuln-disclosure": 3},
    ),
    (
        "acme",
        "what should I do when the primary Postgres database goes down?",
        {"acme-kb-db-failover": 3},
    ),
    (
        "acme",
        "how can an admin download everything stored in a workspace?",
        {"acme-kb-export-data": 3},
    ),
    (
        "acme",
        "someone asked for a copy of the personal information we hold about them, what now?",
        {"acme-kb-dsar": 3},
    ),
    (
        "acme",
        "how many calls per minute may an integration make to the REST API?",
        {"acme-kb-api-rate-limits": 3},
    ),
    (
        "acme",
        "how do we check that a webhook call really came from Acme Flow?",
        {"acme-kb-webhooks": 3},
    ),
    ("acme", "how do I let staff sign in with their Okta accounts?", {"acme-kb-sso-saml": 3}),
    ("acme", "how long must an employee password be?", {"acme-kb-password-mfa": 3}),
    (
        "acme",
        "what does a newly hired engineer do in the first week?",
        {"acme-kb-onboarding-engineers": 3},
    ),
    ("acme", "how does a merged pull request reach production?", {"acme-kb-release-process": 3}),
    ("acme", "is paying for a year cheaper than paying monthly?", {"acme-kb-pricing-plans": 3}),
    (
        "acme",
        "can I get my hotel costs back after a business trip?",
        {"acme-kb-travel-expenses": 3},
    ),
    ("acme", "what is the wifi password for visitors?", {"acme-kb-guest-wifi": 3}),
    (
        "acme",
        "who takes charge during a production outage and how is it communicated?",
        {"acme-kb-incident-runbook": 3},
    ),
    (
        "acme",
        "what caused the checkout API outage in March?",
        {"acme-meeting-inc-2291-postmortem": 3},
    ),
    ("acme", "when does the end-of-year code freeze begin?", {"acme-chat-code-freeze": 3}),
    (
        "acme",
        "how much will the Team plan cost per month from March?",
        {"acme-email-team-price-change": 3},
    ),
    ("acme", "a customer's invoice shows an outdated VAT number", {"acme-ticket-sup-4502": 3}),
    (
        "acme",
        "were staff warned about phishing mails pretending to be document signing requests?",
        {"acme-email-phishing-warning": 3},
    ),
    (
        "globex",
        "how long are Globex pumps covered against manufacturing defects?",
        {"globex-kb-warranty": 3},
    ),
    (
        "globex",
        "how do I send back a pump we bought directly from Globex?",
        {"globex-kb-returns-policy": 3},
    ),
    (
        "globex",
        "how do I make sure a machine cannot start while I repair it?",
        {"globex-kb-loto": 3},
    ),
    ("globex", "what protective gear must I wear in production areas?", {"globex-kb-ppe": 3}),
    ("globex", "who is allowed to drive a forklift?", {"globex-kb-forklift": 3}),
    (
        "globex",
        "what must I do after a near miss at work?",
        {"globex-kb-injury-reporting": 3},
    ),
    (
        "globex",
        "how is a new supplier of castings approved?",
        {"globex-kb-supplier-qualification": 3},
    ),
    (
        "globex",
        "what should the outgoing team leader pass on to the next shift?",
        {"globex-kb-shift-handover": 3},
    ),
    (
        "globex",
        "who pays the freight for customer orders shipped from Dayton?",
        {"globex-kb-incoterms": 3},
    ),
    (
        "globex",
        "how often are measuring instruments recalibrated?",
        {"globex-kb-gauge-calibration": 3},
    ),
    (
        "globex",
        "what do I do when a part does not match its drawing?",
        {"globex-kb-ncr-procedure": 3},
    ),
    (
        "globex",
        "where are the alarm codes of the Line 3 PLC explained?",
        {"globex-kb-line3-alarm-codes": 3, "globex-chat-line3-down": 1},
    ),
    (
        "globex",
        "why are the impeller castings from the foundry late?",
        {"globex-email-castwell-delay": 3},
    ),
    ("globex", "are stainless steel prices going up?", {"globex-email-steel-surcharge": 3}),
    (
        "globex",
        "how often must the bearings of the GX-300 be regreased?",
        {"globex-datasheet-gx-300": 3},
    ),
)


def _boiler_feed(entities: list[EvalEntity]) -> EvalQuery:
    """A paraphrase whose answers are derived from the generated datasheets."""
    duty = re.compile(r"designed for boiler feed")
    relevant = {
        e.entity_id: 3
        for e in entities
        if e.entity_id.startswith("globex-datasheet-") and duty.search(e.content)
    }
    return EvalQuery(
        query_id="near-a-boiler-feed",
        text="which of our pumps are meant for feeding water into boilers?",
        tenant="globex",
        kind=QueryKind.PARAPHRASE,
        answerable=True,
        relevant=relevant,
    )


def neardomain_evalset() -> EvalSet:
    """The near-domain eval set (deterministic)."""
    entities = demo_entities()
    known = {e.entity_id for e in entities}
    queries = [
        EvalQuery(
            query_id=f"near-u{n:02d}",
            text=text,
            tenant=tenant,
            kind=QueryKind.UNANSWERABLE,
            answerable=False,
        )
        for n, (tenant, text, _absent) in enumerate(UNANSWERABLE, start=1)
    ]
    for n, (tenant, text, relevant) in enumerate(ANSWERABLE, start=1):
        missing = set(relevant) - known
        if missing:
            raise ValueError(f"neardomain judges entities the corpus lacks: {sorted(missing)}")
        queries.append(
            EvalQuery(
                query_id=f"near-a{n:02d}",
                text=text,
                tenant=tenant,
                kind=QueryKind.PARAPHRASE,
                answerable=True,
                relevant=relevant,
            )
        )
    queries.append(_boiler_feed(entities))
    return EvalSet(
        name=NAME,
        version=VERSION,
        description=__doc__ or "",
        entities=tuple(entities),
        queries=tuple(queries),
    )
