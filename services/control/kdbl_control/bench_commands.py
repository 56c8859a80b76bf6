"""`kdbl-control bench ...`: each benchmark's run and summary from its parsed arguments (cli.py parses)."""

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


def run_bench(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench, bench_scale
    from kdbl_control.evaluate import default_model_path
    from kdbl_control.proctime import postmaster_pid
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    if args.action == "answer":
        return _bench_answer(args, settings)
    if args.action == "fairness":
        from kdbl_control import bench_fairness

        options = {"seconds": args.seconds, "noisy_clients": args.noisy_clients, "n_queries": args.queries,
                   "noisy_max_in_flight": args.noisy_max_in_flight, "chat_model": args.chat_model}
        return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-fairness",
                          lambda url, work, db: bench_fairness.run_fairness_bench(url, args.dataset, work, **options),
                          bench_fairness.summarise)
    if args.action == "permissions":
        from kdbl_control import bench_permissions

        return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-permissions",
                          lambda url, work, db: bench_permissions.run_permissions_bench(
                              url, work, files=args.files, n_queries=args.queries,
                              log=lambda line: print(line, file=sys.stderr)), bench_permissions.summarise)
    if args.action == "entities":
        from kdbl_control import bench_entities

        result = bench_entities.run_entities_bench(args.labeled, args.text_dir)
        print(json.dumps(result, indent=2) if args.json else bench_entities.summarise(result))
        return 0
    if args.action == "entity-graph":
        from kdbl_control import bench_entity_graph

        return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-entity-graph",
                          lambda url, work, db: bench_entity_graph.run_entity_graph_bench(
                              url, work, files=args.files, chunks=args.chunks, n_queries=args.queries,
                              log=lambda line: print(line, file=sys.stderr)), bench_entity_graph.summarise)
    if args.action == "replica":
        from kdbl_control import bench_replica

        if settings.database_url is not None and args.data_dir is None:
            raise ConfigError("bench replica makes a standby of the embedded database: unset KDBL_DATABASE_URL "
                              "(or give --data-dir DIR)")
        return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-replica",
                          lambda url, work, db: bench_replica.run_replica_bench(
                              db, args.dataset, work, clients=args.clients, seconds=args.seconds,
                              n_queries=args.queries, log=lambda line: print(line, file=sys.stderr)),
                          bench_replica.summarise)
    if args.action == "smb-permissions":
        from kdbl_control import bench_smb_permissions

        pairs = dict(item.split("=", 1) for item in args.credentials_env.split(",") if "=" in item)
        config = {"server": args.server, "share": args.share, "path": args.path, "port": args.port,
                  "credentials": {"env": pairs}}
        result = bench_smb_permissions.walk_costs(config, runs=args.runs)
        print(json.dumps(result, indent=2) if args.json else bench_smb_permissions.summarise(result))
        return 0
    model = args.model or default_model_path(settings)
    if args.action == "search" and args.response_modes:
        return _bench_response_modes(args, settings, model)
    if args.action == "search" and args.cache:
        return _bench_cache(args, settings)
    if not (args.dataset / "corpus.jsonl").exists():
        raise ConfigError(f"{args.dataset} is not a BEIR folder (no corpus.jsonl)")
    if args.action == "similar":
        from kdbl_control import bench_similar

        if model is None:
            raise ConfigError("bench similar needs an embedding model (--model or KDBL_EMBED_MODEL_PATH)")
        terms = tuple(int(t) for t in args.terms.split(",") if t.strip())
        return _run_bench(args, settings, bench.default_work_dir(),
                          lambda url, work, db: bench_similar.run_similar_bench(
                              url, args.dataset, work, model, split=args.split, terms=terms), bench_similar.summarise)
    if args.action == "vectors":
        from kdbl_control import bench_vectors

        if model is None:
            raise ConfigError("bench vectors needs an embedding model (--model or KDBL_EMBED_MODEL_PATH)")
        if args.data_dir is None:
            raise ConfigError("bench vectors runs on a bench scale database: give --data-dir DIR")
        with EmbeddedDatabase(args.data_dir) as db:
            result = bench_vectors.run_vectors_bench(
                db.owner_url, args.dataset, model_path=model, tenant=args.tenant, n_queries=args.queries,
                n_random=args.random_queries, quantise=not args.no_quantisation,
                log=lambda line: print(line, file=sys.stderr))
        print(json.dumps(result, indent=2, default=str) if args.json else bench_vectors.summarise(result))
        return 0
    if args.action == "scale":
        if model is None:
            raise ConfigError("bench scale needs an embedding model (--model or KDBL_EMBED_MODEL_PATH)")
        work = (args.work_dir or Path(tempfile.gettempdir()) / "kdbl-scale").resolve()
        work.mkdir(parents=True, exist_ok=True)
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        with EmbeddedDatabase(args.data_dir or work / "db") as db:
            result = bench_scale.run_scale_bench(
                db.owner_url, args.dataset, work, sizes=sizes, model_path=model, n_queries=args.queries,
                clients=args.clients, seconds=args.seconds, log=lambda line: print(line, file=sys.stderr),
                lexical_only=args.lexical_only, writers=args.writers or settings.write_connections,
                exhaustive_queries=args.exhaustive_queries, build_lists=not args.no_lists_build)
        print(json.dumps(result, indent=2, default=str) if args.json else bench_scale.summarise(result))
        return 0
    options = {"clients": args.clients, "seconds": args.seconds, "n_queries": args.queries, "mode": args.mode,
               "model_path": model if args.mode == "hybrid" else None}
    return _run_bench(args, settings, bench.default_work_dir(), lambda url, work, db: bench.run_search_bench(
        url, args.dataset, work, **options,
        **({"postgres_pid": postmaster_pid(db.data_dir / "pgdata")} if db is not None else {})), bench.summarise)


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
        with EmbeddedDatabase(args.data_dir or work / "db") as db:
            result = run(db.owner_url, work, db)
    print(json.dumps(result, indent=2, default=str) if args.json else summarise(result))
    return 0


def _bench_answer(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench_answer

    options = {"n_queries": args.queries, "n_docs": args.docs, "split": args.split, "chat_model": args.chat_model,
               "max_tokens": args.max_tokens}
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-answer",
                      lambda url, work, db: bench_answer.run_answer_bench(url, args.dataset, work, **options),
                      bench_answer.summarise)


def _bench_cache(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import bench, bench_cache

    return _run_bench(args, settings, bench.default_work_dir(), lambda url, work, db: bench_cache.run_cache_bench(
        url, args.dataset, work, n_queries=args.queries), bench_cache.summarise)


def _bench_response_modes(args: argparse.Namespace, settings: Settings, model: Path | None) -> int:
    from kdbl_control import bench_modes

    if not args.dataset.is_dir():
        raise ConfigError(f"{args.dataset} is not a folder")
    options = {"n_queries": args.queries, "search_mode": args.mode, "queries_file": args.queries_file,
               "model_path": model}
    return _run_bench(args, settings, Path(tempfile.gettempdir()) / "kdbl-bench-modes",
                      lambda url, work, db: bench_modes.run_modes_bench(url, args.dataset, work, **options),
                      bench_modes.summarise)
