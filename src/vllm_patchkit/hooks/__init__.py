"""The framework's own patch set: its observing hooks (config-ready points, step counters).

Declared and pinned like any patch (so their drift is caught too); `observer: true` lets them
apply unpinned on a release no manifest covers, so what a model needs is always known.
"""
