/*
 * kdbl_core.search._fragments: a hit's snippet from its matches, in C (issue 33). After the scan moved to C
 * (_scan.c), choosing the fragments and writing them was most of a snippet's Python: ~6-9 us of a SciFact
 * hit's ~14-18 us, two windows over the matches with a dict of counts, then lists, joins and splits.
 *
 * snippet(text, matches, fragment_chars, max_fragments, fallback_chars, mark, unmark, delimiter) -> str
 *
 * The same string as kdbl_core.search.snippets._snippet_py, character for character
 * (tests/unit/test_snippet_fragments.py compares the two): up to `max_fragments` windows of at most
 * `fragment_chars` characters, each starting at a match and covering the most distinct lexemes (then the
 * most matches; the earliest on ties), clear of the previous fragment; each widened to about
 * `fragment_chars` on spaces, overlapping ones merged, written in text order with the matches between
 * `mark` and `unmark`, `&`, `<` and `>` escaped, whitespace runs (str.split's) folded to one space, the
 * fragments joined by `delimiter`. No window: the text's first `fallback_chars` characters, escaped and
 * folded.
 *
 * Inputs are checked: `matches` is a list of (start, end, lexeme) tuples, in text order, not overlapping,
 * within the text (TypeError / ValueError otherwise), so every read is bounded by the text's length. The
 * only allocations are the per-match table, a dict numbering the distinct lexemes and the output buffer,
 * sized before writing. Long match lists answer Ctrl-C and other signals.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SIGNAL_EVERY 65536
#define LIMIT ((Py_ssize_t)1 << 30) /* the sizes asked for: no sum of them overflows */

typedef struct {
    Py_ssize_t start, end;
    Py_ssize_t lexeme; /* the lexeme's number among the distinct ones */
} Match;

typedef struct {
    Py_ssize_t left, right;
} Span;

typedef struct {
    int kind;
    const void *data;
    Py_ssize_t size;
} Text;

static inline Py_UCS4 char_at(const Text *t, Py_ssize_t i) { return PyUnicode_READ(t->kind, t->data, i); }

/* The matches as a table, each lexeme numbered (equal strings, one number); -1 with an exception set. */
static Py_ssize_t take_matches(PyObject *list, Py_ssize_t size, Match *out, Py_ssize_t *distinct)
{
    PyObject *numbers = PyDict_New();
    if (numbers == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(list), previous_end = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(item, 2))) {
            PyErr_SetString(PyExc_TypeError, "matches must be (start, end, lexeme) tuples");
            goto fail;
        }
        Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        if (start == -1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t end = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        if (end == -1 && PyErr_Occurred())
            goto fail;
        if (start < previous_end || end < start || end > size) {
            PyErr_SetString(PyExc_ValueError, "matches must be in text order, not overlapping, within the text");
            goto fail;
        }
        previous_end = end;
        PyObject *lexeme = PyTuple_GET_ITEM(item, 2);
        PyObject *number = PyDict_GetItemWithError(numbers, lexeme);
        if (number == NULL) {
            if (PyErr_Occurred())
                goto fail;
            number = PyLong_FromSsize_t(*distinct);
            if (number == NULL || PyDict_SetItem(numbers, lexeme, number) < 0) {
                Py_XDECREF(number);
                goto fail;
            }
            Py_DECREF(number);
            out[i].lexeme = (*distinct)++;
        } else {
            out[i].lexeme = PyLong_AsSsize_t(number);
        }
        out[i].start = start;
        out[i].end = end;
    }
    Py_DECREF(numbers);
    return n;
fail:
    Py_DECREF(numbers);
    return -1;
}

/* The window of at most `width` characters starting at a match, clear of `taken` (NULL: none), that covers
 * the most distinct lexemes, then the most matches: two pointers over the matches. 0: none; 1: found; -1: a
 * signal's exception. `counts` has one zeroed slot per distinct lexeme and is left zeroed. */
static int best_window(const Match *m, Py_ssize_t n, Py_ssize_t width, const Span *taken, Py_ssize_t *counts,
                       Span *best)
{
    Py_ssize_t best_distinct = 0, best_count = 0, distinct = 0, j = 0;
    int found = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i % SIGNAL_EVERY == SIGNAL_EVERY - 1 && PyErr_CheckSignals() < 0) {
            for (; i < j; i++) /* leave the counts zeroed */
                counts[m[i].lexeme] = 0;
            return -1;
        }
        Py_ssize_t start = m[i].start;
        if (j < i)
            j = i; /* the counts are empty here: every match before j was counted and taken back */
        Py_ssize_t limit = start + width;
        while (j < n && m[j].end <= limit) {
            if (counts[m[j].lexeme]++ == 0)
                distinct++;
            j++;
        }
        if (j > i) {
            Py_ssize_t end = m[j - 1].end;
            if ((distinct > best_distinct || (distinct == best_distinct && j - i > best_count))
                && (taken == NULL || !(taken->left < end && start < taken->right))) {
                best->left = start;
                best->right = end;
                best_distinct = distinct;
                best_count = j - i;
                found = 1;
            }
            if (--counts[m[i].lexeme] == 0)
                distinct--;
        }
    }
    return found;
}

/* A span grown to about `width` characters, split evenly around it, ending on spaces. */
static Span widen(const Text *t, Py_ssize_t start, Py_ssize_t end, Py_ssize_t width)
{
    Py_ssize_t room = width - (end - start);
    room = room > 0 ? room / 2 : 0;
    Py_ssize_t left = start - room > 0 ? start - room : 0;
    Py_ssize_t right = end + room < t->size ? end + room : t->size;
    if (left > 0) { /* text.find(" ", left, start) */
        Py_ssize_t k = left;
        while (k + 1 <= start && char_at(t, k) != ' ')
            k++;
        if (k + 1 <= start)
            left = k + 1;
    }
    if (right < t->size) { /* text.rfind(" ", end, right) */
        Py_ssize_t k = right - 1;
        while (k >= end && char_at(t, k) != ' ')
            k--;
        if (k >= end)
            right = k;
    }
    Span s = {left, right};
    return s;
}

/* Output with whitespace runs folded to one space, none leading or trailing (" ".join(s.split())). */
typedef struct {
    Py_UCS4 *buf;
    Py_ssize_t length, capacity;
    Py_ssize_t fragment; /* where the fragment being written starts */
    int space;           /* a whitespace run is pending since the last character written */
} Writer;

static inline void put(Writer *w, Py_UCS4 c)
{
    if (Py_UNICODE_ISSPACE(c)) {
        w->space = 1;
        return;
    }
    if (w->space && w->length > w->fragment)
        w->buf[w->length++] = ' ';
    w->space = 0;
    w->buf[w->length++] = c;
}

static void put_text(Writer *w, const Text *t, Py_ssize_t from, Py_ssize_t to)
{
    for (Py_ssize_t i = from; i < to; i++) {
        Py_UCS4 c = char_at(t, i);
        const char *entity = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : NULL;
        if (entity == NULL) {
            put(w, c);
        } else {
            for (; *entity; entity++)
                put(w, (Py_UCS4)*entity);
        }
    }
}

static void put_str(Writer *w, const Text *s)
{
    for (Py_ssize_t i = 0; i < s->size; i++)
        put(w, char_at(s, i));
}

/* One fragment: text[left:right] with the matches inside it marked; `first` is the first match that may be
 * inside (the matches before it end before `left`). Returns the next fragment's first candidate. */
static Py_ssize_t put_fragment(Writer *w, const Text *t, const Match *m, Py_ssize_t n, Py_ssize_t first,
                               Span span, const Text *mark, const Text *unmark)
{
    Py_ssize_t pos = span.left, i = first;
    w->space = 0;
    w->fragment = w->length;
    for (; i < n && m[i].start < span.right; i++) {
        if (m[i].start < span.left || m[i].end > span.right)
            continue;
        put_text(w, t, pos, m[i].start);
        put_str(w, mark);
        put_text(w, t, m[i].start, m[i].end);
        put_str(w, unmark);
        pos = m[i].end;
    }
    put_text(w, t, pos, span.right);
    return i;
}

static int text_of(PyObject *s, Text *t)
{
    t->kind = PyUnicode_KIND(s);
    t->data = PyUnicode_DATA(s);
    t->size = PyUnicode_GET_LENGTH(s);
    return 0;
}

static int span_order(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    if (x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return x->right < y->right ? -1 : x->right > y->right;
}

static PyObject *fragments_snippet(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *text_obj, *matches, *mark_obj, *unmark_obj, *delimiter_obj, *result = NULL;
    Py_ssize_t width, max_fragments, fallback;
    if (!PyArg_ParseTuple(args, "UO!nnnUUU:snippet", &text_obj, &PyList_Type, &matches, &width, &max_fragments,
                          &fallback, &mark_obj, &unmark_obj, &delimiter_obj))
        return NULL;
    if (width < 1 || width > LIMIT || max_fragments < 0 || max_fragments > LIMIT || fallback < 0 || fallback > LIMIT) {
        PyErr_SetString(PyExc_ValueError, "fragment_chars must be 1 to 2**30, max_fragments and fallback_chars "
                                          "0 to 2**30");
        return NULL;
    }
    Text t, mark, unmark, delimiter;
    text_of(text_obj, &t);
    text_of(mark_obj, &mark);
    text_of(unmark_obj, &unmark);
    text_of(delimiter_obj, &delimiter);
    Py_ssize_t n = PyList_GET_SIZE(matches), distinct = 0;
    Match *m = PyMem_Calloc((size_t)n + 1, sizeof(Match));
    Py_ssize_t *counts = NULL;
    Span *taken = NULL;
    Writer w = {0};
    if (m == NULL)
        return PyErr_NoMemory();
    if (take_matches(matches, t.size, m, &distinct) < 0)
        goto done;
    counts = PyMem_Calloc((size_t)distinct + 1, sizeof(Py_ssize_t));
    taken = PyMem_Calloc((size_t)max_fragments + 1, sizeof(Span));
    if (counts == NULL || taken == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_taken = 0;
    for (Py_ssize_t k = 0; k < max_fragments; k++) {
        Span window;
        int found = best_window(m, n, width, n_taken ? &taken[n_taken - 1] : NULL, counts, &window);
        if (found < 0)
            goto done;
        if (!found)
            break;
        taken[n_taken++] = widen(&t, window.left, window.right, width);
    }
    Py_ssize_t capacity = 1;
    if (n_taken == 0) {
        capacity += (fallback < t.size ? fallback : t.size) * 5;
    } else {
        qsort(taken, (size_t)n_taken, sizeof(Span), span_order);
        Py_ssize_t merged = 0;
        for (Py_ssize_t k = 0; k < n_taken; k++) {
            if (merged && taken[k].left <= taken[merged - 1].right) {
                if (taken[k].right > taken[merged - 1].right)
                    taken[merged - 1].right = taken[k].right;
            } else {
                taken[merged++] = taken[k];
            }
        }
        n_taken = merged;
        for (Py_ssize_t k = 0; k < n_taken; k++) /* "&amp;" is the longest a character grows */
            capacity += (taken[k].right - taken[k].left) * 5 + delimiter.size;
        capacity += n * (mark.size + unmark.size); /* merged fragments do not overlap: each match marked once */
    }
    w.capacity = capacity;
    w.buf = PyMem_Malloc((size_t)capacity * sizeof(Py_UCS4));
    if (w.buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_taken == 0) {
        put_text(&w, &t, 0, fallback < t.size ? fallback : t.size);
    } else {
        Py_ssize_t first = 0;
        for (Py_ssize_t k = 0; k < n_taken; k++) {
            if (k) {
                for (Py_ssize_t i = 0; i < delimiter.size; i++) /* as it is: not folded */
                    w.buf[w.length++] = char_at(&delimiter, i);
            }
            first = put_fragment(&w, &t, m, n, first, taken[k], &mark, &unmark);
        }
    }
    assert(w.length <= w.capacity);
    result = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, w.buf, w.length);
done:
    PyMem_Free(w.buf);
    PyMem_Free(taken);
    PyMem_Free(counts);
    PyMem_Free(m);
    return result;
}

static PyMethodDef fragments_methods[] = {
    {"snippet", fragments_snippet, METH_VARARGS,
     "snippet(text, matches, fragment_chars, max_fragments, fallback_chars, mark, unmark, delimiter) -> str: "
     "the hit's snippet from its (start, end, lexeme) matches (kdbl_core.search.snippets)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fragments_module = {
    PyModuleDef_HEAD_INIT, "_fragments", "The snippet's fragments of kdbl_core.search.snippets, in C.", -1,
    fragments_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fragments(void) { return PyModule_Create(&fragments_module); }
