"""Every route of the service has its HTTP store method, and every route a method of the HTTP
store declares is one the service serves (as Prefect's client checks its ``ServerRoutes``).

The service's routes are read from its app (the OpenAPI document FastAPI makes of its
routers: each path with its methods); the store's from :mod:`tunecache.store.http.routes`,
through the ``@calls`` declaration of each method and function that sends a request, whose
paths come from those declarations alone (:meth:`~tunecache.store.http.routes.Route.call`):
a mistyped path or method in the store is a route the service does not serve, and fails.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

import tunecache.store.http as http_store
from tunecache.service.app import create_app
from tunecache.service.settings import Settings
from tunecache.store.http import routes
from tunecache.store.http.routes import Route

#: Routes of the service that are no client's to call, and why.
NOT_THE_STORES = {
    ("GET", "/metrics"): "Prometheus scrapes it",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> set[tuple[str, str]]:
    """``(method, path)`` of every route of the service's API (no database is touched)."""
    app = create_app(Settings(worker="off", data_dir=tmp_path_factory.mktemp("data")))
    return {(method.upper(), path) for path, operations in app.openapi()["paths"].items() for method in operations}


def _modules():
    return [importlib.import_module(f"{http_store.__name__}.{info.name}")
            for info in pkgutil.iter_modules(http_store.__path__)]


def _declared() -> dict[str, tuple[Route, ...]]:
    """``{qualified name: routes}`` of every function and method of the HTTP store that
    declares the routes it calls."""
    return {name: declared for name, (_, declared) in _declarations().items()}


def _declarations() -> dict[str, tuple[object, tuple[Route, ...]]]:
    """``{qualified name: (function, routes)}``, as :func:`_declared`."""
    found = {}
    for module in [http_store, *_modules()]:
        for name, value in vars(module).items():
            members = vars(value).items() if inspect.isclass(value) else [(None, value)]
            for member, function in members:
                if getattr(function, "__routes__", None) and getattr(function, "__module__", None) == module.__name__:
                    qualified = f"{module.__name__}.{name}" + (f".{member}" if member else "")
                    found[qualified] = (function, function.__routes__)
    return found


def test_every_route_a_store_method_declares_is_served(served):
    declared = _declared()
    assert len(declared) >= 25, sorted(declared)  # the methods are found at all
    unserved = {f"{name}: {route}" for name, calls in declared.items() for route in calls
                if (route.method, route.template) not in served}
    assert not unserved, f"declared routes the service does not serve: {sorted(unserved)}"


def test_every_route_of_the_service_has_its_store_method(served):
    called = {(route.method, route.template) for calls in _declared().values() for route in calls}
    missing = served - called - set(NOT_THE_STORES)
    assert not missing, f"routes of the service no method of the HTTP store calls: {sorted(missing)}"
    assert not set(NOT_THE_STORES) & called, "a route said to be no client's is called by one"


def test_a_method_calls_the_routes_it_declares_and_names_no_path_of_its_own():
    """Each declared method builds its requests from its own declared routes (``routes.NAME``
    in its body), and no module of the store writes a ``/v1/`` path outside the route table."""
    for qualified, (function, declared) in _declarations().items():
        used = {node.attr for node in ast.walk(ast.parse(inspect.cleandoc("\n" + inspect.getsource(function))))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "routes"}
        assert used == {_name_of(route) for route in declared}, (qualified, used)
    for module in _modules():
        if module is routes:
            continue
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/v1"):
                pytest.fail(f"{module.__name__} names the path {node.value!r}: declare it in tunecache.store.http.routes")


def test_a_mistyped_route_is_not_served_and_a_route_takes_exactly_its_parameters(served):
    assert (routes.PIN_RUN.method, routes.PIN_RUN.template) in served
    assert ("PUT", "/v1/tunings/{run_id}/pinned") not in served and ("POST", "/v1/tunings/{run_id}/pin") not in served
    assert routes.PIN_RUN.call(run_id=7) == ("PUT", "/v1/tunings/7/pin")
    with pytest.raises(TypeError):
        routes.PIN_RUN.call(id=7)
    with pytest.raises(TypeError):
        routes.LIST_RUNS.call(run_id=7)


def _name_of(route: Route) -> str:
    return next(name for name, value in vars(routes).items() if value is route)
