"""Typed relations between entities a sentence states (issue 31): "Acme Corp. acquired Initech GmbH".

Simple, testable patterns over the words *between* two entities that follow each other in one sentence
(kdbl_core.content.entities finds them): what stands between decides the relation and its direction.

| relation | subject, object | between them, e.g. |
|---|---|---|
| ACQUIRED | ORG, ORG | "acquired", "bought", "has agreed to acquire", "completed the acquisition of" |
| PARTNERS_WITH | ORG, ORG | "partners with", "signed an agreement with", "teamed up with" |
| COMPETES_WITH | ORG, ORG | "competes with", "rivals" |
| LOCATED_IN | ORG or EVENT, PLACE | "is based in", "headquartered in", "opened an office in" |
| WORKS_FOR | PERSON, ORG | ", chief executive of", "joined", "works for" — or ORG, PERSON: "'s CEO" (reversed) |

A relation rests on its chunk: row-level security shows it to whoever may read the chunk (migration 0025).
Precision over recall: a sentence the patterns do not cover gives a co-occurrence only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdbl_core.content.entities import Mention

RELATIONS = ("ACQUIRED", "PARTNERS_WITH", "COMPETES_WITH", "LOCATED_IN", "WORKS_FOR")
_ROLE = (r"(?:the\s+)?(?:chief\s+\w+\s+officer|chief\s+executive|ceo|cfo|cto|coo|president|vice\s+president|founder|"
         r"co-?founder|managing\s+director|director|chair(?:man|woman|person)?|head|manager|partner|professor|"
         r"researcher|engineer|analyst|spokes(?:man|woman|person))")
# (relation, subject types, object types, the words between, reversed: the object comes first in the text)
_PATTERNS: tuple[tuple[str, frozenset[str], frozenset[str], re.Pattern[str], bool], ...] = tuple(
    (name, frozenset(subject), frozenset(obj), re.compile(rf"^\s*(?:{between})\s*$", re.IGNORECASE), reverse)
    for name, subject, obj, between, reverse in (
        ("ACQUIRED", {"ORG"}, {"ORG"}, r"(?:has\s+|had\s+|will\s+)?(?:acquired|acquires|acquire|bought|buys|buy|"
         r"purchased|purchases|took\s+over|takes\s+over|(?:has\s+)?agreed\s+to\s+(?:acquire|buy)|"
         r"completed\s+(?:its|the)\s+(?:acquisition|purchase|takeover)\s+of|announced\s+(?:its|the)\s+"
         r"(?:acquisition|purchase)\s+of|plans\s+to\s+(?:acquire|buy))", False),
        ("PARTNERS_WITH", {"ORG"}, {"ORG"}, r"(?:has\s+)?(?:partnered|partners|is\s+partnering|teamed\s+up|teams\s+up|"
         r"signed(?:\s+an?\s+(?:agreement|deal|contract|partnership))?|formed\s+a\s+partnership|collaborates|"
         r"collaborated|entered\s+(?:into\s+)?a\s+partnership)\s+with", False),
        ("COMPETES_WITH", {"ORG"}, {"ORG"}, r"(?:competes|competed|compete)\s+(?:with|against)|rivals|"
         r"is\s+a\s+(?:competitor|rival)\s+(?:of|to)", False),
        ("LOCATED_IN", {"ORG", "EVENT"}, {"PLACE"}, r"(?:,\s*)?(?:is\s+|are\s+|was\s+)?(?:based|located|headquartered|"
         r"held|hosted)\s+in|(?:has\s+|had\s+)?(?:opened|opens|opening|moved|moves|relocated)\s+(?:an?\s+|its\s+)?"
         r"(?:new\s+)?(?:office|offices|headquarters|hq|plant|factory|site|campus|branch)\s+in|in", False),
        ("WORKS_FOR", {"PERSON"}, {"ORG"}, rf",\s*{_ROLE}\s+(?:of|at)|,?\s*(?:who\s+)?(?:joined|joins|works\s+for|"
         rf"worked\s+for|works\s+at|worked\s+at|is\s+employed\s+by|leads|led|heads|headed|founded|co-?founded)|"
         rf"\s+is\s+{_ROLE}\s+(?:of|at)", False),
        ("WORKS_FOR", {"PERSON"}, {"ORG"}, rf"(?:'s|’s)?\s*{_ROLE}", True),
    ))
_SENTENCE_END = re.compile(r"[.!?]\s+[A-Z]|\n\s*\n")


@dataclass(frozen=True, slots=True)
class Relation:
    subject: Mention
    object: Mention
    type: str


def relations(text: str, mentions: list[Mention]) -> list[Relation]:
    """The typed relations between consecutive mentions of one sentence of `text` (module docstring)."""
    found: list[Relation] = []
    for first, second in zip(mentions, mentions[1:]):
        between = text[first.end:second.start]
        if len(between) > 80 or _SENTENCE_END.search(between):
            continue
        for name, subjects, objects, pattern, reverse in _PATTERNS:
            subject, obj = (second, first) if reverse else (first, second)
            if name == "LOCATED_IN" and between.strip().casefold() == "in" and first.type != "EVENT":
                continue  # "Acme in Zurich" says too little, but "the Web Summit in Lisbon" is where it is held
            if subject.type in subjects and obj.type in objects and pattern.match(between):
                found.append(Relation(subject, obj, name))
                break
    return found
