"""The manifest model and the runtime loader: standard library only (torch lazily).

Vendoring copies this folder verbatim into each vendored family package, so nothing in it
may import ``cake`` by name: only relative imports inside ``core``.
"""
