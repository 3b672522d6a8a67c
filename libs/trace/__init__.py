"""A job's trace derived from the log: pure, like the core (no IO, no OpenTelemetry).

``spans.py`` holds the span records and their deterministic ids; ``derive.py`` turns one job's entries into
its span tree; ``causes.py`` finds why a run ended; ``render.py`` draws the tree for ``corral trace``.
"""
