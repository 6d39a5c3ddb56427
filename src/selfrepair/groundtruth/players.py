"""Who plays the ablation game: every component (the default), or, where a model has too
many components for that, a stated subset.

``Settings.players`` (:class:`selfrepair.groundtruth.pipeline.Settings`):

- ``all``: every head and MLP is a player (the papers' models; nothing changes);
- ``top``: the ``n_players`` components of largest single-ablation drop in absolute value
  (in the game's ablation mode; ties in component order) are players, and the rest are
  either one more player, ``rest``, ablated and restored together (``rest: player``; the
  Shapley values then still add up to v(empty) - v(everything ablated)), or never ablated
  (``rest: intact``; the game of the chosen components on the intact rest);
- ``layers``: one player per layer, its heads and MLP ablated together (``L3`` ...).

A player that is a set of components is a :class:`Group`; :func:`grouped` turns a game of
components into a game of players. Where players are not the components, the Shapley
values and pairs are the players', the single drops of the game's mode every
component's, and the agreement covers the players that are components (a group has no
method score). With ``top`` the methods (the other mode's single drops and COAX's scan
included) score the chosen components only, so that their cost follows ``n_players``,
not the model's size; with ``layers`` every component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from selfrepair.core.components import Component

PLAYERS = ("all", "top", "layers")
RESTS = ("player", "intact")


@dataclass(frozen=True)
class Group:
    """A player made of several components, ablated together."""

    name: str
    members: tuple[Component, ...]

    def __str__(self) -> str:
        return self.name


def check(players: str, n_players: int, rest: str) -> None:
    """ValueError for settings that name no player set."""
    if players not in PLAYERS:
        raise ValueError(f"players must be one of {PLAYERS}, not {players!r}")
    if rest not in RESTS:
        raise ValueError(f"rest must be one of {RESTS}, not {rest!r}")
    if players == "top" and (not isinstance(n_players, int) or n_players < 1):
        raise ValueError(f"players 'top' needs n_players >= 1, got {n_players!r}")


def flatten(players: Sequence) -> list[Component]:
    """The components of a coalition of players (a :class:`Group` gives its members)."""
    out = []
    for p in players:
        out.extend(p.members if isinstance(p, Group) else [p])
    return out


def grouped(game):
    """``game`` (a callable on lists of component coalitions) as a game of players; the
    same game where no player is a :class:`Group`."""
    return lambda sets: game([flatten(s) for s in sets])


def choose(components: Sequence[Component], single: dict[str, float], players: str, n_players: int, rest: str) -> list:
    """The players of the game (module doc). ``single``: each component's single-ablation
    drop in the game's mode (needed for ``top`` only)."""
    check(players, n_players, rest)
    components = list(components)
    if players == "all" or (players == "top" and n_players >= len(components)):
        return components
    if players == "layers":
        layers = sorted({c.layer for c in components})
        return [Group(f"L{la}", tuple(c for c in components if c.layer == la)) for la in layers]
    order = sorted(range(len(components)), key=lambda i: -abs(single[components[i].name]))
    keep = set(order[:n_players])
    top = [c for i, c in enumerate(components) if i in keep]
    others = tuple(c for i, c in enumerate(components) if i not in keep)
    return top + [Group("rest", others)] if rest == "player" else top
