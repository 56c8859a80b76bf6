"""The search plan (kdbl_core.search.plan, issue 33) without a database: the statement it opens with is the one
whose answer it reads (a retry's copy too), it chooses the serving mode and index state from that answer, and
search_content's plan refuses a bad argument when it is made, before any database work."""

from __future__ import annotations

import dataclasses
import uuid
from collections import namedtuple
from typing import Any

import pytest

from kdbl_api.tools import search
from kdbl_api.tools.context import Services
from kdbl_api.tools.models import SearchContentArgs
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.signing import CursorCodec
from kdbl_core.errors import InvalidArgument
from kdbl_core.search.lexical import Filters
from kdbl_core.search.pipeline import SearchRequest
from kdbl_core.search.plan import Opening, SearchPlan
from kdbl_core.settings import Settings

# the preflight's row, as psycopg's named rows give it
Row = namedtuple("Row", "tenant_on source_on sources_on terms ef_search iterative_scan state entities")


def _row(*, tenant_on: bool = True, source_on: bool | None = None, state: tuple[int, ...] = (5, 6, 7, 8)) -> Row:
    return Row(tenant_on, source_on, None, ["err4021"], None, None, list(state), None)


class _Embedder:
    model_id = "test-model"


class _Conn:
    """Records what is sent; answers each statement with `rows` (none: nothing may be sent)."""

    def __init__(self, rows: list[Row] | None = None) -> None:
        self.rows, self.sent = rows, []

    async def execute(self, sql: str, params: Any) -> Any:
        assert self.rows is not None, "the plan sent a statement although its opening was answered"
        self.sent.append((sql, params))
        conn = self

        class _Cursor:
            async def fetchone(self) -> Row:
                return conn.rows[0]

        return _Cursor()


def _plan(mode: str = "hybrid", **request: Any) -> SearchPlan:
    return SearchPlan(SearchRequest(query="ERR4021 gateway", mode=mode, **request), settings=Settings(),
                      embedder=_Embedder())


async def test_a_plan_reads_the_answer_its_opening_got_with_begin_and_sends_nothing_itself():
    plan = _plan()
    assert isinstance(plan.opening, Opening) and plan.opening.plan is plan and plan.mode is None
    plan.opening.rows = [_row()]  # what AsyncPool.transaction(also=plan.opening) leaves there
    await plan.prepare(_Conn(), plan.opening)
    assert (plan.mode, plan.degraded_reason, plan.state) == ("hybrid", None, max(5, 7))
    assert plan.terms == ["err4021"] and plan.states == (5, 6, 7, 8)


async def test_a_retrys_copy_of_the_opening_leads_back_to_its_plan_which_reads_the_copys_answer():
    plan = _plan(mode="semantic")
    plan.opening.rows = [_row()]
    fresh = dataclasses.replace(plan.opening, rows=None)  # kdbl_api.read_route's copy for one more attempt
    assert fresh.plan is plan and (fresh.sql, fresh.params) == (plan.opening.sql, plan.opening.params)
    fresh.rows = [_row(state=(9, 10, 11, 12))]
    await plan.prepare(_Conn(), fresh)
    assert (plan.mode, plan.state) == ("semantic", 10)


async def test_without_an_answer_a_plan_sends_the_very_statement_it_opens_with():
    plan = _plan(mode="lexical", filters=Filters(source_id=uuid.uuid4()))
    conn = _Conn([_row(source_on=True)])
    await plan.prepare(conn)
    await plan.prepare(conn, dataclasses.replace(plan.opening, rows=None))  # sent with no BEGIN: no answer
    assert conn.sent == [(plan.opening.sql, plan.opening.params)] * 2
    assert (plan.mode, plan.state) == ("lexical", 5)


async def test_a_plan_refuses_to_read_another_plans_answer():
    plan, other = _plan(), _plan()
    other.opening.rows = [_row()]
    with pytest.raises(AssertionError, match="another plan's opening"):
        await plan.prepare(_Conn(), other.opening)


async def test_the_preflight_decides_the_serving_mode_and_says_why_it_is_not_the_asked_for_one():
    unseen = _plan(filters=Filters(source_id=uuid.uuid4()))
    with pytest.raises(InvalidArgument, match="unknown source"):
        await unseen.prepare(_Conn([_row(source_on=None)]))
    off = _plan()
    await off.prepare(_Conn([_row(tenant_on=False)]))
    assert (off.mode, off.degraded_reason, off.state) == ("lexical", "hybrid is disabled for this tenant", 5)
    no_entity = _plan(mode="graph")  # the query names no entity the caller can read (entities: NULL)
    await no_entity.prepare(_Conn([_row()]))
    assert no_entity.mode == "lexical" and no_entity.degraded_reason.startswith("graph: the query names no")
    policy = SearchPlan(SearchRequest(query="x"), settings=Settings(), embedder=_Embedder(), allowed_modes=("lexical",))
    await policy.prepare(_Conn([_row()]))
    assert policy.mode == "lexical" and "policy" in policy.degraded_reason


def test_the_opening_tunes_hnsw_only_where_vectors_may_serve_and_reads_lexemes_for_hybrid_alone():
    hybrid, semantic = _plan().opening.params, _plan(mode="semantic").opening.params
    lexical = _plan(mode="lexical").opening.params
    no_embedder = SearchPlan(SearchRequest(query="x"), settings=Settings()).opening.params
    assert hybrid["tune"] and hybrid["query"] == "ERR4021 gateway"
    assert semantic["tune"] and semantic["query"] is None
    assert not lexical["tune"] and not no_embedder["tune"] and lexical["ekeys"] == []
    assert _plan(mode="graph").opening.params["ekeys"]  # the query's candidate names ride in the preflight


def test_search_contents_plan_refuses_a_bad_argument_when_made_before_any_database_work():
    services = Services(settings=Settings(), cursors=CursorCodec(b"k" * 32))  # no database anywhere
    with pytest.raises(InvalidArgument, match="non-blank"):
        search.opening(services, TenantPolicy(), SearchContentArgs(query="   "))
    with pytest.raises(InvalidArgument, match="explain"):
        search.opening(services, TenantPolicy(), SearchContentArgs(query="x", explain=True, response_mode="ids_only"))
    opening = search.opening(services, TenantPolicy(), SearchContentArgs(query="x", mode="lexical"))
    assert opening.plan.opening is opening and opening.plan.request.query == "x"
