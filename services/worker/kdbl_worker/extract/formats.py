"""The one table of supported formats: which extensions go to which extractor, as what content type.

Everything else reads this table: `extract.detect`/`extract.extract` dispatch on it, `kdbl-control formats`
prints it, and README's list of supported formats is generated from it (a unit test fails when README and
the table disagree). Extractor targets are "module:function" strings, imported lazily, so a missing optional
library only affects its own rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True, slots=True)
class Format:
    """One row: a format, its extensions (lower-case, with the dot) and the extractor that reads it."""

    extensions: tuple[str, ...]
    content_type: str
    target: str  # "module:function"
    label: str  # human name, shown in README and `kdbl-control formats`
    requires: str | None = None  # install extra / system package it needs; None: the base install reads it


_P = "kdbl_worker.extract."
TEXT = _P + "text:extract_text"
MEDIA = _P + "media:extract_media"
CODE = _P + "code:extract_code"
DOTENV = _P + "code:extract_dotenv"
SNIFF = _P + "code:extract_unknown"  # no row: text by content, else refused (extract/code.py)
_OOXML = "application/vnd.openxmlformats-officedocument."
_STT = "a transcriber model or a subtitle sidecar"
IMAGE = _P + "image:extract_image"
_OCR = "the `ocr` extra"
LISTING = _P + "containers:extract_listing"
COMPRESSED = _P + "compressed:extract_compressed"  # one file inside, not an archive (extract/compressed.py)

# THE FORMAT TABLE. To support a format, add ONE row here:
#     Format((".ext", ".ext2"), "content/type", _P + "module:function", "Human label", "extra or package"),
# The extractor is a function (Source) -> Extraction in extract/<module>.py (contract: extract/base.py).
# An entry without a leading dot is a whole file name (README, Dockerfile), matched case-insensitively.
# Then regenerate README's list with `kdbl-control formats --markdown` (test_formats_table.py checks it).
# An extension must appear in one row only (the test checks that too).
FORMATS: list[Format] = [
    Format((".txt", ".text"), "text/plain", TEXT, "Plain text"),
    Format(("README", "LICENSE", "LICENCE", "COPYING", "CHANGELOG", "CHANGES", "AUTHORS", "CONTRIBUTORS",
            "CONTRIBUTING", "NOTICE", "TODO", "INSTALL", "NEWS", "HISTORY", "CODEOWNERS"), "text/plain", TEXT,
           "Plain text (well-known names)"),
    Format((".md", ".markdown"), "text/markdown", _P + "markdown:extract_markdown", "Markdown"),
    Format((".html", ".htm"), "text/html", _P + "html:extract_html", "HTML"),
    Format((".xhtml",), "application/xhtml+xml", _P + "html:extract_html", "XHTML"),
    Format((".pdf",), "application/pdf", _P + "pdf:extract_pdf", "PDF"),
    Format((".docx",), _OOXML + "wordprocessingml.document", _P + "docx:extract_docx", "Word (DOCX)"),
    Format((".pptx",), _OOXML + "presentationml.presentation", _P + "pptx:extract_pptx",
           "PowerPoint (PPTX)"),
    Format((".xlsx",), _OOXML + "spreadsheetml.sheet", _P + "xlsx:extract_xlsx", "Excel (XLSX)"),
    Format((".xlsm",), "application/vnd.ms-excel.sheet.macroEnabled.12", _P + "xlsx:extract_xlsx",
           "Excel with macros (XLSM)"),
    Format((".csv",), "text/csv", _P + "csv:extract_csv", "CSV"),
    Format((".tsv",), "text/tab-separated-values", _P + "csv:extract_csv", "TSV"),
    Format((".eml",), "message/rfc822", _P + "eml:extract_eml", "E-mail (EML)"),
    Format((".msg",), "application/vnd.ms-outlook", _P + "msg:extract_msg", "Outlook message (MSG)"),
    Format((".json",), "application/json", _P + "json_xml:extract_json", "JSON"),
    Format((".jsonl",), "application/jsonl", _P + "json_xml:extract_jsonl", "JSON Lines"),
    Format((".ndjson",), "application/x-ndjson", _P + "json_xml:extract_jsonl", "Newline-delimited JSON"),
    Format((".xml",), "application/xml", _P + "json_xml:extract_xml", "XML"),
    Format((".xsd", ".xsl", ".xslt", ".wsdl", ".xaml", ".csproj", ".vbproj", ".fsproj", ".resx", ".kml",
            ".gpx", ".rss", ".atom", ".opml", ".xlf", ".xliff"), "application/xml",
           _P + "json_xml:extract_xml", "XML vocabularies"),
    Format((".svg",), "image/svg+xml", _P + "json_xml:extract_xml", "SVG (its text elements)"),
    Format((".ipynb",), "application/x-ipynb+json", _P + "json_xml:extract_json", "Jupyter notebook"),
    Format((".vtt",), "text/vtt", _P + "subtitles:extract_subtitles", "WebVTT subtitles"),
    Format((".srt",), "application/x-subrip", _P + "subtitles:extract_subtitles", "SubRip subtitles"),
    Format((".odt",), "application/vnd.oasis.opendocument.text", _P + "odt:extract_odt",
           "OpenDocument text (ODT)"),
    Format((".epub",), "application/epub+zip", _P + "epub:extract_epub", "EPUB"),
    Format((".rtf",), "application/rtf", _P + "rtf:extract_rtf", "RTF"),
    # archives: the file's text lists its members; each member is indexed as a child file
    # (`a.zip!/docs/b.md`, extract/containers.py), as are e-mail attachments
    Format((".zip",), "application/zip", LISTING, "Zip archive (members indexed)"),
    Format((".tar",), "application/x-tar", LISTING, "Tar archive (members indexed)"),
    Format((".tar.gz", ".tgz"), "application/gzip", LISTING, "Tar archive, gzip (members indexed)"),
    Format((".tar.bz2", ".tbz2"), "application/x-bzip2", LISTING, "Tar archive, bzip2 (members indexed)"),
    Format((".tar.xz", ".txz"), "application/x-xz", LISTING, "Tar archive, xz (members indexed)"),
    Format((".gz",), "application/gzip", COMPRESSED, "gzip-compressed file (the text of the file inside)"),
    Format((".bz2",), "application/x-bzip2", COMPRESSED, "bzip2-compressed file (the text of the file inside)"),
    Format((".xz",), "application/x-xz", COMPRESSED, "xz-compressed file (the text of the file inside)"),
    Format((".7z",), "application/x-7z-compressed", LISTING, "7-Zip archive (members indexed)",
           "the `archives` extra"),
    # legacy binary Office (OLE2): our own readers over olefile, xlrd for .xls; a .doc/.xls/.ppt that really
    # holds RTF, HTML, XML or a zip goes to that format's extractor (extract/ole.py)
    Format((".doc", ".dot"), "application/msword", _P + "doc:extract_doc", "Word 97-2003 (DOC)"),
    Format((".xls", ".xlt"), "application/vnd.ms-excel", _P + "xls:extract_xls", "Excel 97-2003 (XLS)"),
    Format((".ppt", ".pps", ".pot"), "application/vnd.ms-powerpoint", _P + "ppt:extract_ppt",
           "PowerPoint 97-2003 (PPT)"),
    # images: text by OCR (extract/image.py, extract/ocr.py); a multi-page TIFF gives one page per frame
    Format((".png",), "image/png", IMAGE, "PNG image (OCR)", _OCR),
    Format((".jpg", ".jpeg", ".jpe", ".jfif"), "image/jpeg", IMAGE, "JPEG image (OCR)", _OCR),
    Format((".tif", ".tiff"), "image/tiff", IMAGE, "TIFF image, multi-page (OCR)", _OCR),
    Format((".webp",), "image/webp", IMAGE, "WebP image (OCR)", _OCR),
    Format((".bmp",), "image/bmp", IMAGE, "BMP image (OCR)", _OCR),
    Format((".gif",), "image/gif", IMAGE, "GIF image, first frame (OCR)", _OCR),
    # audio and video: text from a subtitle sidecar or a local transcriber (extract/media.py)
    Format((".mp3",), "audio/mpeg", MEDIA, "MP3 audio", _STT),
    Format((".m4a",), "audio/mp4", MEDIA, "M4A audio", _STT),
    Format((".wav",), "audio/wav", MEDIA, "WAV audio", _STT),
    Format((".flac",), "audio/flac", MEDIA, "FLAC audio", _STT),
    Format((".ogg",), "audio/ogg", MEDIA, "Ogg audio", _STT),
    Format((".opus",), "audio/opus", MEDIA, "Opus audio", _STT),
    Format((".mp4",), "video/mp4", MEDIA, "MP4 video", _STT),
    Format((".m4v",), "video/x-m4v", MEDIA, "M4V video", _STT),
    Format((".mkv",), "video/x-matroska", MEDIA, "Matroska video", _STT),
    Format((".webm",), "video/webm", MEDIA, "WebM video", _STT),
    Format((".mov",), "video/quicktime", MEDIA, "QuickTime video", _STT),
    Format((".avi",), "video/x-msvideo", MEDIA, "AVI video", _STT),
    # source code, configuration, markup and logs: indexed as text, the label is the language recorded in the
    # status (extract/code.py); entries without a leading dot are whole file names (case-insensitive)
    Format((".py", ".pyw", ".pyi"), "text/x-python", CODE, "Python"),
    Format((".go",), "text/x-go", CODE, "Go"),
    Format((".rs",), "text/x-rust", CODE, "Rust"),
    Format((".java",), "text/x-java", CODE, "Java"),
    Format((".c", ".h"), "text/x-c", CODE, "C"),
    Format((".cpp", ".cc", ".cxx", ".c++", ".hpp", ".hh", ".hxx", ".ino"), "text/x-c++", CODE, "C++"),
    Format((".cs", ".csx"), "text/x-csharp", CODE, "C#"),
    Format((".js", ".mjs", ".cjs", ".jsx"), "text/javascript", CODE, "JavaScript"),
    Format((".ts", ".tsx", ".mts", ".cts"), "text/x-typescript", CODE, "TypeScript"),
    Format((".sh", ".bash", ".zsh", ".ksh", ".bashrc", ".zshrc", ".profile", ".bash_profile", "PKGBUILD"),
           "text/x-shellscript", CODE, "Shell"),
    Format((".ps1", ".psm1", ".psd1"), "text/x-powershell", CODE, "PowerShell"),
    Format((".bat", ".cmd"), "text/x-msdos-batch", CODE, "Batch"),
    Format((".sql", ".ddl"), "application/sql", CODE, "SQL"),
    Format((".rb", ".rake", ".gemspec", "Gemfile", "Rakefile", "Vagrantfile", "Podfile", "Brewfile"),
           "text/x-ruby", CODE, "Ruby"),
    Format((".php",), "text/x-php", CODE, "PHP"),
    Format((".kt", ".kts"), "text/x-kotlin", CODE, "Kotlin"),
    Format((".swift",), "text/x-swift", CODE, "Swift"),
    Format((".scala", ".sc", ".sbt"), "text/x-scala", CODE, "Scala"),
    Format((".groovy", ".gradle", "Jenkinsfile"), "text/x-groovy", CODE, "Groovy / Gradle"),
    Format((".r", ".rmd"), "text/x-r", CODE, "R"),
    Format((".m", ".mm"), "text/x-objective-c", CODE, "Objective-C / MATLAB"),
    Format((".pl", ".pm", ".t"), "text/x-perl", CODE, "Perl"),
    Format((".lua",), "text/x-lua", CODE, "Lua"),
    Format((".dart",), "text/x-dart", CODE, "Dart"),
    Format((".hs",), "text/x-haskell", CODE, "Haskell"),
    Format((".ex", ".exs"), "text/x-elixir", CODE, "Elixir"),
    Format((".erl", ".hrl"), "text/x-erlang", CODE, "Erlang"),
    Format((".clj", ".cljs", ".edn"), "text/x-clojure", CODE, "Clojure"),
    Format((".vb", ".vbs", ".bas"), "text/x-vb", CODE, "Visual Basic"),
    Format((".f", ".f90", ".f95"), "text/x-fortran", CODE, "Fortran"),
    Format((".asm", ".s"), "text/x-asm", CODE, "Assembly"),
    Format((".vue",), "text/x-vue", CODE, "Vue"),
    Format((".svelte",), "text/x-svelte", CODE, "Svelte"),
    Format((".css",), "text/css", CODE, "CSS"),
    Format((".scss", ".sass"), "text/x-scss", CODE, "Sass"),
    Format((".less",), "text/x-less", CODE, "Less"),
    Format((".proto",), "text/x-protobuf", CODE, "Protocol Buffers"),
    Format((".graphql", ".gql"), "text/x-graphql", CODE, "GraphQL"),
    Format((".tf", ".tfvars", ".hcl"), "text/x-terraform", CODE, "Terraform / HCL"),
    Format((".dockerfile", "Dockerfile", "Containerfile"), "text/x-dockerfile", CODE, "Dockerfile"),
    Format((".mk", ".mak", "Makefile", "GNUmakefile", "BSDmakefile"), "text/x-makefile", CODE, "Makefile"),
    Format((".cmake", "CMakeLists.txt"), "text/x-cmake", CODE, "CMake"),
    Format((".yaml", ".yml"), "application/yaml", CODE, "YAML"),
    Format((".toml",), "application/toml", CODE, "TOML"),
    Format((".ini", ".cfg", ".conf", ".cnf", ".editorconfig"), "text/x-ini", CODE, "INI / config"),
    Format((".properties",), "text/x-java-properties", CODE, "Java properties"),
    Format((".gitignore", ".dockerignore", ".npmignore", ".hgignore"), "text/x-ignore", CODE, "Ignore rules"),
    Format((".gitattributes", ".gitconfig", ".gitmodules"), "text/x-gitconfig", CODE, "Git config"),
    Format((".env",), "text/x-dotenv", DOTENV, "dotenv (values redacted)"),
    Format((".rst",), "text/x-rst", CODE, "reStructuredText"),
    Format((".org",), "text/x-org", CODE, "Org"),
    Format((".tex", ".ltx", ".sty", ".cls"), "text/x-tex", CODE, "TeX / LaTeX"),
    Format((".bib",), "text/x-bibtex", CODE, "BibTeX"),
    Format((".adoc", ".asciidoc"), "text/asciidoc", CODE, "AsciiDoc"),
    Format((".textile",), "text/x-textile", CODE, "Textile"),
    Format((".wiki", ".mediawiki"), "text/x-wiki", CODE, "Wiki markup"),
    Format((".diff", ".patch"), "text/x-diff", CODE, "Diff"),
    Format((".log",), "text/x-log", CODE, "Log"),
]


@functools.cache
def by_extension() -> dict[str, Format]:
    """Extension or whole file name (lower-case) -> row; later rows win. Built once."""
    return {ext.lower(): row for row in FORMATS for ext in row.extensions}


def lookup(name: str) -> Format | None:
    """The row for a file name: its whole name (Dockerfile, .gitignore), then its last two extensions
    (.tar.gz), then its extension, then the name before the extension (Dockerfile.prod, .env.local); None
    when no row reads it."""
    index = by_extension()
    path = PurePosixPath(name.lower())
    return (index.get(path.name) or index.get("".join(path.suffixes[-2:])) or index.get(path.suffix)
            or (index.get(path.stem) if path.suffix else None))


def line_structured(content_type: str | None) -> bool:
    """Code, configuration, markup and logs (CODE rows): the chunker cuts their long blocks at line ends."""
    return content_type is not None and any(
        row.content_type == content_type for row in FORMATS if row.target in (CODE, DOTENV))


BEGIN = "<!-- formats:begin (generated by `kdbl-control formats --markdown` from extract/formats.py) -->"
END = "<!-- formats:end -->"


def _names(row: Format) -> str:
    return " ".join(f"`{ext}`" for ext in row.extensions)


def rows() -> list[dict[str, str]]:
    """The table as `kdbl-control formats` prints it."""
    return [{"label": row.label, "extensions": " ".join(row.extensions), "content_type": row.content_type,
             "requires": row.requires or ""} for row in FORMATS]


def markdown() -> str:
    """README's list of supported formats, between its markers (test_formats_table.py keeps them equal)."""
    text_rows = [row for row in FORMATS if row.target in (CODE, DOTENV)]
    lines = [BEGIN, "", "| Format | Extensions and file names | Content type | Needs |", "|---|---|---|---|"]
    lines += [f"| {row.label} | {_names(row)} | `{row.content_type}` | {row.requires or ''} |"
              for row in FORMATS if row not in text_rows]
    lines += ["", "Source code, configuration, markup and logs are indexed as text; the file's status names "
              "the language (`language: Python`) and code is cut at top-level definitions and line ends:",
              "", "| Language | Extensions and file names | Content type |", "|---|---|---|"]
    lines += [f"| {row.label} | {_names(row)} | `{row.content_type}` |" for row in text_rows]
    lines += ["", "A file no row reads is judged by its first 64 KB: text is indexed as `text/plain` (status "
              "reason `detected as text by content`), anything else is skipped (`unsupported format "
              "(binary content)`). Entries without a leading dot are whole file names, matched "
              "case-insensitively.", "", END]
    return "\n".join(lines) + "\n"
