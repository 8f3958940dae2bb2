"""Pydantic models made and written without pydantic's general machinery: the one home of code that
reaches into pydantic's internals, and of the pin it is checked against.

Two crafts, each the same result as pydantic's own at a fraction of its cost:

- ``built(cls, values)``: a model holding already-validated values, as ``model_construct`` makes it
  with every field given, by setting ``BaseModel``'s slots (``__dict__``,
  ``__pydantic_fields_set__``, ``__pydantic_extra__``, ``__pydantic_private__``) through their own
  setters. Every output of every core is enveloped so (``shared.kernel.events.wrap``), and the
  decoders and the cores' commonest payloads are built so.
- ``writer(model, field)``: the JSON writer of ``model``'s instances whose ``field`` is a tagged
  union of models, written by a serializer of ``model``'s own field schemas with the union's member
  chosen beforehand (``narrowed``), the same bytes as ``model``'s serializer for much less of its
  time: that serializer spends most of it outside the fields. ``shared.kernel.events.to_json``
  writes every envelope with it.

Why here, in the kernel, and not in the bus codec: the kernel needs both. ``wrap`` (the contract's
enveloping, ``shared.kernel.events``) and the cores' payload builders (``services/``, which import
only the kernel) use ``built``; ``to_json`` is the contract's JSON, the bytes of every log and of
every decision a replay compares, written alike by the runtimes and the audit. The layers forbid
the kernel importing the runtime, so the craft lives at the bottom, apart from the contract.

It depends on pydantic's layout, not its API: the slot descriptors of ``BaseModel``, the core
schema's shape (a model schema, possibly under a validator's, with ``model-fields`` and a
``tagged-union`` of ``model`` choices) and ``pydantic_core``'s serializers. So pydantic is pinned in
pyproject.toml to ``PYDANTIC_VERSION`` (which pins pydantic-core ``PYDANTIC_CORE_VERSION``), and
tests/unit/shared/test_fastmodel.py fails loudly when a pydantic of another behaviour comes: each
sample payload ``built`` equals it validated, each envelope written equals ``model_dump_json``, and
every payload type has its fast writer (a layout the writer no longer finds would fall back, the
same bytes, slowly and silently). Upgrading pydantic: change the pin and these two constants, run
that test.

``shared.runtime.statecodec`` (snapshots) relies on pydantic's layout too — a model's
``__getstate__`` keys — and holds to the same pin: the same test checks that layout, so it needs
no pin of its own.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from pydantic import BaseModel, TypeAdapter

PYDANTIC_VERSION = "2.14.4"
"""The pydantic this craft is checked against (pinned in pyproject.toml)."""
PYDANTIC_CORE_VERSION = "2.50.5"
"""The pydantic-core that pydantic ``PYDANTIC_VERSION`` requires."""

_new = object.__new__
_set_dict, _set_fields_set, _set_extra, _set_private = (
    BaseModel.__dict__[slot].__set__
    for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"))
"""The setters of ``BaseModel``'s slots, what ``object.__setattr__`` finds by name on every call (a
lookup that counts: ``built`` makes two models per watch event decoded and two per output)."""


_T = TypeVar("_T")


def built(cls: type[_T], values: dict[str, Any]) -> _T:
    """A model of ``cls`` holding ``values`` — every field, in field order, of the types validation
    leaves — as ``model_construct`` makes it with all fields given, at a fraction of its cost."""
    model = _new(cls)
    _set_dict(model, values)
    _set_fields_set(model, set(values))
    _set_extra(model, None)
    _set_private(model, None)
    return model


Writer = Callable[[BaseModel], bytes]
_UNKNOWN: Any = object()


def writer(model: type[BaseModel], field: str) -> Writer:
    """The JSON writer of ``model``'s instances, ``field`` being a tagged union of models: the same
    bytes as ``TypeAdapter(model).dump_json``. An instance laid out as ``built`` lays it (of
    ``model`` itself, its ``__dict__`` holding exactly the fields in order) with a member of the
    union goes through that member's narrowed serializer (``narrowed``, made once per member
    class); any other through ``model``'s own."""
    adapter = TypeAdapter(model)
    dump_json = adapter.dump_json
    order = tuple(model.model_fields)
    dumps: dict[type, Any] = {}
    """Member class -> its narrowed serializer (None: ``model``'s own writes it)."""

    def write(instance: BaseModel) -> bytes:
        fields = instance.__dict__
        if type(instance) is model and tuple(fields) == order:
            member = type(fields[field])
            dump = dumps.get(member, _UNKNOWN)
            if dump is _UNKNOWN:
                dump = dumps[member] = narrowed(model, field, member)
            if dump is not None:
                written: bytes = dump(fields)
                return written
        return dump_json(instance)

    return write


def narrowed(model: type[BaseModel], field: str, member: type) -> Callable[[dict[str, Any]], bytes] | None:
    """The JSON writer of ``model``'s fields (its ``__dict__``) whose ``field`` holds a ``member``.

    ``model``'s serializer spends most of its time outside the fields (a model's writer, the
    union's dispatch), so this one is a typed dict of the very field schemas ``model``'s core
    schema holds, ``field`` the union's choice for ``member``, under ``model``'s config
    (non-finite numbers written as constants, nested models too, as in ``model``'s): the same
    writer of each field, so the same bytes. A typed dict writes the keys of the dict it is given
    in their order, so ``writer`` hands it only a ``__dict__`` holding exactly the fields in order.
    None when ``member`` is no choice of the union or the schema is not laid out so (another pydantic)."""
    from pydantic_core import SchemaSerializer, core_schema

    try:
        schema = model.__pydantic_core_schema__
        if schema.get("type") != "model":
            schema = schema["schema"]  # under a model validator's
        if schema["type"] != "model" or schema["cls"] is not model:
            return None
        fields = schema["schema"]["fields"]
        union = fields[field]["schema"]
        if tuple(fields) != tuple(model.model_fields) or union["type"] != "tagged-union":
            return None
        chosen = [choice for choice in union["choices"].values()
                  if isinstance(choice, dict) and choice.get("type") == "model" and choice.get("cls") is member]
        if len(chosen) != 1:
            return None
        typed = core_schema.typed_dict_schema(
            {name: core_schema.typed_dict_field(chosen[0] if name == field else spec["schema"])
             for name, spec in fields.items()}, config=schema["config"])
        return SchemaSerializer(typed, schema["config"]).to_json
    except (KeyError, TypeError, AttributeError):
        return None
