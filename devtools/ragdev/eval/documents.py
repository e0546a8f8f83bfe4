"""The `documents` eval set: which page, section or row block answers (issue 43 item 2).

One tenant, `northwind` (a maker of chillers and heat pumps), keeps five files generated here
by `ragdev.docgen` at load time (deterministic text; nothing binary is committed):

- `hydra7-service-manual.pdf` (9 pages) and `aurora3-installation-guide.pdf` (8 pages): two
  products' manuals that both name their product on every page and share topics (electrical
  supply, refrigerant, noise, warranty), so a question's words appear on several pages of both;
- `travel-policy.pdf` (8 pages): one rule per page, "approval", "trip" and "receipt" on most;
- `security-incident-procedure.docx`: one heading per section;
- `spare-parts.xlsx`: 120 part rows (40 per product, the same components for each, so a
  component's name is in every row block) and a sheet of labour rates.

Each question is answered by exactly one passage, named in `expected_passage` as the citation
names it after the file name (`p. 3`, `IT security incident procedure > Ransomware`,
`Parts > rows 42-81`); the file's entity is grade 3. `ragstream eval --dataset documents`
reports page-level hit@k and MRR@k (`ragcore.quality.metrics`) beside the entity-level ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragcore.documents import encode_document
from ragcore.quality.dataset import EvalEntity, EvalQuery, EvalSet, QueryKind
from ragdev.docgen import docx_bytes, pdf_bytes, xlsx_bytes
from schemas.entities import ContentFormat

NAME = "documents"
VERSION = "1.0.0"
TENANT = "northwind"

HYDRA = "nw-hydra7-manual"
AURORA = "nw-aurora3-guide"
TRAVEL = "nw-travel-policy"
INCIDENT = "nw-incident-procedure"
PARTS = "nw-spare-parts"

HYDRA_PAGES: tuple[tuple[str, ...], ...] = (
    (
        "Hydra-7 water-cooled chiller - service manual, page 1 of 9: overview.",
        "The Hydra-7 is a water-cooled chiller for offices, hospitals and data rooms. It",
        "delivers 700 kW of cooling with two screw compressors on two independent circuits,",
        "and leaves the chilled water at 7 degrees Celsius in its standard configuration.",
    ),
    (
        "Hydra-7 service manual, page 2 of 9: refrigerant circuit.",
        "Each Hydra-7 circuit holds 42 kg of R-1234ze refrigerant. Recover the charge into a",
        "certified recovery cylinder before opening a circuit; never vent it. A leak check with",
        "an electronic detector is due every 12 months and after every repair of the circuit.",
    ),
    (
        "Hydra-7 service manual, page 3 of 9: electrical supply.",
        "The Hydra-7 takes a 400 V three-phase supply at 50 Hz. Protect the feeder with a",
        "250 A type C circuit breaker and a residual-current device of 300 mA. Lock the main",
        "isolator open before any work inside the control cabinet.",
    ),
    (
        "Hydra-7 service manual, page 4 of 9: condenser cleaning.",
        "Clean the Hydra-7 condenser tubes every 12 months with a nylon brush. When the",
        "approach temperature rises above 3 K, descale the tubes with a mild citric acid",
        "solution; never use hydrochloric acid, which attacks the copper.",
    ),
    (
        "Hydra-7 service manual, page 5 of 9: compressor oil.",
        "The screw compressors of the Hydra-7 run on polyolester oil POE-170. Take an oil",
        "sample for an acid test every year and change the oil and its filter every 20,000",
        "operating hours, or at once when the acid test fails.",
    ),
    (
        "Hydra-7 service manual, page 6 of 9: alarm codes.",
        "H-12 low evaporator pressure: check the water flow and the refrigerant charge.",
        "H-31 high discharge temperature: the condenser is fouled or its water flow is too low.",
        "H-44 phase loss: a fuse has blown or a supply phase is missing. Reset after the cause",
        "is found; three trips of one alarm within an hour lock the Hydra-7 out.",
    ),
    (
        "Hydra-7 service manual, page 7 of 9: freeze protection.",
        "Where the Hydra-7 chilled water pipes run outdoors and the air can fall below -5",
        "degrees Celsius, fill the loop with 30 percent propylene glycol. The evaporator flow",
        "switch stops the compressors when the water flow drops below half its design value.",
    ),
    (
        "Hydra-7 service manual, page 8 of 9: noise and vibration.",
        "The sound pressure level of the Hydra-7 is 78 dB(A) at one metre at full load. Set",
        "the chiller on the spring anti-vibration mounts supplied and connect the water pipes",
        "through flexible connectors so that vibration does not travel into the building.",
    ),
    (
        "Hydra-7 service manual, page 9 of 9: warranty and service.",
        "The Hydra-7 compressors carry a warranty of 36 months from commissioning, the rest of",
        "the chiller 24 months, provided the yearly maintenance is done by an authorised",
        "Northwind partner. Book service visits through the Northwind service portal.",
    ),
)

AURORA_PAGES: tuple[tuple[str, ...], ...] = (
    (
        "Aurora-3 air-to-water heat pump - installation guide, page 1 of 8: overview.",
        "The Aurora-3 heats homes and small offices and makes hot water. Its outdoor unit",
        "gives 14 kW of heating at 7 degrees outside and works down to -25 degrees Celsius.",
    ),
    (
        "Aurora-3 installation guide, page 2 of 8: siting and clearances.",
        "Leave at least 300 mm free behind the Aurora-3 outdoor unit and 1 m in front of it,",
        "where the fan blows out. Do not place it below a bedroom window or in a closed",
        "courtyard where the cold air cannot get away.",
    ),
    (
        "Aurora-3 installation guide, page 3 of 8: base and condensate.",
        "Set the Aurora-3 on a concrete base at least 100 mm above the ground so that snow",
        "cannot block the coil. The condensate drain must run to a soakaway below the frost",
        "line or be fitted with the heating cable kit.",
    ),
    (
        "Aurora-3 installation guide, page 4 of 8: electrical supply.",
        "The Aurora-3 takes a 230 V single-phase supply. Protect it with a 32 A type C circuit",
        "breaker and a residual-current device of 30 mA, and fit a lockable isolator within",
        "sight of the outdoor unit.",
    ),
    (
        "Aurora-3 installation guide, page 5 of 8: water connection.",
        "Connect the Aurora-3 to the heating circuit with 28 mm copper pipes and fit a buffer",
        "tank of at least 50 litres. The flow through the unit must stay above 40 litres per",
        "minute, or the unit stops with a flow alarm.",
    ),
    (
        "Aurora-3 installation guide, page 6 of 8: refrigerant lines.",
        "The Aurora-3 comes pre-charged with 1.9 kg of R-32, enough for refrigerant lines up to",
        "15 m long. For every metre beyond 15 m add 20 g of R-32; lines may not exceed 30 m.",
    ),
    (
        "Aurora-3 installation guide, page 7 of 8: commissioning.",
        "Flush the heating system before the first start, fill it to 1.5 bar cold and bleed",
        "the air. Then set the weather compensation curve for the building on the Aurora-3",
        "controller and record the settings in the commissioning sheet.",
    ),
    (
        "Aurora-3 installation guide, page 8 of 8: noise and warranty.",
        "The Aurora-3 outdoor unit makes 54 dB(A) at one metre. The warranty is five years when",
        "a certified installer commissions the unit and registers it with Northwind within 30",
        "days; otherwise it is two years.",
    ),
)

TRAVEL_PAGES: tuple[tuple[str, ...], ...] = (
    (
        "Northwind travel and expenses policy, page 1 of 8: approval of trips.",
        "Every business trip needs approval before anything is booked: your line manager",
        "approves trips within the country, a director approves trips abroad.",
    ),
    (
        "Northwind travel policy, page 2 of 8: flights.",
        "Book economy class for flights under six hours and premium economy for longer ones.",
        "Business class needs a director's approval. Book at least 14 days ahead when you can.",
    ),
    (
        "Northwind travel policy, page 3 of 8: rail and cars.",
        "Trains are booked in second class. When you drive your own car on a trip we pay 0.30",
        "EUR per kilometre; a hire car must be of the compact class unless four people travel.",
    ),
    (
        "Northwind travel policy, page 4 of 8: hotels.",
        "Hotels are reimbursed up to 160 EUR a night, and up to 220 EUR a night in London,",
        "Paris, Zurich and New York. Book through the travel desk to get the company rates.",
    ),
    (
        "Northwind travel policy, page 5 of 8: meals.",
        "On a trip you receive a daily allowance of 45 EUR for meals, without receipts. When",
        "the hotel includes breakfast, 9 EUR is deducted from that day's allowance.",
    ),
    (
        "Northwind travel policy, page 6 of 8: entertaining clients.",
        "A meal with customers may cost up to 80 EUR per guest including drinks. Write the",
        "names and companies of the guests on the receipt; spirits are never reimbursed.",
    ),
    (
        "Northwind travel policy, page 7 of 8: expense claims.",
        "Submit your expense claim within 30 days of your return, with a receipt for every",
        "item above 25 EUR. Costs paid with the corporate card are matched automatically.",
    ),
    (
        "Northwind travel policy, page 8 of 8: safety on the road.",
        "Register every trip abroad with the travel security service. Trips to countries on",
        "the high-risk list need the approval of the security officer as well as a director.",
    ),
)

INCIDENT_TITLE = "IT security incident procedure"
#: (heading, paragraph) under the document's title (a level-1 heading).
INCIDENT_SECTIONS: tuple[tuple[str, str], ...] = (
    (
        "Scope",
        "This procedure applies to every Northwind employee and contractor who uses a company "
        "laptop, phone or account, at the office, at home or on the road.",
    ),
    (
        "Reporting an incident",
        "Call the service desk on extension 4400 as soon as you notice something, at any hour, "
        "and do not wait until you are sure. The service desk opens a ticket and calls the "
        "security officer on duty.",
    ),
    (
        "Severity levels",
        "P1: customer data or the production network is affected, or a system is encrypted. "
        "P2: one employee's account or device is compromised. P3: a suspicious event with no "
        "known damage. A P1 brings the crisis team together within one hour.",
    ),
    (
        "Lost or stolen devices",
        "Report a lost or stolen laptop or phone within two hours. IT locks the device and "
        "wipes it remotely; file a police report when it was stolen and send the reference.",
    ),
    (
        "Phishing",
        "Do not click links or open attachments in a suspicious email. Forward it as an "
        "attachment to phishing@northwind.example and delete it. If you entered your password, "
        "change it at once and call the service desk.",
    ),
    (
        "Ransomware",
        "If files become unreadable or a message demands payment, unplug the network cable and "
        "switch off Wi-Fi, but leave the computer running so that memory can be examined. Never "
        "pay and never contact the attackers.",
    ),
    (
        "Evidence",
        "Do not delete logs or reinstall a device before the security officer agrees. Devices "
        "taken for examination are labelled and logged on the chain-of-custody form.",
    ),
    (
        "Communication",
        "Only the communications team speaks to the press. When personal data of customers is "
        "affected, the data protection officer informs the authority and the customers within "
        "72 hours.",
    ),
    (
        "Review",
        "Every P1 and P2 incident gets a review meeting within ten working days, with an action "
        "list whose owners and dates are tracked by the security officer.",
    ),
)

#: The spare-parts sheet: one row per (product, component), 40 rows per product.
PRODUCTS: tuple[tuple[str, str, float], ...] = (
    ("Hydra-7", "H7", 3.0),
    ("Aurora-3", "A3", 1.0),
    ("Zephyr-5", "Z5", 1.6),
)
#: (component, base price in EUR, lead time in days).
COMPONENTS: tuple[tuple[str, int, int], ...] = (
    ("compressor contactor", 84, 5),
    ("condenser fan motor", 420, 12),
    ("electronic expansion valve", 265, 10),
    ("oil filter", 38, 3),
    ("fan belt", 22, 2),
    ("filter drier", 56, 4),
    ("sight glass", 31, 4),
    ("high pressure switch", 74, 6),
    ("low pressure switch", 69, 6),
    ("water flow switch", 95, 7),
    ("water temperature sensor", 41, 3),
    ("discharge temperature sensor", 47, 3),
    ("suction temperature sensor", 45, 3),
    ("main control board", 610, 21),
    ("display panel", 230, 14),
    ("door gasket", 28, 5),
    ("crankcase heater", 64, 7),
    ("anti-vibration mount", 36, 5),
    ("service valve", 52, 6),
    ("pressure transducer", 118, 8),
    ("phase monitor relay", 88, 9),
    ("circulation pump", 540, 15),
    ("condensate pump", 130, 8),
    ("air filter", 19, 2),
    ("fan blade", 96, 10),
    ("motor run capacitor", 27, 3),
    ("four-way reversing valve", 310, 18),
    ("shaft seal kit", 145, 11),
    ("bearing kit", 175, 12),
    ("insulation kit", 60, 6),
    ("drain pan", 85, 9),
    ("coil cleaning kit", 49, 4),
    ("pressure relief valve", 66, 6),
    ("isolation valve", 58, 5),
    ("water strainer", 43, 4),
    ("room thermostat", 99, 5),
    ("communication module", 185, 16),
    ("fuse kit", 24, 2),
    ("terminal block", 33, 3),
    ("refrigerant charging hose", 71, 4),
)
LABOUR_RATES: tuple[tuple[str, str], ...] = (
    ("Service technician, per hour", "95 EUR"),
    ("Refrigeration engineer, per hour", "120 EUR"),
    ("Call-out fee, working days", "80 EUR"),
    ("Call-out fee, weekends and public holidays", "190 EUR"),
    ("Travel, per kilometre beyond 50 km", "0.90 EUR"),
    ("Annual maintenance contract, Aurora-3", "290 EUR"),
    ("Annual maintenance contract, Hydra-7", "4,800 EUR"),
)


def part_number(code: str, index: int) -> str:
    """The part number of component `index` (1-based) of the product with `code`."""
    return f"NW-{code}-{index:03d}"


def part_rows() -> list[list[object]]:
    """The `Parts` sheet: a header, then 40 rows per product (rows 2-41, 42-81, 82-121)."""
    rows: list[list[object]] = [["Part number", "Model", "Component", "Price EUR", "Lead time"]]
    for model, code, factor in PRODUCTS:
        for index, (component, price, lead) in enumerate(COMPONENTS, start=1):
            rows.append(
                [part_number(code, index), model, component, round(price * factor), f"{lead} days"]
            )
    return rows


def _pdf(pages: Sequence[Sequence[str]], title: str) -> str:
    return encode_document(pdf_bytes(pages, title=title))


def documents_entities() -> tuple[EvalEntity, ...]:
    """The five files as eval entities (their content the file, base64)."""

    def entity(entity_id: str, title: str, fmt: ContentFormat, file: str, body: str) -> EvalEntity:
        return EvalEntity(
            entity_id=entity_id,
            tenant=TENANT,
            entity_type="KNOWLEDGE_ARTIFACT",
            title=title,
            content=body,
            format=fmt,
            metadata={"file_name": file},
        )

    incident: list[tuple[str, str]] = [("h1", INCIDENT_TITLE)]
    for heading, text in INCIDENT_SECTIONS:
        incident += [("h2", heading), ("p", text)]
    labour: list[list[object]] = [["Service", "Rate"]]
    labour += [[service, rate] for service, rate in LABOUR_RATES]
    sheets: list[tuple[str, Sequence[Sequence[object]]]] = [
        ("Parts", part_rows()),
        ("Labour rates", labour),
    ]
    return (
        entity(
            HYDRA,
            "Hydra-7 chiller service manual",
            ContentFormat.PDF,
            "hydra7-service-manual.pdf",
            _pdf(HYDRA_PAGES, "Hydra-7 service manual"),
        ),
        entity(
            AURORA,
            "Aurora-3 heat pump installation guide",
            ContentFormat.PDF,
            "aurora3-installation-guide.pdf",
            _pdf(AURORA_PAGES, "Aurora-3 installation guide"),
        ),
        entity(
            TRAVEL,
            "Travel and expenses policy",
            ContentFormat.PDF,
            "travel-policy.pdf",
            _pdf(TRAVEL_PAGES, "Northwind travel and expenses policy"),
        ),
        entity(
            INCIDENT,
            INCIDENT_TITLE,
            ContentFormat.DOCX,
            "security-incident-procedure.docx",
            encode_document(docx_bytes(incident)),
        ),
        entity(
            PARTS,
            "Spare parts and labour price list",
            ContentFormat.XLSX,
            "spare-parts.xlsx",
            encode_document(xlsx_bytes(sheets)),
        ),
    )


def _page(n: int) -> str:
    return f"p. {n}"


def _section(heading: str) -> str:
    return f"{INCIDENT_TITLE} > {heading}"


_H7_BLOCK, _A3_BLOCK, _Z5_BLOCK = "Parts > rows 2-41", "Parts > rows 42-81", "Parts > rows 82-121"
_LABOUR = f"Labour rates > rows 2-{len(LABOUR_RATES) + 1}"

#: (entity, locator, kind, question): each answered by that one passage.
QUESTIONS: tuple[tuple[str, str, QueryKind, str], ...] = (
    (HYDRA, _page(1), QueryKind.KEYWORD, "What cooling capacity does the Hydra-7 deliver?"),
    (HYDRA, _page(2), QueryKind.KEYWORD, "How much refrigerant is in each Hydra-7 circuit?"),
    (HYDRA, _page(3), QueryKind.HARD_NEGATIVE, "What breaker protects the Hydra-7 supply?"),
    (HYDRA, _page(4), QueryKind.KEYWORD, "How often are the Hydra-7 condenser tubes cleaned?"),
    (
        HYDRA,
        _page(4),
        QueryKind.PARAPHRASE,
        "Which chemical may I use to remove scale from the chiller's heat-rejection tubes?",
    ),
    (HYDRA, _page(5), QueryKind.KEYWORD, "When is the compressor oil of the Hydra-7 changed?"),
    (HYDRA, _page(6), QueryKind.EXACT_IDENTIFIER, "What does alarm H-31 mean?"),
    (
        HYDRA,
        _page(7),
        QueryKind.PARAPHRASE,
        "The chiller's pipes outside could freeze in winter: what goes into the water?",
    ),
    (HYDRA, _page(8), QueryKind.HARD_NEGATIVE, "How loud is the Hydra-7 at one metre?"),
    (
        HYDRA,
        _page(9),
        QueryKind.HARD_NEGATIVE,
        "How long is the warranty on the Hydra-7 compressors?",
    ),
    (
        AURORA,
        _page(2),
        QueryKind.KEYWORD,
        "How much free space is needed in front of the Aurora-3 outdoor unit?",
    ),
    (
        AURORA,
        _page(3),
        QueryKind.PARAPHRASE,
        "How high off the ground should the heat pump stand so snow does not bury it?",
    ),
    (
        AURORA,
        _page(4),
        QueryKind.HARD_NEGATIVE,
        "What circuit breaker and RCD does the Aurora-3 need?",
    ),
    (AURORA, _page(5), QueryKind.KEYWORD, "Which pipe size connects the Aurora-3 to the heating?"),
    (
        AURORA,
        _page(6),
        QueryKind.KEYWORD,
        "How much R-32 must be added per metre when the Aurora-3 lines are longer than 15 m?",
    ),
    (
        AURORA,
        _page(7),
        QueryKind.PARAPHRASE,
        "To what pressure is the heating system filled before the heat pump first starts?",
    ),
    (
        AURORA,
        _page(8),
        QueryKind.HARD_NEGATIVE,
        "What does an installer have to do to get five years of Aurora-3 warranty?",
    ),
    (AURORA, _page(1), QueryKind.KEYWORD, "Down to what outdoor temperature does Aurora-3 work?"),
    (TRAVEL, _page(1), QueryKind.KEYWORD, "Who approves a business trip abroad?"),
    (
        TRAVEL,
        _page(2),
        QueryKind.PARAPHRASE,
        "Can I fly the roomier cabin on a thirteen-hour flight to Singapore?",
    ),
    (TRAVEL, _page(3), QueryKind.KEYWORD, "What is paid per kilometre when I drive my own car?"),
    (TRAVEL, _page(4), QueryKind.KEYWORD, "What is the hotel limit per night in Paris?"),
    (TRAVEL, _page(5), QueryKind.KEYWORD, "How much is the daily meal allowance on a trip?"),
    (
        TRAVEL,
        _page(6),
        QueryKind.PARAPHRASE,
        "How much may I spend per person when I take customers out to dinner?",
    ),
    (TRAVEL, _page(7), QueryKind.KEYWORD, "By when must I hand in my expense claim?"),
    (
        TRAVEL,
        _page(8),
        QueryKind.HARD_NEGATIVE,
        "Whose approval do I need to travel to a high-risk country?",
    ),
    (
        INCIDENT,
        _section("Reporting an incident"),
        QueryKind.KEYWORD,
        "Which number do I call to report a security incident?",
    ),
    (
        INCIDENT,
        _section("Lost or stolen devices"),
        QueryKind.PARAPHRASE,
        "I left my work laptop on the train. What now?",
    ),
    (
        INCIDENT,
        _section("Phishing"),
        QueryKind.KEYWORD,
        "Where do I forward a suspicious phishing email?",
    ),
    (
        INCIDENT,
        _section("Ransomware"),
        QueryKind.PARAPHRASE,
        "My screen says all my files are locked until I pay in bitcoin. What do I do?",
    ),
    (
        INCIDENT,
        _section("Communication"),
        QueryKind.KEYWORD,
        "How soon must customers be told when their personal data is affected?",
    ),
    (
        INCIDENT,
        _section("Review"),
        QueryKind.HARD_NEGATIVE,
        "When is the review meeting held after a P1 incident?",
    ),
    (
        INCIDENT,
        _section("Severity levels"),
        QueryKind.HARD_NEGATIVE,
        "What makes a security incident a P1?",
    ),
    (
        PARTS,
        _A3_BLOCK,
        QueryKind.HARD_NEGATIVE,
        "What does the electronic expansion valve for the Aurora-3 cost?",
    ),
    (PARTS, _H7_BLOCK, QueryKind.HARD_NEGATIVE, "What is the lead time of the Hydra-7 oil filter?"),
    (PARTS, _Z5_BLOCK, QueryKind.HARD_NEGATIVE, "Part number of the Zephyr-5 fan belt"),
    (PARTS, _A3_BLOCK, QueryKind.EXACT_IDENTIFIER, part_number("A3", 14)),
    (PARTS, _Z5_BLOCK, QueryKind.EXACT_IDENTIFIER, f"price of {part_number('Z5', 22)}"),
    (PARTS, _LABOUR, QueryKind.KEYWORD, "What is the hourly rate of a service technician?"),
    (
        PARTS,
        _LABOUR,
        QueryKind.PARAPHRASE,
        "What does it cost to have someone come out on a Sunday?",
    ),
)


def documents_evalset() -> EvalSet:
    """The generated files and their questions."""
    queries = tuple(
        EvalQuery(
            query_id=f"doc-{n:02d}",
            text=text,
            tenant=TENANT,
            kind=kind,
            answerable=True,
            relevant={entity_id: 3},
            expected_passage=f"{entity_id}#{locator}",
        )
        for n, (entity_id, locator, kind, text) in enumerate(QUESTIONS, start=1)
    )
    return EvalSet(
        name=f"ragstream-{NAME}",
        version=VERSION,
        description=__doc__ or "",
        entities=documents_entities(),
        queries=queries,
    )
