"""What is derived from a declaration's fields (the stage a patch is decided at, the places its pins cover, its
key): shared by the objects every process reads (schema.py) and the validating models (validation.py).
"""

from __future__ import annotations

from typing import ClassVar

from vllm_patchkit.declaration.kinds import declaration_of
from vllm_patchkit.declaration.precondition_table import CONFIG_STAGE


class WhenReading:
    __slots__ = ()
    #: the preconditions judged at the config stage (their rows in declaration/precondition_table.py)
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = tuple(row.name for row in CONFIG_STAGE)

    def needs_config(self) -> bool:
        return any(getattr(self, name) is not None for name in self.CONFIG_FIELDS)


class PatchReading:
    __slots__ = ()

    @property
    def pinned_specs(self) -> list[str]:
        """Every upstream place the manifest pins for this patch: target, copies, uses, (kind subclass) each
        overridden base method as `target.method`, and (kind set) the base attribute named in `inherited_from`."""
        specs = (([self.target] if self.target else []) + list(self.copies) + list(self.uses)
                 + [f"{self.target}.{m}" for m in self.overrides] + list(self.reimplements or ())
                 + ([self.inherited_from] if self.inherited_from else []))
        return list(dict.fromkeys(specs))

    @property
    def source_pinned_specs(self) -> frozenset[str]:
        """The places pinned with their source digest: what the implementation copies (`reimplements`; unset, a
        replace copies its target)."""
        if self.reimplements is None:
            return frozenset([self.target] if declaration_of(self.kind).pins_source and self.target else [])
        return frozenset(self.reimplements)

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    @property
    def stage(self) -> str:
        """'import' if every precondition can be judged at plugin load, else 'config'.

        A subclass is always config-stage: the field that selects it lives on the VllmConfig."""
        return "config" if self.when.needs_config() or declaration_of(self.kind).selects_class else "import"
