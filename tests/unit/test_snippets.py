"""Snippets mark the words that stem to a query lexeme, pick the densest fragments, never mark inside words."""

from __future__ import annotations

from kdbl_core.search.snippets import DELIMITER, FALLBACK_CHARS, FRAGMENT_CHARS, snippet


def test_marks_inflected_forms_with_the_snowball_stemmer() -> None:
    out = snippet("Studies show effects of the delivery; earlier study was flawed.",
                  frozenset({"studi", "effect", "deliveri"}), "english")
    assert out == ("<mark>Studies</mark> show <mark>effects</mark> of the <mark>delivery</mark>; earlier "
                   "<mark>study</mark> was flawed.")


def test_does_not_mark_a_prefix_inside_another_word() -> None:
    out = snippet("Follow the yellow allowance; low tide.", frozenset({"low"}), "english")
    assert out.count("<mark>") == 1 and "<mark>low</mark> tide" in out


def test_short_lexemes_match_whole_words_only() -> None:
    out = snippet("Vitamin D and dairy, d-dimer.", frozenset({"d"}), "english")
    assert out == "Vitamin <mark>D</mark> and dairy, <mark>d</mark>-dimer."


def test_without_a_match_the_opening_is_returned() -> None:
    text = "word " * 200
    out = snippet(text, frozenset({"okapi"}), "english")
    assert "<mark>" not in out and len(out) <= FALLBACK_CHARS


def test_two_distant_clusters_become_two_fragments() -> None:
    filler = "lorem ipsum dolor sit amet " * 30
    text = f"aspirin trial. {filler} headache trial. {filler}"
    out = snippet(text, frozenset({"aspirin", "headach"}), "english")
    first, second = out.split(DELIMITER)
    assert "<mark>aspirin</mark>" in first and "<mark>headache</mark>" in second
    assert all(len(part) < FRAGMENT_CHARS + 60 for part in (first, second))


def test_fragments_are_the_densest_spans_in_text_order() -> None:
    filler = "lorem ipsum dolor sit amet " * 30
    text = f"fever fever fever. {filler} fever with rash and cough. {filler} a lone rash here."
    first, second = snippet(text, frozenset({"fever", "rash", "cough"}), "english").split(DELIMITER)
    assert first.startswith("<mark>fever</mark> <mark>fever</mark>")
    assert "<mark>rash</mark> and <mark>cough</mark>" in second and "lone" not in second


def test_a_config_without_stemmer_marks_equal_words() -> None:
    out = snippet("Okapi okapis OKAPI", frozenset({"okapi"}), "simple")
    assert out == "<mark>Okapi</mark> okapis <mark>OKAPI</mark>"


def test_offsets_survive_characters_that_change_length_when_lower_cased() -> None:
    out = snippet("İstanbul trial of aspirin", frozenset({"aspirin"}), "english")
    assert out.endswith("<mark>aspirin</mark>") and out.startswith("İstanbul")


def test_a_match_longer_than_a_fragment_falls_back_to_the_opening() -> None:
    word = "cell" + "x" * (FRAGMENT_CHARS + 10)
    out = snippet(f"Opening words. {word} end.", frozenset({word}), "simple")
    assert out.startswith("Opening words.") and "<mark>" not in out


def test_the_stem_memo_is_per_configuration() -> None:
    # "running" stems to "run" in english; the simple configuration keeps the word as it is
    assert snippet("running fast", frozenset({"run"}), "english") == "<mark>running</mark> fast"
    assert snippet("running fast", frozenset({"run"}), "simple") == "running fast"
    assert snippet("running fast", frozenset({"running"}), "simple") == "<mark>running</mark> fast"


def test_a_hyphenated_word_is_marked_once_not_with_its_parts_again() -> None:
    # Postgres indexes "c-myc" as "c-myc", "c" and "myc"
    out = snippet("Role for c-myc in apoptosis.", frozenset({"c-myc", "c", "myc"}), "english")
    assert out == "Role for <mark>c-myc</mark> in apoptosis."


def test_markup_in_the_text_is_escaped_and_only_the_marks_remain_html() -> None:
    text = 'Hostile <script>alert("x")</script> & <img src=x onerror=alert(1)> okapi <b>bold</b> \'q\''
    out = snippet(text, frozenset({"okapi", "script"}), "english")
    assert "<script>" not in out and "<img" not in out and "<b>" not in out
    assert '&lt;<mark>script</mark>&gt;alert("x")&lt;/<mark>script</mark>&gt;' in out
    assert "&amp; &lt;img src=x onerror=alert(1)&gt; <mark>okapi</mark> &lt;b&gt;bold&lt;/b&gt; 'q'" in out
    without_marks = out.replace("<mark>", "").replace("</mark>", "")
    assert "<" not in without_marks and ">" not in without_marks


def test_the_opening_without_a_match_is_escaped_too() -> None:
    assert snippet("<script>x</script> a & b", frozenset({"okapi"}), "english") == (
        "&lt;script&gt;x&lt;/script&gt; a &amp; b")
