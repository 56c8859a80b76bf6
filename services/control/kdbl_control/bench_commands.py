"""`kdbl-control bench ...`: each benchmark's options, run and summary (one handler per action)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings

SCIFACT = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "scifact"
"""The default --dataset: the BEIR SciFact folder beside the repository."""


def _log(line: str) -> None:
    print(line, file=sys.stderr)


def add_commands(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks (numbers for docs/benchmarks.md)")
    actions = bench.add_subparsers(dest="action", required=True)
    for add in (_add_search, _add_scale, _add_vectors, _add_permissions, _add_entities, _add_entity_graph,
                _add_replica, _add_smb_permissions, _add_similar, _add_answer, _add_fairness):
        add(actions)


def _add_search(actions: Any) -> None:
    bs = actions.add_parser("search", help="search_content latency via HTTP vs the SQL floor, and throughput")
    bs.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR folder (corpus.jsonl, queries.jsonl)")
    bs.add_argument("--clients", type=int, default=16, help="concurrent clients of the throughput run (default 16)")
    bs.add_argument("--seconds", type=float, default=20.0, help="length of the throughput run (default 20)")
    bs.add_argument("--queries", type=int, default=300, help="queries from the dataset (default 300)")
    bs.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    bs.add_argument("--mode", choices=["lexical", "hybrid"], default="lexical",
                    help="search mode measured (hybrid needs an embedding model: --model or KDBL_EMBED_MODEL_PATH)")
    bs.add_argument("--model", type=Path, help="GGUF embedding model for --mode hybrid (default: the cached one)")
    bs.add_argument("--response-modes", action="store_true",
                    help="instead: each response_mode's latency, bytes and tokens per 10 hits (1 client, limit 10); "
                    "--dataset may then be any folder of documents")
    bs.add_argument("--cache", action="store_true",
                    help="instead: the result cache through HTTP: miss and hit p50/p95 and a replayed agent "
                    "session's hit rate (lexical, limit 10, --queries queries; default 300 -> use ~100)")
    bs.add_argument("--queries-file", type=Path, help="with --response-modes on a plain folder: one query per line "
                    "(default: its Markdown headings)")
    bs.set_defaults(func=_search)


def _add_scale(actions: Any) -> None:
    sc = actions.add_parser("scale", help="lexical and hybrid latency on a synthetic corpus at growing sizes, the "
                            "keyword arm beside exhaustive BM25 (top-10 agreement), bytes per chunk, load rates")
    sc.add_argument("--dataset", type=Path, default=SCIFACT,
                    help="BEIR folder whose token distribution and queries are used")
    sc.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated chunk counts")
    sc.add_argument("--queries", type=int, default=200, help="queries measured per mode and size (default 200)")
    sc.add_argument("--clients", type=int, default=1, help="also measure N concurrent clients when > 1")
    sc.add_argument("--seconds", type=float, default=10.0, help="length of each N-client run (default 10)")
    sc.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    sc.add_argument("--work-dir", type=Path, help="where the embedded database goes (default: /tmp/kdbl-scale)")
    sc.add_argument("--lexical-only", action="store_true",
                    help="chunks without vectors, no HNSW, lexical search alone (e.g. the 10M run)")
    sc.add_argument("--writers", type=int, help="connections writing the load at once "
                    "(default: KDBL_WRITE_CONNECTIONS, as the worker)")
    sc.add_argument("--no-lists-build", action="store_true",
                    help="search the keyword lists as the writers packed them (no full build after the load)")
    sc.add_argument("--exhaustive-queries", type=int, help="the exhaustive reference on the first N queries "
                    "only (default: all; at 10M chunks each takes seconds)")
    sc.set_defaults(func=_scale)


def _add_vectors(actions: Any) -> None:
    ve = actions.add_parser("vectors", help="the vector arm on a bench scale tenant (--data-dir): HNSW size, "
                            "ef_search vs recall, iterative scans under RLS, halfvec / binary quantisation")
    ve.add_argument("--dataset", type=Path, default=SCIFACT,
                    help="BEIR folder whose queries are embedded as query vectors")
    ve.add_argument("--queries", type=int, default=100, help="dataset queries (embedded by the model)")
    ve.add_argument("--random-queries", type=int, default=50, help="random unit query vectors too")
    ve.add_argument("--tenant", default="bench-scale", help="the tenant bench scale wrote")
    ve.add_argument("--no-quantisation", action="store_true", help="skip the halfvec / binary indexes (built, "
                    "measured and dropped: minutes at 1M chunks)")
    ve.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    ve.set_defaults(func=_vectors)


def _add_permissions(actions: Any) -> None:
    bp = actions.add_parser("permissions", help="what permissions from the share cost: crawl and re-crawl "
                            "files/s, a permission change's delay, keyword search under RLS, tenant vs from-source "
                            "(root)")
    bp.add_argument("--files", type=int, default=1000, help="generated files (default 1,000)")
    bp.add_argument("--queries", type=int, default=100, help="searches per mode")
    bp.add_argument("--work-dir", type=Path, help="where the folder and the embedded database go")
    bp.set_defaults(func=_permissions)


def _add_entities(actions: Any) -> None:
    be = actions.add_parser("entities", help="the entity extractor: precision and recall on labelled sentences, "
                            "and chunks a second over a folder of text")
    be.add_argument("--labeled", type=Path, default=Path("tests/data/entities/labeled.jsonl"),
                    help="JSON lines of {id, text, entities: [[start, end, TYPE], ...]}")
    be.add_argument("--text-dir", type=Path, help="a folder of Markdown / text / HTML to time extraction on "
                    "(default: the labelled sentences)")
    be.set_defaults(func=_entities)


def _add_entity_graph(actions: Any) -> None:
    bg = actions.add_parser("entity-graph", help="the entity graph at scale: the worker's entity stage against "
                            "the crawl, the graph's bytes a chunk, find_entity p50 / p95 per response mode")
    bg.add_argument("--files", type=int, default=1000, help="generated files (default 1,000)")
    bg.add_argument("--chunks", type=int, default=10, help="chunks of ~900 characters a file (default 10)")
    bg.add_argument("--queries", type=int, default=100, help="find_entity calls per response mode")
    bg.add_argument("--work-dir", type=Path, help="where the folder and the embedded database go")
    bg.set_defaults(func=_entity_graph)


def _add_replica(actions: Any) -> None:
    br = actions.add_parser("replica", help="searches reading on a hot standby of the embedded database beside "
                            "the same searches on the primary, the standby's lag during a bulk crawl, WAL bytes a "
                            "chunk")
    br.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR folder to crawl and query")
    br.add_argument("--clients", type=int, default=16, help="concurrent clients of the throughput run")
    br.add_argument("--seconds", type=float, default=20.0, help="length of each throughput run")
    br.add_argument("--queries", type=int, default=300, help="queries of the 1-client run")
    br.add_argument("--work-dir", type=Path, help="where the documents, the database and its standby go")
    br.set_defaults(func=_replica)


def _add_smb_permissions(actions: Any) -> None:
    bm = actions.add_parser("smb-permissions", help="what reading NT ACLs costs a listing of a real SMB share: "
                            "files/s and messages a file with and without descriptors, and with unchanged change "
                            "times")
    bm.add_argument("--server", required=True, help="file server host")
    bm.add_argument("--share", required=True, help="share name")
    bm.add_argument("--path", default="", help="a folder in the share (default: its root)")
    bm.add_argument("--port", type=int, default=445, help="the server's SMB port (default 445)")
    bm.add_argument("--credentials-env", required=True, metavar="username=VAR,password=VAR",
                    help="the environment variables holding the account's name and password")
    bm.add_argument("--runs", type=int, default=3, help="listings per mode (the median is reported)")
    bm.set_defaults(func=_smb_permissions)


def _add_similar(actions: Any) -> None:
    si = actions.add_parser("similar", help="find_similar's recall@10 on SciFact's multi-citation claims (vector, "
                            "lexical MLT, exact dense reference) and its latency")
    si.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR folder with qrels")
    si.add_argument("--split", default="train", help="qrels split whose claims cite several documents")
    si.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    si.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    si.add_argument("--terms", default="25", help="KDBL_SIMILAR_TERMS values for the lexical method, e.g. 12,25,40")
    si.set_defaults(func=_similar)


def _add_answer(actions: Any) -> None:
    an = actions.add_parser("answer", help="the answer tool: extractive latency on a SciFact-like slice, and with "
                            "--chat-model abstractive tokens/s")
    an.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR folder with qrels")
    an.add_argument("--split", default="train", help="qrels split the questions (claims) come from")
    an.add_argument("--queries", type=int, default=30, help="questions (claims with judged abstracts)")
    an.add_argument("--docs", type=int, default=1000, help="abstracts beside the judged ones")
    an.add_argument("--chat-model", type=Path, help="GGUF chat model: also measure abstractive answers")
    an.add_argument("--max-tokens", type=int, default=128, help="abstractive max_tokens")
    an.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    an.set_defaults(func=_answer)


def _add_fairness(actions: Any) -> None:
    fa = actions.add_parser("fairness", help="a quiet tenant's search p95 alone and beside a noisy tenant's heavy "
                            "calls (long searches, answers, find_similar; goal <= 2x)")
    fa.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR folder (both tenants)")
    fa.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    fa.add_argument("--noisy-clients", type=int, default=8, help="the noisy tenant's concurrent clients")
    fa.add_argument("--queries", type=int, default=100, help="distinct queries each side cycles through")
    fa.add_argument("--noisy-max-in-flight", type=int, help="the noisy tenant's concurrency (default: the "
                    "installation's); a large value, with KDBL_DB_POOL_SIZE raised, shows it without fair share")
    fa.add_argument("--chat-model", type=Path, help="GGUF chat model: the noisy answers are abstractive")
    fa.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    fa.set_defaults(func=_fairness)


# --------------------------------------------------------------------------- the benchmarks


def _run_bench(args: argparse.Namespace, settings: Settings, default_work: Path,
               run: Callable[[str, Path, Any], dict[str, Any]], summarise: Callable[[dict[str, Any]], str]) -> int:
    """One benchmark: its work folder, then `run(owner_url, work, db)` on KDBL_DATABASE_URL (db None) or,
    without one or with --data-dir, on an embedded database in the work folder; prints JSON or the summary."""
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    work = (args.work_dir or default_work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if settings.database_url is not None and args.data_dir is None:
        result = run(settings.database_url.get_secret_value(), work, None)
    else:
        with EmbeddedDatabase(args.data_dir or work / "db", settings=settings) as db:
            result = run(db.owner_url, work, db)
    print(json.dumps(result, indent=2, default=str) if args.json else summarise(result))
    return 0


def _model(args: argparse.Namespace, settings: Settings) -> Path | None:
    """--model, else KDBL_EMBED_MODEL_PATH, else the cached default model if present."""
    from kdbl_control.evaluate import default_model_path

    return args.model or default_model_path(settings)


def _beir_dataset(args: argparse.Namespace) -> None:
    if not (args.dataset / "corpus.jsonl").exists():
        raise ConfigError(f"{args.dataset} is not a BEIR folder (no corpus.jsonl)")


def _needs_model(args: argparse.Namespace, settings: Settings) -> Path:
    """The embedding model of `bench similar | vectors | scale` (after the --dataset check)."""
    model = _model(args, settings)
    _beir_dataset(args)
    if model is None:
        raise ConfigError(f"bench {args.action} needs an embedding model (--model or KDBL_EMBED_MODEL_PATH)")
    return model


def _search(args: argparse.Namespace, settings: Settings) -> int:
    """`bench search`, or with --response-modes / --cache one of its variants."""
    from kdbl_control import bench
    from kdbl_control.proctime import postmaster_pid

    model = _model(args, settings)
    if args.response_modes:
        return _response_modes(args, settings, model)
    if args.cache:
        return _cache(args, settings)
    _beir_dataset(args)
    options = {"clients": args.clients, "seconds": args.seconds, "n_queries": args.queries, "mode": args.mode,
               "model_path": model if args.mode == "hybrid" else None}
    return _run_bench(args, settings, bench.default_work_dir(), lambda url, work, db: bench.run_search_bench(
        url, args.dataset, work, **options,
        **({"postgres_pid": postmaster_pid(db.data_dir / "pgdata")} if db is not None else {})), bench.summarise)


def _response_modes(args: argparse.Namespace, settings: Settings, model: Path | None) -> int:
    from kdbl_control import bench_modes

    if not args.dataset.is_dir():
        raise ConfigError(f"{args.dataset} is not a folder")
    options = {"n_queries": args.queries, "search_mode": args.mode, "queries_file": args.queries_file,
               "model_path": model}
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-modes",
                      lambda url, work, db: bench_modes.run_modes_bench(url, args.dataset, work, **options),
                      bench_modes.summarise)


def _cache(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench, bench_cache

    return _run_bench(args, settings, bench.default_work_dir(), lambda url, work, db: bench_cache.run_cache_bench(
        url, args.dataset, work, n_queries=args.queries), bench_cache.summarise)


def _scale(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_scale
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    model = _needs_model(args, settings)
    work = (args.work_dir or Path(tempfile.gettempdir()) / "kdbl-scale").resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with EmbeddedDatabase(args.data_dir or work / "db", settings=settings) as db:
        result = bench_scale.run_scale_bench(
            db.owner_url, args.dataset, work, sizes=sizes, model_path=model, n_queries=args.queries,
            clients=args.clients, seconds=args.seconds, log=_log,
            lexical_only=args.lexical_only, writers=args.writers or settings.write_connections,
            exhaustive_queries=args.exhaustive_queries, build_lists=not args.no_lists_build)
    print(json.dumps(result, indent=2, default=str) if args.json else bench_scale.summarise(result))
    return 0


def _vectors(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_vectors
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    model = _needs_model(args, settings)
    if args.data_dir is None:
        raise ConfigError("bench vectors runs on a bench scale database: give --data-dir DIR")
    with EmbeddedDatabase(args.data_dir, settings=settings) as db:
        result = bench_vectors.run_vectors_bench(
            db.owner_url, args.dataset, model_path=model, tenant=args.tenant, n_queries=args.queries,
            n_random=args.random_queries, quantise=not args.no_quantisation, log=_log)
    print(json.dumps(result, indent=2, default=str) if args.json else bench_vectors.summarise(result))
    return 0


def _similar(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench, bench_similar

    model = _needs_model(args, settings)
    terms = tuple(int(t) for t in args.terms.split(",") if t.strip())
    return _run_bench(args, settings, bench.default_work_dir(),
                      lambda url, work, db: bench_similar.run_similar_bench(
                          url, args.dataset, work, model, split=args.split, terms=terms), bench_similar.summarise)


def _permissions(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_permissions

    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-permissions",
                      lambda url, work, db: bench_permissions.run_permissions_bench(
                          url, work, files=args.files, n_queries=args.queries, log=_log),
                      bench_permissions.summarise)


def _entities(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_entities

    result = bench_entities.run_entities_bench(args.labeled, args.text_dir)
    print(json.dumps(result, indent=2) if args.json else bench_entities.summarise(result))
    return 0


def _entity_graph(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_entity_graph

    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-entity-graph",
                      lambda url, work, db: bench_entity_graph.run_entity_graph_bench(
                          url, work, files=args.files, chunks=args.chunks, n_queries=args.queries, log=_log),
                      bench_entity_graph.summarise)


def _replica(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_replica

    if settings.database_url is not None and args.data_dir is None:
        raise ConfigError("bench replica makes a standby of the embedded database: unset KDBL_DATABASE_URL "
                          "(or give --data-dir DIR)")
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-replica",
                      lambda url, work, db: bench_replica.run_replica_bench(
                          db, args.dataset, work, clients=args.clients, seconds=args.seconds,
                          n_queries=args.queries, log=_log),
                      bench_replica.summarise)


def _smb_permissions(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_smb_permissions

    pairs = dict(item.split("=", 1) for item in args.credentials_env.split(",") if "=" in item)
    config = {"server": args.server, "share": args.share, "path": args.path, "port": args.port,
              "credentials": {"env": pairs}}
    result = bench_smb_permissions.walk_costs(config, runs=args.runs)
    print(json.dumps(result, indent=2) if args.json else bench_smb_permissions.summarise(result))
    return 0


def _answer(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_answer

    options = {"n_queries": args.queries, "n_docs": args.docs, "split": args.split, "chat_model": args.chat_model,
               "max_tokens": args.max_tokens}
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-answer",
                      lambda url, work, db: bench_answer.run_answer_bench(url, args.dataset, work, **options),
                      bench_answer.summarise)


def _fairness(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_fairness

    options = {"seconds": args.seconds, "noisy_clients": args.noisy_clients, "n_queries": args.queries,
               "noisy_max_in_flight": args.noisy_max_in_flight, "chat_model": args.chat_model}
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-fairness",
                      lambda url, work, db: bench_fairness.run_fairness_bench(url, args.dataset, work, **options),
                      bench_fairness.summarise)
