"""The audit report: structure (html.parser), escaping, headless Chromium rendering, clear errors on bad runs."""

import html.parser
import json
import shutil
import subprocess
import tempfile

import pytest

from dpaudit.campaign import runner
from dpaudit.cli import main
from dpaudit.config import CampaignConfig, Execution
from dpaudit.reporting import audit_report


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs that differ in rank; one directory name carries markup that must be escaped."""
    roots = []
    for rank, name in ((4, "rank4"), (8, "<img src=x onerror=alert(1)>")):
        root = tmp_path_factory.mktemp("runs") / name
        store = runner.run(CampaignConfig(models=8, epochs=1, rank=rank), Execution(progress=False, workers=1), root)
        from dpaudit.cli.audit import finish

        finish(store, "canary-loss", as_json=True)
        roots.append(root)
    return roots


class _Structure(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in ("img", "meta", "br"):
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()


def test_report_html_is_self_contained_well_formed_and_escaped(runs, tmp_path):
    html_path, md_path = audit_report.write(runs, tmp_path)
    page = html_path.read_text()
    structure = _Structure()
    structure.feed(page)
    assert structure.open == ["html"] or structure.open == []  # everything but the root closed in order
    assert structure.tags.count("table") == 1 and structure.tags.count("tr") == 3  # header + one row per run
    assert len(structure.images) >= 2 and all(src.startswith("data:image/png;base64,") for src in structure.images)
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # the run's name is shown, escaped, not obeyed
    assert "http://" not in page and "https://" not in page  # no network
    markdown = md_path.read_text()
    assert "| run | mechanism |" in markdown and "report_sweep.png" in markdown  # two ranks → a sweep figure


def test_report_renders_in_headless_chromium(runs, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed here (apt-get install chromium); html.parser checks ran")
    html_path, _ = audit_report.write(runs, tmp_path)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp()}",
    ]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert 'id="theory-vs-audit"' in dom and dom.count("<img") >= 2
    screenshot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1280,1600", f"--screenshot={screenshot}", html_path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    from PIL import Image

    pixels = Image.open(screenshot).convert("RGB")
    assert pixels.size == (1280, 1600) and len(pixels.getcolors(1 << 20)) > 50  # a rendered page, not blank


def test_report_of_a_missing_or_old_run_is_a_one_line_error(runs, tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "has no summary.json" in capsys.readouterr().err
    old = tmp_path / "old"
    shutil.copytree(runs[0], old)
    summary = json.loads((old / "summary.json").read_text())
    del summary["attack"]
    (old / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(old)]) == 2
    err = capsys.readouterr().err
    assert "summary.json does not name the attack" in err and len(err.strip().splitlines()) == 1
