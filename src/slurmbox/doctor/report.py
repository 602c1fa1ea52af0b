"""Results of doctor checks and the shape of ``slurmbox doctor --json``."""

from dataclasses import asdict, dataclass

PASS, WARN, FAIL, NOT_PRESENT = "pass", "warn", "fail", "not-present"
STATUSES = (PASS, WARN, FAIL, NOT_PRESENT)
SCHEMA_ID = "slurmbox-doctor/1"


@dataclass
class Check:
    """One check's outcome: ``id`` (stable, e.g. "runsc.version"), ``group``
    (runtime|devices|node), ``status`` (one of STATUSES), ``summary`` (what was
    found) and ``action`` (what to do; "none" when nothing is)."""

    id: str
    group: str
    status: str
    summary: str
    action: str = "none"

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError("status %r is not one of %s" % (self.status, STATUSES))


def report(node, checks):
    """The --json document for ``checks`` run on ``node`` (see JSON_SCHEMA)."""
    counts = {status: sum(1 for c in checks if c.status == status) for status in STATUSES}
    return {"schema": SCHEMA_ID, "node": node, "ok": counts[FAIL] == 0, "summary": counts,
            "checks": [asdict(c) for c in checks]}


#: JSON Schema (draft 2020-12) of the --json output, for fleet tooling.
JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "slurmbox doctor report",
    "type": "object",
    "required": ["schema", "node", "ok", "summary", "checks"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "node": {"type": "string", "minLength": 1},
        "ok": {"type": "boolean"},
        "summary": {
            "type": "object",
            "required": list(STATUSES),
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
        },
        "checks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "group", "status", "summary", "action"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "pattern": "^[a-z][a-z0-9_-]*(\\.[a-z0-9_-]+)*$"},
                    "group": {"enum": ["runtime", "devices", "node"]},
                    "status": {"enum": list(STATUSES)},
                    "summary": {"type": "string", "minLength": 1},
                    "action": {"type": "string", "minLength": 1},
                },
            },
        },
    },
}
