"""A PDF without an Info /Author names its authors from its XMP metadata's dc:creator (issue 16). The PDFs
are built here: helpers.make_pdf's pages, with a /Metadata stream added to the catalog by pypdf
(plain and Flate-compressed), extracted in the real sandbox path (kdbl_worker.extract)."""

from __future__ import annotations

import io

from helpers import make_pdf, pdf_text_page
from pypdf import PdfReader, PdfWriter
from pypdf.generic import NameObject, StreamObject

from kdbl_worker.extract import Source, extract
from kdbl_worker.extract.authors import pdf_xmp_creators, xmp_creators


def xmp(creators: str) -> bytes:
    return ('<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
            '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/">'
            f'<dc:title><rdf:Alt><rdf:li xml:lang="x-default">Otters</rdf:li></rdf:Alt></dc:title>{creators}'
            '</rdf:Description></rdf:RDF></x:xmpmeta><?xpacket end="w"?>').encode()


SEQ = "<dc:creator><rdf:Seq><rdf:li>Ada Lovelace</rdf:li><rdf:li>Grace  Hopper</rdf:li></rdf:Seq></dc:creator>"


def with_xmp(packet: bytes, *, info: bytes = b"", compress: bool = False) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf([pdf_text_page("Otters hold hands")], info=info))))
    stream = StreamObject()
    stream.set_data(packet)
    stream[NameObject("/Type")] = NameObject("/Metadata")
    stream[NameObject("/Subtype")] = NameObject("/XML")
    if compress:
        stream = stream.flate_encode()
    writer.root_object[NameObject("/Metadata")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def run(data: bytes):
    return extract(Source(io.BytesIO(data), "otters.pdf", len(data)))


def test_a_pdf_without_an_info_author_takes_its_authors_from_xmp_dc_creator():
    for compress in (False, True):
        result = run(with_xmp(xmp(SEQ), compress=compress))
        assert result.status == "ok" and "Otters hold hands" in result.blocks[0].text
        assert result.authors == ["Ada Lovelace", "Grace Hopper"]


def test_the_info_dictionarys_author_wins_over_xmp():
    result = run(with_xmp(xmp(SEQ), info=b"/Author (Jane Doe)"))
    assert result.authors == ["Jane Doe"]


def test_bad_or_hostile_xmp_gives_no_authors_and_the_file_is_still_read():
    bomb = (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
            b'<x:xmpmeta xmlns:x="adobe:ns:meta/" xmlns:dc="http://purl.org/dc/elements/1.1/">'
            b'<dc:creator>&b;</dc:creator></x:xmpmeta>')
    for packet in (b"<x:xmpmeta not xml", bomb, xmp("")):
        result = run(with_xmp(packet))
        assert result.status == "ok" and result.authors == []


def test_xmp_creators_reads_a_seq_a_bag_a_plain_element_and_the_attribute_form():
    bag = "<dc:creator><rdf:Bag><rdf:li>Doe, Jane; Roe</rdf:li></rdf:Bag></dc:creator>"
    assert xmp_creators(xmp(SEQ)) == ["Ada Lovelace", "Grace Hopper"]
    assert xmp_creators(xmp(bag)) == ["Doe, Jane", "Roe"]
    assert xmp_creators(xmp("<dc:creator>Solo Author</dc:creator>")) == ["Solo Author"]
    attribute = xmp("").replace(b'rdf:about=""', b'rdf:about="" dc:creator="Attr Author"')
    assert xmp_creators(attribute) == ["Attr Author"]


def test_a_pdf_pypdf_cannot_read_strictly_gives_no_xmp_authors():
    assert pdf_xmp_creators(io.BytesIO(b"%PDF-1.4\nnot really a pdf")) == []
    assert pdf_xmp_creators(io.BytesIO(make_pdf([pdf_text_page("No metadata")]))) == []
