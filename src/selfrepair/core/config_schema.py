"""A config section checked against its JSON schema (workflow/schemas/), at parse time.

:func:`problems` names every error by its key (``gim.mib.batch_size: ... is greater than
the maximum of 65536``), so that a bad config stops the run before any job starts;
besides JSON Schema's keywords it reads ``ascending: true`` (a list of numbers, each
larger than the one before: an area under a curve over them changes sign otherwise);
:func:`fill_defaults` then writes the schema's defaults into the section in place, as
Snakemake's ``snakemake.utils.validate`` does (jsonschema's documented recipe: a
``properties`` validator that sets each missing property's default, at every depth the
validation reaches). Both use the schema already read, once: ``validate`` would read the
file again, with the pure-Python YAML parser, at every Snakemake start (a SLURM job
starts Snakemake twice). ``tests/test_workflow.py`` checks that the sections filled here
equal ``validate``'s.
"""

from __future__ import annotations

import jsonschema
from jsonschema import validators


def _ascending(validator, wanted, instance, schema):
    """The ``ascending`` keyword: each number of the list larger than the one before."""
    if not wanted or not validator.is_type(instance, "array"):
        return
    numbers = [x for x in instance if validator.is_type(x, "number")]
    if any(b <= a for a, b in zip(numbers, numbers[1:])):
        fixed = sorted(set(numbers))
        yield jsonschema.ValidationError(
            f"{instance} is not in ascending order (each value must be larger than the one before; write {fixed})"
        )


_CHECKER = validators.extend(jsonschema.Draft202012Validator, {"ascending": _ascending})


def problems(section, schema: dict, where: str = "") -> list[str]:
    """Every schema error of ``section``, one line each, named by its dotted key below
    ``where`` (the section's own key; empty for the top level), sorted by key."""
    errors = sorted(_CHECKER(schema).iter_errors(section), key=lambda e: [str(p) for p in e.path])
    out = []
    for e in errors:
        key = ".".join([where, *map(str, e.path)] if where else map(str, e.path))
        out.append(f"{key or '(top level)'}: {e.message}")
    return out


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        for name, sub in properties.items():
            if "default" in sub:
                instance.setdefault(name, sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


_DEFAULTS = _with_defaults(jsonschema.Draft202012Validator)


def fill_defaults(section, schema: dict):
    """``section`` with the schema's defaults filled in place (and returned); it must have
    passed :func:`problems` (a schema error raises jsonschema's ValidationError). As
    ``validate``, a mapping only: a list section (``own``) is left as it is
    (``selfrepair.own.entries.fill_defaults`` fills its items)."""
    if isinstance(section, dict):
        _DEFAULTS(schema).validate(section)
    return section
