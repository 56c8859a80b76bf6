"""kdbl_core.db.sql_text.fold: a statement's text without comments and with its whitespace folded, its quoted
strings and identifiers as written; what its lexer does not read is left unchanged."""

from __future__ import annotations

from kdbl_core.db.sql_text import fold


def test_comments_go_and_whitespace_folds_where_tokens_cannot_merge():
    sql = """
        SELECT a.id , count( * )  AS n   -- the count
          FROM t a /* a block
          comment */ WHERE a.x = %(x)s
           AND a.y >= 2 * a.z - 1 LIMIT %(n)s ;
    """
    # a placeholder is a word: "LIMIT$1" would be one identifier once psycopg numbers it
    assert fold(sql) == "SELECT a.id,count(*)AS n FROM t a WHERE a.x=%(x)s AND a.y>=2*a.z-1 LIMIT %(n)s;"


def test_quoted_strings_and_identifiers_are_kept_as_written():
    sql = "SELECT 'two  spaces -- not a comment /* nor this */', \"odd  name\", 'it''s'  FROM t"
    assert fold(sql) == "SELECT 'two  spaces -- not a comment /* nor this */',\"odd  name\",'it''s' FROM t"


def test_two_operator_characters_keep_the_space_between_them():
    # "a--1" would start a comment, "b/*c" a block comment, "x< -1" must not become the operator "<-"
    assert fold("SELECT a - -1, b / *c, x < -1, y -  +2") == "SELECT a- -1,b/ *c,x< -1,y- +2"


def test_texts_its_lexer_does_not_read_are_left_as_written():
    for sql in ("SELECT $$ a  b $$", "SELECT $q$ x $q$", "SELECT E'it\\'s  here'", "SELECT 'unterminated  x",
                "SELECT 1 /* unterminated  comment", "SELECT 1 /* nested /* comment */ */"):
        assert fold(sql) == sql


def test_folding_twice_changes_nothing():
    sql = "SELECT  x -- c\n FROM ( SELECT 1 AS x ) s WHERE x <> 2"
    assert fold(fold(sql)) == fold(sql) == "SELECT x FROM(SELECT 1 AS x)s WHERE x<>2"
