"""Search cursors: stateless, signed, bound to the principal, the query and the index state.

A cursor is kdbl_core.access.signing.CursorCodec's (HMAC-SHA256 with the server key in the database,
so any API replica reads any replica's cursor) over {offset, state, mode}, for the listing
`search:<digest>`, where the digest covers the principal's groups and everything that decides the
ranking: the query, the mode and the normalised filters (the page size, `explain` and the response shape
may change between pages). Another principal's cursor, a tampered one or one from another query is
-32602 on `cursor`.

Pages are slices of one ranking: page k runs the pipeline for the first offset + limit + 1 hits (the
extra one answers has_more) and returns [offset, offset + limit). The pipeline's ranking is a prefix of
a longer one (BM25 orders by score then chunk id; fusion and diversification are greedy over a
candidate depth that does not depend on the page), so while the index state is unchanged the pages
neither repeat nor skip a hit. When the state changed since the cursor was cut, the call is -32602 on
`cursor` with a reason starting "stale:" and the client starts over without a cursor; a state *before* the cursor's
(one sequence, never reused: the read came from a replica that has not replayed that far) is ReadBehind,
which the API answers by reading on the primary (issue 32). The state is the
serving mode's (kdbl_core.search.cache.state_for: a lexical cursor survives vectors being written, a
vector one writes to sources it does not read), and the serving mode is part of it (the API adds the
embedding model to a vector mode): a hybrid search served lexically on one replica (no embedder there) and
with vectors on another, or by two models during a rollout, is two rankings.

Paging stops at the candidate cap, max(limit, KDBL_HYBRID_DEPTH) hits (100 by default): deeper hits
would come from a deeper candidate set and could repeat earlier ones; the last page says `capped`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kdbl_core.access.principal import Principal
from kdbl_core.access.signing import CursorCodec
from kdbl_core.errors import InvalidArgument, ReadBehind

STALE = "stale: the index changed since this cursor was issued; start over without a cursor"


def listing(principal: Principal, ranking_args: dict[str, Any]) -> str:
    """The listing a search cursor pages: the principal's groups and the ranking's arguments, hashed."""
    body = json.dumps({"g": sorted(principal.groups), "a": ranking_args}, sort_keys=True, separators=(",", ":"),
                      default=str)
    return "search:" + hashlib.sha256(body.encode()).hexdigest()[:32]


def encode(codec: CursorCodec, principal: Principal, listing_: str, *, offset: int, state: int, mode: str) -> str:
    return codec.encode(principal, listing_, {"o": offset, "s": state, "m": mode})


def decode(codec: CursorCodec, cursor: str, principal: Principal, listing_: str, *, state: int, mode: str) -> int:
    """The cursor's offset; InvalidArgument on `cursor` when it is not this caller's, not this query's,
    altered, or cut from another index state or serving mode (`stale: ...`)."""
    position = codec.decode(cursor, principal, listing_)
    offset, cut_from = position.get("o"), position.get("s")
    if not isinstance(offset, int) or offset < 1 or not isinstance(cut_from, int):
        raise InvalidArgument("cursor", "malformed or tampered cursor (pass back next_cursor unchanged)")
    if position.get("m") != mode or cut_from < state:
        raise InvalidArgument("cursor", STALE)
    if cut_from > state:  # cut where the index is further on: this read (a replica) is behind, not the cursor
        raise ReadBehind(f"this replica is behind the cursor's index state ({state} < {cut_from})")
    return offset
