"""Skills: reusable instructions the agent reads when a task needs them.

A :class:`Skill` is a named block of instructions (a checklist, a house style, a playbook),
disclosed progressively: the system prompt lists each skill's name and one-line description
(:func:`skills_index`), and the model reads a whole skill through the ``load_skill`` tool
(:class:`LoadSkillTool`) when it needs it. :func:`load_skills` reads a folder with one
sub-folder per skill, each holding a ``SKILL.md`` with ``name`` and ``description`` in its
front matter."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, JsonValue

from agent_plugin.errors import AgentError
from agent_plugin.tools import ToolContext, ToolEffect

__all__ = ["SKILL_FILE", "LoadSkillTool", "Skill", "load_skills", "skills_index"]

SKILL_FILE: Final = "SKILL.md"
"""The file name :func:`load_skills` looks for in each skill's folder."""

_FENCE: Final = "---"
_QUOTES: Final = ('"', "'")


class Skill(BaseModel):
    """One skill: the name the model asks for, a one-line description, the instructions."""

    model_config = ConfigDict(frozen=True)

    name: str
    """What the model passes to ``load_skill``; keep it ``kebab-case``."""
    description: str
    """One line that tells the model when the skill applies."""
    body: str
    """The full instructions."""

    @classmethod
    def parse(cls, markdown: str) -> Skill:
        """Read a ``SKILL.md`` document: ``---`` front matter, then the body.

        The front matter holds ``key: value`` lines; ``name`` and ``description`` are used
        (values may be wrapped in matching single or double quotes), other keys are ignored.
        The body is the rest of the document, trimmed. A missing or unterminated front matter,
        or a missing or empty ``name`` or ``description``, is a config error.
        """
        lines = [line.removesuffix("\r") for line in markdown.removeprefix("\ufeff").split("\n")]
        if lines[0].strip() != _FENCE:
            raise AgentError.config("skill document must start with a `---` front matter line")
        try:
            end = next(i for i, line in enumerate(lines) if i > 0 and line.strip() == _FENCE)
        except StopIteration:
            raise AgentError.config("skill front matter is not closed with `---`") from None
        fields: dict[str, str] = {}
        for line in lines[1:end]:
            key, colon, value = line.partition(":")
            if colon and key.strip() in ("name", "description"):
                fields[key.strip()] = _unquote(value.strip())
        name = fields.get("name", "")
        if not name:
            raise AgentError.config("skill front matter needs a `name`")
        description = fields.get("description", "")
        if not description:
            raise AgentError.config(f"skill {_quoted(name)} needs a `description`")
        body = "\n".join(lines[end + 1 :]).strip()
        return cls(name=name, description=description, body=body)


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] in _QUOTES and value[-1] == value[0]:
        return value[1:-1]
    return value


def load_skills(folder: str | Path) -> list[Skill]:
    """Every skill in ``folder``: each sub-folder's ``SKILL.md``, sorted by skill name.

    Sub-folders without a ``SKILL.md`` are skipped. A missing folder, an unreadable or invalid
    skill file (the error names the file) and two skills with the same name (the error names
    both files) are config errors. Reads files synchronously: call it at startup.
    """
    root = Path(folder)
    if not root.is_dir():
        raise AgentError.config(f"skills folder {str(root)!r} does not exist or is not a folder")
    found: dict[str, tuple[Skill, Path]] = {}
    for path in sorted(root.glob(f"*/{SKILL_FILE}")):
        if not path.is_file():
            continue
        try:
            skill = Skill.parse(path.read_text(encoding="utf-8"))
        except AgentError as error:
            raise AgentError.config(f"{path}: {error.message}") from None
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError.config(f"{path}: cannot read the skill: {error}") from None
        if skill.name in found:
            other = found[skill.name][1]
            raise AgentError.config(
                f"two skills are named {skill.name!r}: {other} and {path}; rename one of them"
            )
        found[skill.name] = (skill, path)
    return [found[name][0] for name in sorted(found)]


_INDEX_HEADER: Final = (
    "## Skills\nBefore you do a task that a skill covers, read it with the `load_skill` tool.\n"
)


def skills_index(skills: Iterable[Skill]) -> str:
    """The ``## Skills`` section of the system prompt: names and descriptions, no bodies."""
    return _INDEX_HEADER + "".join(f"- {s.name}: {s.description}\n" for s in skills)


_SCHEMA: Final[dict[str, JsonValue]] = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Skill name."}},
    "required": ["name"],
}


class LoadSkillTool:
    """The built-in ``load_skill`` tool (effect ``read_only``): a skill's full instructions.

    Input ``{"name": ...}``; returns ``{"name", "instructions"}``. A missing name and an unknown
    skill are tool errors written for the model (the latter lists the known names). The input is
    checked here rather than by the schema, so the model gets those texts.
    """

    __slots__ = ("_skills",)

    def __init__(self, skills: Iterable[Skill]) -> None:
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            if skill.name in self._skills:
                raise AgentError.config(f"two skills are named {skill.name!r}")
            self._skills[skill.name] = skill

    @property
    def name(self) -> str:
        return "load_skill"

    @property
    def description(self) -> str:
        return "Read the full instructions of one skill from the Skills list."

    @property
    def input_schema(self) -> dict[str, JsonValue]:
        return _SCHEMA

    @property
    def effect(self) -> ToolEffect:
        return ToolEffect.READ_ONLY

    @property
    def sequential(self) -> bool:
        return False

    @property
    def skills(self) -> list[Skill]:
        """The skills this tool serves, in the order given."""
        return list(self._skills.values())

    def validate(self, arguments: JsonValue) -> str | None:
        """Always None: :meth:`execute` checks the input and explains what is wrong."""
        return None

    async def execute(self, arguments: JsonValue, ctx: ToolContext) -> dict[str, JsonValue]:
        name = arguments.get("name") if isinstance(arguments, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise AgentError.tool("give the skill `name`")
        wanted = name.strip()
        skill = self._skills.get(wanted)
        if skill is None:
            known = ", ".join(_quoted(n) for n in self._skills)
            raise AgentError.tool(f"no skill {_quoted(wanted)}; skills: [{known}]")
        return {"name": skill.name, "instructions": skill.body}

    def __repr__(self) -> str:
        return f"LoadSkillTool({list(self._skills)!r})"
