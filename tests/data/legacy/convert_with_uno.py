"""Store OOXML files as Word/Excel/PowerPoint 97-2003 with LibreOffice's UNO API (for make_samples.py).

    /usr/bin/python3 convert_with_uno.py SOURCE_DIR OUT_DIR

Runs under the system python3 (Debian python3-uno). UNO rather than `soffice --convert-to` because it
can set what the command line cannot: NoThumbnail (the .ppt preview image was 588 KB of 620) and a
Password, which LibreOffice turns into real RC4 encryption in the binary formats.
"""

import os
import subprocess
import sys
import tempfile
import time

import uno
from com.sun.star.beans import PropertyValue
from com.sun.star.connection import NoConnectException

JOBS = [  # source, target, filter, password
    ("heron.docx", "heron.doc", "MS Word 97", None),
    ("heron.docx", "heron-word.rtf", "Rich Text Format", None),
    ("heron.docx", "heron-locked.doc", "MS Word 97", "secret"),
    ("tides.xlsx", "tides.xls", "MS Excel 97", None),
    ("tides.xlsx", "tides-locked.xls", "MS Excel 97", "secret"),
    ("lighthouse.pptx", "lighthouse.ppt", "MS PowerPoint 97", None),
]


def props(**values):
    out = []
    for name, value in values.items():
        prop = PropertyValue()
        prop.Name, prop.Value = name, value
        out.append(prop)
    return tuple(out)


def main(source_dir, out_dir):
    profile = tempfile.mkdtemp()
    pipe = f"kdbl_legacy_{os.getpid()}"
    office = subprocess.Popen(["soffice", "--headless", "--norestore", "--invisible",
                               "-env:UserInstallation=file://" + profile, f"--accept=pipe,name={pipe};urp;"])
    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
    for _ in range(120):
        try:
            context = resolver.resolve(f"uno:pipe,name={pipe};urp;StarOffice.ComponentContext")
            break
        except NoConnectException:
            time.sleep(0.5)
    else:
        raise SystemExit("LibreOffice did not start")
    desktop = context.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", context)
    try:
        for source, target, filter_name, password in JOBS:
            url = uno.systemPathToFileUrl(os.path.abspath(os.path.join(source_dir, source)))
            document = desktop.loadComponentFromURL(url, "_blank", 0, props(Hidden=True))
            store = {"FilterName": filter_name, "Overwrite": True, "NoThumbnail": True}
            if password:
                store["Password"] = password
            document.storeToURL(uno.systemPathToFileUrl(os.path.abspath(os.path.join(out_dir, target))),
                                props(**store))
            document.close(True)
    finally:
        desktop.terminate()
        office.wait(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
