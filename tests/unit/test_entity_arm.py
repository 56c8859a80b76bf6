"""The query side of search mode graph (kdbl_core.search.entity_arm): which runs of a query's words may name an
entity, and which names win when several overlap."""

from __future__ import annotations

from kdbl_core.search import entity_arm


def test_candidate_names_are_word_runs_that_neither_start_nor_end_with_a_stop_word():
    found = entity_arm.windows("What did Acme Corp. acquire from the Bank of America in March 2024?")
    keys = {w.key for w in found}
    assert {"acme", "bank of america", "america", "march 2024"} <= keys  # "Acme Corp." is "acme"
    assert not keys & {"what", "the", "in", "what did", "of america", "the bank"}
    assert all(len(w.key.split()) <= entity_arm.MAX_WINDOW + 2 for w in found)


def test_a_long_query_offers_at_most_max_keys_names():
    query = " ".join(f"Word{i}" for i in range(600))
    assert len({w.key for w in entity_arm.windows(query)}) == entity_arm.MAX_KEYS
    assert entity_arm.windows("") == () and entity_arm.windows("the of and") == ()


def test_the_longest_matching_name_wins_and_every_type_of_it_is_taken():
    query = "loans at Bank of America in Paris"
    found = entity_arm.windows(query)
    rows = [[1, "ORG", "bank of america", "Bank of America"], [2, "PLACE", "america", "America"],
            [3, "PLACE", "paris", "Paris"], [4, "PERSON", "paris", "Paris"]]
    chosen = entity_arm.chosen(found, rows)
    assert [(e.id, e.type) for e in chosen] == [(1, "ORG"), (4, "PERSON"), (3, "PLACE")]  # in query order
    assert query[chosen[0].start:chosen[0].end] == "Bank of America"  # not "America" inside it
    assert sorted(entity_arm.seeds(chosen)) == [1, 3, 4]


def test_dates_and_amounts_rank_but_never_seed():
    found = entity_arm.windows("Acme revenue of $4.2 billion in March 2024")
    rows = [[1, "ORG", "acme", "Acme"], [2, "MONEY", "$4.2 billion", "$4.2 billion"],
            [3, "DATE", "march 2024", "March 2024"]]
    chosen = entity_arm.chosen(found, rows)
    assert {e.id for e in chosen} == {1, 2, 3} and entity_arm.seeds(chosen) == [1]
