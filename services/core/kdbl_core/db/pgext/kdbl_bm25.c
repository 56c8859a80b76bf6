/*
 * kdbl_bm25: packed BM25 posting lists and an exact top-k over them, for K-Lake's keyword arm.
 *
 * Two aggregates, and one function for inspection (docs/architecture.md, "The keyword index and its top-k"):
 *
 *   kdbl_bm25_pack(chunk_id bigint, tf int, dl int ORDER BY chunk_id) -> bytea
 *       one term's postings in one source, packed: a header, then per posting the chunk id's delta
 *       from the previous one, tf and the chunk length (dl) as LEB128 varints (~4 bytes a posting).
 *
 *   kdbl_bm25_topk(list bytea, chunk_id bigint, tf int, dl int, weight float8, k1b_avgdl float8,
 *                  k1_1mb float8, k int, exclude bigint[]) -> float8[]
 *       the k best chunks by BM25 over its input rows, each either a packed list (list not null) or
 *       one posting (chunk_id, tf, dl); weight = idf·(k1+1) of that row's term. A posting scores
 *       weight·tf / (tf + (k1_1mb + k1b_avgdl·dl)), the same float8 operations as lexical.BM25_SQL;
 *       a chunk's score is the sum over its rows. Chunks in `exclude` are left out. Result:
 *       {id1, score1, id2, score2, ...}, best first: by score to 1e-9, ties by the smaller chunk id.
 *
 *   kdbl_bm25_unpack(list bytea) -> setof (chunk_id, tf, dl)
 *
 * Neither function reads a table: the rows they get are the rows the calling query may see, so
 * row-level security and every filter apply before the top k, in SQL.
 *
 * Every argument is untrusted (issue 27: a role with EXECUTE could crash the server with two extreme chunk
 * ids). What is checked, and where:
 *   - arguments, once per row: chunk ids in [0, KB_MAX_ID] (the top k returns ids as float8, exact up to
 *     2^53), tf >= 1, dl >= 0, finite weights, k1_1mb and k1b_avgdl finite and >= 0 (so a posting's
 *     denominator is >= 1 and no score is NaN), 0 <= k <= K_MAX;
 *   - a list's header, once per list (read with memcpy: a bytea's data is not aligned): magic, version,
 *     n >= 1, 0 <= first <= last, n no larger than the bytes can hold;
 *   - every posting: its delta keeps the id within [previous id, last] (one compare, which also bounds
 *     the dense accumulator's index), varints end within the list and within 64 bits, tf and dl fit an
 *     int4 (checked where the score is computed from them); at the end, the last id is the header's and
 *     no bytes are left over.
 *   - spans and sizes with overflow-checked arithmetic (common/int.h), memory with MaxAllocSize checks.
 * Long loops call CHECK_FOR_INTERRUPTS() every INTERRUPT_EVERY postings or ids (a query can be cancelled;
 * ~0.1 ms apart at the loops' speeds).
 *
 * The top k is exact. Scores are summed into a dense array indexed by chunk id when the ids span at most
 * DENSE_FACTOR times the postings read (one large tenant: ~2 ns a posting, lists read in id order), in
 * windows of at most work_mem bytes (one window at the API's 32 MB up to 4M ids), otherwise the lists are
 * merged by chunk id with a binary heap of list cursors.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "common/int.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#ifdef PG_MODULE_MAGIC_EXT
PG_MODULE_MAGIC_EXT(.name = "kdbl_bm25", .version = "1.1");
#else
PG_MODULE_MAGIC;
#endif

#define KB_MAGIC 0x3532424Bu		/* "KB25", little-endian */
#define KB_VERSION 1u
#define KB_MAX_ID (INT64CONST(1) << 53)	/* top k: ids travel as float8 */
#define K_MAX 100000
#define DENSE_FACTOR 16				/* dense accumulator when span <= 16 x postings */
#define INTERRUPT_EVERY 65536		/* postings (or ids scanned) between interrupt checks */

typedef struct KbHeader
{
	uint32		magic;
	uint32		version;
	uint32		n;				/* postings */
	uint32		tf_max;
	int64		first;			/* smallest chunk id */
	int64		last;			/* largest chunk id */
	uint32		dl_min;
	uint32		reserved;
} KbHeader;

StaticAssertDecl(sizeof(KbHeader) == 40, "the packed header is 40 bytes");

#define CORRUPT(...) \
	ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), \
					errmsg("kdbl_bm25: corrupt posting list"), errdetail(__VA_ARGS__)))

/* ---------------------------------------------------------------- varints */

static inline uint8 *
put_varint(uint8 *p, uint64 v)
{
	while (v >= 0x80)
	{
		*p++ = (uint8) (v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8) v;
	return p;
}

/* A varint of at most 10 bytes that ends before `end` and fits 64 bits. */
static inline uint64
get_varint(const uint8 **pp, const uint8 *end)
{
	const uint8 *p = *pp;
	uint64		v = 0;
	int			shift = 0;

	for (;;)
	{
		uint8		b;

		if (unlikely(p >= end))
			CORRUPT("a varint runs past the end of the list");
		b = *p++;
		if (unlikely(shift == 63 && b > 1))
			CORRUPT("a varint does not fit 64 bits");
		v |= (uint64) (b & 0x7f) << shift;
		if (!(b & 0x80))
			break;
		shift += 7;
	}
	*pp = p;
	return v;
}

/*
 * One posting (delta, tf, dl) from p: a posting takes at most 3 x 10 bytes, so when that much is left the
 * bytes are read without a bound check, and one-byte varints (most tf and dl, and the deltas of common
 * terms) take no loop. Near the end get_varint()'s checks apply.
 */
#define POSTING_MAX_BYTES 30

static inline uint64
fast_varint(const uint8 **pp)
{
	const uint8 *p = *pp;
	uint64		v;
	int			shift;

	if (likely(*p < 0x80))
	{
		*pp = p + 1;
		return *p;
	}
	v = *p++ & 0x7f;
	for (shift = 7;; shift += 7)
	{
		uint8		b = *p++;

		if (unlikely(shift == 63 && b > 1))
			CORRUPT("a varint does not fit 64 bits");
		v |= (uint64) (b & 0x7f) << shift;
		if (!(b & 0x80))
			break;
	}
	*pp = p;
	return v;
}

static inline void
read_posting(const uint8 **pp, const uint8 *end, uint64 *delta, uint64 *tf, uint64 *dl)
{
	if (likely(end - *pp >= POSTING_MAX_BYTES))
	{
		*delta = fast_varint(pp);
		*tf = fast_varint(pp);
		*dl = fast_varint(pp);
	}
	else
	{
		*delta = get_varint(pp, end);
		*tf = get_varint(pp, end);
		*dl = get_varint(pp, end);
	}
}

/* A posting's id: `id` plus `delta`, which must not pass the list's `last` id (no overflow: 0 <= id <= last). */
static inline int64
next_id(int64 id, uint64 delta, int64 last)
{
	if (unlikely(delta > (uint64) (last - id)))
		CORRUPT("a posting's chunk id is past the list's last id " INT64_FORMAT, last);
	return id + (int64) delta;
}

/* tf and dl as pack writes them: 1 <= tf, 0 <= dl, both int4 */
static inline void
check_tf_dl(uint64 tf, uint64 dl)
{
	if (unlikely(tf == 0 || tf > PG_INT32_MAX || dl > PG_INT32_MAX))
		CORRUPT("a posting has tf " UINT64_FORMAT " and dl " UINT64_FORMAT, tf, dl);
}

/* A list whose header was checked; `p` is its first posting. */
typedef struct KbList
{
	const uint8 *p;
	const uint8 *end;
	int64		first;
	int64		last;
	uint32		n;
} KbList;

static void
list_open(const bytea *list, KbList *l)
{
	const uint8 *data = (const uint8 *) VARDATA_ANY(list);
	Size		len = VARSIZE_ANY_EXHDR(list);
	KbHeader	h;

	if (len < sizeof(KbHeader))
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("kdbl_bm25: posting list too short")));
	memcpy(&h, data, sizeof(KbHeader));	/* not aligned: a short varlena header, or 4 bytes of one */
	if (h.magic != KB_MAGIC || h.version != KB_VERSION)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("kdbl_bm25: not a version-%u posting list", KB_VERSION)));
	if (h.n == 0 || h.first < 0 || h.last < h.first)
		CORRUPT("the header says %u postings with chunk ids " INT64_FORMAT " to " INT64_FORMAT,
				h.n, h.first, h.last);
	/* a posting takes at least 3 bytes; n ids in [first, last] */
	if ((uint64) h.n > (len - sizeof(KbHeader)) / 3 || (uint64) (h.n - 1) > (uint64) (h.last - h.first))
		CORRUPT("the header says %u postings with chunk ids " INT64_FORMAT " to " INT64_FORMAT " in %zu bytes",
				h.n, h.first, h.last, len);
	l->p = data + sizeof(KbHeader);
	l->end = data + len;
	l->first = h.first;
	l->last = h.last;
	l->n = h.n;
}

/* After a list's last posting: it had the header's last id, and nothing follows it. */
static inline void
list_done(const uint8 *p, const uint8 *end, int64 id, int64 last)
{
	if (unlikely(id != last))
		CORRUPT("the list ends at chunk id " INT64_FORMAT ", its header says " INT64_FORMAT, id, last);
	if (unlikely(p != end))
		CORRUPT("%zu bytes follow the list's last posting", (Size) (end - p));
}

/* ---------------------------------------------------------------- pack */

typedef struct PackState
{
	int64	   *ids;
	int32	   *tfs;
	int32	   *dls;
	Size		n;
	Size		cap;
	bool		sorted;
} PackState;

typedef struct Posting
{
	int64		id;
	int32		tf;
	int32		dl;
} Posting;

static int
posting_cmp(const void *a, const void *b, void *arg)
{
	int64		x = ((const Posting *) a)->id,
				y = ((const Posting *) b)->id;

	return (x > y) - (x < y);
}

/* the largest list: each posting takes at most 9 + 5 + 5 bytes (delta < 2^63, tf and dl < 2^31) */
#define PACK_POSTING_MAX_BYTES 19
#define PACK_MAX_POSTINGS ((MaxAllocSize - VARHDRSZ - sizeof(KbHeader)) / PACK_POSTING_MAX_BYTES)

PG_FUNCTION_INFO_V1(kdbl_bm25_pack_step);
Datum
kdbl_bm25_pack_step(PG_FUNCTION_ARGS)
{
	MemoryContext aggctx,
				old;
	PackState  *st;
	int64		id;
	int32		tf,
				dl;

	if (!AggCheckCallContext(fcinfo, &aggctx))
		elog(ERROR, "kdbl_bm25_pack_step called outside an aggregate");
	st = PG_ARGISNULL(0) ? NULL : (PackState *) PG_GETARG_POINTER(0);
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("kdbl_bm25_pack: chunk_id, tf and dl must not be null")));
	id = PG_GETARG_INT64(1);
	tf = PG_GETARG_INT32(2);
	dl = PG_GETARG_INT32(3);
	if (id < 0 || tf < 1 || dl < 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("kdbl_bm25_pack: chunk_id and dl must be >= 0 and tf >= 1")));
	old = MemoryContextSwitchTo(aggctx);
	if (st == NULL)
	{
		st = palloc0(sizeof(PackState));
		st->cap = 64;
		st->ids = palloc(st->cap * sizeof(int64));
		st->tfs = palloc(st->cap * sizeof(int32));
		st->dls = palloc(st->cap * sizeof(int32));
		st->sorted = true;
	}
	else if (st->n == st->cap)
	{
		if (st->n >= PACK_MAX_POSTINGS)
			ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
							errmsg("kdbl_bm25_pack: more than %zu postings in one list", (Size) PACK_MAX_POSTINGS)));
		st->cap = Min(st->cap * 2, PACK_MAX_POSTINGS);
		st->ids = repalloc_huge(st->ids, st->cap * sizeof(int64));
		st->tfs = repalloc_huge(st->tfs, st->cap * sizeof(int32));
		st->dls = repalloc_huge(st->dls, st->cap * sizeof(int32));
	}
	MemoryContextSwitchTo(old);
	if (st->n > 0 && id <= st->ids[st->n - 1])
		st->sorted = false;
	st->ids[st->n] = id;
	st->tfs[st->n] = tf;
	st->dls[st->n] = dl;
	st->n++;
	PG_RETURN_POINTER(st);
}

PG_FUNCTION_INFO_V1(kdbl_bm25_pack_final);
Datum
kdbl_bm25_pack_final(PG_FUNCTION_ARGS)
{
	PackState  *st;
	Size		i;
	bytea	   *out;
	KbHeader	h;
	uint8	   *p;
	int64		prev;

	if (!AggCheckCallContext(fcinfo, NULL))
		elog(ERROR, "kdbl_bm25_pack_final called outside an aggregate");
	st = PG_ARGISNULL(0) ? NULL : (PackState *) PG_GETARG_POINTER(0);
	if (st == NULL || st->n == 0)
		PG_RETURN_NULL();
	Assert(st->n <= PACK_MAX_POSTINGS);
	if (!st->sorted)
	{
		Posting    *tmp = palloc_extended(st->n * sizeof(Posting), MCXT_ALLOC_HUGE);

		for (i = 0; i < st->n; i++)
		{
			tmp[i].id = st->ids[i];
			tmp[i].tf = st->tfs[i];
			tmp[i].dl = st->dls[i];
		}
		qsort_interruptible(tmp, st->n, sizeof(Posting), posting_cmp, NULL);
		for (i = 0; i < st->n; i++)
		{
			st->ids[i] = tmp[i].id;
			st->tfs[i] = tmp[i].tf;
			st->dls[i] = tmp[i].dl;
		}
		pfree(tmp);
		st->sorted = true;
	}
	for (i = 1; i < st->n; i++)
		if (st->ids[i] == st->ids[i - 1])
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							errmsg("kdbl_bm25_pack: chunk " INT64_FORMAT " twice in one list", st->ids[i])));
	out = palloc(VARHDRSZ + sizeof(KbHeader) + st->n * PACK_POSTING_MAX_BYTES);
	memset(&h, 0, sizeof(KbHeader));
	h.magic = KB_MAGIC;
	h.version = KB_VERSION;
	h.n = (uint32) st->n;		/* < PACK_MAX_POSTINGS < 2^32 */
	h.first = st->ids[0];
	h.last = st->ids[st->n - 1];
	h.dl_min = PG_UINT32_MAX;
	p = (uint8 *) VARDATA(out) + sizeof(KbHeader);
	prev = st->ids[0];
	for (i = 0; i < st->n; i++)
	{
		if ((i & (INTERRUPT_EVERY - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
		/* ids are >= 0 and ascending: the delta is in [0, 2^63) */
		p = put_varint(p, (uint64) (st->ids[i] - prev));
		p = put_varint(p, (uint64) st->tfs[i]);
		p = put_varint(p, (uint64) st->dls[i]);
		prev = st->ids[i];
		if ((uint32) st->tfs[i] > h.tf_max)
			h.tf_max = (uint32) st->tfs[i];
		if ((uint32) st->dls[i] < h.dl_min)
			h.dl_min = (uint32) st->dls[i];
	}
	memcpy(VARDATA(out), &h, sizeof(KbHeader));
	SET_VARSIZE(out, p - (uint8 *) out);
	PG_RETURN_BYTEA_P(out);
}

/* kdbl_bm25_unpack(list) -> setof (chunk_id, tf, dl): a list's postings, for tests and inspection */
PG_FUNCTION_INFO_V1(kdbl_bm25_unpack);
Datum
kdbl_bm25_unpack(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bytea	   *list = PG_GETARG_BYTEA_PP(0);
	KbList		l;
	int64		id;
	uint32		i;

	list_open(list, &l);
	id = l.first;
	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < l.n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};
		uint64		tf,
					dl;

		if ((i & (INTERRUPT_EVERY - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
		id = next_id(id, get_varint(&l.p, l.end), l.last);
		tf = get_varint(&l.p, l.end);
		dl = get_varint(&l.p, l.end);
		check_tf_dl(tf, dl);
		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum((int32) tf);
		values[2] = Int32GetDatum((int32) dl);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	list_done(l.p, l.end, id, l.last);
	return (Datum) 0;
}

/* ---------------------------------------------------------------- top k */

typedef struct TopList
{
	bytea	   *copy;			/* detoasted copy, in the aggregate's context; `list` points into it */
	KbList		list;
	double		weight;
} TopList;

typedef struct Single
{
	int64		id;
	double		weight;
	int32		tf;
	int32		dl;
} Single;

typedef struct TopState
{
	TopList    *lists;
	Size		nlists;
	Size		caplists;
	Single	   *singles;
	Size		nsingles;
	Size		capsingles;
	int64	   *exclude;		/* sorted */
	int			nexclude;
	double		k1b_avgdl;
	double		k1_1mb;
	int			k;
	bool		params_set;
} TopState;

static int
int64_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a,
				y = *(const int64 *) b;

	return (x > y) - (x < y);
}

static int
int64_cmp_arg(const void *a, const void *b, void *arg)
{
	return int64_cmp(a, b);
}

static void
topk_params(TopState *st, FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(6) || PG_ARGISNULL(7) || PG_ARGISNULL(8))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("kdbl_bm25_topk: k1b_avgdl, k1_1mb and k must not be null")));
	st->k1b_avgdl = PG_GETARG_FLOAT8(6);
	st->k1_1mb = PG_GETARG_FLOAT8(7);
	st->k = PG_GETARG_INT32(8);
	if (!isfinite(st->k1b_avgdl) || !isfinite(st->k1_1mb) || st->k1b_avgdl < 0 || st->k1_1mb < 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("kdbl_bm25_topk: k1b_avgdl and k1_1mb must be finite and >= 0")));
	if (st->k < 0 || st->k > K_MAX)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("kdbl_bm25_topk: k must be between 0 and %d", K_MAX)));
	if (!PG_ARGISNULL(9))
	{
		ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(9);
		Datum	   *elems;
		bool	   *enulls;
		int			n,
					i,
					j = 0;

		deconstruct_array(arr, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, &enulls, &n);
		st->exclude = palloc(((Size) n + 1) * sizeof(int64));
		for (i = 0; i < n; i++)
			if (!enulls[i])
				st->exclude[j++] = DatumGetInt64(elems[i]);
		st->nexclude = j;
		qsort_interruptible(st->exclude, j, sizeof(int64), int64_cmp_arg, NULL);
	}
	st->params_set = true;
}

PG_FUNCTION_INFO_V1(kdbl_bm25_topk_step);
Datum
kdbl_bm25_topk_step(PG_FUNCTION_ARGS)
{
	MemoryContext aggctx,
				old;
	TopState   *st;
	double		weight;
	bool		single;

	if (!AggCheckCallContext(fcinfo, &aggctx))
		elog(ERROR, "kdbl_bm25_topk_step called outside an aggregate");
	st = PG_ARGISNULL(0) ? NULL : (TopState *) PG_GETARG_POINTER(0);
	old = MemoryContextSwitchTo(aggctx);
	if (st == NULL)
		st = palloc0(sizeof(TopState));
	if (!st->params_set)
		topk_params(st, fcinfo);
	single = !PG_ARGISNULL(2) || !PG_ARGISNULL(3) || !PG_ARGISNULL(4);
	if (PG_ARGISNULL(5) || (PG_ARGISNULL(1) && !single))
	{
		MemoryContextSwitchTo(old);
		PG_RETURN_POINTER(st);	/* a term without statistics, or an empty row: scores nothing */
	}
	weight = PG_GETARG_FLOAT8(5);
	if (!isfinite(weight))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("kdbl_bm25_topk: weight must be finite")));
	if (!PG_ARGISNULL(1))
	{
		TopList    *t;

		if (single)
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							errmsg("kdbl_bm25_topk: a row has a list or a posting (chunk_id, tf, dl), not both")));
		if (st->nlists == st->caplists)
		{
			st->caplists = st->caplists ? st->caplists * 2 : 16;
			st->lists = st->lists ? repalloc(st->lists, st->caplists * sizeof(TopList))
				: palloc(st->caplists * sizeof(TopList));
		}
		t = &st->lists[st->nlists];
		t->copy = (bytea *) PG_DETOAST_DATUM_COPY(PG_GETARG_DATUM(1));
		list_open(t->copy, &t->list);
		if (t->list.last > KB_MAX_ID)
			ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
							errmsg("kdbl_bm25_topk: chunk ids above 2^53 are not supported")));
		t->weight = weight;
		st->nlists++;
	}
	else
	{
		Single	   *s;

		if (PG_ARGISNULL(2) || PG_ARGISNULL(3) || PG_ARGISNULL(4))
			ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
							errmsg("kdbl_bm25_topk: a posting's chunk_id, tf and dl must all be given")));
		if (st->nsingles == st->capsingles)
		{
			st->capsingles = st->capsingles ? st->capsingles * 2 : 256;
			st->singles = st->singles ? repalloc_huge(st->singles, st->capsingles * sizeof(Single))
				: palloc(st->capsingles * sizeof(Single));
		}
		s = &st->singles[st->nsingles];
		s->id = PG_GETARG_INT64(2);
		s->tf = PG_GETARG_INT32(3);
		s->dl = PG_GETARG_INT32(4);
		s->weight = weight;
		if (s->id < 0 || s->id > KB_MAX_ID)
			ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
							errmsg("kdbl_bm25_topk: chunk_id " INT64_FORMAT " is outside 0 to 2^53", s->id)));
		if (s->tf < 1 || s->dl < 0)
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							errmsg("kdbl_bm25_topk: a posting's tf must be >= 1 and dl >= 0")));
		st->nsingles++;
	}
	MemoryContextSwitchTo(old);
	PG_RETURN_POINTER(st);
}

static inline double
bm25(double weight, double tf, double dl, double k1_1mb, double k1b_avgdl)
{
	/* lexical.BM25_SQL: w.idf_k1 * p.tf / (p.tf + (k1(1-b) + w.k1b_avgdl * p.dl)) */
	return weight * tf / (tf + (k1_1mb + k1b_avgdl * dl));
}

/* The k best (score desc, id asc): a heap whose root is the worst kept. */
typedef struct Best
{
	int64	   *id;
	double	   *score;
	int			n;
	int			k;
	double		floor;			/* scaled scores below this cannot enter (best_may_take) */
} Best;

/*
 * Ranking order: score to 1e-9 (rounded half to even, as lexical.rank_order's round() and Python's
 * round()), then the smaller chunk id. Scores equal in exact arithmetic can differ in the last bit with
 * the order their terms were summed in; rounded, a tie is a tie whichever method summed it.
 */
#define RANK_SCALE 1e9

static inline bool
worse(double sa, int64 ia, double sb, int64 ib)
{
	double		ka = rint(sa * RANK_SCALE),
				kb = rint(sb * RANK_SCALE);

	return ka < kb || (ka == kb && ia > ib);
}

/*
 * Whether `score` can enter a full heap: a cheap test before best_offer(), which most chunks fail (the scan
 * offers every chunk that scored). A score whose scaled value is a whole unit below the worst kept one's
 * rounded value cannot round up to it.
 */
static inline bool
best_may_take(const Best *b, double score)
{
	return b->n < b->k || score * RANK_SCALE >= b->floor;
}

static void
best_offer(Best *b, int64 id, double score)
{
	int			i;

	if (b->k == 0)
		return;
	if (b->n < b->k)
	{
		i = b->n++;
		while (i > 0)
		{
			int			parent = (i - 1) / 2;

			if (!worse(score, id, b->score[parent], b->id[parent]))
				break;
			b->id[i] = b->id[parent];
			b->score[i] = b->score[parent];
			i = parent;
		}
		b->id[i] = id;
		b->score[i] = score;
		b->floor = rint(b->score[0] * RANK_SCALE) - 1.0;
		return;
	}
	if (!worse(b->score[0], b->id[0], score, id))
		return;
	i = 0;
	for (;;)
	{
		int			l = 2 * i + 1,
					r = l + 1,
					m = i;
		double		ms = score;
		int64		mi = id;

		if (l < b->n && worse(b->score[l], b->id[l], ms, mi))
		{
			m = l;
			ms = b->score[l];
			mi = b->id[l];
		}
		if (r < b->n && worse(b->score[r], b->id[r], ms, mi))
			m = r;
		if (m == i)
			break;
		b->id[i] = b->id[m];
		b->score[i] = b->score[m];
		i = m;
	}
	b->id[i] = id;
	b->score[i] = score;
	b->floor = rint(b->score[0] * RANK_SCALE) - 1.0;
}

static bool
excluded(const TopState *st, int64 id)
{
	return st->nexclude > 0 &&
		bsearch(&id, st->exclude, st->nexclude, sizeof(int64), int64_cmp) != NULL;
}

/*
 * A posting's score for the commonest (tf, dl) pairs of a long list, computed once per list (and window) by
 * the same bm25() (so bit for bit the same value): a division per posting becomes a load from a table that
 * stays in the L1 cache. Measured at 1M chunks (~520k postings a query, 100 queries, p50 of 3 runs): the
 * aggregate 1.66 -> 1.58 ms.
 */
#define TABLE_TF 4
#define TABLE_DL 512
#define TABLE_MIN_POSTINGS 8192

/* A list read window by window: the posting read last, and where the next one starts. */
typedef struct DenseCursor
{
	KbList		list;			/* list.p: the next posting */
	int64		id;				/* the posting read last */
	uint32		left;			/* postings not read yet */
	bool		held;			/* the posting read last is past the window: added in a later one */
	bool		done;
	uint64		tf;				/* the held posting's */
	uint64		dl;
	double		weight;
} DenseCursor;

/* Add the cursor's postings with ids in [wlo, whi] to acc[id - wlo]. */
static void
dense_list(const TopState *st, DenseCursor *c, double *acc, int64 wlo, int64 whi, double *table)
{
	const uint8 *p = c->list.p,
			   *end = c->list.end;
	int64		id = c->id,
				limit;
	uint32		left = c->left;
	double		w = c->weight;
	bool		tabled = c->list.n >= TABLE_MIN_POSTINGS;

	if (c->done || id > whi)
		return;					/* nothing of this list in this window */
	if (tabled)
	{
		int			t,
					d;

		for (t = 0; t < TABLE_TF; t++)
			for (d = 0; d < TABLE_DL; d++)
				table[t * TABLE_DL + d] = bm25(w, (double) (t + 1), (double) d, st->k1_1mb, st->k1b_avgdl);
	}
	if (c->held)
	{
		acc[id - wlo] += bm25(w, (double) c->tf, (double) c->dl, st->k1_1mb, st->k1b_avgdl);
		c->held = false;
	}
	limit = Min(c->list.last, whi);
	while (left > 0)
	{
		uint32		stop = left > INTERRUPT_EVERY ? left - INTERRUPT_EVERY : 0;

		CHECK_FOR_INTERRUPTS();
		while (left > stop)
		{
			uint64		delta,
						tf,
						dl;

			read_posting(&p, end, &delta, &tf, &dl);
			left--;
			/* id <= limit: one compare bounds the index, and a posting past the window stops */
			if (unlikely(delta > (uint64) (limit - id)))
			{
				id = next_id(id, delta, c->list.last);	/* within the list, past the window */
				check_tf_dl(tf, dl);
				c->held = true;
				c->tf = tf;
				c->dl = dl;
				goto out;
			}
			id += (int64) delta;
			if (tabled && tf - 1 < TABLE_TF && dl < TABLE_DL)
				acc[id - wlo] += table[(tf - 1) * TABLE_DL + dl];
			else
			{
				check_tf_dl(tf, dl);
				acc[id - wlo] += bm25(w, (double) tf, (double) dl, st->k1_1mb, st->k1b_avgdl);
			}
		}
	}
	list_done(p, end, id, c->list.last);
	c->done = true;
out:
	c->list.p = p;
	c->id = id;
	c->left = left;
}

typedef struct SingleRef
{
	int64		id;
	Size		i;				/* index in the input: sorted by (id, i), scores are summed in input order */
} SingleRef;

static int
single_ref_cmp(const void *a, const void *b, void *arg)
{
	const SingleRef *x = (const SingleRef *) a,
			   *y = (const SingleRef *) b;

	if (x->id != y->id)
		return (x->id > y->id) - (x->id < y->id);
	return (x->i > y->i) - (x->i < y->i);
}

/* Offer the window's chunks that scored: until the heap is full every one, then those above its floor. */
static void
dense_scan(Best *best, const double *acc, int64 wlo, Size wlen)
{
	Size		j = 0;

	while (j < wlen)
	{
		Size		stop = Min(wlen, j + 16 * INTERRUPT_EVERY);

		CHECK_FOR_INTERRUPTS();
		for (; j < stop && best->n < best->k; j++)
			if (acc[j] > 0.0)
				best_offer(best, wlo + (int64) j, acc[j]);
		/*
		 * Then one comparison with a threshold just below the worst kept score, which nearly every chunk fails
		 * (a predictable branch: testing `acc > 0` first mispredicted on about half the chunks and took ~3/4
		 * of this function).
		 */
		if (j < stop)
		{
			double		threshold = Max((best->floor - 1.0) / RANK_SCALE, 0.0);

			for (; j < stop; j++)
				if (unlikely(acc[j] > threshold) && best_may_take(best, acc[j]))
				{
					best_offer(best, wlo + (int64) j, acc[j]);
					threshold = Max((best->floor - 1.0) / RANK_SCALE, 0.0);
				}
		}
	}
}

/*
 * Dense: ids lo .. lo + span - 1, in windows of at most work_mem (one window, the common case, reads each
 * list straight through as before; more keep a cursor per list and add the singles in id order).
 */
static void
topk_dense(TopState *st, Best *best, int64 lo, int64 span)
{
	Size		cap = Max((Size) work_mem * 1024 / sizeof(double), 1024),
				wlen = Min((Size) span, cap);
	double	   *acc = palloc_extended(wlen * sizeof(double), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	double	   *table = palloc(TABLE_TF * TABLE_DL * sizeof(double));
	DenseCursor *cur = palloc(Max(st->nlists, 1) * sizeof(DenseCursor));
	SingleRef  *order = NULL;
	Size		l,
				s = 0,
				e = 0;
	int64		wlo;
	bool		windows = (Size) span > wlen;

	for (l = 0; l < st->nlists; l++)
	{
		cur[l].list = st->lists[l].list;
		cur[l].id = cur[l].list.first;
		cur[l].left = cur[l].list.n;
		cur[l].held = false;
		cur[l].done = false;
		cur[l].weight = st->lists[l].weight;
	}
	if (windows && st->nsingles > 0)
	{
		order = palloc_extended(st->nsingles * sizeof(SingleRef), MCXT_ALLOC_HUGE);
		for (s = 0; s < st->nsingles; s++)
		{
			order[s].id = st->singles[s].id;
			order[s].i = s;
		}
		qsort_interruptible(order, st->nsingles, sizeof(SingleRef), single_ref_cmp, NULL);
		s = 0;
	}
	while (e < (Size) st->nexclude && st->exclude[e] < lo)
		e++;
	for (wlo = lo; wlo - lo < span; wlo += (int64) wlen)
	{
		Size		n = Min(wlen, (Size) (span - (wlo - lo)));
		int64		whi = wlo + (int64) n - 1;

		if (wlo != lo)
			memset(acc, 0, n * sizeof(double));
		for (l = 0; l < st->nlists; l++)
			dense_list(st, &cur[l], acc, wlo, whi, table);
		if (order == NULL)
		{
			Size		i;

			for (i = 0; i < st->nsingles; i++)
			{
				const Single *x = &st->singles[i];

				if ((i & (INTERRUPT_EVERY - 1)) == 0)
					CHECK_FOR_INTERRUPTS();
				acc[x->id - wlo] += bm25(x->weight, (double) x->tf, (double) x->dl, st->k1_1mb, st->k1b_avgdl);
			}
		}
		else
			for (; s < st->nsingles && order[s].id <= whi; s++)
			{
				const Single *x = &st->singles[order[s].i];

				if ((s & (INTERRUPT_EVERY - 1)) == 0)
					CHECK_FOR_INTERRUPTS();
				acc[x->id - wlo] += bm25(x->weight, (double) x->tf, (double) x->dl, st->k1_1mb, st->k1b_avgdl);
			}
		for (; e < (Size) st->nexclude && st->exclude[e] <= whi; e++)
			acc[st->exclude[e] - wlo] = 0.0;
		dense_scan(best, acc, wlo, n);
	}
	pfree(acc);
}

/* Merge: list cursors in a binary heap by current chunk id; singles sorted and scored as one list. */
typedef struct Cursor
{
	const uint8 *p;
	const uint8 *end;
	uint32		left;			/* postings after the current one */
	int64		id;				/* current chunk id */
	int64		last;
	double		score;			/* current posting's score */
	double		weight;
} Cursor;

typedef struct Scored
{
	int64		id;
	double		score;
} Scored;

static int
scored_id_cmp(const void *a, const void *b, void *arg)
{
	int64		x = ((const Scored *) a)->id,
				y = ((const Scored *) b)->id;

	return (x > y) - (x < y);
}

static inline void
cursor_read(const TopState *st, Cursor *c)
{
	uint64		delta,
				tf,
				dl;

	read_posting(&c->p, c->end, &delta, &tf, &dl);
	c->id = next_id(c->id, delta, c->last);
	check_tf_dl(tf, dl);
	c->score = bm25(c->weight, (double) tf, (double) dl, st->k1_1mb, st->k1b_avgdl);
}

static void
heap_down(Cursor **heap, int n, int i)
{
	Cursor	   *c = heap[i];

	for (;;)
	{
		int			l = 2 * i + 1,
					m = l;

		if (l >= n)
			break;
		if (l + 1 < n && heap[l + 1]->id < heap[l]->id)
			m = l + 1;
		if (heap[m]->id >= c->id)
			break;
		heap[i] = heap[m];
		i = m;
	}
	heap[i] = c;
}

static void
topk_merge(TopState *st, Best *best)
{
	Cursor	   *cur = palloc(Max(st->nlists, 1) * sizeof(Cursor));
	Cursor	  **heap = palloc(Max(st->nlists, 1) * sizeof(Cursor *));
	Scored	   *singles = palloc_extended(Max(st->nsingles, 1) * sizeof(Scored), MCXT_ALLOC_HUGE);
	int			nheap = 0,
				i;
	Size		l,
				s = 0,
				ns = st->nsingles;
	uint32		tick = 0;

	if (st->nlists > (Size) PG_INT32_MAX)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("kdbl_bm25_topk: too many lists")));
	for (s = 0; s < ns; s++)
	{
		const Single *x = &st->singles[s];

		singles[s].id = x->id;
		singles[s].score = bm25(x->weight, (double) x->tf, (double) x->dl, st->k1_1mb, st->k1b_avgdl);
	}
	qsort_interruptible(singles, ns, sizeof(Scored), scored_id_cmp, NULL);
	s = 0;
	for (l = 0; l < st->nlists; l++)
	{
		const KbList *list = &st->lists[l].list;

		cur[l].p = list->p;
		cur[l].end = list->end;
		cur[l].weight = st->lists[l].weight;
		cur[l].id = list->first;
		cur[l].last = list->last;
		cur[l].left = list->n - 1;	/* n >= 1 (list_open) */
		cursor_read(st, &cur[l]);
		heap[nheap++] = &cur[l];
	}
	for (i = nheap / 2 - 1; i >= 0; i--)
		heap_down(heap, nheap, i);
	while (nheap > 0 || s < ns)
	{
		int64		id;
		double		score = 0.0;

		if (unlikely(++tick == INTERRUPT_EVERY))
		{
			tick = 0;
			CHECK_FOR_INTERRUPTS();
		}
		if (nheap > 0 && (s >= ns || heap[0]->id <= singles[s].id))
			id = heap[0]->id;
		else
			id = singles[s].id;
		while (nheap > 0 && heap[0]->id == id)
		{
			Cursor	   *c = heap[0];

			score += c->score;
			if (c->left > 0)
			{
				c->left--;
				cursor_read(st, c);
			}
			else
			{
				list_done(c->p, c->end, c->id, c->last);
				heap[0] = heap[--nheap];
			}
			if (nheap > 0)
				heap_down(heap, nheap, 0);
		}
		while (s < ns && singles[s].id == id)
			score += singles[s++].score;
		if (best_may_take(best, score) && !excluded(st, id))
			best_offer(best, id, score);
	}
}

static int
best_order(const void *a, const void *b)
{
	const Scored *x = (const Scored *) a,
			   *y = (const Scored *) b;

	/* the ranking order (worse()) */
	if (worse(x->score, x->id, y->score, y->id))
		return 1;
	if (worse(y->score, y->id, x->score, x->id))
		return -1;
	return 0;
}

PG_FUNCTION_INFO_V1(kdbl_bm25_topk_final);
Datum
kdbl_bm25_topk_final(PG_FUNCTION_ARGS)
{
	TopState   *st;
	Best		best;
	Scored	   *pairs;
	Datum	   *elems;
	int64		lo = PG_INT64_MAX,
				hi = PG_INT64_MIN,
				postings = 0,
				span,
				dense_max;
	Size		l;
	int			i;

	if (!AggCheckCallContext(fcinfo, NULL))
		elog(ERROR, "kdbl_bm25_topk_final called outside an aggregate");
	st = PG_ARGISNULL(0) ? NULL : (TopState *) PG_GETARG_POINTER(0);
	if (st == NULL || st->k == 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(FLOAT8OID));
	/* every id was checked in [0, KB_MAX_ID] (topk_step): the sums below cannot overflow, but say so */
	for (l = 0; l < st->nlists; l++)
	{
		lo = Min(lo, st->lists[l].list.first);
		hi = Max(hi, st->lists[l].list.last);
		if (pg_add_s64_overflow(postings, st->lists[l].list.n, &postings))
			elog(ERROR, "kdbl_bm25_topk: posting count overflow");
	}
	for (l = 0; l < st->nsingles; l++)
	{
		lo = Min(lo, st->singles[l].id);
		hi = Max(hi, st->singles[l].id);
	}
	if (pg_add_s64_overflow(postings, (int64) st->nsingles, &postings))
		elog(ERROR, "kdbl_bm25_topk: posting count overflow");
	best.k = st->k;
	best.n = 0;
	best.floor = 0.0;
	best.id = palloc(st->k * sizeof(int64));
	best.score = palloc(st->k * sizeof(double));
	if (postings > 0)
	{
		Assert(lo >= 0 && lo <= hi && hi <= KB_MAX_ID);
		/* span = hi - lo + 1; dense when span <= DENSE_FACTOR x postings */
		if (!pg_sub_s64_overflow(hi, lo, &span) && !pg_add_s64_overflow(span, 1, &span) &&
			(pg_mul_s64_overflow(postings, DENSE_FACTOR, &dense_max) || span <= dense_max))
			topk_dense(st, &best, lo, span);
		else
			topk_merge(st, &best);
	}
	pairs = palloc(Max(best.n, 1) * sizeof(Scored));
	for (i = 0; i < best.n; i++)
	{
		pairs[i].id = best.id[i];
		pairs[i].score = best.score[i];
	}
	qsort(pairs, best.n, sizeof(Scored), best_order);
	elems = palloc(Max(best.n, 1) * 2 * sizeof(Datum));
	for (i = 0; i < best.n; i++)
	{
		elems[2 * i] = Float8GetDatum((double) pairs[i].id);	/* exact: ids <= 2^53 */
		elems[2 * i + 1] = Float8GetDatum(pairs[i].score);
	}
	PG_RETURN_ARRAYTYPE_P(construct_array_builtin(elems, 2 * best.n, FLOAT8OID));
}
