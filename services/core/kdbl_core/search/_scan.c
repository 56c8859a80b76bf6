/*
 * kdbl_core.search._scan: the snippet scan of kdbl_core.search.snippets in C (issue 33: ~20 us of Python
 * per SciFact hit, one str.find pass per lexeme prefix, against ~9 us here: one pass over the text).
 *
 * matches(lowered, prefixes, short, lexemes, stems, stem, cache_max) -> [(start, end, lexeme), ...]
 *
 * The same answer as snippets._matches_py, character for character (tests/unit/test_snippet_scan.py
 * compares the two on generated and hostile text): each occurrence of a prefix that starts a word, or a
 * part of a compound at a letter/digit boundary, whose word stems to a query lexeme; each whole-word
 * occurrence of a 1-2 letter lexeme; in text order, without overlaps. Stemming stays in Python (`stem`,
 * memoised in the dict `stems`, cleared when it holds `cache_max` words).
 *
 * Inputs are checked (types, cache_max; empty words skipped); every read is bounded by the text's or the
 * word's length; the only allocations are the word table (one entry per word) and the result; a long scan
 * answers Ctrl-C and other signals.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    int kind;
    const void *data;
    Py_ssize_t size;
} Text;

#define SIGNAL_EVERY 65536

static inline Py_UCS4 char_at(const Text *t, Py_ssize_t i) { return PyUnicode_READ(t->kind, t->data, i); }

static inline int ascii_digit(Py_UCS4 c) { return c >= '0' && c <= '9'; }

/* str.isalnum of one character: Latin-1 (most of a text) from a table filled at import from the Unicode
 * database, the rest asked of it. */
static unsigned char LATIN1_ALNUM[256];

static inline int alnum(Py_UCS4 c) { return c < 256 ? LATIN1_ALNUM[c] : Py_UNICODE_ISALNUM(c); }

/* A character's class for the scan: not a letter or digit, an ASCII digit, or another letter or digit. */
enum { OTHER = 0, DIGIT = 1, LETTER = 2 };

static unsigned char LATIN1_CLASS[256];

static inline int char_class(Py_UCS4 c)
{
    if (c < 256)
        return LATIN1_CLASS[c];
    return Py_UNICODE_ISALNUM(c) ? LETTER : OTHER;
}

/* Where a word can start, by the classes before and at a position: after a character that is not a letter
 * or digit (WORD_START), or where an ASCII digit meets another letter or digit (a compound's part). */
enum { NO_START = 0, WORD_START = 1, PART_START = 2, ANY_START = WORD_START | PART_START };
static const unsigned char STARTS[3][3] = {
    [OTHER] = {WORD_START, WORD_START, WORD_START},
    [DIGIT] = {NO_START, NO_START, PART_START},
    [LETTER] = {NO_START, PART_START, NO_START},
};

/* The end of the run of letters and digits starting at pos (the regex [^\W_]*: "_" ends a word). */
static Py_ssize_t word_end(const Text *t, Py_ssize_t pos)
{
    while (pos < t->size && alnum(char_at(t, pos)))
        pos++;
    return pos;
}

/* Whether a letter meets a digit (or a digit a letter) between t[pos - 1] and t[pos]. */
static int boundary(const Text *t, Py_ssize_t pos)
{
    if (pos <= 0 || pos >= t->size)
        return 0;
    Py_UCS4 before = char_at(t, pos - 1), after = char_at(t, pos);
    return alnum(before) && alnum(after) && ascii_digit(before) != ascii_digit(after);
}

/* The end of the compound's part starting at pos: the next boundary or the run's end. */
static Py_ssize_t part_end(const Text *t, Py_ssize_t pos)
{
    Py_ssize_t end = pos + 1;
    while (end < t->size && alnum(char_at(t, end)) && !boundary(t, end))
        end++;
    return end;
}

typedef struct {
    PyObject *word; /* borrowed from the caller's tuple */
    int kind;
    const void *data;
    Py_ssize_t length;
    Py_UCS4 head, tail;
    Py_ssize_t next; /* the next word (in order) with the same first character below 256, or -1 */
} Word;

typedef struct {
    PyObject *lowered;
    Text text;
    PyObject *lexemes;  /* frozenset[str] */
    PyObject *stems;    /* dict[str, str] */
    PyObject *stem;     /* callable(str) -> str */
    Py_ssize_t cache_max;
    Word *words;        /* the prefixes, then the short words, each group in the caller's (sorted) order */
    Py_ssize_t n_prefixes, n_words;
    unsigned char heads[256]; /* ANY_START for the words' first characters below 256; for one of another, */
    int other_heads;          /* ANY_START: look at every position past 255 where a word can start */
    Py_ssize_t checked;       /* the position of the last look for a signal */
    Py_ssize_t first[257], last[257]; /* per first character (256: any past 255), its chain of words + 1 */
    Py_ssize_t run_start;     /* where the run of letters and digits at the scan's position began */
    Py_ssize_t split_run;     /* the run whose `splits` answer is memoised (-1: none yet) */
    int split_value;
    PyObject *out;      /* list of (start, end, lexeme) */
} Scan;

#define MAX_BOUNDARIES 3

/* Whether the run of letters and digits at pos is a compound indexed as its parts too: 1..MAX_BOUNDARIES
 * letter/digit boundaries inside the run. Asked of the run the scan is in (it began at s->run_start), and
 * answered once per run: a hostile run ("a1a1...", megabytes long) costs one walk, not one per position. */
static int splits(Scan *s, Py_ssize_t pos)
{
    const Text *t = &s->text;
    if (!alnum(char_at(t, pos))) /* a word can start here only after a non-alnum: no run around pos */
        return 0;
    if (s->split_run == s->run_start)
        return s->split_value;
    Py_ssize_t count = 0;
    for (Py_ssize_t p = s->run_start + 1; p < t->size && alnum(char_at(t, p)); p++) {
        if (ascii_digit(char_at(t, p - 1)) != ascii_digit(char_at(t, p)) && ++count > MAX_BOUNDARIES)
            break;
    }
    s->split_run = s->run_start;
    s->split_value = count > 0 && count <= MAX_BOUNDARIES;
    return s->split_value;
}

/* The lexeme of lowered[start:end] (a new reference), through the memo; NULL with an exception set. */
static PyObject *stem_of(Scan *s, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *word = PyUnicode_Substring(s->lowered, start, end);
    if (word == NULL)
        return NULL;
    PyObject *lexeme = PyDict_GetItemWithError(s->stems, word); /* borrowed */
    if (lexeme != NULL) {
        Py_INCREF(lexeme);
        Py_DECREF(word);
        return lexeme;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(word);
        return NULL;
    }
    if (PyDict_GET_SIZE(s->stems) >= s->cache_max)
        PyDict_Clear(s->stems);
    lexeme = PyObject_CallOneArg(s->stem, word);
    if (lexeme != NULL && !PyUnicode_Check(lexeme)) {
        PyErr_Format(PyExc_TypeError, "stem must return str, not %.80s", Py_TYPE(lexeme)->tp_name);
        Py_CLEAR(lexeme);
    }
    if (lexeme != NULL && PyDict_SetItem(s->stems, word, lexeme) < 0)
        Py_CLEAR(lexeme);
    Py_DECREF(word);
    return lexeme;
}

/* Whether `w` occurs in the text at pos. */
static int occurs(const Text *t, const Word *w, Py_ssize_t pos)
{
    if (w->length > t->size - pos)
        return 0;
    for (Py_ssize_t i = 0; i < w->length; i++) {
        if (PyUnicode_READ(w->kind, w->data, i) != char_at(t, pos + i))
            return 0;
    }
    return 1;
}

/* A prefix at pos (a word's start, or a compound's part at a letter/digit boundary): the end of its word,
 * or of its compound's part, when that stems to a lexeme (*lexeme set, a new reference); 0 when it does
 * not; -1 on an error. */
static Py_ssize_t prefix_match(Scan *s, const Word *w, Py_ssize_t pos, PyObject **lexeme)
{
    const Text *t = &s->text;
    Py_ssize_t end = word_end(t, pos + w->length);
    PyObject *found = stem_of(s, pos, end);
    if (found == NULL)
        return -1;
    int hit = PySet_Contains(s->lexemes, found);
    if (hit == 0 && splits(s, pos)) { /* a part of a compound (kdbl_terms) */
        Py_DECREF(found);
        end = part_end(t, pos);
        found = stem_of(s, pos, end);
        if (found == NULL)
            return -1;
        hit = PySet_Contains(s->lexemes, found);
    }
    if (hit <= 0) {
        Py_DECREF(found);
        return hit;
    }
    *lexeme = found;
    return end;
}

/* A 1-2 letter lexeme at pos, kept as a whole word or a whole part of a compound. */
static int short_match(Scan *s, const Word *w, Py_ssize_t pos, int whole_start, int *split)
{
    const Text *t = &s->text;
    Py_ssize_t end = pos + w->length;
    Py_UCS4 after = end < t->size ? char_at(t, end) : ' ';
    int whole_end = !alnum(after);
    if (whole_start && whole_end)
        return 1;
    if (!whole_end && !(alnum(w->tail) && ascii_digit(after) != ascii_digit(w->tail)))
        return 0;
    if (*split < 0)
        *split = splits(s, pos);
    return *split;
}

static int add(Scan *s, Py_ssize_t start, Py_ssize_t end, PyObject *lexeme)
{
    PyObject *item = Py_BuildValue("(nnO)", start, end, lexeme);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(s->out, item);
    Py_DECREF(item);
    return rc;
}

/* The match starting at pos, if any: the first prefix (in order) whose word stems to a lexeme, else the
 * first short word that stands whole; its end, 0 without one, -1 on an error. A word can start only where
 * the character before is not a letter or digit, or at a letter/digit boundary (then the run must split). */
static Py_ssize_t match_at(Scan *s, Py_ssize_t pos, int whole_start)
{
    const Text *t = &s->text;
    Py_UCS4 c = char_at(t, pos);
    int split = whole_start ? 1 : -1; /* inside a run: whether it splits, asked once */
    for (Py_ssize_t i = s->first[c < 256 ? c : 256] - 1; i >= 0; i = s->words[i].next) {
        const Word *w = &s->words[i];
        if (w->head != c || !occurs(t, w, pos))
            continue;
        if (!whole_start && split < 0)
            split = splits(s, pos);
        if (i < s->n_prefixes) {
            if (!split)
                continue;
            PyObject *lexeme = NULL;
            Py_ssize_t end = prefix_match(s, w, pos, &lexeme);
            if (end < 0)
                return -1;
            if (end == 0)
                continue;
            int rc = add(s, pos, end, lexeme);
            Py_DECREF(lexeme);
            return rc < 0 ? -1 : end;
        }
        int inner = whole_start ? -1 : split;
        if (short_match(s, w, pos, whole_start, &inner))
            return add(s, pos, pos + w->length, w->word) < 0 ? -1 : pos + w->length;
    }
    return 0;
}

/* One pass over the text: at each position where a word or a compound's part can start, the words that
 * begin with its character are compared; a position inside a kept match is passed over (the matches do
 * not overlap: "c-myc" is marked once, not also as "c" and "myc"). Written once per storage width, so the
 * loop over every character reads it directly (~1 ns a character). */
#define SCAN_OF(NAME, TYPE)                                                                 \
    static int NAME(Scan *s)                                                                \
    {                                                                                       \
        const TYPE *chars = (const TYPE *)s->text.data;                                     \
        Py_ssize_t size = s->text.size, resume = 0;                                         \
        int before = OTHER;                                                                 \
        for (Py_ssize_t pos = 0; pos < size; pos++) {                                       \
            Py_UCS4 c = chars[pos];                                                         \
            int kind = char_class(c);                                                       \
            if (kind != OTHER && before == OTHER)                                           \
                s->run_start = pos;                                                         \
            int starts = STARTS[before][kind] & (c < 256 ? s->heads[c] : s->other_heads);   \
            before = kind;                                                                  \
            if (!starts || pos < resume) /* one branch, rarely taken: no mispredictions */  \
                continue;                                                                   \
            if (pos - s->checked >= SIGNAL_EVERY) {                                         \
                s->checked = pos;                                                           \
                if (PyErr_CheckSignals() < 0)                                               \
                    return -1;                                                              \
            }                                                                               \
            Py_ssize_t end = match_at(s, pos, starts == WORD_START);                        \
            if (end < 0)                                                                    \
                return -1;                                                                  \
            if (end > 0)                                                                    \
                resume = end;                                                               \
        }                                                                                   \
        return 0;                                                                           \
    }

SCAN_OF(scan_1, Py_UCS1)
SCAN_OF(scan_2, Py_UCS2)
SCAN_OF(scan_4, Py_UCS4)

static int scan(Scan *s)
{
    switch (s->text.kind) {
    case PyUnicode_1BYTE_KIND:
        return scan_1(s);
    case PyUnicode_2BYTE_KIND:
        return scan_2(s);
    default:
        return scan_4(s);
    }
}

static int take_words(Scan *s, PyObject *words)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(words); i++) {
        PyObject *word = PyTuple_GET_ITEM(words, i);
        if (!PyUnicode_Check(word)) {
            PyErr_Format(PyExc_TypeError, "prefixes and short words must be str, not %.80s",
                         Py_TYPE(word)->tp_name);
            return -1;
        }
        Py_ssize_t length = PyUnicode_GET_LENGTH(word);
        if (length == 0)
            continue;
        Word *w = &s->words[s->n_words];
        w->word = word;
        w->kind = PyUnicode_KIND(word);
        w->data = PyUnicode_DATA(word);
        w->length = length;
        w->head = PyUnicode_READ(w->kind, w->data, 0);
        w->tail = PyUnicode_READ(w->kind, w->data, length - 1);
        if (w->head < 256)
            s->heads[w->head] = ANY_START;
        else
            s->other_heads = ANY_START;
        Py_ssize_t chain = w->head < 256 ? w->head : 256;
        w->next = -1;
        if (s->last[chain])
            s->words[s->last[chain] - 1].next = s->n_words;
        else
            s->first[chain] = s->n_words + 1;
        s->last[chain] = s->n_words + 1;
        s->n_words++;
    }
    return 0;
}

static PyObject *scan_matches(PyObject *module, PyObject *args)
{
    (void)module;
    Scan s = {0};
    PyObject *prefixes, *short_words;
    if (!PyArg_ParseTuple(args, "UO!O!O!O!On:matches", &s.lowered, &PyTuple_Type, &prefixes, &PyTuple_Type,
                          &short_words, &PyFrozenSet_Type, &s.lexemes, &PyDict_Type, &s.stems, &s.stem,
                          &s.cache_max))
        return NULL;
    if (!PyCallable_Check(s.stem)) {
        PyErr_SetString(PyExc_TypeError, "stem must be callable");
        return NULL;
    }
    if (s.cache_max < 1) {
        PyErr_SetString(PyExc_ValueError, "cache_max must be at least 1");
        return NULL;
    }
    s.text.kind = PyUnicode_KIND(s.lowered);
    s.text.data = PyUnicode_DATA(s.lowered);
    s.text.size = PyUnicode_GET_LENGTH(s.lowered);
    s.split_run = -1;
    s.words = PyMem_Calloc((size_t)(PyTuple_GET_SIZE(prefixes) + PyTuple_GET_SIZE(short_words) + 1), sizeof(Word));
    if (s.words == NULL)
        return PyErr_NoMemory();
    int rc = take_words(&s, prefixes);
    s.n_prefixes = s.n_words;
    if (rc == 0)
        rc = take_words(&s, short_words);
    if (rc == 0 && (s.out = PyList_New(0)) != NULL && s.n_words > 0 && scan(&s) < 0)
        Py_CLEAR(s.out);
    PyMem_Free(s.words);
    return s.out;
}

static PyMethodDef scan_methods[] = {
    {"matches", scan_matches, METH_VARARGS,
     "matches(lowered, prefixes, short, lexemes, stems, stem, cache_max) -> [(start, end, lexeme)]: "
     "the words of `lowered` that stem to one of `lexemes` (kdbl_core.search.snippets)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "The snippet scan of kdbl_core.search.snippets, in C.", -1, scan_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void)
{
    for (Py_UCS4 c = 0; c < 256; c++)
    {
        LATIN1_ALNUM[c] = (unsigned char)Py_UNICODE_ISALNUM(c);
        LATIN1_CLASS[c] = (unsigned char)(c >= '0' && c <= '9' ? DIGIT : LATIN1_ALNUM[c] ? LETTER : OTHER);
    }
    return PyModule_Create(&scan_module);
}
