"""What a guarantee means, in plain words: the one place every view (table, report.html,
TensorBoard's read-me) takes them from.

A statement's kind (``PrivacyStatement.guarantee``, the ``guarantee`` column of
``results.csv``) and its neighbouring relation decide the words; the numbers (ε, δ, and the
replace-one ε′, δ′ the views compare on) are printed beside them by each view.
"""

from __future__ import annotations

__all__ = ["GUARANTEE_SHORT", "GUARANTEE_WORDS", "guarantee_short", "guarantee_words"]

#: The kind as one short word, for narrow table columns (defined under every table).
GUARANTEE_SHORT: dict[str, str] = {
    "pure-dp": "pure",
    "approx-dp": "approx",
    "random-dp": "random",
    "per-query": "query",
    "none": "none",
}

#: The kind in plain words. Random DP's words say why it is not a DP guarantee.
GUARANTEE_WORDS: dict[str, str] = {
    "pure-dp": "ε-DP (pure differential privacy): replacing one member's row changes the "
    "probability of any release by at most a factor e^ε",
    "approx-dp": "(ε, δ)-DP (approximate differential privacy): as pure DP, except with "
    "probability at most δ",
    "random-dp": "random DP: not a DP guarantee, because the sensitivity behind the noise was "
    "estimated by sampling data sets, not proven; the (ε, δ) bound holds only with a "
    "confidence over that sampling and only for data drawn like the sampled data sets "
    "(Rubinstein & Aldà 2017), so an unusual member can leak more",
    "per-query": "per-query DP: each answer is (ε, δ)-DP on its own; the released model "
    "as a whole has no guarantee, and repeated queries add up",
    "none": "no guarantee",
}

_RELATIONS = {
    "replace-one": "replace-one (neighbouring data sets differ in one member's row)",
    "add-remove": "add/remove (neighbouring data sets differ by one member's presence); "
    "compared as replace-one (2ε, (1 + e^ε)δ) by group privacy",
}


def guarantee_short(kind: str) -> str:
    """The kind as one short word (``random``, ``approx``, ...); unknown kinds as given."""
    return GUARANTEE_SHORT.get(kind, kind)


def guarantee_words(kind: str, *, neighbouring: str = "") -> str:
    """The guarantee of a statement kind in plain words, with its neighbouring relation.

    Args:
        kind: ``pure-dp``, ``approx-dp``, ``random-dp``, ``per-query`` or ``none`` (the
            statement's ``guarantee``); another kind is named as given.
        neighbouring: ``replace-one``, ``add-remove`` or empty (not stated).

    Returns:
        One sentence, e.g. ``"(ε, δ)-DP (approximate ...), add/remove (...)"``.
    """
    words = GUARANTEE_WORDS.get(kind, f"{kind} (a guarantee kind this report does not know)")
    if kind == "none" or not neighbouring:
        return words
    relation = _RELATIONS.get(neighbouring, neighbouring)
    return f"{words}; {relation}"
