"""DeepSeek-V4's compressor state, as the plugin (ATOM) lays it at the front of a slot.

Facts from ROCm/ATOM: the field list is ``_v4_state_layout`` in
``atom/plugin/vllm/deepseek_v4_bridge.py``; the placement rules (256-B field
alignment, the plane split with the fewest rows, which bytes an image carries)
are ``plan_field_planes``, ``field_extents``, ``entry_bytes_for`` and
``checkpoint_ranges_for`` in ``atom/model_ops/attentions/pool_layout/entry_arena.py``.

Every field is fp32, one ``(rows, width)`` block per layer:

* CSA (ratio 4, overlapping windows): main and indexer compressors, kv and
  score each, ``2*4 + s`` rows of ``2*D`` (main) or ``2*Di`` (indexer) values.
  An image carries them: the overlap reaches back across a block boundary.
* HCA (ratio 128): main compressor kv and score, ``128 + s`` rows of ``D``.
  An image carries nothing of them: an HCA group starts exactly on a
  128-aligned boundary, so its resumer rewrites every row it reads.

``s`` is the number of speculative tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby, product
from typing import Sequence

from .deepseek_v4_rows import CSA_RATIO, HCA_RATIO

#: Fields start on, and a plane's state ends on, this many bytes (entry_arena ``_ALIGN``).
FIELD_ALIGN = 256
FP32_BYTES = 4


def _align(value: int) -> int:
    return -(-value // FIELD_ALIGN) * FIELD_ALIGN


@dataclass(frozen=True)
class StateField:
    """One state tensor family: ``layers`` x ``rows`` x ``width`` fp32 per request."""

    name: str
    layers: int
    rows: int
    width: int
    in_image: bool = True

    @property
    def nbytes(self) -> int:
        return self.layers * self.rows * self.width * FP32_BYTES


def v4_state_fields(n_csa: int, n_hca: int, head_dim: int, index_head_dim: int,
                    spec_tokens: int = 0) -> list[StateField]:
    """The plugin's compressor state fields, in its declared order."""
    csa_rows = 2 * CSA_RATIO + spec_tokens   # coff = 2: two overlapping windows
    hca_rows = HCA_RATIO + spec_tokens
    return [
        StateField("csa_main_kv", n_csa, csa_rows, 2 * head_dim),
        StateField("csa_main_score", n_csa, csa_rows, 2 * head_dim),
        StateField("csa_idx_kv", n_csa, csa_rows, 2 * index_head_dim),
        StateField("csa_idx_score", n_csa, csa_rows, 2 * index_head_dim),
        StateField("hca_main_kv", n_hca, hca_rows, head_dim, in_image=False),
        StateField("hca_main_score", n_hca, hca_rows, head_dim, in_image=False),
    ]


def extents(fields: Sequence[StateField]) -> list[tuple[StateField, int, int]]:
    """Each field with its ``[start, end)`` bytes: placed back to back, each start 256-aligned."""
    out, offset = [], 0
    for f in fields:
        start = _align(offset)
        out.append((f, start, start + f.nbytes))
        offset = start + f.nbytes
    return out


def state_bytes(fields: Sequence[StateField]) -> int:
    ends = [end for _, _, end in extents(fields)]
    return _align(ends[-1]) if ends else 0


def carried_runs(fields: Sequence[StateField]) -> list[tuple[int, int, str]]:
    """``(offset, nbytes, name)`` of an image's state bytes in one plane.

    Consecutive carried fields form one run (padding between them rides along);
    a field left out breaks the run; empty runs are dropped.
    """
    runs = []
    for carried, group in groupby(extents(fields), key=lambda e: e[0].in_image):
        group = list(group)
        start, end = group[0][1], group[-1][2]
        if carried and end > start:
            names = group[0][0].name if len(group) == 1 else f"{group[0][0].name}..{group[-1][0].name}"
            runs.append((start, end - start, names))
    return runs


def split_over_planes(fields: Sequence[StateField], widths: Sequence[int]) -> tuple[list[list[StateField]], int]:
    """The plane for every field that needs the fewest slot rows, and that row count.

    A row index means the same row in every plane, and a field is one strided
    tensor, so each field sits whole in one plane. Every assignment is tried
    (field ``i`` to plane ``(code // P**i) % P``, codes ascending); the first
    with the fewest rows wins, as in ATOM.
    """
    best: tuple[list[list[StateField]], int] | None = None
    for planes_of in product(range(len(widths)), repeat=len(fields)):
        # product() varies the last position fastest; ATOM's code varies field 0 fastest.
        planes_of = planes_of[::-1]
        groups: list[list[StateField]] = [[] for _ in widths]
        for f, p in zip(fields, planes_of):
            groups[p].append(f)
        rows = max(-(-state_bytes(g) // w) for g, w in zip(groups, widths))
        if best is None or rows < best[1]:
            best = (groups, rows)
    assert best is not None
    return best
