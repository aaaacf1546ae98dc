"""Griffe extension: turn the package's reStructuredText-flavoured docstrings into Markdown.

The docstrings are written for reading in an editor: Sphinx roles (``:class:`Report```,
``:meth:`~agent_plugin.tools.ToolRegistry.add```), a ``::`` before an indented literal block,
list items whose continuation lines are indented by two spaces, and the odd tag that points at
the project's internal specification. For the site:

* roles become cross-references. They are *optional* ones: a target that is not in the
  reference renders as plain code, without a warning, so a docstring may name any object;
* a literal block becomes a fenced code block, and its ``::`` a ``:``;
* list items are re-indented to the four spaces Python-Markdown expects, with a blank line
  before a list that follows a paragraph;
* specification tags such as ``[AP-47]`` or ``(SPEC §0, reference §1.1)`` are dropped.

The source stays as it is; only the text the site renders changes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj|const):`(?P<body>[^`]+)`")
_TAG = re.compile(
    r"\s*[\[(](?:(?:[A-Z]{2}-\d+(?:\.\.[A-Z]{2}-\d+)?|SPEC §[\d.]+|reference §[\d.]+)"
    r"(?:,\s*)?)+[\])]"
)
_ITEM = re.compile(r"^(?P<indent> *)(?P<marker>[*-]|\d+\.) +\S")
_FENCE = re.compile(r"^ *(```|~~~)")
_PYTHONISH = re.compile(r"\b(?:import|def|class|async|await|return)\b|\w\(|\w = ")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _target(obj: griffe.Object, name: str) -> str | None:
    """The full path ``name`` refers to from ``obj``, or None when it cannot be resolved."""
    if name.startswith("agent_plugin"):
        return name
    head, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            resolved = scope.resolve(head)
        except Exception:  # griffe's NameResolutionError, or an alias it cannot follow
            resolved = None
        if resolved:
            return f"{resolved}.{rest}" if rest else resolved
        scope = scope.parent
    return None


def _cross_reference(obj: griffe.Object, match: re.Match[str]) -> str:
    body = match["body"].strip()
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<name>[^>]+)>", body)
    if explicit is not None:
        title, name = explicit["title"], explicit["name"].lstrip("~")
    else:
        name = body.lstrip("~")
        title = name.rsplit(".", 1)[-1] if body.startswith("~") else name
    target = _target(obj, name)
    if target is None:
        return f"`{title}`"
    return f'<autoref identifier="{target}" optional><code>{title}</code></autoref>'


def _fence_literal_blocks(lines: list[str]) -> list[str]:
    """``text::`` and the indented block after it: ``text:`` and a fenced code block."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        base = _indent(line)
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        block_start = j
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
            j += 1
        block = lines[block_start:j]
        while block and not block[-1].strip():
            block.pop()
        if not block:  # a "::" with nothing under it: leave the line alone
            out.append(line)
            continue
        text = line.rstrip()[:-2].rstrip()
        if text.strip():
            out.append(text + ":")
        deepest = min(_indent(b) for b in block if b.strip())
        code = [b[deepest:] if b.strip() else "" for b in block]
        language = "python" if any(_PYTHONISH.search(c) for c in code) else "text"
        pad = " " * base
        out.append("")
        out.append(f"{pad}```{language}")
        out.extend(f"{pad}{c}" if c else "" for c in code)
        out.append(f"{pad}```")
        out.append("")
        i = j
    return out


def _reindent_lists(lines: list[str]) -> list[str]:
    """List items with their continuation lines indented the way Python-Markdown reads them."""
    out: list[str] = []
    stack: list[tuple[int, int]] = []  # (where the item's text starts in the source, extra)
    in_fence = False
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        indent = _indent(line)
        if not in_fence:
            while stack and indent < stack[-1][0]:
                stack.pop()
        shift = sum(extra for _, extra in stack)
        item = None if in_fence else _ITEM.match(line)
        if item is not None:
            if out and out[-1].strip() and not _ITEM.match(out[-1]):
                out.append("")  # Python-Markdown needs a blank line before a list
            text_at = indent + len(item["marker"]) + 1
            stack.append((text_at, max(0, indent + 4 - text_at)))
        out.append(" " * shift + line)
        if _FENCE.match(line):
            in_fence = not in_fence
    return out


def clean(obj: griffe.Object, text: str) -> str:
    text = _TAG.sub("", text)
    lines = _reindent_lists(_fence_literal_blocks(text.splitlines()))
    return _ROLE.sub(lambda match: _cross_reference(obj, match), "\n".join(lines))


class MarkdownDocstrings(griffe.Extension):
    """Rewrite every docstring of the loaded package once its object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = clean(obj, obj.docstring.value)
