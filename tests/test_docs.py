"""The documents as a product: every tracked Markdown file keeps its lines readable (at most 120
characters), and every file of the repository a document names (a path in backticks, or a Markdown
link) exists."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT = 120
# A path in backticks is checked when it starts at one of the repository's top-level folders, or is a
# module or folder of a room of the package (docs write `core/traits.py` for byteps_prophet/core/traits.py;
# `torch/types.h` is torch's own header).
TOP = ("docs", "scripts", "tests", "patches", "docker", "byteps_prophet")
ROOMS = tuple(p.name for p in (REPO / "byteps_prophet").iterdir() if p.is_dir() and p.name != "__pycache__")
PATH = re.compile(r"^(?:[\w.-]+/)+[\w.-]*$")


def tracked_markdown() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
        names = out.stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every Markdown file but the venv's
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*.md")
                 if not p.relative_to(REPO).parts[0].startswith(".")]
    return [REPO / n for n in sorted(names) if (REPO / n).is_file()]


DOCS = tracked_markdown()


def prose(text: str) -> str:
    """The text outside fenced code blocks (commands there name files the reader creates)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def named_paths(text: str) -> set[str]:
    """Repository paths a document names: in inline code (a span may wrap across lines) and link targets."""
    found = set()
    for span in re.findall(r"`([^`]+)`", prose(text)):
        for token in span.split():
            token = token.strip(".,;:()'\"")
            first = token.split("/")[0]
            if (PATH.match(token) and "..." not in token and not re.search(r"[<>{}*$]", token)
                    and (first in TOP or (first in ROOMS and token.endswith((".py", "/"))))):
                found.add(token)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if not re.match(r"^[a-z]+:", target) and not target.startswith("#"):
            found.add("./" + target.split("#")[0])
    return found


def exists(doc: Path, name: str) -> bool:
    if name.startswith("./"):  # a Markdown link: relative to the document
        return (doc.parent / name[2:]).exists()
    return any((base / name).exists() for base in (REPO, REPO / "byteps_prophet", doc.parent))


def test_there_are_documents():
    assert REPO / "README.md" in DOCS and len(DOCS) > 5


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_line_is_longer_than_120_characters(doc):
    long = [f"{doc.relative_to(REPO)}:{n}: {len(line)} characters"
            for n, line in enumerate(doc.read_text().splitlines(), 1) if len(line) > LIMIT]
    assert not long, "lines over 120 characters (wrap them; a long table row becomes a list):\n" + "\n".join(long)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_a_document_names_exists(doc):
    missing = sorted(n for n in named_paths(doc.read_text()) if not exists(doc, n))
    assert not missing, f"{doc.relative_to(REPO)} names files that do not exist: {missing}"


def test_the_path_finder_sees_what_it_should():
    text = ("`scripts/benchmarks/bench_sim.py --parts grid`, `core/traits.py`, [x](ENGINE.md#the-traits), "
            "`out/demo.png`, `DIR/<variant>.json`, [y](https://example.com), `/tmp/bench.lock`, `torch/types.h`\n"
            "```\npython scripts/nowhere.py\n```")
    assert named_paths(text) == {"scripts/benchmarks/bench_sim.py", "core/traits.py", "./ENGINE.md"}
