"""HTTP routes, one module per resource, all mounted under ``/v1``."""
