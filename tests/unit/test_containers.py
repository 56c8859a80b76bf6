"""Container expansion (extract/containers.py): archive members and e-mail attachments as child files.

Every archive and message is generated here (zip, tar in its compressions, 7z, EML, an Outlook MSG
written as a compound file to [MS-CFB]/[MS-OXMSG]); hostile ones are built by patching the bytes of
real ones. Nothing comes from outside the repository.
"""

from __future__ import annotations

import io
import random
import stat
import struct
import sys
import tarfile
import tracemalloc
import zipfile
import zlib
from email.message import EmailMessage

import py7zr
import pytest
from helpers import make_pdf, pdf_text_page
from kdbl_core.errors import NotFound
from kdbl_worker.extract import Source, extract
from kdbl_worker.extract.containers import (
    MEMBER_SEP,
    Bounds,
    Budget,
    Member,
    child_key,
    expand,
    is_container,
    member_path,
    read_member,
)
from test_extract_formats import build_cfb

MIB = 1 << 20


def zip_bytes(members: dict[str, bytes | str], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes], mode: str = "w:gz", **kwargs) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, **kwargs) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sevenzip_bytes(members: dict[str, bytes], password: str | None = None,
                   header_encryption: bool = False) -> bytes:
    buf = io.BytesIO()
    with py7zr.SevenZipFile(buf, "w", password=password, header_encryption=header_encryption) as archive:
        for name, data in members.items():
            archive.writestr(data, name)
    return buf.getvalue()


def members_of(name: str, data: bytes, bounds: Bounds | None = None,
               budget: Budget | None = None) -> tuple[list[Member], list[str]]:
    expansion = expand(name, io.BytesIO(data), bounds or Bounds(), budget if budget is not None else Budget())
    return list(expansion.members), expansion.problems


def text_of(name: str, data: bytes) -> str:
    result = extract(Source(io.BytesIO(data), name, len(data)))
    assert result.status == "ok", (name, result.reason)
    return "\n".join(block.text for block in result.blocks)


def docx_bytes(text: str) -> bytes:
    import docx

    document = docx.Document()
    document.add_paragraph(text)
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


PDF = make_pdf([pdf_text_page("Quarterly duck census: 42 ducks")])


# --- archives --------------------------------------------------------------------------------------


def test_zip_members_with_nested_documents_and_a_nested_zip_expand_level_by_level():
    nested = zip_bytes({"deep/c.md": "# Deep\n\nThe innermost note."})
    bundle = zip_bytes({
        "docs/": "",
        "docs/a.md": "# Alpha\n\nFirst note.",
        "docs/report.pdf": PDF,
        "docs/notes.docx": docx_bytes("Minutes of the pond meeting"),
        "inner/nested.zip": nested,
    })
    budget = Budget()
    members, problems = members_of("bundle.zip", bundle, budget=budget)
    assert problems == []
    assert [(m.path, m.size) for m in members] == [
        ("docs/a.md", 20), ("docs/report.pdf", len(PDF)), ("docs/notes.docx", members[2].size),
        ("inner/nested.zip", len(nested))]
    by_path = {m.path: m.data for m in members}
    assert "First note." in text_of("docs/a.md", by_path["docs/a.md"])
    assert "42 ducks" in text_of("docs/report.pdf", by_path["docs/report.pdf"])
    assert "pond meeting" in text_of("docs/notes.docx", by_path["docs/notes.docx"])
    assert is_container("inner/nested.zip")
    deep, problems = members_of("inner/nested.zip", by_path["inner/nested.zip"], budget=budget)
    assert [(m.path, m.data) for m in deep] == [("deep/c.md", b"# Deep\n\nThe innermost note.")]
    assert budget.members == 5 and budget.bytes == sum(m.size for m in members + deep)
    assert child_key(child_key("bundle.zip", "inner/nested.zip"), "deep/c.md") == \
        "bundle.zip!/inner/nested.zip!/deep/c.md"
    assert MEMBER_SEP == "!/"


def test_archive_is_its_own_searchable_row_listing_member_paths_and_sizes():
    bundle = zip_bytes({"docs/a.md": "alpha", "docs/a.md ": "x", "b.txt": "bravo!"})
    result = extract(Source(io.BytesIO(bundle), "bundle.zip", len(bundle)))
    assert (result.status, result.content_type) == ("ok", "application/zip")
    assert result.blocks[0].text.split("\n") == [
        "Archive members: 3 (12 bytes expanded)", "docs/a.md (5 bytes)", "docs/a.md  (1 bytes)",
        "b.txt (6 bytes)"]
    data = tar_bytes({f"f{i:03}.txt": b"x" * i for i in range(120)}, mode="w:xz")
    result = extract(Source(io.BytesIO(data), "many.tar.xz", len(data)))
    assert (result.status, result.content_type) == ("ok", "application/x-xz")
    assert [len(b.text.split("\n")) for b in result.blocks] == [51, 50, 20]  # head line + 50 a block
    assert "f119.txt (119 bytes)" in result.blocks[-1].text


@pytest.mark.parametrize("name,mode", [("b.tar.gz", "w:gz"), ("b.tgz", "w:gz"), ("b.tar.bz2", "w:bz2"),
                                       ("b.tar.xz", "w:xz"), ("b.tar", "w")])
def test_tar_members_in_every_compression_are_read_as_one_stream(name, mode):
    data = tar_bytes({"docs/a.md": b"# A\n\nalpha", "report.pdf": PDF}, mode=mode)
    members, problems = members_of(name, data)
    assert problems == []
    assert [(m.path, m.data) for m in members] == [("docs/a.md", b"# A\n\nalpha"), ("report.pdf", PDF)]
    assert read_member(name, io.BytesIO(data), "report.pdf") == PDF
    assert is_container(name)


def test_compression_is_recognised_by_content_not_name():
    data = tar_bytes({"a.txt": b"alpha"}, mode="w:bz2")
    members, problems = members_of("mislabelled.tar.gz", data)
    assert ([(m.path, m.data) for m in members], problems) == ([("a.txt", b"alpha")], [])


def test_sevenzip_members_and_its_listing():
    data = sevenzip_bytes({"docs/a.md": b"# A\n\nalpha", "docs/report.pdf": PDF, "b.txt": b""})
    members, problems = members_of("b.7z", data)
    assert problems == []
    assert sorted((m.path, m.data) for m in members) == [("b.txt", b""), ("docs/a.md", b"# A\n\nalpha"),
                                                          ("docs/report.pdf", PDF)]
    assert read_member("b.7z", io.BytesIO(data), "docs/report.pdf") == PDF
    assert "docs/a.md (10 bytes)" in text_of("b.7z", data)


def test_sevenzip_members_larger_than_one_batch_are_all_read():
    parts = {f"part{i}.bin": random.Random(i).randbytes(300_000) for i in range(5)}
    members, problems = members_of("big.7z", sevenzip_bytes(parts), Bounds(max_member_bytes=700_000))
    assert problems == []
    assert {m.path: m.data for m in members} == parts


def test_encrypted_members_are_refused_by_name():
    members, problems = members_of("locked.7z", sevenzip_bytes({"secret.txt": b"s" * 100}, password="pw"))
    assert [(m.path, m.data, m.problem) for m in members] == [
        ("secret.txt", None, "encrypted member (encrypted/password-protected)")]
    assert problems == ["secret.txt: encrypted member (encrypted/password-protected)"]
    members, problems = members_of("names.7z", sevenzip_bytes({"s.txt": b"s"}, password="pw",
                                                              header_encryption=True))
    assert members == [] and "encrypted archive" in problems[0]
    plain = zip_bytes({"open.txt": "hello", "locked.txt": "secret"})
    patched = bytearray(plain)
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = patched.rfind(signature)  # the second member's headers come last
        patched[at + flag_at] |= 0x1
    members, problems = members_of("mixed.zip", bytes(patched))
    assert [(m.path, m.data, m.problem) for m in members] == [
        ("open.txt", b"hello", None), ("locked.txt", None, "encrypted member (encrypted/password-protected)")]


def test_directories_symlinks_devices_and_links_are_not_members():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for name, kind in (("dir", tarfile.DIRTYPE), ("link", tarfile.SYMTYPE), ("hard", tarfile.LNKTYPE),
                           ("fifo", tarfile.FIFOTYPE), ("dev", tarfile.CHRTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, "file.txt" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            archive.addfile(info)
        info = tarfile.TarInfo("file.txt")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"data"))
    members, problems = members_of("special.tar", buf.getvalue())
    assert ([(m.path, m.data) for m in members], problems) == ([("file.txt", b"data")], [])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        link = zipfile.ZipInfo("etc-link")
        link.create_system, link.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
        archive.writestr("folder/", "")
        archive.writestr("real.txt", "real")
    members, problems = members_of("special.zip", buf.getvalue())
    assert ([(m.path, m.data) for m in members], problems) == ([("real.txt", b"real")], [])


# --- hostile names -----------------------------------------------------------------------------------


def test_hostile_member_names_are_normalised_and_never_escape():
    long_name = "d" * 300 + "/" + "n" * 400 + ".txt"
    names = ["../../etc/passwd", "/abs/x.txt", "C:\\Windows\\win.ini", "a/./b//c.txt", "nulX.pdf.exe",
             "a/../../b.txt", "x!/y.txt", "..", "dup.txt", "dup.txt", "dup (2).txt", "ctl\x07\x1b.txt",
             "bundle.tar.gz", "bundle.tar.gz", long_name]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive, pytest.warns(UserWarning, match="Duplicate name"):
        for number, name in enumerate(names):
            archive.writestr(zipfile.ZipInfo(name), f"member {number}")
    data = buf.getvalue().replace(b"nulX", b"nul\x00")  # zipfile cuts names at NUL: patch the stored ones
    members, problems = members_of("hostile.zip", data)
    paths = [m.path for m in members]
    assert paths[:14] == ["etc/passwd", "abs/x.txt", "Windows/win.ini", "a/b/c.txt", "nul_.pdf.exe",
                          "a/b.txt", "x!_/y.txt", "_", "dup.txt", "dup (2).txt", "dup (2) (2).txt",
                          "ctl__.txt",
                          "bundle.tar.gz", "bundle (2).tar.gz"]
    assert len(paths[14].encode()) <= 1024 and paths[14].endswith(".txt")
    assert all(len(part.encode()) <= 255 for part in paths[14].split("/"))
    assert len(set(paths)) == len(paths) and problems == []
    for path in paths:
        assert not path.startswith("/") and ".." not in path.split("/") and MEMBER_SEP not in path
        assert "\x00" not in path and member_path(path) == path  # normalising is idempotent
    assert read_member("hostile.zip", io.BytesIO(data), "dup (2) (2).txt") == b"member 10"


def _rename(data: bytes, placeholder: bytes, stored: bytes, flag: int | None = None) -> bytes:
    """Replace a member name in both zip headers (same length), optionally clearing the UTF-8 flag."""
    assert len(placeholder) == len(stored)
    patched = bytearray(data.replace(placeholder, stored))
    if flag is not None:
        for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            at = patched.find(signature)
            while at >= 0:
                patched[at + flag_at] &= ~flag & 0xFF
                patched[at + flag_at + 1] &= ~(flag >> 8) & 0xFF
                at = patched.find(signature, at + 4)
    return bytes(patched)


def test_zip_names_without_the_utf8_flag_are_decoded_as_their_writer_meant():
    data = zip_bytes({"XXXXXX.txt": "utf8 without flag", "YYY.txt": "cp437"})
    data = _rename(data, b"XXXXXX.txt", "café!.txt".encode()[:10], flag=0x800)
    data = _rename(data, b"YYY.txt", b"\x82t\x82.txt")  # cp437: été
    members, _ = members_of("legacy.zip", data)
    assert [m.path for m in members] == ["café!.txt", "été.txt"]
    flagged = zip_bytes({"naïve/résumé.txt": "utf8 with flag"})
    assert [m.path for m in members_of("flagged.zip", flagged)[0]] == ["naïve/résumé.txt"]


def test_tar_names_that_are_not_utf8_are_decoded_and_absolute_ones_made_relative():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as archive:
        for name in ("caf\u00e9.txt", "/etc/shadow", "../../up.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    members, problems = members_of("names.tar", buf.getvalue())
    assert [m.path for m in members] == ["café.txt", "etc/shadow", "up.txt"] and problems == []


# --- bombs and bounds --------------------------------------------------------------------------------


def test_zip_bomb_nested_in_a_zip_is_refused_without_inflating():
    inner = zip_bytes({"zeros.bin": b"\0" * (10 * MIB), "ok.txt": "fine"})
    outer = zip_bytes({"inner.zip": inner})
    assert len(outer) < 40_000
    budget = Budget()
    [inner_member], problems = members_of("outer.zip", outer, budget=budget)
    assert problems == [] and inner_member.data == inner
    members, problems = members_of("inner.zip", inner_member.data, budget=budget)
    assert [(m.path, m.data, m.size) for m in members] == [("zeros.bin", None, 10 * MIB),
                                                           ("ok.txt", b"fine", 4)]
    assert members[0].problem.startswith("zip bomb refused: 10 MiB from ")
    assert members[0].problem.endswith("(ratio > 200)")
    assert problems == [f"zeros.bin: {members[0].problem}"]
    assert budget.bytes == len(inner) + 4
    with pytest.raises(NotFound, match="zip bomb refused"):
        read_member("inner.zip", io.BytesIO(inner), "zeros.bin")


def test_zip_member_bigger_than_declared_is_never_read_past_its_declared_size():
    data = bytearray(zip_bytes({"liar.bin": b"\0" * (10 * MIB)}))
    for signature, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(signature)
        struct.pack_into("<I", data, at + size_at, 1000)  # declare 1000 bytes; 10 MiB are stored
    tracemalloc.start()
    members, _ = members_of("liar.zip", bytes(data))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [(m.path, m.data, m.size) for m in members] == [("liar.bin", None, 1000)]
    assert members[0].problem.startswith("corrupt member: BadZipFile: Bad CRC-32")
    assert peak < MIB  # read in 256 KiB steps, stopped at the declared 1000 bytes


def overlapping_zip(copies: int) -> bytes:
    """One stored kernel referenced by `copies` central-directory entries (the Fifield construction)."""
    kernel = random.Random(7).randbytes(100_000)
    data = zip_bytes({"kernel00": kernel}, zipfile.ZIP_STORED)
    central = data.find(b"PK\x01\x02")
    end = data.find(b"PK\x05\x06")
    record = data[central:end]
    records = b"".join(record.replace(b"kernel00", b"kernel%02d" % i) for i in range(copies))
    eocd = bytearray(data[end:])
    struct.pack_into("<HHII", eocd, 8, copies, copies, len(records), central)
    return data[:central] + records + bytes(eocd)


def test_overlapping_zip_entries_are_refused_as_a_bomb():
    members, problems = members_of("overlap.zip", overlapping_zip(5))
    assert [m.data for m in members] == [None] * 5
    assert {m.problem for m in members} == {"zip bomb refused: member overlaps another member's data"}
    assert problems[0] == "zip bomb refused: 5 members overlap other members' data"


def test_tar_bomb_member_is_refused_and_a_bomb_stream_is_cut_off():
    data = tar_bytes({"zeros.bin": b"\0" * (10 * MIB), "after.txt": b"still read"})
    members, problems = members_of("bomb.tar.gz", data)
    assert [(m.path, m.data) for m in members] == [("zeros.bin", None), ("after.txt", b"still read")]
    assert members[0].problem.startswith("zip bomb refused: more than ")
    assert members[0].problem.endswith(" bytes compressed (ratio > 200)")
    data = tar_bytes({f"zeros{i}.bin": b"\0" * (5 * MIB) for i in range(4)} | {"last.txt": b"never"})
    members, problems = members_of("bombs.tar.gz", data, Bounds(max_member_bytes=3 * MIB))
    assert "last.txt" not in [m.path for m in members]
    assert problems[-1].startswith("tar bomb refused: ")
    assert problems[-1].endswith("the rest of the archive is not read")


def test_sevenzip_bomb_is_refused_by_the_archive_ratio():
    members, problems = members_of("bomb.7z", sevenzip_bytes({"zeros.bin": b"\0" * (10 * MIB)}))
    assert [(m.data, m.problem.split(":")[0]) for m in members] == [(None, "zip bomb refused")]


def test_member_cap_counts_all_levels_of_one_top_file():
    data = zip_bytes({f"m{i:02}.txt": f"member {i}" for i in range(30)})
    budget = Budget()
    members, problems = members_of("many.zip", data, Bounds(max_members=10), budget)
    assert [m.path for m in members] == [f"m{i:02}.txt" for i in range(10)]
    assert problems == ["member cap reached: 10 members per file, 20 more in many.zip not read "
                        "(KDBL_CONTAINER_MAX_MEMBERS; 10 taken)"]
    members, problems = members_of("again.zip", data, Bounds(max_members=10), budget)
    assert members == [] and problems[0].startswith("member cap reached: 10 members per file, 30 more")


def test_member_and_expanded_size_bounds_refuse_members_with_the_reason():
    data = zip_bytes({f"m{i}.txt": b"%d" % i * 1000 for i in range(5)} | {"big.txt": b"b" * 5000})
    members, problems = members_of("sizes.zip", data, Bounds(max_member_bytes=4000, max_expanded_bytes=2500))
    assert [(m.path, m.data is not None) for m in members] == [
        ("m0.txt", True), ("m1.txt", True), ("m2.txt", False), ("m3.txt", False), ("m4.txt", False),
        ("big.txt", False)]
    assert members[2].problem == "expanded size cap reached (0.0 MiB per file, all levels together)"
    assert members[5].problem == "member too large (0.0 MiB > 0.0 MiB)"
    big = zip_bytes({"big.bin": random.Random(1).randbytes(80 * MIB // 64)})
    [member], _ = members_of("big.zip", big, Bounds(max_member_bytes=MIB))
    assert member.problem == "member too large (1.2 MiB > 1.0 MiB)"


@pytest.mark.parametrize("name", ["stream.tar.gz", "stream.zip"])
def test_members_are_read_one_at_a_time(name):
    parts = {f"part{i}.bin": random.Random(i).randbytes(2 * MIB) for i in range(8)}
    zipped = name.endswith(".zip")
    data = zip_bytes(parts, zipfile.ZIP_STORED) if zipped else tar_bytes(parts, compresslevel=1)
    tracemalloc.start()
    seen = 0
    for member in expand(name, io.BytesIO(data), Bounds(), Budget()).members:
        seen += member.size
        del member
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seen == 16 * MIB
    assert peak < 5 * MIB  # one member and the copy it is read into, not all eight (16 MiB)


def test_broken_containers_never_raise_they_report():
    for name, data in (("junk.zip", b"PK\x03\x04 not really"), ("junk.tar.gz", b"\x1f\x8b\x08 broken"),
                       ("junk.7z", b"7z\xbc\xaf\x27\x1c broken"), ("junk.msg", b"not ole"),
                       ("junk.tar", b"")):
        members, problems = members_of(name, data)
        assert members == [] and problems[0].startswith("container unreadable after 0 entries"), name
    truncated = tar_bytes({"a.txt": b"a" * 5000, "b.txt": b"b" * 5000}, mode="w")[:7000]
    members, problems = members_of("cut.tar", truncated)
    assert [m.path for m in members] == ["a.txt"] and problems[0].startswith("container unreadable after 2")
    result = extract(Source(io.BytesIO(b"PK\x03\x04 not really"), "junk.zip", 20))
    assert result.status == "failed" and result.reason.startswith("not a readable archive")


def test_read_member_raises_not_found_for_a_missing_member():
    data = zip_bytes({"a.txt": "alpha"})
    assert read_member("x.zip", io.BytesIO(data), "a.txt") == b"alpha"
    with pytest.raises(NotFound, match="no member 'b.txt' in 'x.zip'"):
        read_member("x.zip", io.BytesIO(data), "b.txt")


# --- e-mail ------------------------------------------------------------------------------------------


def _mail() -> bytes:
    forwarded = EmailMessage()
    forwarded["From"], forwarded["Subject"] = "carol@example.org", "Pond plan"
    forwarded.set_content("The plan is to count again in June.")
    forwarded.add_attachment(b"deep attachment text", maintype="application", subtype="octet-stream",
                             filename="deep.txt")
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "alice@example.org", "bob@example.org", "Census"
    message.set_content("Hello Bob, the census is attached.")
    message.add_alternative("<p>Hello Bob, the census is <b>attached</b>.</p>", subtype="html")
    message.add_attachment(PDF, maintype="application", subtype="pdf", filename="report.pdf")
    message.add_attachment(docx_bytes("Minutes of the pond meeting"), maintype="application",
                           subtype="vnd.openxmlformats-officedocument.wordprocessingml.document",
                           filename="minutes.docx")
    message.add_attachment("plain notes", filename="notes.txt")
    message.add_attachment("second notes", filename="notes.txt")
    message.add_attachment("sneaky", filename="../../etc/evil.txt")
    message.add_attachment(b"\x89PNG", maintype="image", subtype="png")
    message.add_attachment(forwarded)
    return message.as_bytes()


def test_eml_attachments_are_members_and_the_body_is_not():
    mail = _mail()
    members, problems = members_of("mail.eml", mail)
    assert problems == []
    assert [m.path for m in members] == [
        "attachments/report.pdf", "attachments/minutes.docx", "attachments/notes.txt",
        "attachments/notes (2).txt", "attachments/.._.._etc_evil.txt", "attachments/attachment 6.png",
        "attachments/Pond plan.eml"]
    by_path = {m.path: m.data for m in members}
    assert by_path["attachments/notes.txt"] == b"plain notes\n"
    assert "42 ducks" in text_of("report.pdf", by_path["attachments/report.pdf"])
    assert "pond meeting" in text_of("minutes.docx", by_path["attachments/minutes.docx"])
    forwarded = by_path["attachments/Pond plan.eml"]
    assert "count again in June" in text_of("Pond plan.eml", forwarded)
    deep, problems = members_of("attachments/Pond plan.eml", forwarded)
    assert [(m.path, m.data) for m in deep] == [("attachments/deep.txt", b"deep attachment text")]
    assert read_member("mail.eml", io.BytesIO(mail), "attachments/notes (2).txt") == b"second notes\n"
    listing = text_of("mail.eml", mail)
    assert "Attachments: report.pdf (application/pdf" in listing and "Hello Bob" in listing


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le")


def _msg_with_attachments() -> bytes:
    attach_method = struct.pack("<II8s", 0x3705 << 16 | 0x0003, 6, struct.pack("<i", 5) + b"\0" * 4)
    csv, forwarded = "__attach_version1.0_#00000000/", "__attach_version1.0_#00000001/"
    ole_object, embedded = "__attach_version1.0_#00000002/", forwarded + "__substg1.0_3701000D/"
    inner = embedded + "__attach_version1.0_#00000000/"
    return build_cfb({
        "__properties_version1.0": b"\0" * 32,
        "__substg1.0_0037001F": _utf16("Quarterly duck census"),
        "__substg1.0_1000001F": _utf16("Counts attached, and Carol's plan."),
        csv + "__properties_version1.0": b"\0" * 8,
        csv + "__substg1.0_3707001F": _utf16("ducks.csv"),
        csv + "__substg1.0_370E001F": _utf16("text/csv"),
        csv + "__substg1.0_37010102": b"pond,ducks\nnorth,42\n",
        forwarded + "__properties_version1.0": b"\0" * 8 + attach_method,
        forwarded + "__substg1.0_3001001F": _utf16("Re: plan/June"),
        embedded + "__properties_version1.0": b"\0" * 24,
        embedded + "__substg1.0_0037001F": _utf16("Pond plan"),
        embedded + "__substg1.0_0C1A001F": _utf16("Carol Example"),
        embedded + "__substg1.0_1000001F": _utf16("We count again in June."),
        inner + "__properties_version1.0": b"\0" * 8,
        inner + "__substg1.0_3707001F": _utf16("route.txt"),
        inner + "__substg1.0_37010102": b"north pond first",
        ole_object + "__properties_version1.0": b"\0" * 8 + struct.pack("<II8s", 0x3705 << 16 | 3, 6,
                                                                        struct.pack("<i", 6) + b"\0" * 4),
        ole_object + "__substg1.0_3707001F": _utf16("chart.bin"),
    })


def test_msg_attachments_and_an_attached_outlook_message_are_members():
    msg = _msg_with_attachments()
    assert "Attachments: ducks.csv (text/csv, 20 bytes)" in text_of("census.msg", msg)
    members, problems = members_of("census.msg", msg)
    assert [(m.path, m.problem) for m in members] == [
        ("attachments/ducks.csv", None), ("attachments/Re: plan_June.eml", None),
        ("attachments/chart.bin", "embedded OLE object (not extracted)")]
    assert members[0].data == b"pond,ducks\nnorth,42\n"
    forwarded = members[1].data
    text = text_of("Re: plan_June.eml", forwarded)
    assert forwarded.startswith(b"From: Carol Example\r\nSubject: Pond plan\r\n")
    assert "Carol Example" in text and "Subject: Pond plan" in text and "We count again in June." in text
    deep, problems = members_of("attachments/Re: plan_June.eml", forwarded)
    assert [(m.path, m.data) for m in deep] == [("attachments/route.txt", b"north pond first")]
    assert read_member("census.msg", io.BytesIO(msg), "attachments/ducks.csv") == b"pond,ducks\nnorth,42\n"


def test_container_kinds():
    assert all(is_container(n) for n in ("a.zip", "A.ZIP", "a.tar", "a.tar.gz", "a.tgz", "a.tar.bz2",
                                         "a.tar.xz", "a.7z", "m.eml", "m.msg", "x.zip!/b.tar.gz"))
    assert not any(is_container(n) for n in ("a.gz", "a.docx", "a.txt", "tar.gz", "a.epub"))


def test_nesting_stops_at_the_depth_bound_and_the_deepest_container_is_still_listed():
    from kdbl_worker.sandbox import Limits, extract_and_chunk

    data = zip_bytes({"level4.md": "# Bottom\n\nfour levels down"})
    for level in (3, 2, 1):
        note = f"# Level {level}\n\ntext {level}"
        data = zip_bytes({f"level{level + 1}.zip": data, f"note{level}.md": note})
    outcome = extract_and_chunk("top.zip", len(data), io.BytesIO(data), Limits(container_max_depth=2))
    level1 = {kid.path: kid for kid in outcome.children}
    assert sorted(level1) == ["level2.zip", "note1.md"]
    level2 = {kid.path: kid for kid in level1["level2.zip"].outcome.children}
    assert sorted(level2) == ["level3.zip", "note2.md"]
    deepest = level2["level3.zip"].outcome
    assert deepest.children == [] and deepest.status == "partial"
    assert "nested deeper than 2 levels" in deepest.reason
    assert "level4.zip (" in " ".join(chunk[1] for chunk in deepest.chunks)  # its listing is still its text
    # every level above the refusal is partial and names where it happened (the README's promise)
    assert level1["level2.zip"].outcome.status == "partial" and outcome.status == "partial"
    assert "level3.zip: members not expanded: nested deeper than 2 levels" in level1["level2.zip"].outcome.reason
    assert "level2.zip: level3.zip: members not expanded: nested deeper than 2 levels" in outcome.reason


@pytest.mark.parametrize("refused, bounds, why", [
    ("bomb", {}, "zip bomb refused"),
    ("large", {"container_max_member_bytes": 2 * MIB}, "member too large"),
    ("encrypted", {}, "encrypted member"),
    ("over the budget", {"container_max_expanded_bytes": 4 * MIB}, "expanded size cap reached"),
])
def test_a_member_refused_two_levels_down_makes_its_top_level_file_partial_with_the_reason(refused, bounds, why):
    from kdbl_worker.sandbox import Limits, extract_and_chunk

    rng = random.Random(4)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(5000)]
    big = b" ".join(rng.choices(words, k=3 * MIB // 6))[:3 * MIB]  # ~2:1 text: over a size bound, not a bomb
    leaf = {"bomb": zip_bytes({"zeros.bin": b"\0" * (10 * MIB)}), "large": zip_bytes({"big.txt": big}),
            "over the budget": zip_bytes({"big.txt": big}),
            "encrypted": sevenzip_bytes({"secret.txt": b"s" * 100}, password="pw")}[refused]
    inner = f"inner.{'7z' if refused == 'encrypted' else 'zip'}"
    data = zip_bytes({"mid.zip": zip_bytes({inner: leaf, "fine.md": "# Fine"}), "top.md": "# Top"})
    outcome = extract_and_chunk("top.zip", len(data), io.BytesIO(data), Limits(**bounds))
    mid = {kid.path: kid.outcome for kid in outcome.children}["mid.zip"]
    deepest = {kid.path: kid.outcome for kid in mid.children}[inner]
    assert deepest.status == "partial" and why in deepest.reason
    assert mid.status == "partial" and f"{inner}: " in mid.reason and why in mid.reason
    assert outcome.status == "partial" and f"mid.zip: {inner}: " in outcome.reason and why in outcome.reason
    assert {kid.path: kid.outcome.status for kid in outcome.children}["top.md"] == "ok"


def test_info_zip_unicode_path_field_names_the_member():
    stored = b"doc?.txt"
    field = struct.pack("<B I", 1, zlib.crc32(stored)) + "doc\u00e9.txt".encode()
    info = zipfile.ZipInfo(stored.decode())
    info.extra = struct.pack("<HH", 0x7075, len(field)) + field
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr(info, "accent")
    assert [m.path for m in members_of("unicode.zip", buf.getvalue())[0]] == ["docé.txt"]


def test_a_flood_of_directory_entries_stops_the_scan():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for number in range(1200):
            info = tarfile.TarInfo(f"d{number}")
            info.type = tarfile.DIRTYPE
            archive.addfile(info)
        info = tarfile.TarInfo("after.txt")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    members, problems = members_of("dirs.tar.gz", buf.getvalue(), Bounds(max_members=100))
    assert members == [] and problems == ["stopped after 1000 entries (directories and links included)"]


def test_twelve_thousand_equal_names_stay_unique_and_the_listing_counts_past_ten_thousand():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive, pytest.warns(UserWarning, match="Duplicate name"):
        for number in range(12_000):
            archive.writestr("a.txt", b"%d" % number)
    data = buf.getvalue()
    assert read_member("same.zip", io.BytesIO(data), "a (12000).txt") == b"11999"
    result = extract(Source(io.BytesIO(data), "same.zip", len(data)))
    lines = [line for block in result.blocks for line in block.text.split("\n")]
    assert lines[0] == "Archive members: 12000 (48890 bytes expanded)"
    assert lines[1:3] == ["a.txt (1 bytes)", "a (2).txt (1 bytes)"]
    assert lines[-1] == "... and 2000 more members"
    assert len(lines) == 1 + 10_000 + 1


def test_an_unreadable_attachment_is_refused_and_the_others_still_come():
    broken, good = "__attach_version1.0_#00000000/", "__attach_version1.0_#00000001/"
    msg = build_cfb({
        "__properties_version1.0": b"\0" * 32,
        "__substg1.0_0037001F": _utf16("Two attachments"),
        broken + "__properties_version1.0": b"\0" * 8,
        broken + "__substg1.0_3707001F": _utf16("broken.bin"),
        broken + "__substg1.0_37010102/not-a-stream": b"the data property is a storage here",
        good + "__properties_version1.0": b"\0" * 8,
        good + "__substg1.0_3707001F": _utf16("good.txt"),
        good + "__substg1.0_37010102": b"good text",
    })
    members, problems = members_of("odd.msg", msg)
    assert [(m.path, m.data) for m in members] == [("attachments/attachment 1", None),
                                                   ("attachments/good.txt", b"good text")]
    assert members[0].problem.startswith("attachment unreadable: ")


def test_a_recursive_bomb_of_ten_copies_a_level_ends_at_the_shared_member_budget():
    from kdbl_worker.sandbox import Limits, extract_and_chunk

    data = zip_bytes({"zeros.bin": b"\0" * MIB})  # 10,000 leaves of 1 MiB if all were expanded
    for level in range(4):
        data = zip_bytes({f"copy{i}.zip": data for i in range(10)})
    outcome = extract_and_chunk("42.zip", len(data), io.BytesIO(data),
                                Limits(container_max_members=40, container_max_depth=8))

    def walk(kids):
        for kid in kids:
            yield kid
            yield from walk(kid.outcome.children)

    kids = list(walk(outcome.children))
    assert len(kids) == 40 and outcome.status == "partial"
    assert any("member cap reached: 40 members per file" in (kid.outcome.reason or "") for kid in kids)


def test_without_py7zr_a_7z_is_skipped_with_the_reason_and_is_not_a_container(monkeypatch):
    data = sevenzip_bytes({"a.txt": b"alpha"})
    monkeypatch.setitem(sys.modules, "py7zr", None)  # as on an install without the `archives` extra
    assert not is_container("a.7z") and is_container("a.zip")
    result = extract(Source(io.BytesIO(data), "a.7z", len(data)))
    assert result.status == "skipped"
    assert result.reason == ("no extractor available: py7zr is not installed "
                             "(pip install 'kdbl-context-lake[archives]')")


def test_member_path_survives_lone_surrogates_and_names_of_only_dots():
    assert member_path("a\ud800b.txt") == "a?b.txt"
    assert member_path("N" * 300 + ".TXT") == "N" * 251 + ".TXT"  # cut to 255 bytes, extension kept
    assert member_path("caf\udce9.txt") == "café.txt"  # tar's surrogateescape of a latin-1 byte
    assert member_path("../..") == "_" and member_path("C:") == "_" and member_path("a/ /b") == "a/b"


def test_a_reader_that_returns_more_than_its_member_declared_is_refused():
    from kdbl_worker.extract.containers import Entry, Refused, _read

    liar = Entry("x.bin", 5, read=lambda limit: b"x" * (limit + 1))  # what a codec ignoring sizes would give
    with pytest.raises(Refused, match="member larger than declared"):
        _read(liar, Bounds(), Budget())
    assert _read(Entry("ok.bin", 5, read=lambda limit: b"y" * 5), Bounds(), Budget()) == b"yyyyy"


def test_a_7z_from_a_stream_that_is_not_an_io_object_is_read():
    class Stream:  # the least a connector's stream offers: read, seek, tell
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)
            self.read, self.seek, self.tell = self._inner.read, self._inner.seek, self._inner.tell

    data = sevenzip_bytes({"a.txt": b"alpha"})
    members = list(expand("s.7z", Stream(data), Bounds(), Budget()).members)
    assert [(m.path, m.data) for m in members] == [("a.txt", b"alpha")]


def test_a_corrupt_7z_refuses_its_members_with_the_codec_error():
    data = bytearray(sevenzip_bytes({f"f{i}.txt": b"line %d of text\n" % i * 200 for i in range(30)}))
    data[200] ^= 0xFF  # inside the packed stream
    members, problems = members_of("corrupt.7z", bytes(data))
    assert len(members) == 30 and all(m.data is None for m in members)
    assert problems[0] == "f0.txt: corrupt member: LZMAError: Corrupt input data"
    assert problems[-1] == "... and 25 more members refused (corrupt member)"
