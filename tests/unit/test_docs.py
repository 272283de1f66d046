"""The documentation is checked like code (issue 37): the MkDocs site builds with --strict (no
broken link, no missing reference), every relative link of README.md resolves, no page points
outside the repository, and the Python examples of README.md and docs/ run, verbatim, on a
tiny model standing in for Gemma."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import juice

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = {"OpenAI(": "a client of a running server (tests/integration/test_server.py sends the same requests)",
        "client.": "a client of a running server (tests/integration/test_server.py)",
        "register_architecture(": "registers an architecture globally (tests/integration/test_architectures.py)",
        "from vllm import": "runs in vLLM's own environment (tests/vllm_env/run_offline.py builds the same requests)"}


def _python_blocks(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("python\n")]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with `mkdocs build --strict`."""
    pytest.importorskip("mkdocs", reason="the docs extra (in dev) installs MkDocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("docs") / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                         cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_the_site_builds_strictly(site):
    tmp_path = site.parent
    assert (tmp_path / "site" / "api" / "engine" / "index.html").is_file()
    html = (tmp_path / "site" / "api" / "engine" / "index.html").read_text(encoding="utf-8")
    assert ":class:`" not in html and ":func:`" not in html   # Sphinx roles became links or code
    assert 'href="#juice.engine.session.DecodingSession"' in html
    # the public API on its own page, an anchor per name, signatures formatted one parameter a line (ruff)
    public = (tmp_path / "site" / "api" / "public" / "index.html").read_text(encoding="utf-8")
    assert 'id="juice.steerer.Steerer"' in public and 'id="juice.models.load_model"' in public
    assert re.search(r"generate\(\s*\n\s+prompts,", re.sub(r"<[^>]+>", "", public))
    # the command-line reference, generated from the CLI: every command and sub-command has its heading
    cli = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in _cli_commands():
        assert f'id="{name}"' in cli, f"the CLI reference lacks `juice {name}`"
    usages = re.findall(r"<code>([^<]*\[OPTIONS\][^<]*)</code>", cli)
    assert usages and all(u.startswith("juice ") for u in usages), usages[:3]   # `juice analyze all [OPTIONS]`
    _check_tables_fit(tmp_path / "site")
    _check_offline(tmp_path / "site")


NARROW_PAGES = ["index", "getting-started", "concepts", "steering", "results", "when-to-steer"]
TABLE_PX = 686   # a table's room at 1280 px: the 720 px content column less its wrapper's padding (Chromium)


def table_min_width(table_html: str) -> float:
    """A table's narrowest rendering in Material's theme, in px: each column at least its header's
    min-width (5rem = 100 px) and its longest unbreakable word (12.8 px text, ~7.3 px a character)
    plus the cell padding (2 x 1.25em = 32 px). Headless Chromium at 1280 px measured the 7-column
    Table 2 at 712 px (six columns of 100, "Translation" 112) in a 686 px room; this gives 712."""
    import html

    longest: dict[int, int] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table_html, re.S):
        for k, cell in enumerate(re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)):
            words = html.unescape(re.sub(r"<[^>]+>", "", cell)).split()
            longest[k] = max(longest.get(k, 0), max((len(w) for w in words), default=0))
    return sum(max(100.0, 32 + 7.3 * n) for n in longest.values())


def test_table_min_width_sees_the_overflow_it_guards_against():
    cells = "".join(f"<th>correct and not degenerate {i}</th>" for i in range(10))
    assert table_min_width(f"<table><tr>{cells}</tr></table>") > 1000
    narrow = "<table><tr><th>Method</th><th>clean</th><th>substitution</th><th>coherent</th></tr></table>"
    assert table_min_width(narrow) < TABLE_PX


def _check_tables_fit(site: Path) -> None:
    """Issue 63: the tables a newcomer reads (results, when to steer) fit the column at 1280 px."""
    for name in NARROW_PAGES:
        page = (site / name / "index.html") if name != "index" else site / "index.html"
        for table in re.findall(r"<table>(.*?)</table>", page.read_text(encoding="utf-8"), re.S):
            first_row = re.sub(r"<[^>]+>", " ", re.search(r"<tr>(.*?)</tr>", table, re.S).group(1))
            assert table_min_width(table) <= TABLE_PX, f"{name}: a table wider than the column: {' '.join(first_row.split())}"


def _check_offline(site: Path) -> None:
    """Nothing the site shows loads from another host: no Mermaid (Material would fetch it from
    unpkg), the Stage 2 diagram a pre-rendered SVG served with the site, no Google Fonts."""
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert 'class="mermaid"' not in text and "unpkg.com" not in text and "fonts.googleapis" not in text, page
    concepts = (site / "concepts" / "index.html").read_text(encoding="utf-8")
    assert 'src="../assets/juice-stage2.svg"' in concepts and (site / "assets" / "juice-stage2.svg").is_file()


CODE_WIDTH = 76   # characters of a code block that fit the content column of the site at 1280 px
SITE_PAGES = sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", SITE_PAGES, ids=lambda p: p.relative_to(ROOT / "docs").as_posix())
def test_every_code_block_of_the_site_fits_the_column_at_1280_px(page):
    """Issues 47 and 92: no code line on the site is wider than the content column at 1280 px
    (a long command is wrapped with a backslash, a program's output shown as a table), so no
    command or output runs past the page's right edge into a scrolling block. README.md is
    GitHub's page, not the site's: its two set-up commands stay one line each, to copy whole."""
    blocks = page.read_text(encoding="utf-8").split("```")[1::2]
    wide = [line for b in blocks for line in b.splitlines()[1:] if len(line) > CODE_WIDTH]
    assert not wide, wide


def test_in_chromium_no_code_block_of_the_site_scrolls_at_1280_px(site):
    """Issue 92, measured as a reader meets it: every page of the site (the API reference aside,
    whose signatures are Python's) opened in headless Chromium at 1280 px, and no code block is
    wider than its box (before: 2 of 2 on serving.md, 7 of 9 on vllm.md)."""
    import os
    import shutil

    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    chromium = os.environ.get("JUICE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium here (Debian's package `chromium`; .ci/run installs it; or set JUICE_CHROMIUM)")
    pages = [p for p in sorted(site.rglob("index.html")) if "api" not in p.relative_to(site).parts]
    assert len(pages) == len([p for p in SITE_PAGES if "api" not in p.relative_to(ROOT / "docs").parts]), pages
    wide = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                    "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for path in pages:
                page.goto(path.as_uri())
                over = page.evaluate("() => [...document.querySelectorAll('pre > code')]"
                                     ".filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText.slice(0, 60))")
                if over:
                    wide[path.parent.name or "index"] = over
        finally:
            browser.close()
    assert not wide, wide


def _cli_commands() -> list[str]:
    """Every command of `juice` and of its groups (`analyze norm`: "norm"), from the typer app."""
    import typer.main

    from juice.apps.cli import app

    group = typer.main.get_command(app)
    names = []
    for name, command in group.commands.items():
        names.append(name)
        names += list(getattr(command, "commands", {}))
    return names


def test_the_cli_reference_names_every_command():
    assert {"reproduce", "identify", "tune", "evaluate", "generate", "serve", "norm"} <= set(_cli_commands())


def test_links_resolve_and_nothing_points_outside_the_repository():
    link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, page
        for target, _ in link.findall(text):
            if re.match(r"[a-z]+:", target):   # http(s), mailto
                continue
            assert (page.parent / target).resolve().exists(), f"{page.name}: {target}"
    assert len(ROOT.joinpath("README.md").read_text(encoding="utf-8").splitlines()) <= 150


@pytest.mark.integration
def test_the_python_examples_run(tiny_llama, tmp_path, monkeypatch, capsys):
    """Every Python block of README.md and docs/, in order per page (one scope per page), on a
    tiny model with tuned heads files in the working directory; the server clients are skipped
    (SKIP says why)."""
    from juice.when_to_steer.auto import AutoPolicy
    from juice.data.records import Direction
    from juice.stage1 import HeadsArtifact

    sel = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))
    tuned = {"juice": {"beta_plus": 3.0, "beta_minus": -1.0}, "june": {"beta_plus": 1.0, "beta_minus": 0.0},
             "auto": AutoPolicy((0.05,), ("original", "juice"), {"juice": (3.0, -1.0)}).to_json()}
    for name, direction in (("heads.json", "parametric"), ("heads_contextual.json", "contextual")):
        for folder in (tmp_path, tmp_path / "juice-output"):   # as the pages name them: beside, or juice reproduce's
            folder.mkdir(exist_ok=True)
            juice.save_heads(HeadsArtifact(tiny_llama.fingerprint(), direction, 1, [1.0], [-1.0], sel, tuned=tuned),
                             folder / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(juice, "load_model", lambda *a, **k: tiny_llama)
    monkeypatch.setattr("juice.steerer.shipped_heads",   # the heads juice ships, for the tiny model
                        lambda lm, direction: juice.load_heads(
                            "heads.json" if Direction.parse(direction) == "parametric" else "heads_contextual.json",
                            lm))
    monkeypatch.setattr(tiny_llama.tokenizer, "chat_template",
                        "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}is", raising=False)
    ran = 0
    for page in PAGES:
        scope: dict = {}
        for block in _python_blocks(page):
            if any(marker in block for marker in SKIP):
                continue
            capsys.readouterr()
            exec(compile(block, str(page.relative_to(ROOT)), "exec"), scope)
            ran += 1
            if "def answer(" in block:   # the RAG loop: a real retrieval, its answer printed
                assert scope["retrieve"]("What is the capital of Freedonia?").startswith("In 2031")
                assert capsys.readouterr().out.strip().splitlines()[-1] == scope["answer"]("What is the capital of Freedonia?")
    assert ran >= 6


def test_no_page_is_left_out_of_the_site():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", ""))["nav"]

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)
        else:
            for v in node:
                yield from pages(v)

    listed = set(pages(nav))
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == listed, on_disk ^ listed


HISTORY = re.compile(r"\bissues? #?\d+|\bno longer\b|\bused to\b|\bpreviously\b|\bformerly\b|what's new|"
                     r"\bchange ?log\b|\bsince (?:version|release)\b|\bthis issue\b|\bthan today's\b|\btoday's protocol\b|"
                     r"\beach version of\b|\bsaved before\b|\bas before\b|\bthe old name\b", re.IGNORECASE)


def test_no_page_tells_history():
    """Issue 47: the pages say what juice does now; what changed and when is in CHANGELOG.md, and
    no page cites the issue tracker."""
    found = [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for page in PAGES
             for m in HISTORY.finditer(page.read_text(encoding="utf-8"))]
    assert not found, found
    assert (ROOT / "CHANGELOG.md").is_file()


def test_what_has_run_where_is_one_table_on_the_vllm_and_models_pages():
    """Issue 74: docs/vllm.md and docs/models.md hold the same table of device x engine x mode,
    when it last ran and what a GPU guarantee rests on (links aside)."""
    import re

    def table(page: str) -> list[str]:
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        start = text.index("| device | engine | mode | last ran |")
        rows = text[start:text.index("\n\n", start)].splitlines()
        return [re.sub(r"\(\[[^]]*\]\([^)]*\)[^)]*\)", "", row) for row in rows]

    vllm, models = table("vllm.md"), table("models.md")
    assert vllm == models and len(vllm) == 6
    assert any(row.startswith("| GPU | vLLM 0.32") and "| never |" in row for row in vllm)


def _headings(path: Path) -> list[str]:
    """A Markdown page's headings, backticks dropped, code blocks skipped."""
    prose = "".join(path.read_text(encoding="utf-8").split("```")[0::2])
    return [h.replace("`", "").strip() for h in re.findall(r"^#+ (.+)$", prose, re.M)]


def test_every_page_and_section_the_code_names_exists():
    """Issue 92 (and 91's stale references): where a docstring, comment, message or script sends
    the reader to a page (`docs/vllm.md`) or a section (`docs/serving.md, "Limits"`, `README,
    "..."`), that page exists and has a heading holding those words (any case). Lines are joined and
    comment markers dropped first, so a reference broken over two lines is read whole."""
    sources = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
               *sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "tests").rglob("*.py"))]
    pattern = re.compile(r"""(README|docs/[\w./-]+\.md)(?:,? \\?"([^"\\]{2,80})\\?")?""")
    checked, bad = 0, []
    for source in sources:
        text = re.sub(r'"\s*\n\s*"|\s*\n\s*#?\s*', lambda m: "" if m.group(0).strip().startswith('"') else " ",
                      source.read_text(encoding="utf-8"))
        for page, section in pattern.findall(text):
            if (page == "README" and not section) or section == "...":
                continue   # "the README" in prose; a placeholder
            path = ROOT / ("README.md" if page == "README" else page)
            checked += 1
            if not path.is_file():
                bad.append(f"{source.relative_to(ROOT)}: {page} does not exist")
            elif section and not any(section.lower() in h.lower() for h in _headings(path)):
                bad.append(f"{source.relative_to(ROOT)}: {page} has no section {section!r}")
    assert checked > 50, checked   # the code does name pages: the check is not empty
    assert not bad, bad
