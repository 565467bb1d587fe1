"""The audit report: structure (html.parser), escaping, headless Chromium rendering, clear errors on bad runs."""

import dataclasses
import html
import html.parser
import json
import shutil
import subprocess
import tempfile

import pytest

from dpaudit.analysis import certifiable_epsilon
from dpaudit.campaign import runner
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.cli.audit import _verdict_words, finish
from dpaudit.config import CampaignConfig, Execution
from dpaudit.reporting import audit_report
from dpaudit.reporting.summary import WHICH_EPSILON


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs that differ in rank; one directory name carries markup that must be escaped."""
    roots = []
    for rank, name in ((4, "rank4"), (8, "<img src=x onerror=alert(1)>")):
        root = tmp_path_factory.mktemp("runs") / name
        store = runner.run(CampaignConfig(models=8, epochs=1, rank=rank), Execution(progress=False, workers=1), root)
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
    assert page.count('<table class="audited">') == 2  # what was audited, one table per run
    theory = page.split('<table id="theory-vs-audit">')[1].split("</table>")[0]
    assert theory.count("<tr>") == 3  # header + one row per run
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
    assert dom.count('class="headline"') == 2 and 'id="what-was-audited"' in dom and "too few to certify" in dom
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


def test_the_report_opens_with_the_verdict_in_plain_words_the_ceiling_and_what_was_audited(runs, tmp_path, capsys):
    entry = audit_report.load(runs[0])
    numbers = entry.summary
    html_path, md_path = audit_report.write(runs[:1], tmp_path)
    page = html_path.read_text()
    headline = page.split('<p class="headline"><strong>')[1].split("</strong>")[0]
    assert headline == html.escape(numbers["headline"]) and md_path.read_text().startswith(f"**{headline[:40]}")
    assert numbers["verdict"] == "inconclusive"  # 8 models: AUC 0.81, CI 0.40-0.96
    assert headline.startswith("Inconclusive: noise-free LoRA-FA fine-tuning (frozen random A, trained B)")
    assert "does not tell the members from the others significantly better than chance" in headline
    assert ", rank 4, the built-in model on digits. The attack " in headline
    # 4 IN + 4 OUT cannot certify any ε > 0: the ceiling is 0, and the sentence says what 4x the models would give.
    assert numbers["ceiling"]["epsilon"] == 0 == entry.analysis.bound.max_certifiable_epsilon
    assert certifiable_epsilon(entry.analysis, 1) == entry.analysis.bound.max_certifiable_epsilon  # same level
    more = numbers["ceiling"]["more_models_epsilon"]
    assert more == certifiable_epsilon(entry.analysis, 4) > 0 and numbers["ceiling"]["more_models"] == 32
    too_few = "8 shadow models are too few to certify any ε above 0, whatever the attack: 32 models would certify"
    assert f"{too_few} up to ε ≥ {more:.3g}" in page
    audited = page.split('id="what-was-audited"')[1].split("</table>")[0]
    for heading in ("mechanism", "model", "trained layers", "data", "training", "membership test", "test accuracy"):
        assert f"<th>{heading}</th>" in audited
    assert f"<td>{numbers['test_accuracy']:.3f} (mean over the shadow models)</td>" in audited
    assert html.escape(WHICH_EPSILON) in page
    finish(RunStore(runs[0]), "canary-loss", as_json=False)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == numbers["headline"] and printed[2].startswith("8 shadow models are too few")
    assert f"  verdict: inconclusive — {numbers['verdict_reason']}" in printed


@pytest.mark.parametrize(
    "outcome, reason, shown",
    [
        ("confirmed", "confirmed: not DP at any ε", "confirmed: not DP at any ε"),  # was "confirmed — confirmed: …"
        ("consistent", "ε ≥ 1 within the claim", "consistent — ε ≥ 1 within the claim"),
    ],
)
def test_the_verdict_line_says_the_outcome_once(outcome, reason, shown):
    assert _verdict_words({"verdict": outcome, "verdict_reason": reason}) == shown


def test_the_sweep_figure_joins_only_runs_that_differ_in_the_swept_setting(runs):
    entries = [audit_report.load(root) for root in runs]
    assert [len(line) for line in audit_report._sweep_lines(entries, "rank")] == [2]
    other_seed = dataclasses.replace(entries[1], summary={**entries[1].summary})
    other_seed.summary["config"] = {**entries[1].summary["config"], "seed": 1}
    assert [len(line) for line in audit_report._sweep_lines([entries[0], other_seed], "rank")] == [1, 1]


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
