"""Skills: SKILL.md parsing, folder loading, the prompt index and load_skill [AP-40].

The acceptance cases of reference §1.23 (skills) ported, plus loading a folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_plugin.agent import Agent
from agent_plugin.errors import AgentError, ErrorKind
from agent_plugin.messages import Role, ToolResultPart, text_of
from agent_plugin.outcomes import Completed
from agent_plugin.providers.scripted import ScriptedModel, tool_call
from agent_plugin.skills import SKILL_FILE, LoadSkillTool, Skill, load_skills, skills_index
from agent_plugin.tools import Tool, ToolContext, ToolEffect, canonical_json

CTX = ToolContext(run_id="run-1", call_id="call-1")

DIGEST = """\ufeff---
name: "weekly-digest"
description: 'How to write the Monday digest.'
version: 3
---

1. Pull last week's incidents.
2. Group them by team.

"""


def skill_md(name: str, description: str = "does things", body: str = "Do it.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"


def test_parse_reads_front_matter_and_body() -> None:
    skill = Skill.parse(DIGEST)
    assert skill == Skill(
        name="weekly-digest",
        description="How to write the Monday digest.",
        body="1. Pull last week's incidents.\n2. Group them by team.",
    )


def test_parse_details() -> None:
    # CRLF line endings, spaces around the fences and keys, colons inside values
    crlf = "  ---  \r\n name :  triage \r\ndescription: when: a bug comes in\r\n---\r\nStep one\r\n"
    skill = Skill.parse(crlf)
    assert (skill.name, skill.description, skill.body) == (
        "triage",
        "when: a bug comes in",
        "Step one",
    )
    # unmatched quotes stay, matched ones go; an empty body is fine
    skill = Skill.parse('---\nname: "odd\'\ndescription: "x"\n---')
    assert (skill.name, skill.description, skill.body) == ("\"odd'", "x", "")
    # lines without a colon in the front matter are ignored; the last value of a key wins
    skill = Skill.parse("---\njust words\nname: a\nname: b\ndescription: d\n---\nbody")
    assert skill.name == "b"


NO_FENCE = "skill document must start with a `---` front matter line"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("name: x\ndescription: y\n", "skill document must start with a `---` front matter line"),
        ("", "skill document must start with a `---` front matter line"),
        (
            "# Title\n---\nname: x\n---\n",
            "skill document must start with a `---` front matter line",
        ),
        ("---\nname: x\ndescription: y\n", "skill front matter is not closed with `---`"),
        ("---\ndescription: y\n---\nbody", "skill front matter needs a `name`"),
        ("---\nname:   \ndescription: y\n---\nbody", "skill front matter needs a `name`"),
        ("---\nname: ''\ndescription: y\n---\nbody", "skill front matter needs a `name`"),
        ("---\nname: x\n---\nbody", 'skill "x" needs a `description`'),
        ('---\nname: x\ndescription: ""\n---\nbody', 'skill "x" needs a `description`'),
    ],
)
def test_parse_rejects_bad_documents(document: str, message: str) -> None:
    with pytest.raises(AgentError) as excinfo:
        Skill.parse(document)
    assert excinfo.value.kind is ErrorKind.CONFIG
    assert excinfo.value.message == message


def test_index_lists_names_and_descriptions_only() -> None:
    skills = [Skill.parse(DIGEST), Skill(name="triage", description="Sort bugs.", body="SECRET")]
    index = skills_index(skills)
    assert index == (
        "## Skills\n"
        "Before you do a task that a skill covers, read it with the `load_skill` tool.\n"
        "- weekly-digest: How to write the Monday digest.\n"
        "- triage: Sort bugs.\n"
    )
    assert "SECRET" not in index
    assert "Pull last week" not in index


async def test_load_skill_returns_the_body() -> None:
    skills = [Skill.parse(DIGEST), Skill(name="triage", description="Sort bugs.", body="Sort.")]
    load = LoadSkillTool(skills)
    assert isinstance(load, Tool)
    assert load.name == "load_skill"
    assert load.effect is ToolEffect.READ_ONLY
    assert load.input_schema["required"] == ["name"]
    assert await load.execute({"name": "triage"}, CTX) == {
        "name": "triage",
        "instructions": "Sort.",
    }
    result = await load.execute({"name": " weekly-digest "}, CTX)
    assert result["instructions"] == "1. Pull last week's incidents.\n2. Group them by team."

    bad_inputs: list[Any] = [{}, {"name": ""}, {"name": 7}, None, "triage"]
    for bad in bad_inputs:
        with pytest.raises(AgentError) as excinfo:
            await load.execute(bad, CTX)
        assert excinfo.value.kind is ErrorKind.TOOL
        assert excinfo.value.message == "give the skill `name`"
    with pytest.raises(AgentError) as excinfo:
        await load.execute({"name": "cooking"}, CTX)
    assert excinfo.value.kind is ErrorKind.TOOL
    assert excinfo.value.message == 'no skill "cooking"; skills: ["weekly-digest", "triage"]'


def test_load_skill_rejects_two_skills_with_one_name() -> None:
    twice = [Skill(name="a", description="1", body=""), Skill(name="a", description="2", body="")]
    with pytest.raises(AgentError) as excinfo:
        LoadSkillTool(twice)
    assert excinfo.value.kind is ErrorKind.CONFIG


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_folder_of_skills_loads_sorted_by_name(tmp_path: Path) -> None:
    write(tmp_path / "z-folder" / SKILL_FILE, skill_md("alpha", body="First."))
    write(tmp_path / "a-folder" / SKILL_FILE, skill_md("omega", body="Last."))
    write(tmp_path / "a-folder" / "notes.md", "not a skill")
    write(tmp_path / "assets" / "logo.txt", "no SKILL.md here")
    write(tmp_path / "README.md", "the folder's own readme, not a skill")
    write(tmp_path / "deep" / "nested" / SKILL_FILE, skill_md("nested"))  # only one level down
    skills = load_skills(tmp_path)
    assert [(s.name, s.body) for s in skills] == [("alpha", "First."), ("omega", "Last.")]
    assert load_skills(str(tmp_path)) == skills
    assert load_skills(tmp_path / "assets") == []


def test_folder_errors_name_the_files(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as excinfo:
        load_skills(tmp_path / "missing")
    assert excinfo.value.kind is ErrorKind.CONFIG
    assert "missing" in excinfo.value.message

    first = write(tmp_path / "one" / SKILL_FILE, skill_md("same"))
    second = write(tmp_path / "two" / SKILL_FILE, skill_md("same"))
    with pytest.raises(AgentError) as excinfo:
        load_skills(tmp_path)
    assert excinfo.value.kind is ErrorKind.CONFIG
    assert str(first) in excinfo.value.message
    assert str(second) in excinfo.value.message

    second.write_text("no front matter\n", encoding="utf-8")
    with pytest.raises(AgentError) as excinfo:
        load_skills(tmp_path)
    assert excinfo.value.message == (
        f"{second}: skill document must start with a `---` front matter line"
    )

    second.write_bytes(b"---\nname: \xff\n---\n")
    with pytest.raises(AgentError) as excinfo:
        load_skills(tmp_path)
    assert excinfo.value.kind is ErrorKind.CONFIG
    assert excinfo.value.message.startswith(f"{second}: cannot read the skill")


async def test_skills_are_listed_and_loadable_in_a_run() -> None:
    skills = [Skill.parse(DIGEST)]
    model = ScriptedModel([tool_call("load_skill", {"name": "weekly-digest"}), "Digest written."])
    agent = Agent(model, tools=[LoadSkillTool(skills)], system_prompt=skills_index(skills))
    turn = await agent.run("write the digest")
    assert isinstance(turn.outcome, Completed)
    system = model.requests[0].messages[0]
    assert system.role is Role.SYSTEM
    assert "- weekly-digest: How to write the Monday digest." in text_of(system.content)
    assert "Pull last week" not in text_of(system.content)
    results: list[Any] = [
        p.tool_result.content for p in turn.messages[2].content if isinstance(p, ToolResultPart)
    ]
    assert results == [
        canonical_json(
            {
                "instructions": "1. Pull last week's incidents.\n2. Group them by team.",
                "name": "weekly-digest",
            }
        )
    ]
