"""The route registry: a route group is a function `(app, service)` that adds FastAPI routes, registered with
`@register_routes(name)` in one of `ROUTE_MODULES`; `create_app` imports those modules and adds every group.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from .service import Service

RouteGroup = Callable[[FastAPI, Service], None]
ROUTE_GROUPS: dict[str, RouteGroup] = {}
# The modules whose import registers route groups, in the order their routes are added.
ROUTE_MODULES = ("routes_native", "routes_tei", "routes_sparse", "routes_openai", "routes_metrics", "routes_generate",
                 "routes_multivector")


def register_routes(name: str) -> Callable[[RouteGroup], RouteGroup]:
    """`@register_routes("name")` on a function `(app, service)` that adds routes to the app."""
    def add(group: RouteGroup) -> RouteGroup:
        ROUTE_GROUPS[name] = group
        return group
    return add

