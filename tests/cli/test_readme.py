"""The README runs as written and stays a first page; links in README, CHANGELOG and docs/ hold."""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_python_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        namespace: dict = {}
        exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tf-bundle 8 1"
    assert "encoder/enc_dense/kernel (8, 16) float32 (0,)" in out
    assert isinstance(namespace["kernel"], np.ndarray) and namespace["kernel"].shape == (8, 16)


README_MAX_LINES = 300
QUICK_START = (
    'pip install . && ckptinspect ls fixtures/run',  # the main job, on the committed fixtures
    'pip install -e ".[test]" && python -m pytest -q',  # the tests (CI runs this line: .ci/run)
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:...


def _docs() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: pathlib.Path) -> set[str]:
    """The heading anchors GitHub makes for a Markdown file (lower case, punctuation but - and _
    dropped, spaces to -, repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M):
        heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links() -> list[tuple[pathlib.Path, str]]:
    return [(doc, target) for doc in _docs() for target in LINK.findall(_prose(doc.read_text()))
            if not EXTERNAL.match(target)]


def test_readme_is_a_first_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the reference goes under docs/"
    start = lines.index("## Quick start")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start + 1 : end]
    code = [line for block in re.findall(r"^```[^\n]*\n(.*?)^```", "\n".join(section) + "\n", flags=re.S | re.M)
            for line in block.splitlines()]
    assert code == list(QUICK_START), f"## Quick start's commands are {code}"
    assert QUICK_START[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_doc_links_point_to_files():
    links = _links()
    assert links, "no relative links found"
    missing = [f"{doc.relative_to(ROOT)}: {target}" for doc, target in links
               if target.split("#")[0] and not (doc.parent / target.split("#")[0]).exists()]
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_doc_link_anchors_exist():
    bad = []
    for doc, target in _links():
        file, _, anchor = target.partition("#")
        path = (doc.parent / file) if file else doc
        if anchor and path.suffix == ".md" and path.is_file() and anchor not in _anchors(path):
            bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, "links to headings that do not exist:\n" + "\n".join(bad)
