"""An Einsum equation spelt out, one rule for the OpenCL engine's rewrite into a MatMul and for
the FLOP counter: no spaces, each `...` as letters the equation does not use, and the output
written even where the equation leaves it implicit."""

from __future__ import annotations

import string
from collections.abc import Sequence


def explicit(equation: str | bytes, ranks: Sequence[int]) -> str:
    """`equation` with its ellipses spelt out for operands of `ranks` (read only where an
    operand has `...`): numpy's broadcasting, so an operand's ellipsis takes the last of the
    letters of the widest one's. An implicit output is numpy's: the ellipsis, then the letters
    used once, sorted. ValueError where an operand has fewer dims than letters."""
    text = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    lhs, arrow, out = text.partition("->")
    terms = lhs.split(",")
    if not arrow:
        letters = lhs.replace("...", "").replace(",", "")
        out = "..." * ("..." in lhs) + "".join(sorted(c for c in set(letters)
                                                         if letters.count(c) == 1))
    if "..." not in lhs:
        return f"{lhs}->{out}"
    widths = [rank - len(term.replace("...", "")) if "..." in term else 0
              for term, rank in zip(terms, ranks, strict=True)]
    if min(widths) < 0:
        raise ValueError(f"Einsum {text!r}: operands of ranks {list(ranks)} have fewer dims "
                         "than the equation has letters")
    spare = "".join(c for c in string.ascii_letters if c not in text)[:max(widths)]
    spelt = [term.replace("...", spare[len(spare) - width:] if width else "")
             for term, width in zip(terms, widths)]
    return ",".join(spelt) + "->" + out.replace("...", spare)
