"""Retrieval: one entry point (`plan.SearchPlan`: the preflight, the mode, then the pipeline), the pipeline
(`pipeline`), its BM25 (`lexical`) and vector (`vector`) arms, fusion and rerank (`hybrid`), hit windows
(`windows`) and snippets (`snippets`)."""
