"""Documents with headings, generated for the context_header tests: Markdown, HTML, DOCX (python-docx)
and a PDF whose outline (bookmarks) is written by hand (PDF 32000-1 12.3.3), each with the same
sections: "Solar plant manual" > "Heliostats" > "Cleaning", and "Solar plant manual" > "Receiver".
Each section's body holds one word no other section has, so a search lands on it."""

from __future__ import annotations

import io

from helpers import pdf_file

FILLER = ("The plant keeps a written log of every inspection, and the crew reads it at the start of each "
          "shift so that nothing noticed by the previous team is lost or repeated without reason. ")
BODY = FILLER * 6  # ~1,000 characters: each section is a chunk of its own
WORDS = {"azimuth": ("Solar plant manual", "Heliostats"),
         "brushes": ("Solar plant manual", "Heliostats", "Cleaning"),
         "moltensalt": ("Solar plant manual", "Receiver")}


def markdown() -> str:
    return (f"# Solar plant manual\n\n## Heliostats\n\n{BODY}azimuth tracking.\n\n"
            f"```sh\n# not a heading: a shell comment\nls\n```\n\n"
            f"### Cleaning\n\n{BODY}brushes and water.\n\n"
            f"## Receiver\n\n{BODY}moltensalt loop.\n")


def markdown_setext() -> str:
    return (f"Solar plant manual\n==================\n\nHeliostats\n----------\n\n{BODY}azimuth tracking.\n\n"
            f"### Cleaning\n\n{BODY}brushes and water.\n\nReceiver\n--------\n\n{BODY}moltensalt loop.\n")


def html() -> str:
    return ("<html><head><title>Manual</title></head><body><header><h1>Site banner</h1></header><main>"
            f"<h1>Solar plant manual</h1><h2>Heliostats</h2><p>{BODY}azimuth tracking.</p>"
            f"<h3>Cleaning</h3><p>{BODY}brushes and water.</p>"
            f"<h2>Receiver</h2><div><p>{BODY}moltensalt loop.</p></div></main></body></html>")


def docx() -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    document.add_heading("Solar plant manual", level=1)
    document.add_heading("Heliostats", level=2)
    document.add_paragraph(BODY + "azimuth tracking.")
    document.add_heading("Cleaning", level=3)
    document.add_paragraph(BODY + "brushes and water.")
    document.add_heading("Receiver", level=2)
    document.add_paragraph(BODY + "moltensalt loop.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _pdf_string(text: str) -> bytes:
    return b"(" + text.encode("latin-1").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def pdf_with_outline(pages: list[str], outline: list[tuple[int, str, int]], *, action_for: str = "") -> bytes:
    """A PDF with one text line per page and an outline of (level >= 1, title, 0-based page) entries in
    document order; the entry titled `action_for` points at its page by a GoTo action, not a /Dest."""
    objects: list[bytes] = [b"", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", b""]
    page_ids = []
    for text in pages:
        content = b"BT /F1 12 Tf 72 720 Td %s Tj ET" % _pdf_string(text)
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % len(objects))
        page_ids.append(len(objects))
    first_item = len(objects) + 1
    ids = [first_item + i for i in range(len(outline))]
    parent = [4] * len(outline)  # object 4 is the outline root
    stack: list[int] = []
    for i, (level, _, _) in enumerate(outline):
        del stack[level - 1:]
        parent[i] = ids[stack[-1]] if stack else 4
        stack.append(i)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    for i, (_, title, page) in enumerate(outline):
        siblings = children[parent[i]]
        at = siblings.index(i)
        target = b"[%d 0 R /Fit]" % page_ids[page]
        entry = b"<< /Title %s /Parent %d 0 R " % (_pdf_string(title), parent[i])
        entry += (b"/A << /S /GoTo /D %s >> " % target) if title == action_for else (b"/Dest %s " % target)
        if at > 0:
            entry += b"/Prev %d 0 R " % ids[siblings[at - 1]]
        if at + 1 < len(siblings):
            entry += b"/Next %d 0 R " % ids[siblings[at + 1]]
        if kids := children.get(ids[i]):
            entry += b"/First %d 0 R /Last %d 0 R /Count %d " % (ids[kids[0]], ids[kids[-1]], len(kids))
        objects.append(entry + b">>")
    top = children.get(4, [])
    objects[3] = (b"<< /Type /Outlines /First %d 0 R /Last %d 0 R /Count %d >>"
                  % (ids[top[0]], ids[top[-1]], len(top))) if top else b"<< /Type /Outlines /Count 0 >>"
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R /Outlines 4 0 R >>"
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % p for p in page_ids),
                                                               len(page_ids))
    return pdf_file(objects)


def manual_pdf() -> bytes:
    """Five pages: a title page, the two Heliostats pages (the second one under Cleaning, reached by a
    GoTo action), an unbookmarked page that stays under Cleaning, and the Receiver page."""
    pages = ["Solar plant manual, edition 3.", "Heliostats: azimuth tracking keeps the mirrors aligned.",
             "Cleaning: brushes and water remove the dust.", "More cleaning notes: brushes wear out.",
             "Receiver: the moltensalt loop carries the heat."]
    outline = [(1, "Solar plant manual", 0), (2, "Heliostats", 1), (3, "Cleaning", 2), (2, "Receiver", 4)]
    return pdf_with_outline(pages, outline, action_for="Cleaning")
