"""The sample corpus `ragstream dev` loads: a few hundred rows in two SoR tables, two tenants.

Table `entities`: the golden evaluation set's hand-written documents
(`devtools/ragdev/eval/data/golden.json`: policies, runbooks, emails, meeting notes for `acme`,
a SaaS company, and `globex`, a pump manufacturer) plus documents generated deterministically from
small tables: release notes and incident reviews for acme, pump datasheets and service bulletins
for globex. Table `tickets`: support tickets of both tenants, shaped unlike `entities` (content
from two columns, a constant entity type, status and priority copied into the metadata). Table
`documents`: PDF, DOCX, XLSX and CSV files in a binary column (`ragdev.sample_documents`).
`SAMPLE_TABLES` maps all three.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from ragcore.mapping import TableMapping
from ragcore.resources import package_dir
from ragdev.sample_documents import DOCUMENTS_TABLE, sample_files

#: The mappings of the sample tables (the dev stack's `plan.tables`).
SAMPLE_TABLES: tuple[TableMapping, ...] = (
    TableMapping(),
    TableMapping(
        table="public.tickets",
        key_columns=("id",),
        tenant_column="company_id",
        type_column=None,
        default_entity_type="TICKET",
        title_column="subject",
        content_columns=("subject", "body"),
        metadata_column=None,
        metadata_columns=("status", "priority"),
        content_hash_column=None,
    ),
    DOCUMENTS_TABLE,
)
#: DDL of the sample tables, per dialect (files under schemas/sql/).
SAMPLE_DDL = {
    "sqlite": ("entities.sqlite.sql", "tickets.sqlite.sql", "documents.sqlite.sql"),
    "postgres": ("entities.postgres.sql", "tickets.postgres.sql", "documents.postgres.sql"),
}

FEATURES = [
    ("SSO with Okta and Azure AD", "single sign-on through SAML 2.0 and OIDC providers"),
    ("audit log export", "a nightly export of the audit log to S3 or GCS buckets"),
    ("webhook retries", "exponential backoff for webhook deliveries with a dead-letter view"),
    ("usage-based billing", "metered billing per workflow run, invoiced monthly"),
    ("workflow templates", "a gallery of approved templates for common approval flows"),
    ("data residency in the EU", "storage of customer data in Frankfurt and Dublin only"),
    ("granular API tokens", "API tokens scoped to a project with read or write rights"),
    ("scheduled reports", "PDF reports e-mailed on a weekly or monthly schedule"),
    ("bulk import", "CSV import of up to 100,000 records with a validation preview"),
    ("two-factor enforcement", "mandatory TOTP or WebAuthn for every workspace member"),
]
FIXES = [
    ("E-2001", "uploads over 2 GB stalled at 99 percent"),
    ("E-2017", "timezone offsets were ignored in scheduled reports"),
    ("E-2044", "the approval button stayed disabled after a reassignment"),
    ("E-2090", "CSV exports dropped rows containing line breaks"),
    ("E-2113", "SAML logins failed when the IdP clock drifted by more than 60 seconds"),
    ("E-2150", "webhooks were sent twice after a worker restart"),
    ("E-2188", "search returned archived workflows to users without access"),
]
SERVICES = ["api-gateway", "workflow-engine", "billing", "search", "notifications", "auth"]
CAUSES = [
    "an expired TLS certificate on an internal load balancer",
    "a database connection pool exhausted by a runaway batch job",
    "a configuration change that disabled the read replica failover",
    "a memory leak in the PDF renderer under sustained load",
    "a DNS change that propagated before the new backend was ready",
    "a queue consumer that stopped acknowledging messages after a deploy",
]
MATERIALS = ["cast iron", "stainless steel 316", "duplex stainless steel", "bronze"]
SEALS = ["single mechanical seal", "double mechanical seal", "packed gland"]
APPLICATIONS = [
    "municipal water supply",
    "cooling water circulation",
    "chemical transfer",
    "irrigation",
    "boiler feed",
    "wastewater lifting",
]


def golden_documents() -> list[dict[str, Any]]:
    """The golden set's text entities as rows of `entities` (its documents, such as the GX-950
    datasheet PDF, are files of the `documents` table: `ragdev.sample_documents`)."""
    path = package_dir("ragdev") / "eval" / "data" / "golden.json"
    data = json.loads(path.read_text())
    return [
        {
            "id": e["entity_id"],
            "company_id": e["tenant"],
            "entity_type": e["entity_type"],
            "name": e["title"],
            "content": e["content"],
            "metadata": {**e.get("metadata", {}), "format": e.get("format", "text")},
        }
        for e in data["entities"]
        if e.get("format", "text") in ("text", "markdown", "html")
    ]


def _release_notes(rng: random.Random) -> Iterator[dict[str, Any]]:
    for major in range(1, 5):
        for minor in range(0, 12):
            version = f"{major}.{minor}"
            feats = rng.sample(FEATURES, 2)
            fixes = rng.sample(FIXES, 2)
            lines = [f"# Acme Flow {version} release notes", ""]
            lines += ["## New features", ""]
            lines += [f"- **{name}**: {what}." for name, what in feats]
            lines += ["", "## Fixes", ""]
            lines += [f"- {code}: fixed a bug where {what}." for code, what in fixes]
            lines += ["", f"Upgrade by running `acme upgrade --to {version}`."]
            yield {
                "id": f"acme-release-{major}-{minor}",
                "company_id": "acme",
                "entity_type": "RELEASE_NOTE",
                "name": f"Acme Flow {version} release notes",
                "content": "\n".join(lines),
                "metadata": {"format": "markdown", "version": version},
            }


def _incidents(rng: random.Random) -> Iterator[dict[str, Any]]:
    for n in range(1, 41):
        service = rng.choice(SERVICES)
        cause = rng.choice(CAUSES)
        minutes = rng.randint(7, 190)
        yield {
            "id": f"acme-incident-{n:03d}",
            "company_id": "acme",
            "entity_type": "INTERACTION_EVENT",
            "name": f"Incident INC-{4000 + n}: {service} degraded",
            "content": (
                f"Incident INC-{4000 + n} affected the {service} service for {minutes} minutes. "
                f"Customers saw elevated error rates and slow responses. The root cause was "
                f"{cause}. On-call engineers mitigated it by rolling back and scaling the "
                f"service. Follow-up actions: add an alert on the failing signal, document the "
                f"recovery steps in the {service} runbook, and review the change process."
            ),
            "metadata": {"format": "text", "service": service},
        }


def _datasheets(rng: random.Random) -> Iterator[dict[str, Any]]:
    for n in range(1, 61):
        model = f"GX-{100 + 10 * n}"
        flow = rng.randint(5, 400)
        head = rng.randint(10, 160)
        power = round(flow * head / 300 + rng.uniform(0.5, 4), 1)
        material = rng.choice(MATERIALS)
        seal = rng.choice(SEALS)
        app = rng.choice(APPLICATIONS)
        yield {
            "id": f"globex-datasheet-{model.lower()}",
            "company_id": "globex",
            "entity_type": "KNOWLEDGE_ARTIFACT",
            "name": f"{model} centrifugal pump datasheet",
            "content": (
                f"<h1>{model} centrifugal pump</h1><p>The {model} is designed for {app}. "
                f"Rated flow is {flow} m³/h at a head of {head} m with a {power} kW motor.</p>"
                f"<h2>Construction</h2><p>Casing and impeller are {material}; the shaft is "
                f"sealed by a {seal}.</p><h2>Maintenance</h2><ul><li>Check the seal for "
                f"leakage every {rng.choice([500, 1000, 2000])} operating hours.</li><li>"
                f"Regrease bearings every {rng.choice([2000, 4000, 8000])} hours.</li></ul>"
            ),
            "metadata": {"format": "html", "model": model},
        }


def _bulletins(rng: random.Random) -> Iterator[dict[str, Any]]:
    for n in range(1, 41):
        model = f"GX-{100 + 10 * rng.randint(1, 60)}"
        yield {
            "id": f"globex-bulletin-{n:03d}",
            "company_id": "globex",
            "entity_type": "SERVICE_BULLETIN",
            "name": f"Service bulletin SB-{700 + n} for {model}",
            "content": (
                f"Service bulletin SB-{700 + n} applies to {model} pumps built before "
                f"{rng.choice(['2019', '2020', '2021', '2022'])}. Field reports show "
                f"{rng.choice(['premature seal wear', 'bearing noise', 'impeller erosion', 'vibration at partial load'])}. "  # noqa: E501
                f"Inspect the unit at the next scheduled stop and replace the affected part "
                f"with kit {rng.choice(['K-11', 'K-27', 'K-35', 'K-42'])}. Warranty covers "
                f"parts and labour until the end of the year."
            ),
            "metadata": {"format": "text", "model": model},
        }


TICKET_PROBLEMS = {
    "acme": [
        (
            "Login fails with E-2113",
            "Our users cannot log in through SAML since this morning; "
            "the login page shows error E-2113. Our IdP runs in a VM whose clock we do not "
            "control.",
        ),
        (
            "Change the invoice address",
            "Our finance team moved to a new office; please send future invoices to the "
            "new billing address and reissue the last one.",
        ),
        (
            "Webhook sent twice",
            "Every webhook arrived twice after your maintenance window; our "
            "order system booked duplicate orders.",
        ),
        (
            "Export drops rows",
            "The CSV export of workflow runs is missing rows whose comment "
            "field contains a line break.",
        ),
        (
            "Two-factor for contractors",
            "Can we exempt external contractors from the mandatory "
            "two-factor authentication of the workspace?",
        ),
        (
            "Slow search",
            "Searching workflows takes more than ten seconds for our largest "
            "project since the last release.",
        ),
    ],
    "globex": [
        (
            "Seal leaking on GX-300",
            "The GX-300 at the cooling tower leaks at the mechanical seal "
            "after 900 operating hours; the datasheet says to check it every 1000 hours.",
        ),
        (
            "Bearing noise after regreasing",
            "A GX-410 pump became noisy right after the bearings "
            "were regreased; the grease type was not documented.",
        ),
        (
            "Vibration at partial load",
            "Our irrigation pump vibrates when throttled below half "
            "of its rated flow. Is service bulletin SB-712 relevant?",
        ),
        (
            "Spare impeller lead time",
            "What is the delivery time for a duplex stainless steel impeller for the GX-550?",
        ),
        (
            "Warranty claim for kit K-27",
            "We replaced a seal with kit K-27 under the service "
            "bulletin; please confirm that parts and labour are covered.",
        ),
    ],
}
STATUSES = ["open", "pending", "solved", "closed"]
PRIORITIES = ["low", "normal", "high", "urgent"]


def sample_tickets() -> list[dict[str, Any]]:
    """Support tickets of both tenants as rows of the `tickets` table (deterministic)."""
    rng = random.Random(20261124)
    rows = []
    for tenant, problems in TICKET_PROBLEMS.items():
        for n in range(24):
            subject, body = problems[n % len(problems)]
            number = 1000 + n if tenant == "acme" else 5000 + n
            rows.append(
                {
                    "id": f"{tenant}-ticket-{number}",
                    "company_id": tenant,
                    "subject": f"{subject} (#{number})",
                    "body": f"{body} Reported by customer account {rng.randint(100, 999)}.",
                    "status": rng.choice(STATUSES),
                    "priority": rng.choice(PRIORITIES),
                }
            )
    return rows


def sample_rows(limit: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The sample corpus per table name: `limit` rows per table at most."""
    tickets = sample_tickets()
    files = sample_files()
    return {
        "entities": sample_documents(limit),
        "tickets": tickets[:limit] if limit is not None else tickets,
        "documents": files[:limit] if limit is not None else files,
    }


def sample_documents(limit: int | None = None) -> list[dict[str, Any]]:
    """The whole sample corpus as SoR rows (deterministic), tenants interleaved so that the
    first N (`limit`) hold documents of both tenants."""
    rng = random.Random(20261122)
    docs = golden_documents()
    docs += list(_release_notes(rng))
    docs += list(_incidents(rng))
    docs += list(_datasheets(rng))
    docs += list(_bulletins(rng))
    position: dict[str, int] = {}
    keyed = []
    for doc in docs:
        n = position[doc["company_id"]] = position.get(doc["company_id"], -1) + 1
        keyed.append((n, doc["company_id"], doc))
    ordered = [doc for _, _, doc in sorted(keyed, key=lambda k: (k[0], k[1]))]
    return ordered[:limit] if limit is not None else ordered
