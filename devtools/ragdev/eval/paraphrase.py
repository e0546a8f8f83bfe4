"""The `paraphrase` eval set: held-out questions worded unlike their answers (issue 43 item 3).

Over the golden set's corpus (its 58 entities of `acme` and `globex`), 55 answerable questions
that ask for one fact of one entity in other words than the entity uses: "a physical token" for
"hardware security keys", "the lunch room" for "the canteen", "a colleague's padlock" for
"another person's lock". Each was written against the entity's text, judged by hand (grade 3:
the entity that answers; 2: another that also answers it; 1: one that helps), and none repeats
a golden or `neardomain` question. `word_overlap` measures how little of a question's wording
its answer shares (the test holds every question to at most half its content words).

It is held out: no question is used to fit or choose a threshold, a weight or a configuration
(the calibration is self-supervised per index, and the decisions that move a knob are measured
on the golden set). It reports what the golden set's 15 paraphrases measure too few of: whether
a reworded real question is found (hit@3) and answered (`success_rate`: SUCCESS, not
NO_EVIDENCE) rather than taken for a near miss.
"""

from __future__ import annotations

import re

from ragcore.quality.dataset import EvalQuery, EvalSet, QueryKind, load_evalset
from ragdev.eval import GOLDEN_PATH

NAME = "paraphrase"
VERSION = "1.0.0"

#: (tenant, question, judgments): each answered by the grade-3 entity, in other words.
QUESTIONS: tuple[tuple[str, str, dict[str, int]], ...] = (
    (
        "acme",
        "I found a way to read other customers' records in your app; whom should I tell?",
        {"acme-kb-vuln-disclosure": 3},
    ),
    (
        "acme",
        "for how many days do you keep the trail of each automated job that ran?",
        {"acme-kb-data-retention": 3},
    ),
    (
        "acme",
        "what is the most I can spend on lodging per night in a big city while away for work?",
        {"acme-kb-travel-expenses": 3},
    ),
    (
        "acme",
        "is wine with my evening meal refunded when I travel for the firm?",
        {"acme-kb-travel-expenses": 3},
    ),
    (
        "acme",
        "may we create extra keys so our integration can go faster than the throttle allows?",
        {"acme-kb-api-rate-limits": 3},
    ),
    (
        "acme",
        "the service says our account is frozen because bills were not paid: what still works?",
        {"acme-kb-error-codes": 3},
    ),
    (
        "acme",
        "how old may an incoming event notification be before our endpoint should throw it away?",
        {"acme-kb-webhooks": 3},
    ),
    (
        "acme",
        "since we put a proxy in front of our listener, every event you push is rejected as "
        "forged. Why?",
        {"acme-chat-webhook-debug": 3, "acme-kb-webhooks": 2, "acme-kb-error-codes": 1},
    ),
    (
        "acme",
        "is a one-time code texted to my phone good enough as the second login step?",
        {"acme-kb-password-mfa": 3},
    ),
    (
        "acme",
        "do people who administer the production systems need a physical token to log in?",
        {"acme-kb-password-mfa": 3},
    ),
    (
        "acme",
        "which chat rooms should a freshly hired developer join?",
        {"acme-kb-onboarding-engineers": 3},
    ),
    (
        "acme",
        "how long is a new build watched on a small slice of live users before it goes wider?",
        {"acme-kb-release-process": 3},
    ),
    (
        "acme",
        "which tier do we need to buy to get our own named contact person at Acme?",
        {"acme-kb-pricing-plans": 3},
    ),
    (
        "acme",
        "how much unused holiday can I roll over past December?",
        {"acme-kb-pto-policy": 3},
    ),
    (
        "acme",
        "what notice do I owe my boss for a fortnight off?",
        {"acme-kb-pto-policy": 3},
    ),
    (
        "acme",
        "after how long does the main data store hand over to a replica without anyone "
        "stepping in?",
        {"acme-kb-db-failover": 3},
    ),
    (
        "acme",
        "for how long can I use the link to fetch the archive of all our workspace content?",
        {"acme-kb-export-data": 3},
    ),
    (
        "acme",
        "somebody wants us to erase what we hold on them inside a client's account; do we "
        "just do it?",
        {"acme-kb-dsar": 3},
    ),
    (
        "acme",
        "from when until when must I be reachable for calls with coworkers?",
        {"acme-kb-employee-handbook": 3},
    ),
    (
        "acme",
        "how often does the visitors' internet passphrase change?",
        {"acme-kb-guest-wifi": 3},
    ),
    (
        "acme",
        "if an alert wakes me at 3 am, may I start late the following morning?",
        {"acme-kb-oncall-compensation": 3},
    ),
    (
        "acme",
        "did the logistics company whose yearly plan renewed by itself get money back?",
        {"acme-email-refund-bluefin": 3, "acme-kb-refund-policy": 1},
    ),
    (
        "acme",
        "until what date around new year may only urgent fixes be shipped?",
        {"acme-chat-code-freeze": 3, "acme-kb-release-process": 1},
    ),
    (
        "acme",
        "why might automatic deployments to the pre-production environment break at the end of "
        "this week?",
        {"acme-chat-vpn-cert": 3},
    ),
    (
        "acme",
        "what is the quickest way to flag a dodgy-looking message in my mailbox?",
        {"acme-email-phishing-warning": 3},
    ),
    (
        "acme",
        "how many purchases had to be redone after checkout went down in the spring?",
        {"acme-meeting-inc-2291-postmortem": 3},
    ),
    (
        "acme",
        "why is the analytics client keen on a pricier tier next time round?",
        {"acme-meeting-kestrel-call": 3},
    ),
    (
        "acme",
        "a client's bill still shows the tax number they had before relocating; how was that "
        "fixed?",
        {"acme-ticket-sup-4502": 3},
    ),
    (
        "acme",
        "how many reliability engineers are we planning to hire this quarter, and where?",
        {"acme-meeting-q3-planning": 3},
    ),
    (
        "acme",
        "when does a suspected break-in count as the most severe kind of outage?",
        {"acme-kb-incident-runbook": 3},
    ),
    (
        "globex",
        "how long are gaskets and O-rings guaranteed after they leave our plant?",
        {"globex-kb-warranty": 3},
    ),
    (
        "globex",
        "will we replace a pump that broke because it was run with no water in it?",
        {"globex-kb-warranty": 3},
    ),
    (
        "globex",
        "can a buyer give us back a unit made to their own spec?",
        {"globex-kb-returns-policy": 3},
    ),
    (
        "globex",
        "how much food money do I get for the day I head home from a customer visit?",
        {"globex-kb-travel-expenses": 3},
    ),
    (
        "globex",
        "whose okay do I need before reserving travel for an exhibition?",
        {"globex-kb-travel-expenses": 3},
    ),
    (
        "globex",
        "may I borrow a colleague's padlock to isolate a machine before working on it?",
        {"globex-kb-loto": 3},
    ),
    (
        "globex",
        "how recent must my training be before I may put my padlock on a machine's power source?",
        {"globex-kb-loto": 3},
    ),
    (
        "globex",
        "somebody hit the big red button on the assembly line; what do we do before restarting?",
        {"globex-kb-line3-alarm-codes": 3},
    ),
    (
        "globex",
        "where do faulty parts go while we wait for a decision about them?",
        {"globex-kb-ncr-procedure": 3},
    ),
    (
        "globex",
        "which internal number do I ring so someone meets the ambulance at the gate?",
        {"globex-kb-injury-reporting": 3},
    ),
    (
        "globex",
        "how often must lift truck operators be re-examined at the wheel?",
        {"globex-kb-forklift": 3},
    ),
    (
        "globex",
        "can a customer collect the goods from our door and do all the loading themselves?",
        {"globex-kb-incoterms": 3},
    ),
    (
        "globex",
        "how often do the tools that tighten bolts to a set force need verifying?",
        {"globex-kb-gauge-calibration": 3},
    ),
    (
        "globex",
        "what breathing protection do I need where the parts get sprayed?",
        {"globex-kb-ppe": 3},
    ),
    (
        "globex",
        "must we always visit a new foundry in person before ordering from it?",
        {"globex-kb-supplier-qualification": 3},
    ),
    (
        "globex",
        "how long should the leaving and arriving crew leads overlap at the changeover?",
        {"globex-kb-shift-handover": 3},
    ),
    (
        "globex",
        "when will the late impeller parts finally leave the supplier's works?",
        {"globex-email-castwell-delay": 3},
    ),
    (
        "globex",
        "why are prices for corrosion-resistant pumps and parts going up this summer?",
        {"globex-email-steel-surcharge": 3},
    ),
    (
        "globex",
        "when does the lunch room shut this Friday?",
        {"globex-chat-canteen": 3},
    ),
    (
        "globex",
        "how many housings from the bad melts sit in quarantine?",
        {"globex-meeting-capa-ncr-2024-118": 3, "globex-kb-ncr-procedure": 1},
    ),
    (
        "globex",
        "how often should the water utility run its idle backup unit?",
        {"globex-meeting-lakeshore-visit": 3},
    ),
    (
        "globex",
        "why did the test stand's pump start shaking so much, and what fixed it?",
        {"globex-ticket-mnt-8812": 3},
    ),
    (
        "globex",
        "up to what amount may the newly hired buyer sign off purchases in the ERP?",
        {"globex-ticket-it-771": 3},
    ),
    (
        "globex",
        "what stopped the test rig one evening, and how was it fixed?",
        {"globex-chat-line3-down": 3, "globex-kb-line3-alarm-codes": 1},
    ),
    (
        "globex",
        "what did the safety group decide about people walking between the storage racks?",
        {"globex-meeting-safety-committee": 3},
    ),
)

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
#: Words too common to say anything about wording (they are left out of `word_overlap`).
_STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "before",
        "being",
        "between",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "get",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "may",
        "me",
        "might",
        "must",
        "my",
        "of",
        "on",
        "or",
        "our",
        "should",
        "so",
        "some",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "they",
        "this",
        "to",
        "up",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def content_words(text: str) -> set[str]:
    """The lower-cased words of `text` that are not stop words."""
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def word_overlap(question: str, answer: str) -> float:
    """Share of the question's content words that occur in the answer's text (exact words)."""
    words = content_words(question)
    if not words:
        return 0.0
    return len(words & content_words(answer)) / len(words)


def paraphrase_evalset() -> EvalSet:
    """The golden corpus with the held-out paraphrase questions."""
    golden = load_evalset(GOLDEN_PATH)
    queries = tuple(
        EvalQuery(
            query_id=f"para-{n:02d}",
            text=question,
            tenant=tenant,
            kind=QueryKind.PARAPHRASE,
            answerable=True,
            relevant=judgments,
            tags=("held-out",),
        )
        for n, (tenant, question, judgments) in enumerate(QUESTIONS, start=1)
    )
    return EvalSet(
        name=f"ragstream-{NAME}",
        version=VERSION,
        description=__doc__ or "",
        entities=golden.entities,
        queries=queries,
    )
