"""Graph-level passes, one per file, each ``run(graph, options) -> graph``; ``pipeline`` orders them."""
