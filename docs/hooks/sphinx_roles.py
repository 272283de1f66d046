"""A griffe extension for the API reference (mkdocs.yml): juice's docstrings cross-reference with
Sphinx roles (:func:`juice.engine.generate`, :class:`~juice.Steerer`); mkdocstrings links with
autorefs (`[generate][juice.engine.generate]`). Each role becomes a link where its target is a
documented object of the package (a relative name is looked up in the object's module and
class), else code."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|exc|obj|const):`(~?)([^`<>]+?)(?:\(\))?`")


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        collection = loader.modules_collection

        def find(path: str):
            try:
                target = collection[path]
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
            try:
                if target.is_alias:
                    target = target.final_target
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
            if any(part.startswith("_") for part in target.path.split(".")[1:]) or not target.docstring:
                return None
            return target

        def convert(obj) -> None:
            doc = obj.docstring
            if doc is not None and ":" in doc.value:
                module = obj if obj.is_module else obj.module
                scopes = [s.path for s in (obj, obj.parent, module) if s is not None and not s.is_function]

                def link(m: re.Match) -> str:
                    short, name = m.group(1), m.group(2).strip()
                    shown = name.rsplit(".", 1)[-1] if short else name
                    target = find(name) or next((t for s in scopes if (t := find(f"{s}.{name}"))), None)
                    return f"[`{shown}`][{target.path}]" if target is not None else f"`{shown}`"

                doc.value = ROLE.sub(link, doc.value)
            for member in obj.members.values():
                if not member.is_alias:
                    convert(member)

        convert(pkg)
