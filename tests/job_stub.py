"""What the integrity tests hand ``selfrepair.core.runtime`` in place of a Snakemake job:
Snakemake's Namedlist reduced to what the runtime reads (a list whose items have names)."""


class Named(list):
    """A Snakemake Namedlist stand-in: a list with named items (``items()``)."""

    def __init__(self, **named):
        super().__init__(named.values())
        self._named = named

    def items(self):
        return self._named.items()
