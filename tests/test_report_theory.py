"""Theory against evidence in the report: shaded allowed regions, the ε-vs-ε figure, findings, the new verdicts.

A violating run is written without training, through the run directory's own writers (RunStore) and the same
analysis and report code as a real run: a DP-SGD campaign with σ = 20 (analytic ε ≈ 0.06) whose stored outputs
separate IN from OUT models far more than that ε allows.
"""

import dataclasses
import json
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
import torch

from dpaudit import analysis, models
from dpaudit.campaign import plan as campaign_plan
from dpaudit.campaign import resolve as resolver
from dpaudit.campaign import runner, sketch_inputs
from dpaudit.campaign.store import ChunkOutputs, Plan, RunStore
from dpaudit.cli.audit import finish
from dpaudit.config import CampaignConfig, Execution
from dpaudit.mechanisms import bounds, privacy
from dpaudit.reporting import audit_report, figures
from dpaudit.reporting import summary as run_summary
from dpaudit.training import engine

ALLOWED_RGB = (213, 236, 213)  # tab:green at alpha 0.2 on white
ROC_RGB = (148, 103, 189)  # tab:purple
VIOLATION_RGB = (251, 233, 233)  # tab:red at alpha 0.1 on white
CLOPPER_PEARSON_RGB = (23, 190, 207)  # tab:cyan


def written_run(root, seed: int, separation: float, models_count: int = 200) -> dict:
    """A finished DP-SGD canary campaign (σ = 20, one epoch) whose IN models' canary margin is ``separation``."""
    config = CampaignConfig(mechanism="dp-sgd", noise=20.0, clip=1.0, epochs=1, models=models_count, seed=seed)
    dataset = resolver.load_dataset(config.dataset)
    store = RunStore(root)
    store.create_or_check(config, dataset.fingerprint())
    architecture = models.for_input(dataset.input_shape, dataset.num_classes)
    membership = np.arange(models_count)[:, None] % 2 == 0
    classes = dataset.num_classes
    layers = campaign_plan.layer_shapes(architecture)
    members = len(dataset.private) + 1
    mechanism = resolver.mechanism(config)
    claimed = privacy.to_record(campaign_plan.claimed_privacy(mechanism, config, members, layers))
    store.save_plan(
        Plan(
            task=np.array("classification"),
            target_labels=np.array([0]),
            membership=membership,
            reference_outputs=np.zeros((1, classes), dtype=np.float32),
            population_labels=dataset.test.y,
            max_members=np.array(members),
            layer_shapes=np.array([[s.d_out, s.d_in, s.example_rank] for s in layers]),
            base_checksum=np.array("not trained"),
            claimed_privacy=np.array(json.dumps(claimed)),
            sketch_inputs=np.array(""),
        )
    )
    store.write_privacy_event()
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(models_count, 1, classes)).astype(np.float32)
    target[:, 0, 0] += separation * membership[:, 0]  # the canary's label gets a larger logit in IN models
    population = np.zeros((models_count, len(dataset.test), classes), dtype=np.float32)
    store.make_chunks_directory()
    store.write_chunk(ChunkOutputs(np.arange(models_count), target, population))
    finish(store, "canary-loss", as_json=True)  # what `dpaudit audit --json` does once training is done
    return json.loads((root / "summary.json").read_text())


@pytest.fixture(scope="module")
def violating(tmp_path_factory):
    root = tmp_path_factory.mktemp("theory") / "violating"
    return root, written_run(root, seed=0, separation=4.0)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("theory") / "clean"
    return root, written_run(root, seed=1, separation=0.0)


def test_violating_run_is_violated_and_says_so_first(violating, capsys):
    root, summary = violating
    assert 0 < summary["analytic_epsilon"] < 0.1 and summary["epsilon_lower_bound"] > 1.0
    assert summary["verdict"] == "violated"
    assert summary["finding"].startswith("VIOLATED: dp-sgd (σ=20, C=1): empirical ε ≥ ")
    assert f"against analytic ε = {summary['analytic_epsilon']:.3g}" in summary["finding"]
    assert summary["headline"].startswith("LEAKS MORE THAN ITS CLAIM ALLOWS: DP-SGD on every weight, the built-in")
    assert f"it shows ε ≥ {summary['epsilon_lower_bound']:.3g} at 95% confidence" in summary["headline"]
    markdown = (root / "report.md").read_text().splitlines()
    assert markdown[0] == f"**{audit_report._markdown_text(summary['headline'])}**"
    assert markdown[2] == audit_report._markdown_text(summary["finding"])  # the paper's terms below the headline


def test_finding_of_a_consistent_run_states_the_recovered_share(clean):
    _, summary = clean
    assert summary["verdict"] in ("consistent", "inconclusive")
    if summary["verdict"] == "consistent":
        assert f"recovers {summary['audit_tightness']:.0%} of the bound" in summary["finding"]


def test_not_dp_verdict_confirms_leakage_and_inconclusive_without_evidence(violating, clean):
    """The same stored outputs read as noise-free LoRA-FA: separated outputs confirm [W] Prop. 2, none do not."""
    for (root, _), expected in ((violating, "confirmed"), (clean, "inconclusive")):
        result = analysis.analyse(RunStore(root))
        not_dp = dataclasses.replace(
            result, analytic=bounds.AnalyticBound(None, None, "noise-free lora-fa: not DP", not_dp=True)
        )
        judged = not_dp.verdict
        assert judged.outcome == expected, judged.reason
        if expected == "confirmed":
            assert judged.reason.startswith("confirmed: noise-free lora-fa: not DP; the audit finds ε ≥ ")
            assert f"AUC {result.metrics.auc:.2f}" in judged.reason


def _rgb(path):
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _mask(pixels, rgb, tolerance=3):
    return (np.abs(pixels - np.array(rgb)) <= tolerance).all(axis=-1)


def _screenshot(html_path, out, height):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed here (apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={tempfile.mkdtemp()}", "--force-device-scale-factor=1"]
    command = [chromium, *flags, f"--window-size=1280,{height}", f"--screenshot={out}", html_path.as_uri()]
    subprocess.run(command, capture_output=True, timeout=120, check=True)
    return _rgb(out)


def _curve_pixels_above_allowed_region(pixels) -> int:
    """ROC pixels with shading below them in the same column (within one figure's height) and none above."""
    roc, allowed = _mask(pixels, ROC_RGB), _mask(pixels, ALLOWED_RGB)
    count = 0
    for y, x in zip(*np.nonzero(roc)):
        below, above = allowed[y + 5 : y + 400, x], allowed[max(0, y - 400) : y, x]
        count += bool(below.any() and not above.any())
    return count


def test_report_of_a_violating_run_shows_the_roc_leaving_the_allowed_region(violating, tmp_path):
    root, _ = violating
    pixels = _screenshot(root / "report.html", tmp_path / "single.png", 1400)
    assert _mask(pixels, ALLOWED_RGB).sum() > 500  # the allowed region is shaded
    assert _mask(pixels, ROC_RGB).sum() > 200  # the ROC is drawn
    assert _curve_pixels_above_allowed_region(pixels) > 100  # and much of it runs above the region


def test_multi_run_report_puts_the_violating_run_above_the_diagonal(violating, clean, tmp_path):
    html_path, _ = audit_report.write([violating[0], clean[0]], tmp_path / "both")
    assert "empirical against analytic ε" in html_path.read_text()
    pixels = _screenshot(html_path, tmp_path / "multi.png", 3600)
    markers, shaded = _mask(pixels, CLOPPER_PEARSON_RGB), _mask(pixels, VIOLATION_RGB)
    assert shaded.sum() > 2000
    # A Clopper-Pearson marker inside the shaded half: shading just left and right of a marker pixel.
    inside = [
        (y, x)
        for y, x in zip(*np.nonzero(markers))
        if shaded[y, max(0, x - 8) : x].any() and shaded[y, x + 1 : x + 9].any()
    ]
    assert len(inside) > 10


def test_roc_without_analytic_bound_says_so_instead_of_shading(violating):
    """The legend names why nothing is shaded; nothing is shaded."""
    root, _ = violating
    result = analysis.analyse(RunStore(root))
    no_bound = dataclasses.replace(
        result, analytic=bounds.AnalyticBound(None, None, "noise-free lora-fa: not DP", not_dp=True)
    )
    summary = run_summary.summary(no_bound)
    texts = []

    def draw(ax):
        figures.draw_campaign_roc(ax, no_bound, summary, "t", loglog=True)
        texts.extend(t.get_text() for t in ax.get_legend().get_texts())
        assert not ax.collections  # no fill_between

    figures.figure_png(draw)
    assert any(t.startswith("no analytic ε to shade: not DP at any ε") for t in texts)


def test_default_audit_is_not_inconclusive(tmp_path, capsys):
    """`dpaudit audit` at its defaults (noise-free LoRA-FA) at 16 models: [W] Prop. 2 confirmed.

    [S] Lemma 7.2 is set beside it with its inputs measured into measured.json.
    """
    store = runner.run(CampaignConfig(models=16), Execution(progress=False, workers=1), tmp_path / "run")
    assert finish(store, None, as_json=True) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "confirmed", summary["verdict_reason"]
    assert summary["finding"].startswith("lora-fa (r=16): confirmed: ")
    claim = summary["sketch_claim"]
    measured = store.measurements()
    assert claim["measured"] == measured and measured["grad_bound"] > 0 and measured["smoothness"] > 0
    # The first layer's W is 128 × 64: G Gᵀ (128 × 128) has rank ≤ 64, so λ̄ = 0 and Γ = 0.
    assert measured["gram_minimum"] == 0 and claim["gamma"] == 0 and claim["outcome"] == "vacuous"
    assert claim["epsilon"] == "inf" and "Γ = 0 ≤ 1" in claim["reason"]


def test_sketch_inputs_are_measured_on_the_campaigns_own_models(tmp_path):
    """The recording retrain (full-weight LoRA-FA, the models' own A and batches) ends where the campaign did.

    Their stored canary logits agree, and measured.json's λ̄ and C are those of the recorded gradients.
    """
    config = CampaignConfig(models=4, epochs=1)
    store = runner.run(config, Execution(progress=False, workers=1), tmp_path / "run")
    setup = campaign_plan.prepare(config, store, torch.device("cpu"))
    indices = np.array(store.measurements()["models"])
    recorder, shadow = sketch_inputs.retrain_recording(setup, indices, frozenset())
    retrained = engine.logits(shadow, setup.targets_x).numpy()
    stored = store.outputs().target_outputs[indices]
    np.testing.assert_allclose(retrained, stored, rtol=1e-4, atol=1e-4 * np.abs(stored).max())
    smallest = min(
        np.linalg.eigvalsh(g @ g.transpose(0, 2, 1))[:, 0].clip(min=0).min()
        for g in (t.numpy() for t in recorder.cumulative.values())
    )
    assert store.measurements()["gram_minimum"] == pytest.approx(smallest, abs=1e-9)
    assert 0 < recorder.grad_bound == pytest.approx(store.measurements()["grad_bound"], rel=1e-6)
