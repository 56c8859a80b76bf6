"""A file's labels: what its source's config gives it (`labels` for every file, `label_globs` for the
keys a glob matches, the include/exclude glob rules of kdbl_core.sources.globs) and its own tags (S3
object tags when the source's config has `object_tags: true`, then Markdown front matter `tags`).
Stored in files.labels, searched by the `labels` filter (any-of, exact match); the own tags alone are
kept in files.own_labels (migration 0015), so a change of the source's label config relabels every
file from the database (kdbl_core.sources.relabel) without reading it again.

The one implementation of the rule: the worker labels each file it writes with it, and the relabel
recomputes stored files with it. It lives in the core (with the glob rules it needs) because the
writers of a source's config (kdbl-control, the operator) run the relabel and import no worker code.

The union keeps the first occurrence of each label: the source's list, then the globs in the order of
the stored config (a jsonb object keeps its keys shorter first, then bytewise: not the order written),
then the file's own tags. At most MAX_LABELS per file (a front matter with thousands of tags must not
bloat the row; 64 is a chosen bound, not a measured one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import config as source_config
from kdbl_core.sources.globs import Selection

MAX_LABELS = 64


@dataclass(frozen=True, slots=True)
class Labeler:
    common: tuple[str, ...] = ()
    globs: tuple[tuple[Selection, tuple[str, ...]], ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Labeler:
        """From a stored source config; InvalidArgument names `labels` / `label_globs` when malformed."""
        parsed = source_config.label_list(config.get("labels"), "labels")
        pairs = source_config.label_globs(config)
        try:
            return cls(parsed, tuple((Selection.of([glob]), labels) for glob, labels in pairs))
        except InvalidArgument as exc:
            raise InvalidArgument("label_globs", exc.reason) from None

    def __call__(self, key: str, own: Iterable[str] = ()) -> list[str]:
        out = list(self.common)
        for selects, labels in self.globs:
            if selects(key):
                out.extend(labels)
        out.extend(own)
        return list(dict.fromkeys(label for label in out if label))[:MAX_LABELS]


def own_labels(tags: Iterable[str]) -> list[str]:
    """What files.own_labels stores of a file's own tags: non-empty, first occurrence kept, at most
    MAX_LABELS (the union above can never take more of them)."""
    return list(dict.fromkeys(tag for tag in tags if tag))[:MAX_LABELS]


NO_LABELS = Labeler()
