"""MkDocs hook: one API reference page per module named in the nav, generated at build time.

A nav entry such as ``- agent_plugin.tools: reference/agent_plugin.tools.md`` under
"API reference" needs no file in ``docs/``: when the file does not exist, this hook adds a
generated page whose whole content is ``::: agent_plugin.tools`` (mkdocstrings renders it from
the module's docstrings). Adding a module to the reference is therefore one line in
``mkdocs.yml``. A page that does exist in ``docs/reference/`` is left alone, so a module can
get a hand-written introduction above its ``:::`` block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

_PAGE = re.compile(r"^reference/(?P<module>agent_plugin(?:\.[a-z_][a-z0-9_]*)*)\.md$")


def _paths(nav: Any) -> Iterator[str]:
    """Every page path in a (nested) nav configuration."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _paths(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _paths(value)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path in _paths(config.nav or []):
        match = _PAGE.match(path)
        if match is None or files.get_file_from_path(path) is not None:
            continue
        module = match["module"]
        files.append(File.generated(config, path, content=f"::: {module}\n"))
    return files
