"""What crosses a process or the network, typed once.

Every message one process sends another (engine, projector, API, SDK, CLI)
belongs here, defined once and imported by each side, never copied:

* :mod:`tiffany.wire.plan`: a plan's shape (the pydantic models the engine
  validates with and the API's OpenAPI schema describes);
* :mod:`tiffany.wire.status`: the run and step status vocabulary.

Invariants:
    A leaf: it imports the standard library, pydantic and msgspec only, and
    every layer may import it (tests/test_layering.py). This ``__init__``
    imports nothing, so that importing one module (the SDK's statuses) does
    not load the others.
"""
